#include "worker/train/multi_node_batch_norm.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

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

// Reduced-precision input far from zero (300 + N(0, 1), [64, 4, 32, 32] per rank) on 2 ranks
// versus float at::batch_norm on the concatenated batch of the same (rounded) values. The
// statistics used to be computed in the input's dtype: in bf16 E[x²] - E[x]² of a 65536-sample
// channel cancelled to noise (outputs off by 3 to 5) and the output came back in float; in f16
// the squares overflow (on the CPU it threw first: libtorch 1.13 has no f16 rsqrt). The output
// is in the input's dtype, so compared within its rounding.
void check_reduced_precision_matches_float(at::ScalarType dtype) {
  SCOPED_TRACE(::testing::Message() << "dtype " << dtype);
  constexpr int kRanks = 2;
  at::Generator gen = at::detail::createCPUGenerator(5);
  Tensors xs;
  for (int r = 0; r < kRanks; ++r) xs.push_back(at::randn({64, 4, 32, 32}, gen).add(300).to(dtype));
  at::Tensor running_mean = at::zeros({4});
  at::Tensor running_var = at::ones({4});
  at::Tensor want = at::batch_norm(at::cat(xs).to(at::kFloat), {}, {}, running_mean, running_var,
                                   /*training=*/true, 0.1, 1e-5, false);
  Tensors want_ys = want.split(64);
  std::string failures = run_autograd_ranks(kRanks, [&](int rank, comm::Communicator& comm) {
    MultiNodeBatchNorm bn(comm, torch::nn::BatchNormOptions(4));
    at::Tensor y = bn->forward(xs[rank]);
    EXPECT_EQ(y.scalar_type(), dtype) << "rank " << rank;
    at::Tensor error = y.to(at::kFloat).sub(want_ys[rank]).abs().max();
    // bf16 keeps 8 significant bits (|y| < 8: within 2^-5 after rounding), f16 11.
    EXPECT_LT(error.item<float>(), dtype == at::kBFloat16 ? 0.04 : 0.01) << "rank " << rank;
    EXPECT_TRUE(at::allclose(bn->running_mean, running_mean, 1e-4, 1e-3)) << "rank " << rank;
    EXPECT_TRUE(at::allclose(bn->running_var, running_var, 1e-3, 1e-3)) << "rank " << rank;
  });
  ASSERT_EQ(failures, "");
}

TEST(MultiNodeBatchNormTest, BFloat16InputFarFromZeroMatchesFloat) {
  check_reduced_precision_matches_float(at::kBFloat16);
}

TEST(MultiNodeBatchNormTest, HalfInputFarFromZeroMatchesFloat) {
  check_reduced_precision_matches_float(at::kHalf);
}

// A Sequential with BatchNorm layers, seeded so every rank builds the same one.
torch::nn::Sequential small_bn_model() {
  at::manual_seed(11);
  torch::nn::Sequential model(torch::nn::Linear(4, kChannels), torch::nn::BatchNorm1d(kChannels),
                              torch::nn::ReLU(), torch::nn::Linear(kChannels, kChannels),
                              torch::nn::BatchNorm1d(kChannels));
  model->to(at::kDouble);
  return model;
}

TEST(CreateMnbnModelTest, ReplacesEveryBatchNormAndTrainsOnTheGlobalBatch) {
  constexpr int kRanks = 3;
  // The reference: the unchanged model on the concatenated batch (BatchNorm's global statistics).
  torch::nn::Sequential reference = small_bn_model();
  Tensors xs;
  for (int r = 0; r < kRanks; ++r) xs.push_back(batch_of(r, {4}));
  at::Tensor want = reference->forward(at::cat(xs));
  Tensors want_ys = want.split_with_sizes({1, 2, 3});
  // Built here, one after another: small_bn_model seeds the process-wide generator, which rank
  // threads building their own at once would draw from in turns (different weights per rank).
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < kRanks; ++r) models.push_back(small_bn_model());

  std::string failures = run_autograd_ranks(kRanks, [&](int rank, comm::Communicator& comm) {
    torch::nn::Sequential model = models[rank];
    torch::nn::Sequential mnbn = create_mnbn_model(model, comm);
    ASSERT_EQ(mnbn->size(), model->size());
    int replaced = 0;
    for (size_t i = 0; i < mnbn->size(); ++i) {
      if (std::dynamic_pointer_cast<MultiNodeBatchNormImpl>(mnbn->ptr(i)) != nullptr) ++replaced;
      EXPECT_EQ(dynamic_cast<torch::nn::BatchNorm1dImpl*>(mnbn->ptr(i).get()), nullptr) << "layer " << i;
    }
    EXPECT_EQ(replaced, 2);
    // The other layers are shared with the original model, not copied.
    EXPECT_EQ(mnbn->ptr(0).get(), model->ptr(0).get());
    at::Tensor y = mnbn->forward(batch_of(rank, {4}));
    EXPECT_TRUE(at::allclose(y, want_ys[rank].detach())) << "rank " << rank;
    // Running statistics are the global batch's, as the reference's BatchNorm has them.
    auto bn = std::dynamic_pointer_cast<MultiNodeBatchNormImpl>(mnbn->ptr(4));
    auto reference_bn = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(reference->ptr(4));
    ASSERT_TRUE(bn != nullptr && reference_bn != nullptr);
    EXPECT_TRUE(at::allclose(bn->running_mean, reference_bn->running_mean)) << "rank " << rank;
  });
  ASSERT_EQ(failures, "");
}

// A custom block whose child is a BatchNorm: it calls the child through its own member, so the
// layer cannot be swapped generically.
struct BlockImpl : torch::nn::Module {
  BlockImpl() : bn(register_module("bn", torch::nn::BatchNorm1d(kChannels))) {}
  at::Tensor forward(const at::Tensor& x) { return bn->forward(x); }
  torch::nn::BatchNorm1d bn;
};
TORCH_MODULE(Block);

TEST(CreateMnbnModelTest, RefusesABatchNormInsideACustomModuleNamingIt) {
  std::string failures = run_autograd_ranks(1, [&](int, comm::Communicator& comm) {
    torch::nn::Sequential model(torch::nn::Linear(4, kChannels), Block());
    try {
      create_mnbn_model(model, comm);
      ADD_FAILURE() << "expected std::invalid_argument";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'1.bn'"), std::string::npos) << e.what();
    }
  });
  ASSERT_EQ(failures, "");
}

}  // namespace
}  // namespace cohort::train
