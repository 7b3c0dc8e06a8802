// CUDA tensors through worker/autograd and worker/train: two ranks as threads over the loopback
// transport with "flat" communicators (which stage device buffers through pinned host memory, so
// ranks may share a GPU), every result compared with the same computation on CPU tensors.
// Needs a CUDA libtorch; elsewhere every case reports SKIPPED.
//
//   bazel test --repo_env=COHORT_LIBTORCH=/opt/libtorch-cu128 --config=cuda //tests/gpu:torch_cuda_test

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/optim/sgd.h>

#include "cohort/v1/job.pb.h"
#include "worker/autograd/collective_functions.h"
#include "worker/autograd/point_to_point_functions.h"
#include "worker/autograd/testing/autograd_ranks.h"
#include "worker/autograd/testing/test_tensors.h"
#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/runner/job_runner.h"
#include "worker/train/multi_node_batch_norm.h"
#include "worker/train/multi_node_checkpointer.h"
#include "worker/train/multi_node_optimizer.h"

namespace cohort {
namespace {

constexpr int kRanks = 2;

// Why this process cannot run CUDA tensors; "" when it can.
std::string missing_torch_cuda() {
  if (torch::cuda::is_available() && torch::cuda::device_count() >= 1) return "";
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
    return "libtorch is CPU-only: build with --repo_env=COHORT_LIBTORCH=<a CUDA libtorch> --config=cuda";
  }
  return "no GPU visible";
}

#define SKIP_UNLESS_TORCH_CUDA()                                         \
  do {                                                                   \
    std::string cohort_skip_reason = missing_torch_cuda();               \
    if (!cohort_skip_reason.empty()) {                                   \
      std::fprintf(stderr, "SKIPPED: %s\n", cohort_skip_reason.c_str()); \
      GTEST_SKIP() << cohort_skip_reason;                                \
    }                                                                    \
  } while (0)

using DeviceOf = std::function<at::Device(int rank)>;

at::Device on_cpu(int /*rank*/) { return at::Device(at::kCPU); }

// Every rank on the first GPU: for work whose backward never blocks on a peer.
at::Device on_first_gpu(int /*rank*/) { return at::Device(at::kCUDA, 0); }

// For work whose backward blocks in collectives. Autograd runs the CUDA part of every backward on
// one engine thread per GPU, shared by all threads of a process, so two rank threads whose
// blocking backward collectives land on the same GPU would wait for each other there (separate
// processes, as cohort-worker runs, have an engine each). Each rank gets a GPU of its own when
// there are enough; otherwise rank 0 takes the GPU and the other rank stays on the CPU (ranks may
// mix devices).
at::Device own_gpu_or_cpu(int rank) {
  const int64_t gpus = static_cast<int64_t>(torch::cuda::device_count());
  if (gpus >= kRanks) return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(rank));
  return rank == 0 ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
}

// Per rank: what the rank's function returned, as host tensors.
using Results = std::vector<std::vector<at::Tensor>>;
using RankFn = std::function<std::vector<at::Tensor>(int rank, comm::Communicator& comm, at::Device device)>;

// Runs `fn` on every rank with its device; checks that everything it returns lives there.
Results run_on(const DeviceOf& device_of, const RankFn& fn) {
  Results results(kRanks);
  std::string failures =
      autograd::testing::run_autograd_ranks(kRanks, [&](int rank, comm::Communicator& comm) {
        const at::Device device = device_of(rank);
        for (const at::Tensor& t : fn(rank, comm, device)) {
          EXPECT_EQ(t.device(), device) << "rank " << rank;
          results[rank].push_back(t.detach().cpu());
        }
      });
  EXPECT_EQ(failures, "");
  return results;
}

void expect_same(const Results& cpu, const Results& gpu, double tolerance) {
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t rank = 0; rank < cpu.size(); ++rank) {
    ASSERT_EQ(cpu[rank].size(), gpu[rank].size()) << "rank " << rank;
    for (size_t i = 0; i < cpu[rank].size(); ++i) {
      ASSERT_EQ(cpu[rank][i].sizes(), gpu[rank][i].sizes()) << "rank " << rank << " result " << i;
      EXPECT_TRUE(at::allclose(cpu[rank][i], gpu[rank][i], tolerance, tolerance))
          << "rank " << rank << " result " << i << ": CPU " << cpu[rank][i] << " CUDA " << gpu[rank][i];
    }
  }
}

