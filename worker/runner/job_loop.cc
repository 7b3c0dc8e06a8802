#include "worker/runner/job_run.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "worker/train/multi_node_evaluator.h"

// JobRun's training loop: an epoch's steps, rank 0's progress lines and metrics reports, and the
// global means behind them (worker/runner/job_run.h).

namespace cohort::worker::job_run {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

StatusOr<std::map<std::string, double>> JobRun::global(train::Metrics local) {
  return train::create_multi_node_evaluator([&]() -> StatusOr<train::Metrics> { return local; }, comm_)
      ->evaluate();
}

void JobRun::print(const std::string& line) {
  if (!is_reporter() || options_.out == nullptr) return;
  std::fputs(line.c_str(), options_.out);
  std::fputc('\n', options_.out);
  std::fflush(options_.out);
}

void JobRun::report(v1::Metrics metrics, bool epoch_end) {
  if (!is_reporter() || options_.metrics == nullptr) return;
  metrics.set_rank(comm_.rank());
  metrics.set_total_steps(steps_per_epoch_ * spec_.epochs());
  metrics.set_total_epochs(spec_.epochs());
  // Sharded data: each rank a batch of its own; broadcast batches: one batch for all ranks.
  metrics.set_samples_per_step(static_cast<int64_t>(spec_.batch_size()) * (sharded_ ? comm_.size() : 1));
  // Communication wait: this rank's time blocked in collectives, in total and since the last report.
  const Clock::time_point now = Clock::now();
  const std::chrono::nanoseconds blocked = comm_.blocked_time();
  const double interval = std::chrono::duration<double>(now - last_report_time_).count();
  metrics.set_comm_wait_s(std::chrono::duration<double>(blocked).count());
  if (interval > 0) {
    const double waited = std::chrono::duration<double>(blocked - last_report_blocked_).count();
    metrics.set_comm_wait_ratio(std::clamp(waited / interval, 0.0, 1.0));
  }
  last_report_time_ = now;
  last_report_blocked_ = blocked;
  options_.metrics->report(metrics, epoch_end);
}

Status JobRun::train_epoch(int epoch) {
  model_.module->train();
  train_batches_->set_position({epoch, 0});
  double window_loss = 0, epoch_loss = 0;
  int64_t window_loss_steps = 0, epoch_loss_steps = 0, window_samples = 0, epoch_samples = 0, in_epoch = 0;
  Clock::time_point epoch_start = Clock::now();
  Clock::time_point window_start = epoch_start;
  while (true) {
    COHORT_ASSIGN_OR_RETURN(std::optional<TensorDataset> batch, next_train_batch());
    if (!batch.has_value()) break;
    batch = on_device(*batch);
    set_learning_rate(step_);
    if (multi_node_optimizer_) {
      multi_node_optimizer_->zero_grad();
    } else {
      optimizer_->zero_grad();
    }
    at::Tensor y = model_.forward(batch->inputs);
    if (model_.computes_loss) {
      at::Tensor loss = compute_loss(loss_, y, batch->targets);
      loss.backward();
      double value = loss.item<double>();
      window_loss += value;
      epoch_loss += value;
      ++window_loss_steps;
      ++epoch_loss_steps;
    } else if (y.defined() && y.requires_grad()) {
      y.backward();  // a delegate: runs this rank's part of the pipeline's backward
    }
    if (multi_node_optimizer_) {
      multi_node_optimizer_->step();
    } else {
      optimizer_->step();
    }
    ++step_;
    ++in_epoch;
    window_samples += batch->size();
    epoch_samples += batch->size();

    // Progress every log_every_steps (every rank reaches the same step counts: collective).
    if (options_.log_every_steps > 0 && in_epoch % options_.log_every_steps == 0 &&
        in_epoch < steps_per_epoch_) {
      COHORT_ASSIGN_OR_RETURN(
          auto g,
          global({{"loss", {window_loss_steps ? window_loss / window_loss_steps : 0.0, window_loss_steps}},
                  {"samples", {static_cast<double>(window_samples), 1}}}));
      double rate =
          g["samples"] * (sharded_ ? comm_.size() : 1) / std::max(1e-9, seconds_since(window_start));
      print(fmt::format("epoch {}/{} step {}/{} loss {:.4f} samples/s {:.0f}", epoch + 1, spec_.epochs(),
                        in_epoch, steps_per_epoch_, g["loss"], rate));
      v1::Metrics metrics;
      metrics.set_step(step_);
      metrics.set_epoch(epoch);
      metrics.set_loss(g["loss"]);
      metrics.set_accuracy(last_accuracy_);
      metrics.set_samples_per_s(rate);
      report(metrics, /*epoch_end=*/false);
      window_loss = 0;
      window_loss_steps = 0;
      window_samples = 0;
      window_start = Clock::now();
    }
  }
  return evaluate(epoch, epoch_loss, epoch_loss_steps, epoch_samples, seconds_since(epoch_start));
}

}  // namespace cohort::worker::job_run
