#include "worker/train/parallel_convolution_2d.h"

#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/conv.h>

#include "worker/autograd/testing/autograd_ranks.h"

namespace cohort::train {
namespace {

using autograd::testing::run_autograd_ranks;

TEST(ParallelChannelsTest, SpreadsTheRemainderOverTheFirstRanks) {
  // 7 channels over 3 ranks: 3, 2, 2 starting at 0, 3, 5.
  EXPECT_EQ(parallel_channel_count(7, 0, 3), 3);
  EXPECT_EQ(parallel_channel_count(7, 1, 3), 2);
  EXPECT_EQ(parallel_channel_count(7, 2, 3), 2);
  EXPECT_EQ(parallel_channel_offset(7, 0, 3), 0);
  EXPECT_EQ(parallel_channel_offset(7, 1, 3), 3);
  EXPECT_EQ(parallel_channel_offset(7, 2, 3), 5);
}

// Compares ParallelConvolution2D on `size` ranks with one Conv2d holding the same filters: the
// output, the input gradient and every rank's filter gradients (loss = sum(y * upstream), the
// same on every rank).
void check_matches_conv2d(int size, const torch::nn::Conv2dOptions& options) {
  SCOPED_TRACE(::testing::Message() << "size " << size << ", out_channels " << options.out_channels());
  torch::nn::Conv2d full(options);
  full->to(at::kDouble);
  {
    torch::NoGradGuard no_grad;
    full->weight.copy_(
        at::arange(full->weight.numel(), at::kDouble).mul(0.31).sin().reshape(full->weight.sizes()));
    if (options.bias()) full->bias.copy_(at::arange(options.out_channels(), at::kDouble).mul(0.7).cos());
  }
  at::Tensor x_value = at::arange(2 * options.in_channels() * 6 * 5, at::kDouble)
                           .mul(0.13)
                           .cos()
                           .reshape({2, options.in_channels(), 6, 5});
  at::Tensor x = x_value.clone().set_requires_grad(true);
  at::Tensor want = full->forward(x);
  at::Tensor upstream = at::arange(want.numel(), at::kDouble).mul(0.47).sin().add(0.2).reshape(want.sizes());
  want.mul(upstream).sum().backward();

  std::string failures = run_autograd_ranks(size, [&](int rank, comm::Communicator& comm) {
    ParallelConvolution2D conv(comm, options);
    conv->to(at::kDouble);
    const int64_t offset = conv->channel_offset();
    const int64_t count = conv->channel_count();
    {
      torch::NoGradGuard no_grad;
      conv->weight().copy_(full->weight.narrow(0, offset, count));
      if (options.bias()) conv->bias().copy_(full->bias.narrow(0, offset, count));
    }
    at::Tensor xr = x_value.clone().set_requires_grad(true);
    at::Tensor y = conv->forward(xr);
    ASSERT_EQ(y.sizes(), want.sizes());
    EXPECT_TRUE(at::allclose(y, want.detach())) << "rank " << rank << " output";
    y.mul(upstream).sum().backward();
    EXPECT_TRUE(at::allclose(xr.grad(), x.grad())) << "rank " << rank << " input grad";
    EXPECT_TRUE(at::allclose(conv->weight().grad(), full->weight.grad().narrow(0, offset, count)))
        << "rank " << rank << " weight grad";
    if (options.bias()) {
      EXPECT_TRUE(at::allclose(conv->bias().grad(), full->bias.grad().narrow(0, offset, count)))
          << "rank " << rank << " bias grad";
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(ParallelConvolution2DTest, MatchesConv2dForOneToFourRanks) {
  for (int size = 1; size <= 4; ++size) {
    check_matches_conv2d(size, torch::nn::Conv2dOptions(3, 7, 3).padding(1));
  }
}

TEST(ParallelConvolution2DTest, MatchesStridedConv2dWithoutBias) {
  for (int size : {2, 4}) {
    check_matches_conv2d(size, torch::nn::Conv2dOptions(2, 4, {3, 2}).stride(2).bias(false));
  }
}

TEST(ParallelConvolution2DTest, RejectsFewerChannelsThanRanks) {
  std::string failures = run_autograd_ranks(3, [&](int, comm::Communicator& comm) {
    EXPECT_THROW(ParallelConvolution2D(comm, torch::nn::Conv2dOptions(2, 2, 3)), std::invalid_argument);
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace cohort::train