// The input of `rank` on `device`, a leaf that requires grad.
at::Tensor input(int rank, at::IntArrayRef shape, at::Device device) {
  return autograd::testing::data(rank, shape).to(device).requires_grad_(true);
}

at::Tensor upstream(int rank, at::IntArrayRef shape, at::Device device) {
  return autograd::testing::upstream(rank, shape).to(device);
}

// Forward and backward of `fn` on CPU tensors and on CUDA tensors agree.
void expect_cuda_matches_cpu(const RankFn& fn, const DeviceOf& gpu_devices) {
  Results cpu = run_on(on_cpu, fn);
  Results gpu = run_on(gpu_devices, fn);
  expect_same(cpu, gpu, 1e-10);
}

TEST(TorchCudaAutograd, AllreduceSumAndMaxForwardAndBackward) {
  SKIP_UNLESS_TORCH_CUDA();
  for (comm::ReduceOp op : {comm::ReduceOp::kSum, comm::ReduceOp::kMax}) {
    SCOPED_TRACE(comm::reduce_op_name(op));
    expect_cuda_matches_cpu(
        [op](int rank, comm::Communicator& comm, at::Device device) -> std::vector<at::Tensor> {
          at::Tensor x = input(rank, {3, 4}, device);
          at::Tensor y = autograd::allreduce(comm, x, op);
          y.mul(upstream(rank, {3, 4}, device)).sum().backward();
          return {y, x.grad()};
        },
        own_gpu_or_cpu);
  }
}

TEST(TorchCudaAutograd, AllgatherForwardAndBackward) {
  SKIP_UNLESS_TORCH_CUDA();
  expect_cuda_matches_cpu(
      [](int rank, comm::Communicator& comm, at::Device device) -> std::vector<at::Tensor> {
        at::Tensor x = input(rank, {2, 5}, device);
        at::Tensor y = autograd::allgather_stacked(comm, x);
        y.mul(upstream(rank, {kRanks, 2, 5}, device)).sum().backward();
        return {y, x.grad()};
      },
      own_gpu_or_cpu);
}

// Off root, the result and its anchor go on the device passed.
TEST(TorchCudaAutograd, BcastPlacesTheResultOnEachRanksDevice) {
  SKIP_UNLESS_TORCH_CUDA();
  expect_cuda_matches_cpu(
      [](int rank, comm::Communicator& comm, at::Device device) -> std::vector<at::Tensor> {
        at::Tensor x = input(rank, {6}, device);
        at::Tensor y = autograd::bcast(comm, rank == 0 ? x : at::Tensor(), 0, device);
        y.mul(upstream(rank, {6}, device)).sum().backward();
        if (rank == 0) return {y, x.grad()};
        return {y};
      },
      own_gpu_or_cpu);
}

// ChainerMN's Model_0 / Model_1 over send / recv with a delegate, on CUDA tensors.
TEST(TorchCudaAutograd, SendRecvWithDelegateForwardAndBackward) {
  SKIP_UNLESS_TORCH_CUDA();
  expect_cuda_matches_cpu(
      [](int rank, comm::Communicator& comm, at::Device device) -> std::vector<at::Tensor> {
        const std::vector<int64_t> shape{4, 3};
        at::Tensor w = input(rank + 2, shape, device);
        if (rank == 0) {
          at::Tensor x = input(0, shape, device);
          at::Tensor phi = autograd::send(comm, x.mul(w), 1, 0);
          at::Tensor y = autograd::recv(comm, 1, 1, phi, shape, at::kDouble, device);
          y.mul(upstream(0, shape, device)).sum().backward();
          return {phi, y, x.grad(), w.grad()};
        }
        at::Tensor h = autograd::recv(comm, 0, 0, {}, shape, at::kDouble, device);
        at::Tensor phi = autograd::send(comm, h.mul(w), 0, 1);
        phi.backward();
        return {h, phi, w.grad()};
      },
      own_gpu_or_cpu);
}

// ---- worker/train --------------------------------------------------------------------------

