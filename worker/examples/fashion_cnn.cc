#include "worker/examples/fashion_cnn.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <torch/optim/sgd.h>

#include "worker/train/allreduce_persistent.h"
#include "worker/train/idx_dataset.h"
#include "worker/train/multi_node_evaluator.h"
#include "worker/train/multi_node_iterator.h"
#include "worker/train/multi_node_optimizer.h"
#include "worker/train/scatter_dataset.h"

namespace cohort::examples {
namespace {

using Clock = std::chrono::steady_clock;

// Batch size for evaluation: no gradients are kept, so larger batches only save overhead.
constexpr int64_t kEvalBatch = 1000;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// EpochStats::skew_wait_seconds: every rank's end-of-backward times (one allgather; every rank ran
// the same number of steps), then per step the smaller of this rank's wait and how long after it
// the last rank ended its backward.
StatusOr<double> skew_wait_seconds(comm::Communicator& comm, const std::vector<double>& ready_times,
                                   const std::vector<double>& step_waits) {
  const size_t steps = ready_times.size();
  std::vector<double> all(steps * static_cast<size_t>(comm.size()));
  if (steps > 0) {
    Status gathered = comm.allgather(ready_times.data(), all.data(), steps, comm::DataType::kFloat64)->wait();
    if (!gathered.ok()) return gathered.with_context("measuring the ranks' skew (allgather of step times)");
  }
  double total = 0;
  for (size_t i = 0; i < steps; ++i) {
    double last_ready = ready_times[i];
    for (int r = 0; r < comm.size(); ++r) last_ready = std::max(last_ready, all[static_cast<size_t>(r) * steps + i]);
    total += std::min(step_waits[i], last_ready - ready_times[i]);
  }
  return total;
}

// CPU time of this process, all threads (EpochStats::cpu_seconds).
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Minor page faults of this process so far (EpochStats::page_faults).
int64_t process_page_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

train::TensorDataset limited(const train::TensorDataset& data, int64_t limit) {
  if (limit <= 0 || limit >= data.size()) return data;
  return data.slice(0, limit);
}

// This rank's contiguous part of `data` (no communication: every rank holds the whole set).
train::TensorDataset shard(const train::TensorDataset& data, const comm::Communicator& comm, bool equal) {
  train::IndexRange range = train::scatter_range(data.size(), comm.size(), comm.rank(), equal);
  at::Tensor indices = at::arange(range.begin, range.end, at::kLong).remainder(data.size());
  return data.select(indices);
}

// This rank's part of a Fashion-MNIST split as floats. The split is read as u8 and only the
// part is scaled, and the whole split is freed on return: holding it as floats for the whole run
// (as this did) cost 219 MB per rank (train 188 MB + test 31 MB), the largest item of a rank's
// resident memory.
// equal: every rank's part has the same length (scatter_range's force_equal_length).
StatusOr<train::TensorDataset> read_part(bool train_split, int64_t limit, const comm::Communicator& comm,
                                         bool equal) {
  StatusOr<train::TensorDataset> all = train::read_fashion_mnist_u8(train_split);
  if (!all.ok()) return all.status();
  return train::scale_images(shard(limited(*all, limit), comm, equal));
}

}  // namespace

FashionCnnImpl::FashionCnnImpl() {
  conv1_ = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)));
  bn1_ = register_module("bn1", torch::nn::BatchNorm2d(32));
  conv2_ = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)));
  bn2_ = register_module("bn2", torch::nn::BatchNorm2d(64));
  fc1_ = register_module("fc1", torch::nn::Linear(3136, 128));
  fc2_ = register_module("fc2", torch::nn::Linear(128, 10));
}

at::Tensor FashionCnnImpl::forward(const at::Tensor& x) {
  // One layer per statement: a nested call keeps every intermediate alive until the end of the
  // full expression, so evaluation's 1000-sample batches held conv, BN and ReLU outputs (100 MB
  // each) at once. Here each dies when the next is assigned (autograd keeps what backward needs).
  at::Tensor h = conv1_->forward(x);
  h = bn1_->forward(h);
  h = at::relu(h);
  h = at::max_pool2d(h, 2);
  h = conv2_->forward(h);
  h = bn2_->forward(h);
  h = at::relu(h);
  h = at::max_pool2d(h, 2);
  h = at::relu(fc1_->forward(h.flatten(1)));
  return fc2_->forward(h);
}

