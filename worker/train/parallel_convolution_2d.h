#pragma once

// Model parallelism inside one layer (ChainerMN's ParallelConvolution2D, from its "channel-wise
// parallel convolution" example). Two splits (ChannelSplit):
//
// kInputAndOutput (the default, as ChainerMN's example): rank r of `size` takes the input
// channels r, r + size, r + 2·size, ... (ChainerMN's _channel_indices) and a contiguous share of
// the output channels (out_channels / size, the first out_channels % size ranks one more). It
// convolves its input channels with its filters, and the shares are allgathered and concatenated
// along the channel axis, so every rank gets the full output. The layer is therefore a Conv2d
// whose filters are zero outside each rank's (output share × input channels) block: each
// filter sees 1/size of the input channels, for 1/size² of the full layer's weights and work.
//
// kOutput: every rank convolves all input channels with its share of the output channels; the
// layer equals one full Conv2d.
//
//   ParallelConvolution2D conv(*comm, torch::nn::Conv2dOptions(64, 128, 3).padding(1));
//   at::Tensor y = conv->forward(x);        // same x on every rank → same y, [N, 128, H, W]
//   loss_of(y).backward();                  // collective: every rank runs it
//
// Gradients assume the model-parallel contract: every rank feeds the same input and computes the
// same loss from the (identical) output. Then each rank's filter gradients equal the matching
// block of the equivalent Conv2d's, and the input gradient equals its input gradient (the
// per-rank input gradients, each covering this rank's input channels, are allreduced in
// backward). Backward is collective; it goes through worker/autograd's allgather, so the
// communicator must outlive the graphs.

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include "worker/comm/communicator.h"

namespace cohort::train {

// The output channels rank `rank` of `size` holds, and the first of them in the full layer.
// parallel_channel_count is also the number of input channels the rank takes under
// kInputAndOutput (ChainerMN's _channel_size).
int64_t parallel_channel_count(int64_t channels, int rank, int size);
int64_t parallel_channel_offset(int64_t channels, int rank, int size);

// The input channels rank `rank` of `size` takes under kInputAndOutput: rank, rank + size, ...
// below `channels` (ChainerMN's _channel_indices).
std::vector<int64_t> parallel_input_channel_indices(int64_t channels, int rank, int size);

// Which channels ParallelConvolution2D splits over the ranks (see the top of this file).
enum class ChannelSplit {
  kInputAndOutput,  // ChainerMN's example: strided input channels and a share of the outputs
  kOutput,          // output channels only; each rank sees every input channel
};

class ParallelConvolution2DImpl : public torch::nn::Module {
 public:
  // `options` describe the full layer; this rank's Conv2d gets its share of out_channels (and,
  // under kInputAndOutput, of in_channels), with libtorch's default initialization. Throws
  // std::invalid_argument for groups != 1, out_channels < comm.size(), or (kInputAndOutput)
  // in_channels < comm.size(). `comm` must outlive this module. Local.
  ParallelConvolution2DImpl(comm::Communicator& comm, const torch::nn::Conv2dOptions& options,
                            ChannelSplit split = ChannelSplit::kInputAndOutput);

  // x: [N, in_channels, H, W], identical on every rank. Returns [N, out_channels, H', W'].
  // Collective and blocking (one allgather forward; an allgather's backward and an allreduce of
  // the input gradient in backward); throws std::runtime_error on a communication failure.
  at::Tensor forward(const at::Tensor& x);

  // This rank's filters: weight() is [count, in, kH, kW], rows [offset, offset + count) of the
  // full layer and its columns input_channel_indices() (all of them under kOutput); bias() is
  // undefined without bias.
  at::Tensor& weight() { return conv_->weight; }
  at::Tensor& bias() { return conv_->bias; }
  int64_t channel_offset() const { return offset_; }
  int64_t channel_count() const { return count_; }
  const std::vector<int64_t>& input_channel_indices() const { return in_indices_; }
  ChannelSplit split() const { return split_; }

 private:
  comm::Communicator& comm_;
  int64_t out_channels_;
  int64_t offset_;
  int64_t count_;
  ChannelSplit split_;
  int64_t in_channels_;
  std::vector<int64_t> in_indices_;  // this rank's input channels, ascending
  torch::nn::Conv2d conv_{nullptr};
};

TORCH_MODULE(ParallelConvolution2D);

}  // namespace cohort::train
