// CUDA tensors through worker/distributed (the torch.distributed-style API): two ranks as threads
// over the loopback transport with "flat" communicators (device buffers staged through pinned
// host memory, so the ranks may share a GPU), each result compared with the CPU computation.
// Needs a CUDA libtorch; elsewhere every case reports SKIPPED.
//
//   bazel test --repo_env=COHORT_LIBTORCH=/opt/libtorch-cu128 --config=cuda //tests/gpu:distributed_cuda_test

#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "worker/autograd/testing/autograd_ranks.h"
#include "worker/distributed/process_group.h"
#include "worker/distributed/testing/expect_tensor.h"

namespace cohort::distributed {
namespace {

using autograd::testing::run_autograd_ranks;
using testing::expect_equal;

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

const at::Device kGpu(at::kCUDA, 0);

TEST(DistributedCudaTest, CollectivesOnNonContiguousCudaTensors) {
  SKIP_UNLESS_TORCH_CUDA();
  EXPECT_EQ(
      run_autograd_ranks(
          2,
          [](int rank, comm::Communicator& comm) {
            at::Tensor t = at::arange(6, at::kFloat).add(rank).reshape({2, 3}).to(kGpu).t();
            all_reduce(comm, t);
            expect_equal(t.cpu(), at::arange(6, at::kFloat).mul(2).add(1).reshape({2, 3}).t(), "all_reduce");
            std::vector<at::Tensor> list = {at::zeros({1}, kGpu), at::zeros({2}, kGpu)};
            auto work = all_gather(comm, list, at::full({rank + 1}, rank + 1.0, kGpu),
                                   {.async_op = true, .timeout = {}});
            work->wait();
            expect_equal(list[1].cpu(), at::full({2}, 2.0), "all_gather");
            at::Tensor b = rank == 0 ? at::full({4}, 7.0, kGpu) : at::zeros({4}, kGpu);
            broadcast(comm, b, 0);
            expect_equal(b.cpu(), at::full({4}, 7.0), "broadcast");
          }),
      "");
}

TEST(DistributedCudaTest, SendToARecvThatLearnsTheShapeOnTheGpu) {
  SKIP_UNLESS_TORCH_CUDA();
  EXPECT_EQ(run_autograd_ranks(2,
                               [](int rank, comm::Communicator& comm) {
                                 at::Tensor sent = at::arange(12, at::kDouble).reshape({3, 4});
                                 if (rank == 0) {
                                   send(comm, sent.to(kGpu).t(), 1);
                                 } else {
                                   at::Tensor got = recv(comm, 0, 0, kGpu);
                                   if (!got.is_cuda()) throw std::runtime_error("received on the CPU");
                                   expect_equal(got.cpu(), sent.t(), "recv");
                                 }
                               }),
            "");
}

}  // namespace
}  // namespace cohort::distributed