StatusOr<DataParallelResult> train_data_parallel(comm::Communicator& comm, const DataParallelOptions& options) {
  StatusOr<train::TensorDataset> train_read = read_part(/*train_split=*/true, options.limit, comm, true);
  if (!train_read.ok()) return train_read.status();
  StatusOr<train::TensorDataset> test_read = read_part(/*train_split=*/false, options.limit, comm, false);
  if (!test_read.ok()) return test_read.status();
  train::TensorDataset train_part = std::move(*train_read);
  train::TensorDataset test_part = std::move(*test_read);

  at::manual_seed(options.seed + comm.rank());  // ranks differ; the optimizer broadcasts rank 0's
  FashionCnn model;
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(options.lr).momentum(options.momentum));
  DataParallelResult result;
  try {
    train::MultiNodeOptimizerOptions optimizer_options;
    optimizer_options.double_buffering = options.double_buffering;
    auto optimizer = train::create_multi_node_optimizer(sgd, comm, optimizer_options);
    optimizer->broadcast_parameters();
    train::AllreducePersistent sync_bn(*model, comm);
    train::BatchIterator batches(train_part, options.batch_size, /*shuffle=*/true, options.seed + comm.rank());
    // Every rank's shard has the same length, so every rank stops at the same step.
    int64_t total_steps = 0;
    auto out_of_steps = [&] { return options.max_steps > 0 && total_steps >= options.max_steps; };
    const int64_t steps_per_epoch = (train_part.size() + options.batch_size - 1) / options.batch_size;
    int64_t run_steps = steps_per_epoch * options.epochs;
    if (options.max_steps > 0) run_steps = std::min(run_steps, options.max_steps);
    for (int epoch = 0; epoch < options.epochs && !out_of_steps(); ++epoch) {
      EpochStats stats;
      model->train();
      double wait_before = optimizer->communication_wait_seconds();
      double loss_sum = 0;
      int64_t steps = 0;
      Clock::time_point start = Clock::now();
      const double cpu_start = process_cpu_seconds();
      const int64_t faults_start = process_page_faults();
      const bool measure_skew = options.measure_skew && !options.double_buffering;
      std::vector<double> ready_times;  // measure_skew: each step's end of backward (CLOCK_MONOTONIC s)
      std::vector<double> step_waits;   // measure_skew: each step's wait in step()
      double compute_sum = 0, compute_square_sum = 0;
      while (!out_of_steps()) {
        std::optional<train::TensorDataset> batch = batches.next();
        if (!batch) break;
        const Clock::time_point compute_start = Clock::now();
        optimizer->zero_grad();
        at::Tensor loss = at::cross_entropy_loss(model->forward(batch->inputs), batch->targets);
        loss.backward();
        const Clock::time_point ready = Clock::now();
        const double compute = std::chrono::duration<double>(ready - compute_start).count();
        compute_sum += compute;
        compute_square_sum += compute * compute;
        const double wait_at_ready = optimizer->communication_wait_seconds();
        optimizer->step();
        if (measure_skew) {
          ready_times.push_back(std::chrono::duration<double>(ready.time_since_epoch()).count());
          step_waits.push_back(optimizer->communication_wait_seconds() - wait_at_ready);
        }
        const double batch_loss = loss.item<double>();
        loss_sum += batch_loss;
        ++steps;
        ++total_steps;
        stats.samples += batch->size();
        if (options.on_step) options.on_step(total_steps, run_steps, epoch, batch_loss);
      }
      stats.seconds = seconds_since(start);
      stats.cpu_seconds = process_cpu_seconds() - cpu_start;
      stats.page_faults = process_page_faults() - faults_start;
      stats.steps = steps;
      stats.comm_wait_seconds = optimizer->communication_wait_seconds() - wait_before;
      if (steps > 0) {
        stats.compute_mean_seconds = compute_sum / static_cast<double>(steps);
        stats.compute_sd_seconds = std::sqrt(std::max(
            0.0, compute_square_sum / static_cast<double>(steps) - stats.compute_mean_seconds * stats.compute_mean_seconds));
      }
      if (measure_skew) {
        StatusOr<double> skew = skew_wait_seconds(comm, ready_times, step_waits);
        if (!skew.ok()) return skew.status();
        stats.skew_wait_seconds = *skew;
      }

      Status synced = sync_bn();
      if (!synced.ok()) return synced;
      model->eval();
      at::NoGradGuard no_grad;
      auto evaluator = train::create_multi_node_evaluator(
          [&]() -> StatusOr<train::Metrics> {
            double loss = 0;
            double correct = 0;
            int64_t n = test_part.size();
            for (int64_t begin = 0; begin < n; begin += kEvalBatch) {
              train::TensorDataset b = test_part.slice(begin, std::min(n, begin + kEvalBatch));
              at::Tensor logits = model->forward(b.inputs);
              loss += at::cross_entropy_loss(logits, b.targets, {}, at::Reduction::Sum).item<double>();
              correct += logits.argmax(1).eq(b.targets).sum().item<double>();
            }
            double denom = n > 0 ? static_cast<double>(n) : 1.0;
            train::Metrics metrics;
            metrics["accuracy"] = {correct / denom, n};
            metrics["loss"] = {loss / denom, n};
            metrics["train_loss"] = {steps > 0 ? loss_sum / steps : 0.0, 1};
            metrics["samples"] = {static_cast<double>(stats.samples), 1};
            return metrics;
          },
          comm);
      StatusOr<std::map<std::string, double>> global = evaluator->evaluate();
      if (!global.ok()) return global.status();
      stats.test_accuracy = global->at("accuracy");
      stats.test_loss = global->at("loss");
      stats.train_loss = global->at("train_loss");
      stats.samples = static_cast<int64_t>(std::llround(global->at("samples") * comm.size()));
      if (options.verbose && comm.rank() == 0) {
        std::printf("epoch %d  train_loss=%.4f  test_loss=%.4f  test_acc=%.4f  time=%.1fs  comm_wait=%.1fs\n",
                    epoch + 1, stats.train_loss, stats.test_loss, stats.test_accuracy, stats.seconds,
                    stats.comm_wait_seconds);
        std::fflush(stdout);
      }
      if (options.on_epoch) options.on_epoch(total_steps, epoch, stats);
      result.epochs.push_back(stats);
    }
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("train_data_parallel: ") + e.what());
  }
  return result;
}

}  // namespace cohort::examples
