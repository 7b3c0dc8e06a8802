#include "worker/train/multi_node_batch_norm.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "worker/autograd/testing/autograd_ranks.h"

namespace cohort::train {
namespace {

using autograd::testing::run_autograd_ranks;
using Tensors = std::vector<at::Tensor>;

constexpr int64_t kChannels = 3;

// Rank r's batch: 1 + r samples of `sample_shape` (different sizes per rank), distinct values.
at::Tensor batch_of(int rank, const std::vector<int64_t>& sample_shape) {
  std::vector<int64_t> shape{1 + rank};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  return at::arange(numel, at::kDouble).mul(0.29 * (rank + 1)).sin().mul(1.5).add(0.3 * rank).reshape(shape);
}

at::Tensor upstream_of(const at::Tensor& y, int rank) {
  return at::arange(y.numel(), at::kDouble).mul(0.53 + 0.1 * rank).cos().reshape(y.sizes());
}

// MultiNodeBatchNorm over `size` ranks versus at::batch_norm on the concatenated batch: output,
// input gradients, summed weight / bias gradients, running statistics, and eval-mode output.
void check_matches_global_batch_norm(int size, const std::vector<int64_t>& sample_shape) {
  SCOPED_TRACE(::testing::Message() << "size " << size << ", sample dims " << sample_shape.size());
  Tensors xs;
  Tensors ups;
  for (int r = 0; r < size; ++r) xs.push_back(batch_of(r, sample_shape).set_requires_grad(true));
  at::Tensor weight = at::arange(kChannels, at::kDouble).add(0.5).set_requires_grad(true);
  at::Tensor bias = at::arange(kChannels, at::kDouble).mul(-0.2).set_requires_grad(true);
  at::Tensor running_mean = at::zeros({kChannels}, at::kDouble);
  at::Tensor running_var = at::ones({kChannels}, at::kDouble);
  at::Tensor y = at::batch_norm(at::cat(xs), weight, bias, running_mean, running_var, /*training=*/true, 0.1,
                                1e-5, false);
  Tensors want_ys = y.split_with_sizes([&] {
    std::vector<int64_t> sizes;
    for (const at::Tensor& x : xs) sizes.push_back(x.size(0));
    return sizes;
  }());
  at::Tensor loss = at::zeros({}, at::kDouble);
  for (int r = 0; r < size; ++r) {
    ups.push_back(upstream_of(want_ys[r], r));
    loss = loss + want_ys[r].mul(ups[r]).sum();
  }
  loss.backward();
  at::Tensor x_probe = batch_of(0, sample_shape);
  at::Tensor want_eval = at::batch_norm(x_probe, weight.detach(), bias.detach(), running_mean, running_var,
                                        /*training=*/false, 0.1, 1e-5, false);

  Tensors weight_grads(size);
  Tensors bias_grads(size);
  std::string failures = run_autograd_ranks(size, [&](int rank, comm::Communicator& comm) {
    MultiNodeBatchNorm bn(comm, torch::nn::BatchNormOptions(kChannels));
    bn->to(at::kDouble);
    {
      torch::NoGradGuard no_grad;
      bn->weight.copy_(weight);
      bn->bias.copy_(bias);
    }
    at::Tensor x = batch_of(rank, sample_shape).set_requires_grad(true);
    at::Tensor y = bn->forward(x);
    EXPECT_TRUE(at::allclose(y, want_ys[rank].detach())) << "rank " << rank << " output";
    y.mul(ups[rank]).sum().backward();
    EXPECT_TRUE(at::allclose(x.grad(), xs[rank].grad())) << "rank " << rank << " input grad";
    EXPECT_TRUE(at::allclose(bn->running_mean, running_mean)) << "rank " << rank << " running_mean";
    EXPECT_TRUE(at::allclose(bn->running_var, running_var)) << "rank " << rank << " running_var";
    EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 1);
    weight_grads[rank] = bn->weight.grad().clone();
    bias_grads[rank] = bn->bias.grad().clone();
    bn->eval();
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(at::allclose(bn->forward(x_probe), want_eval)) << "rank " << rank << " eval output";
  });
  ASSERT_EQ(failures, "");
  EXPECT_TRUE(at::allclose(at::stack(weight_grads).sum(0), weight.grad()));
  EXPECT_TRUE(at::allclose(at::stack(bias_grads).sum(0), bias.grad()));
}

TEST(MultiNodeBatchNormTest, MatchesBatchNorm2dOnTheGlobalBatch) {
  for (int size = 2; size <= 4; ++size) check_matches_global_batch_norm(size, {kChannels, 4, 3});
}

TEST(MultiNodeBatchNormTest, MatchesBatchNorm1dOnTheGlobalBatch) {
  for (int size = 2; size <= 4; ++size) check_matches_global_batch_norm(size, {kChannels});
}

TEST(MultiNodeBatchNormTest, OneRankIsPlainBatchNorm) {
  check_matches_global_batch_norm(1, {kChannels, 2, 2});
}

}  // namespace
}  // namespace cohort::train
