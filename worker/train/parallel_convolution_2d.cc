#include "worker/train/parallel_convolution_2d.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/autograd/collective_functions.h"
#include "worker/autograd/tensor_comm.h"

namespace cohort::train {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Identity forward; backward allreduces (sums) the gradient: the input is replicated on every
// rank and each rank's convolution sees only its filters, so the input gradient is the sum of
// the ranks' parts (Megatron's "copy to the model-parallel region").
struct CopyToRanks : public torch::autograd::Function<CopyToRanks> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Communicator* comm) {
    autograd::save_communicator(ctx, comm);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    comm::Communicator& comm = autograd::load_communicator(ctx);
    return {autograd::allreduce(comm, grads[0].contiguous(), comm::ReduceOp::kSum), at::Tensor()};
  }
};

// Identity forward; backward scales the gradient by 1 / size. The allgather's backward sums the
// ranks' gradients of this rank's share; with the replicated loss of the contract these are
// size equal copies, and the scale turns the sum back into one.
struct ScaleGradient : public torch::autograd::Function<ScaleGradient> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double scale) {
    ctx->saved_data["scale"] = scale;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0].mul(ctx->saved_data["scale"].toDouble()), at::Tensor()};
  }
};

}  // namespace

int64_t parallel_channel_count(int64_t channels, int rank, int size) {
  return channels / size + (rank < channels % size ? 1 : 0);
}

int64_t parallel_channel_offset(int64_t channels, int rank, int size) {
  return rank * (channels / size) + std::min<int64_t>(rank, channels % size);
}

std::vector<int64_t> parallel_input_channel_indices(int64_t channels, int rank, int size) {
  std::vector<int64_t> indices;
  for (int64_t c = rank; c < channels; c += size) indices.push_back(c);
  return indices;
}

ParallelConvolution2DImpl::ParallelConvolution2DImpl(comm::Communicator& comm,
                                                     const torch::nn::Conv2dOptions& options, ChannelSplit split)
    : comm_(comm),
      out_channels_(options.out_channels()),
      offset_(parallel_channel_offset(options.out_channels(), comm.rank(), comm.size())),
      count_(parallel_channel_count(options.out_channels(), comm.rank(), comm.size())),
      split_(split),
      in_channels_(options.in_channels()) {
  if (options.groups() != 1) {
    throw std::invalid_argument(
        fmt::format("ParallelConvolution2D: groups must be 1, got {}", options.groups()));
  }
  if (out_channels_ < comm.size()) {
    throw std::invalid_argument(
        fmt::format("ParallelConvolution2D: out_channels {} < {} ranks; every rank needs at least one filter",
                    out_channels_, comm.size()));
  }
  if (split_ == ChannelSplit::kInputAndOutput && in_channels_ < comm.size()) {
    throw std::invalid_argument(fmt::format(
        "ParallelConvolution2D: in_channels {} < {} ranks; splitting the input channels gives every rank at least "
        "one; use ChannelSplit::kOutput for a layer with fewer input channels than ranks",
        in_channels_, comm.size()));
  }
  if (split_ == ChannelSplit::kInputAndOutput) {
    in_indices_ = parallel_input_channel_indices(in_channels_, comm.rank(), comm.size());
  } else {
    in_indices_ = parallel_input_channel_indices(in_channels_, 0, 1);
  }
  torch::nn::Conv2dOptions local = options;
  local.out_channels(count_);
  local.in_channels(static_cast<int64_t>(in_indices_.size()));
  conv_ = register_module("conv", torch::nn::Conv2d(local));
}

at::Tensor ParallelConvolution2DImpl::forward(const at::Tensor& x) {
  const int size = comm_.size();
  if (x.dim() != 4 || x.size(1) != in_channels_) {
    throw std::invalid_argument(fmt::format("ParallelConvolution2D: input must be [N, {}, H, W], got [{}]",
                                            in_channels_, fmt::join(x.sizes(), ", ")));
  }
  at::Tensor input = x.requires_grad() ? CopyToRanks::apply(x, &comm_) : x;
  // This rank's input channels: a strided view (no copy); its backward scatters the gradient
  // into those channels and leaves the others zero, which the allreduce fills from their ranks.
  if (split_ == ChannelSplit::kInputAndOutput && size > 1) input = input.slice(1, comm_.rank(), in_channels_, size);
  at::Tensor share = conv_->forward(input);
  // allgather needs equal shapes: shares are padded to the largest count with zero channels.
  const int64_t max_count = parallel_channel_count(out_channels_, 0, size);
  if (count_ < max_count) share = at::constant_pad_nd(share, {0, 0, 0, 0, 0, max_count - count_});
  if (share.requires_grad()) share = ScaleGradient::apply(share, 1.0 / size);
  at::Tensor gathered = autograd::allgather_stacked(comm_, share);  // [size, N, max_count, H', W']
  std::vector<at::Tensor> shares;
  for (int r = 0; r < size; ++r)
    shares.push_back(gathered[r].narrow(1, 0, parallel_channel_count(out_channels_, r, size)));
  return at::cat(shares, 1);
}

}  // namespace cohort::train
