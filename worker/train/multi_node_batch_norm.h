#pragma once

// Batch normalization over the global batch (ChainerMN's MultiNodeBatchNormalization): a drop-in
// for torch::nn::BatchNorm1d / BatchNorm2d / BatchNorm3d in data-parallel training whose batch
// statistics are those of the union of every rank's batch. Each rank computes, per channel, the
// sum and the sum of squares of its batch; one differentiable allreduce (worker/autograd) adds
// them up, and the sample count is allreduced alongside. The output, the input gradients (of the
// sum of the ranks' losses) and the running statistics equal BatchNorm's on the concatenated
// batch; the weight / bias gradients are this rank's part (the multi-node optimizer's gradient
// allreduce completes them, as for any parameter).
//
//   MultiNodeBatchNorm bn(*comm, torch::nn::BatchNormOptions(64));
//   at::Tensor y = bn->forward(x);            // x: this rank's [N_r, 64, H, W]; collective
//
// Parameters and buffers carry torch::nn::BatchNorm's names (weight, bias, running_mean,
// running_var, num_batches_tracked), so state dicts load into either.
//
// The variance is E[x^2] - E[x]^2 (one allreduce instead of two, as ChainerMN): less accurate
// than a two-pass variance in float when |mean| >> std. f16 and bf16 inputs are normalized in
// float with statistics summed (and allreduced) in double; the output is in the input's dtype.
//
// create_mnbn_model (ChainerMN's) turns the BatchNorm layers of an existing Sequential model into
// MultiNodeBatchNorm. Only Sequential models can be rewritten generically: other libtorch modules
// call their children through typed member holders, which Module::replace_module does not update,
// so a BatchNorm inside such a module is refused with its path (build that module with
// MultiNodeBatchNorm instead).
//
//   torch::nn::Sequential model(torch::nn::Conv2d(...), torch::nn::BatchNorm2d(32), ...);
//   torch::nn::Sequential mnbn = create_mnbn_model(model, *comm);   // train `mnbn`

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include "worker/comm/communicator.h"

namespace cohort::train {

class MultiNodeBatchNormImpl : public torch::nn::Module {
 public:
  // `comm` must outlive this module and the graphs built over it. Local.
  MultiNodeBatchNormImpl(comm::Communicator& comm, const torch::nn::BatchNormOptions& options);

  // x: [N, C, *] with C = num_features (N may differ per rank, and be 0 on some). In training
  // mode (or without running statistics) normalizes with the global batch statistics and updates
  // the running ones (momentum, or a cumulative average when momentum is unset; unbiased running
  // variance); collective and blocking, every rank must call it, and backward is collective too.
  // In eval mode normalizes with the running statistics, locally. Throws std::runtime_error on a
  // communication failure, std::invalid_argument on a bad shape or an empty global batch.
  at::Tensor forward(const at::Tensor& x);

  const torch::nn::BatchNormOptions& options() const { return options_; }

  at::Tensor weight;
  at::Tensor bias;
  at::Tensor running_mean;
  at::Tensor running_var;
  at::Tensor num_batches_tracked;

 private:
  at::Tensor normalize_with_batch_statistics(const at::Tensor& x);

  comm::Communicator& comm_;
  torch::nn::BatchNormOptions options_;
};

TORCH_MODULE(MultiNodeBatchNorm);

// A new Sequential with `model`'s layers in order, where every torch::nn::BatchNorm1d/2d/3d layer
// becomes a MultiNodeBatchNorm with the same options, its parameters
// and running statistics copied (dtype and device kept) and its training mode kept. Every other
// layer is shared with `model`, not copied. `comm` must outlive the returned model. Throws
// std::invalid_argument naming the layer and the BatchNorm's path when a BatchNorm sits inside
// another module (a custom block), which cannot be rewritten. Local (no communication).
torch::nn::Sequential create_mnbn_model(const torch::nn::Sequential& model, comm::Communicator& comm);

}  // namespace cohort::train