// A few data-parallel steps of a small MLP behind the multi-node optimizer; the parameters after
// them. Ranks start from different weights (step 0 broadcasts rank 0's) and see different data.
std::vector<at::Tensor> train_steps(int rank, comm::Communicator& comm, at::Device device,
                                    const train::MultiNodeOptimizerOptions& options) {
  torch::nn::Sequential model(torch::nn::Linear(6, 5), torch::nn::ReLU(), torch::nn::Linear(5, 3));
  {
    at::NoGradGuard no_grad;
    int k = 0;
    for (at::Tensor& p : model->parameters()) {
      p.copy_(autograd::testing::data(rank * 10 + k++, p.sizes()).mul(0.5));
    }
  }
  model->to(device);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto optimizer = train::create_multi_node_optimizer(sgd, comm, options);
  const int steps = options.double_buffering ? 4 : 3;
  for (int step = 0; step < steps; ++step) {
    at::Tensor x = autograd::testing::data(rank + 3 * step, {8, 6}).to(at::kFloat).to(device);
    at::Tensor target = autograd::testing::upstream(rank + step, {8, 3}).to(at::kFloat).to(device);
    optimizer->zero_grad();
    at::mse_loss(model->forward(x), target).backward();
    optimizer->step();
  }
  return model->parameters();
}

// The optimizer's hooks only launch allreduces (they never wait for a peer), so both ranks can
// run their backward on the one GPU.
TEST(TorchCudaTrain, MultiNodeOptimizerStepsMatchTheCpuRun) {
  SKIP_UNLESS_TORCH_CUDA();
  for (bool double_buffering : {false, true}) {
    SCOPED_TRACE(double_buffering ? "double buffering" : "single buffer");
    train::MultiNodeOptimizerOptions options;
    options.bucket_bytes = 64;  // several buckets
    options.first_bucket_bytes = 32;
    options.double_buffering = double_buffering;
    auto fn = [&](int rank, comm::Communicator& comm, at::Device device) {
      return train_steps(rank, comm, device, options);
    };
    Results cpu = run_on(on_cpu, fn);
    Results gpu = run_on(on_first_gpu, fn);
    expect_same(cpu, gpu, 1e-5);
    // Data parallel: every rank ends with rank 0's parameters.
    for (size_t i = 0; i < gpu[0].size(); ++i) EXPECT_TRUE(at::allclose(gpu[0][i], gpu[1][i]));
  }
}

TEST(TorchCudaTrain, MultiNodeBatchNormForwardBackwardAndRunningStatistics) {
  SKIP_UNLESS_TORCH_CUDA();
  auto fn = [](int rank, comm::Communicator& comm, at::Device device) -> std::vector<at::Tensor> {
    train::MultiNodeBatchNorm bn(comm, torch::nn::BatchNormOptions(3));
    bn->to(device, at::kDouble);
    at::Tensor x = input(rank, {4 + rank, 3, 2}, device);  // unequal local batches
    at::Tensor y = bn->forward(x);
    y.mul(upstream(rank, {4 + rank, 3, 2}, device)).sum().backward();
    return {y, x.grad(), bn->weight.grad(), bn->bias.grad(), bn->running_mean, bn->running_var};
  };
  expect_cuda_matches_cpu(fn, own_gpu_or_cpu);
}

// A model on a GPU is written as host tensors: it loads back onto the GPU and into a CPU model.
TEST(TorchCudaTrain, CheckpointerWritesHostTensorsAndLoadsOntoEachModelsDevice) {
  SKIP_UNLESS_TORCH_CUDA();
  const std::string dir = ::testing::TempDir() + "/torch_cuda_checkpoint_" + std::to_string(::getpid());
  auto make_model = [](int seed, at::Device device) {
    torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
    at::NoGradGuard no_grad;
    int k = 0;
    for (at::Tensor& p : model->parameters()) p.copy_(autograd::testing::data(seed + k++, p.sizes()));
    for (at::Tensor& b : model->buffers()) {
      if (at::isFloatingType(b.scalar_type()))
        b.copy_(autograd::testing::upstream(seed + k++, b.sizes()).abs());
    }
    model->to(device);
    return model;
  };
  auto state_of = [](const torch::nn::Sequential& model) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& p : model->parameters()) out.push_back(p.detach().cpu());
    for (const at::Tensor& b : model->buffers()) out.push_back(b.detach().cpu());
    return out;
  };
  std::string failures =
      autograd::testing::run_autograd_ranks(kRanks, [&](int rank, comm::Communicator& comm) {
        const at::Device gpu(at::kCUDA, 0);
        torch::nn::Sequential saved = make_model(rank, gpu);
        auto writer = train::create_multi_node_checkpointer("cuda", comm, dir);
        writer->add_module("model", *saved);
        ASSERT_TRUE(writer->save(7).ok());
        for (at::Device device : {gpu, at::Device(at::kCPU)}) {
          torch::nn::Sequential loaded = make_model(rank + 100, device);
          auto reader = train::create_multi_node_checkpointer("cuda", comm, dir);
          reader->add_module("model", *loaded);
          StatusOr<std::optional<int64_t>> resumed = reader->resume();
          ASSERT_TRUE(resumed.ok()) << resumed.status().to_string();
          EXPECT_EQ(resumed->value_or(-1), 7);
          for (const at::Tensor& p : loaded->parameters()) EXPECT_EQ(p.device(), device);
          for (const at::Tensor& b : loaded->buffers()) EXPECT_EQ(b.device(), device);
          std::vector<at::Tensor> want = state_of(saved), got = state_of(loaded);
          ASSERT_EQ(want.size(), got.size());
          for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(at::equal(want[i], got[i])) << "tensor " << i;
        }
      });
  EXPECT_EQ(failures, "");
  std::filesystem::remove_all(dir);
}

