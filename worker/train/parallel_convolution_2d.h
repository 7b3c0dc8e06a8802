#pragma once

// Model parallelism inside one layer (ChainerMN's ParallelConvolution2D): a drop-in for
// torch::nn::Conv2d whose output channels are split over the ranks of a communicator. Each rank
// holds out_channels / size filters (the first out_channels % size ranks one more), convolves the
// full input with them, and the shares are allgathered and concatenated along the channel axis,
// so every rank gets the full output.
//
//   ParallelConvolution2D conv(*comm, torch::nn::Conv2dOptions(3, 64, 3).padding(1));
//   at::Tensor y = conv->forward(x);        // same x on every rank → same y, [N, 64, H, W]
//   loss_of(y).backward();                  // collective: every rank runs it
//
// Gradients assume the model-parallel contract: every rank feeds the same input and computes the
// same loss from the (identical) output. Then each rank's filter gradients equal the matching
// rows of Conv2d's, and the input gradient equals Conv2d's input gradient (the per-rank input
// gradients are allreduced in backward). Backward is collective; it goes through worker/autograd's
// allgather, so the communicator must outlive the graphs.

#include <cstdint>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include "worker/comm/communicator.h"

namespace cohort::train {

// The output channels rank `rank` of `size` holds, and the first of them in the full layer.
int64_t parallel_channel_count(int64_t channels, int rank, int size);
int64_t parallel_channel_offset(int64_t channels, int rank, int size);

class ParallelConvolution2DImpl : public torch::nn::Module {
 public:
  // `options` describe the full layer; this rank's Conv2d gets its share of out_channels (and
  // libtorch's default initialization). Throws for groups != 1 or out_channels < comm.size().
  // `comm` must outlive this module. Local.
  ParallelConvolution2DImpl(comm::Communicator& comm, const torch::nn::Conv2dOptions& options);

  // x: [N, in_channels, H, W], identical on every rank. Returns [N, out_channels, H', W'].
  // Collective and blocking (one allgather forward; an allgather's backward and an allreduce of
  // the input gradient in backward); throws std::runtime_error on a communication failure.
  at::Tensor forward(const at::Tensor& x);

  // This rank's filters: weight() is [count, in_channels, kH, kW], rows
  // [offset, offset + count) of the full layer; bias() is undefined without bias.
  at::Tensor& weight() { return conv_->weight; }
  at::Tensor& bias() { return conv_->bias; }
  int64_t channel_offset() const { return offset_; }
  int64_t channel_count() const { return count_; }

 private:
  comm::Communicator& comm_;
  int64_t out_channels_;
  int64_t offset_;
  int64_t count_;
  torch::nn::Conv2d conv_{nullptr};
};

TORCH_MODULE(ParallelConvolution2D);

}  // namespace cohort::train
