// The multi-node optimizer's communication hooks with ranks as threads over the loopback
// transport: allreduce / fp16 / bf16 hooks average the gradients (with overlap during backward
// and without), and a custom hook's result is what the optimizer applies.

#include "worker/train/comm_hook.h"

#include <atomic>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "worker/autograd/testing/autograd_ranks.h"
#include "worker/train/multi_node_optimizer.h"

namespace cohort::train {
namespace {

using autograd::testing::run_autograd_ranks;

// Two parameters in two buckets (first_bucket_bytes = 1 closes the first at once); rank r's
// loss is sum(p * (r + 1) * w) with w = [1, 2, ...], so dL/dp = (r + 1) * w and the average over
// n ranks is (n + 1) / 2 * w. One SGD step with lr 1 from p = 0 gives -(n + 1) / 2 * w.
void check_hook(const CommHook& hook, bool overlap, double tolerance) {
  for (int size : {1, 2, 3}) {
    EXPECT_EQ(run_autograd_ranks(size,
                                 [&](int rank, comm::Communicator& comm) {
                                   at::Tensor a = at::zeros({3}).set_requires_grad(true);
                                   at::Tensor b = at::zeros({2, 2}).set_requires_grad(true);
                                   torch::optim::SGD sgd({a, b}, torch::optim::SGDOptions(1.0));
                                   MultiNodeOptimizerOptions options;
                                   options.first_bucket_bytes = 1;
                                   options.bucket_bytes = 1;
                                   options.overlap = overlap;
                                   options.comm_hook = hook;
                                   MultiNodeOptimizer optimizer(sgd, comm, options);
                                   if (optimizer.bucket_sizes().size() != 2)
                                     throw std::runtime_error("not 2 buckets");
                                   optimizer.zero_grad();
                                   at::Tensor wa = at::arange(1, 4, at::kFloat),
                                              wb = at::arange(1, 5, at::kFloat);
                                   ((a * wa).sum() + (b.reshape({4}) * wb).sum()).mul(rank + 1).backward();
                                   optimizer.step();
                                   const double mean = (size + 1) / 2.0;
                                   if (!at::allclose(a, wa * -mean, 0, tolerance) ||
                                       !at::allclose(b.reshape({4}), wb * -mean, 0, tolerance)) {
                                     std::ostringstream out;
                                     out << "rank " << rank << " of " << size << ": a " << a << " b " << b;
                                     throw std::runtime_error(out.str());
                                   }
                                 }),
              "")
        << "size " << size << " overlap " << overlap;
  }
}

TEST(CommHookTest, AllreduceHookAverages) {
  check_hook(allreduce_hook, true, 1e-6);
  check_hook(allreduce_hook, false, 1e-6);
}

TEST(CommHookTest, Fp16CompressHookAveragesWithinHalfPrecision) {
  check_hook(fp16_compress_hook, true, 1e-2);
  check_hook(fp16_compress_hook, false, 1e-2);
}

TEST(CommHookTest, Bf16CompressHookAveragesWithinBFloat16Precision) {
  check_hook(bf16_compress_hook, true, 5e-2);
}

TEST(CommHookTest, TheOptimizerAppliesTheHooksResultBucketByBucket) {
  EXPECT_EQ(
      run_autograd_ranks(2,
                         [](int rank, comm::Communicator& comm) {
                           at::Tensor a = at::zeros({3}).set_requires_grad(true);
                           at::Tensor b = at::zeros({2}).set_requires_grad(true);
                           torch::optim::SGD sgd({a, b}, torch::optim::SGDOptions(1.0));
                           std::vector<size_t> seen;
                           std::vector<bool> last;
                           MultiNodeOptimizerOptions options;
                           options.first_bucket_bytes = 1;
                           options.bucket_bytes = 1;
                           options.overlap = false;
                           // No communication: every bucket "averages" to its index + 1.
                           options.comm_hook = [&](comm::Communicator&, const GradBucket& bucket) {
                             seen.push_back(bucket.index);
                             last.push_back(bucket.is_last);
                             at::Tensor result = at::full({bucket.buffer.numel()}, bucket.index + 1.0);
                             return BucketFuture{distributed::finished_work("custom"), result};
                           };
                           MultiNodeOptimizer optimizer(sgd, comm, options);
                           a.mutable_grad() = at::ones({3});
                           b.mutable_grad() = at::ones({2});
                           optimizer.step();
                           // Buckets are laid out in reverse parameter order: b is bucket 0.
                           if (seen != std::vector<size_t>{0, 1} || last != std::vector<bool>{false, true}) {
                             throw std::runtime_error("the hook did not see buckets 0 then 1 (last)");
                           }
                           if (!at::equal(b, at::full({2}, -1.0)) || !at::equal(a, at::full({3}, -2.0))) {
                             std::ostringstream out;
                             out << "a " << a << " b " << b;
                             throw std::runtime_error(out.str());
                           }
                         }),
      "");
}

// The compression hooks really send the bucket in 16 bits (an allreduce in Float would also pass the
// averaging tests above, whose values are exact in Half): with 2 ranks each holding g, the average
// is g for the allreduce hook; 1 + 2^-9 survives Half (10 mantissa bits) but not BFloat16 (7), and
// 1 + 2^-13 survives neither, so those hooks return 1.0 there. The result keeps the bucket's dtype.
TEST(CommHookTest, CompressionHooksRoundTheBucketToTheirPrecision) {
  const double fine = 1.0 + std::ldexp(1.0, -9), finer = 1.0 + std::ldexp(1.0, -13);
  struct Case {
    const char* name;
    CommHook hook;
    double value;
    double expected;
  };
  const std::vector<Case> cases = {
      {"allreduce", allreduce_hook, finer, finer},
      {"fp16", fp16_compress_hook, fine, fine},
      {"fp16", fp16_compress_hook, finer, 1.0},
      {"bf16", bf16_compress_hook, fine, 1.0},
      {"bf16", bf16_compress_hook, 1.0 + std::ldexp(1.0, -6), 1.0 + std::ldexp(1.0, -6)},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(run_autograd_ranks(2,
                                 [&](int, comm::Communicator& comm) {
                                   GradBucket bucket;
                                   bucket.buffer = at::full({5}, c.value, at::kFloat);
                                   bucket.is_last = true;
                                   BucketFuture future = c.hook(comm, bucket);
                                   future.work->wait();
                                   if (future.result.scalar_type() != at::kFloat ||
                                       !at::equal(future.result, at::full({5}, c.expected, at::kFloat))) {
                                     std::ostringstream out;
                                     out.precision(10);
                                     out << c.name << " of " << c.value << ": expected " << c.expected
                                         << " (Float), got " << future.result;
                                     throw std::runtime_error(out.str());
                                   }
                                 }),
              "")
        << c.name << " " << c.value;
  }
}

}  // namespace
}  // namespace cohort::train