// ---- worker/job_runner ---------------------------------------------------------------------

// A learnable 4-class problem and an MLP for it (worker/job_runner_test.cc's).
constexpr const char* kDataParallelSpec = R"pb(
  name: "tiny-cuda"
  dataset {
    kind: SYNTHETIC
    train_size: 512
    test_size: 128
    input_shape: [ 1, 8, 8 ]
    num_classes: 4
  }
  data_parallel {
    graph {
      layers { type: "flatten" }
      layers { type: "linear" in_features: 64 out_features: 32 }
      layers { type: "relu" }
      layers { type: "linear" in_features: 32 out_features: 4 }
    }
  }
  loss: "cross_entropy"
  optimizer { kind: MOMENTUM lr: 0.1 momentum: 0.9 }
  batch_size: 16
  epochs: 2
  seed: 7
)pb";

// run_job on every rank (threads, flat communicators) with `device`; rank 0's result.
worker::JobResult run_job_on(const v1::JobSpec& spec, at::Device device, bool resume = false) {
  auto worlds = comm::testing::loopback_worlds(kRanks);
  std::vector<worker::JobResult> results(kRanks);
  std::string failures = comm::testing::failures(comm::testing::run_ranks(kRanks, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, comm::create_communicator("flat", worlds[rank]));
    worker::JobRunnerOptions options;
    options.out = nullptr;
    options.device = device;
    options.resume = resume;
    COHORT_ASSIGN_OR_RETURN(results[rank], worker::run_job(spec, *comm, options));
    return ok_status();
  }));
  EXPECT_EQ(failures, "");
  return results[0];
}

// The worker's training loop on CUDA (model, batches, evaluation, optimizer buckets and
// checkpoints on the GPU) reaches the CPU run's result, and resumes from its own checkpoint.
TEST(TorchCudaJobRunner, DataParallelTrainingMatchesTheCpuRunAndResumes) {
  SKIP_UNLESS_TORCH_CUDA();
  v1::JobSpec spec;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(kDataParallelSpec, &spec));
  worker::JobResult cpu = run_job_on(spec, at::Device(at::kCPU));
  const std::string dir = ::testing::TempDir() + "/torch_cuda_job_" + std::to_string(::getpid());
  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_interval_epochs(1);
  worker::JobResult gpu = run_job_on(spec, at::Device(at::kCUDA, 0));
  ASSERT_EQ(gpu.epochs.size(), cpu.epochs.size());
  EXPECT_NEAR(gpu.test_loss, cpu.test_loss, 1e-3);
  EXPECT_NEAR(gpu.test_accuracy, cpu.test_accuracy, 2.0 / 128);
  spec.set_epochs(3);
  worker::JobResult resumed = run_job_on(spec, at::Device(at::kCUDA, 0), /*resume=*/true);
  EXPECT_EQ(resumed.resumed_from.value_or(-1), 2 * gpu.steps_per_epoch);
  EXPECT_EQ(resumed.epochs.size(), 1u);
  EXPECT_GT(resumed.test_accuracy, 0.5);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cohort
