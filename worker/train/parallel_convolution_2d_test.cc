#include "worker/train/parallel_convolution_2d.h"

#include <string>
#include <vector>

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

TEST(ParallelChannelsTest, InputChannelsAreStridedByRankAsChainerMNsChannelIndices) {
  // 7 input channels over 3 ranks: {0, 3, 6}, {1, 4}, {2, 5}; counts match parallel_channel_count.
  EXPECT_EQ(parallel_input_channel_indices(7, 0, 3), (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(parallel_input_channel_indices(7, 1, 3), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(parallel_input_channel_indices(7, 2, 3), (std::vector<int64_t>{2, 5}));
  for (int size = 1; size <= 5; ++size) {
    for (int rank = 0; rank < size; ++rank) {
      EXPECT_EQ(static_cast<int64_t>(parallel_input_channel_indices(11, rank, size).size()),
                parallel_channel_count(11, rank, size));
    }
  }
}

// The Conv2d equal to ParallelConvolution2D on `size` ranks: under kInputAndOutput the filters
// of rank r's output share see only its input channels r, r + size, ..., so every other weight
// is zero; under kOutput every weight is used.
at::Tensor equivalent_weight_mask(const torch::nn::Conv2dOptions& options, int size, ChannelSplit split) {
  const int64_t out = options.out_channels(), in = options.in_channels();
  at::Tensor mask = at::zeros({out, in, 1, 1}, at::kDouble);
  for (int r = 0; r < size; ++r) {
    const int64_t offset = parallel_channel_offset(out, r, size), count = parallel_channel_count(out, r, size);
    for (int64_t c : split == ChannelSplit::kOutput ? parallel_input_channel_indices(in, 0, 1)
                                                    : parallel_input_channel_indices(in, r, size)) {
      mask.narrow(0, offset, count).narrow(1, c, 1).fill_(1.0);
    }
  }
  return mask;
}

// This rank's block of a full [out, in, kH, kW] tensor: its output rows, its input columns.
at::Tensor block_of(const at::Tensor& full, int64_t offset, int64_t count, const std::vector<int64_t>& columns) {
  return full.narrow(0, offset, count).index_select(1, at::tensor(columns, at::kLong));
}

// Compares ParallelConvolution2D on `size` ranks with one Conv2d holding the same filters (zero
// outside the ranks' blocks): the output, the input gradient and every rank's filter gradients
// (loss = sum(y * upstream), the same on every rank).
void check_matches_conv2d(int size, const torch::nn::Conv2dOptions& options, ChannelSplit split) {
  SCOPED_TRACE(::testing::Message() << "size " << size << ", in_channels " << options.in_channels()
                                    << ", out_channels " << options.out_channels() << ", split "
                                    << (split == ChannelSplit::kOutput ? "output" : "input and output"));
  torch::nn::Conv2d full(options);
  full->to(at::kDouble);
  {
    torch::NoGradGuard no_grad;
    full->weight.copy_(at::arange(full->weight.numel(), at::kDouble)
                           .mul(0.31)
                           .sin()
                           .reshape(full->weight.sizes())
                           .mul(equivalent_weight_mask(options, size, split)));
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
    ParallelConvolution2D conv(comm, options, split);
    conv->to(at::kDouble);
    const int64_t offset = conv->channel_offset();
    const int64_t count = conv->channel_count();
    const std::vector<int64_t>& columns = conv->input_channel_indices();
    ASSERT_EQ(conv->weight().size(1), static_cast<int64_t>(columns.size()));
    {
      torch::NoGradGuard no_grad;
      conv->weight().copy_(block_of(full->weight, offset, count, columns));
      if (options.bias()) conv->bias().copy_(full->bias.narrow(0, offset, count));
    }
    at::Tensor xr = x_value.clone().set_requires_grad(true);
    at::Tensor y = conv->forward(xr);
    ASSERT_EQ(y.sizes(), want.sizes());
    EXPECT_TRUE(at::allclose(y, want.detach())) << "rank " << rank << " output";
    y.mul(upstream).sum().backward();
    EXPECT_TRUE(at::allclose(xr.grad(), x.grad())) << "rank " << rank << " input grad";
    EXPECT_TRUE(at::allclose(conv->weight().grad(), block_of(full->weight.grad(), offset, count, columns)))
        << "rank " << rank << " weight grad";
    if (options.bias()) {
      EXPECT_TRUE(at::allclose(conv->bias().grad(), full->bias.grad().narrow(0, offset, count)))
          << "rank " << rank << " bias grad";
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(ParallelConvolution2DTest, SplitsInputAndOutputChannelsLikeChainerMNForOneToFourRanks) {
  for (int size = 1; size <= 4; ++size) {
    // 7 → 5: neither count divides evenly by 2, 3 or 4; 4 → 8 divides by 1, 2 and 4.
    check_matches_conv2d(size, torch::nn::Conv2dOptions(7, 5, 3).padding(1), ChannelSplit::kInputAndOutput);
    check_matches_conv2d(size, torch::nn::Conv2dOptions(4, 8, 3).padding(1), ChannelSplit::kInputAndOutput);
  }
}

TEST(ParallelConvolution2DTest, InputAndOutputSplitIsTheDefault) {
  std::string failures = run_autograd_ranks(2, [&](int, comm::Communicator& comm) {
    ParallelConvolution2D conv(comm, torch::nn::Conv2dOptions(5, 4, 3));
    EXPECT_EQ(conv->split(), ChannelSplit::kInputAndOutput);
    EXPECT_EQ(conv->weight().size(1), static_cast<int64_t>(conv->input_channel_indices().size()));
  });
  EXPECT_EQ(failures, "");
}

TEST(ParallelConvolution2DTest, InputAndOutputSplitMatchesStridedConv2dWithoutBias) {
  for (int size : {2, 3}) {
    check_matches_conv2d(size, torch::nn::Conv2dOptions(5, 4, {3, 2}).stride(2).bias(false),
                         ChannelSplit::kInputAndOutput);
  }
}

TEST(ParallelConvolution2DTest, OutputSplitMatchesConv2dForOneToFourRanks) {
  for (int size = 1; size <= 4; ++size) {
    check_matches_conv2d(size, torch::nn::Conv2dOptions(3, 7, 3).padding(1), ChannelSplit::kOutput);
  }
}

TEST(ParallelConvolution2DTest, OutputSplitMatchesStridedConv2dWithoutBias) {
  for (int size : {2, 4}) {
    check_matches_conv2d(size, torch::nn::Conv2dOptions(2, 4, {3, 2}).stride(2).bias(false), ChannelSplit::kOutput);
  }
}

TEST(ParallelConvolution2DTest, InputAndOutputSplitRejectsFewerInputChannelsThanRanks) {
  std::string failures = run_autograd_ranks(3, [&](int, comm::Communicator& comm) {
    EXPECT_THROW(ParallelConvolution2D(comm, torch::nn::Conv2dOptions(2, 6, 3)), std::invalid_argument);
    EXPECT_NO_THROW(ParallelConvolution2D(comm, torch::nn::Conv2dOptions(2, 6, 3), ChannelSplit::kOutput));
  });
  EXPECT_EQ(failures, "");
}

TEST(ParallelConvolution2DTest, RejectsFewerOutputChannelsThanRanks) {
  std::string failures = run_autograd_ranks(3, [&](int, comm::Communicator& comm) {
    EXPECT_THROW(ParallelConvolution2D(comm, torch::nn::Conv2dOptions(4, 2, 3), ChannelSplit::kOutput),
                 std::invalid_argument);
    EXPECT_THROW(ParallelConvolution2D(comm, torch::nn::Conv2dOptions(4, 2, 3)), std::invalid_argument);
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace cohort::train
