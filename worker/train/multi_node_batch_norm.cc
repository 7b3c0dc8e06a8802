#include "worker/train/multi_node_batch_norm.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/any.h>

#include "worker/autograd/collective_functions.h"
#include "worker/autograd/tensor_comm.h"

namespace cohort::train {

MultiNodeBatchNormImpl::MultiNodeBatchNormImpl(comm::Communicator& comm,
                                               const torch::nn::BatchNormOptions& options)
    : comm_(comm), options_(options) {
  const int64_t c = options_.num_features();
  if (options_.affine()) {
    weight = register_parameter("weight", at::ones({c}));
    bias = register_parameter("bias", at::zeros({c}));
  }
  if (options_.track_running_stats()) {
    running_mean = register_buffer("running_mean", at::zeros({c}));
    running_var = register_buffer("running_var", at::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", at::zeros({}, at::kLong));
  }
}

at::Tensor MultiNodeBatchNormImpl::forward(const at::Tensor& x) {
  if (x.dim() < 2 || x.size(1) != options_.num_features()) {
    throw std::invalid_argument(fmt::format("MultiNodeBatchNorm: expected [N, {}, *], got {}",
                                            options_.num_features(),
                                            fmt::join(x.sizes().begin(), x.sizes().end(), "x")));
  }
  if (is_training() || !options_.track_running_stats()) return normalize_with_batch_statistics(x);
  return at::batch_norm(x, weight, bias, running_mean, running_var, /*training=*/false, /*momentum=*/0.0,
                        options_.eps(), /*cudnn_enabled=*/false);
}

at::Tensor MultiNodeBatchNormImpl::normalize_with_batch_statistics(const at::Tensor& x) {
  std::vector<int64_t> reduce_dims{0};
  std::vector<int64_t> channel_shape(x.dim(), 1);  // [1, C, 1, ...] for broadcasting
  channel_shape[1] = x.size(1);
  for (int64_t d = 2; d < x.dim(); ++d) reduce_dims.push_back(d);

  // f16 / bf16 input: statistics accumulated in double over the input widened to float, and the
  // normalization in float. In the input's dtype the squares overflow f16 (300² > 65504), and
  // bf16's 8 significant bits cancel E[x²] - E[x]² to noise, or below zero, once |mean| is a few
  // times the std; summed in float, a 65536-sample channel at mean 300 still loses ~1 %
  // of a unit variance. x² of an 8- or 11-bit value is exact in float, so the double sums are
  // exact but for their own rounding. Widening is differentiable; the output is cast back.
  const at::ScalarType input_type = x.scalar_type();
  const bool reduced = input_type == at::kHalf || input_type == at::kBFloat16;
  const at::Tensor xs = reduced ? x.to(at::kFloat) : x;
  const at::ScalarType stats_type = reduced ? at::kDouble : input_type;

  // Protocol: one differentiable SUM allreduce of [sum; sum of squares] per channel, then the
  // sample count (not differentiable) in the same order on every rank.
  at::Tensor local = at::stack({xs.sum(reduce_dims, /*keepdim=*/false, stats_type),
                                xs.mul(xs).sum(reduce_dims, /*keepdim=*/false, stats_type)});
  at::Tensor global = autograd::allreduce(comm_, local, comm::ReduceOp::kSum);
  const double local_count = x.size(1) == 0 ? 0.0 : static_cast<double>(x.numel() / x.size(1));
  auto count_or = comm_.allreduce_obj(local_count, comm::ReduceOp::kSum);
  autograd::throw_if_error(count_or.status(), "MultiNodeBatchNorm: allreducing the sample count");
  const double n = count_or.value();
  if (n < 1) throw std::invalid_argument("MultiNodeBatchNorm: the global batch is empty");

  at::Tensor mean = global[0].div(n);
  at::Tensor var = global[1].div(n).sub(mean.mul(mean));
  at::Tensor y = xs.sub(mean.to(xs.scalar_type()).view(channel_shape))
                     .mul(var.add(options_.eps()).rsqrt().to(xs.scalar_type()).view(channel_shape));
  if (options_.affine()) y = y.mul(weight.view(channel_shape)).add(bias.view(channel_shape));
  if (y.scalar_type() != input_type) y = y.to(input_type);

  if (is_training() && options_.track_running_stats()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
    const double momentum = options_.momentum().has_value()
                                ? *options_.momentum()
                                : 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
    const double unbias = n > 1 ? n / (n - 1) : 1.0;
    running_mean.mul_(1 - momentum).add_(mean.detach().to(running_mean.scalar_type()), momentum);
    running_var.mul_(1 - momentum).add_(var.detach().mul(unbias).to(running_var.scalar_type()), momentum);
  }
  return y;
}

namespace {

// The MultiNodeBatchNorm standing in for `bn` (any torch::nn::BatchNorm{1,2,3}dImpl).
template <typename BatchNormImpl>
MultiNodeBatchNorm multi_node_copy_of(const BatchNormImpl& bn, comm::Communicator& comm) {
  MultiNodeBatchNorm replacement(comm, bn.options);
  torch::NoGradGuard no_grad;
  // Same dtype and device as the layer it replaces, then its values.
  if (bn.running_mean.defined()) replacement->to(bn.running_mean.options().device(), bn.running_mean.scalar_type());
  auto copy = [](at::Tensor& to, const at::Tensor& from) {
    if (to.defined() && from.defined()) to.copy_(from);
  };
  copy(replacement->weight, bn.weight);
  copy(replacement->bias, bn.bias);
  copy(replacement->running_mean, bn.running_mean);
  copy(replacement->running_var, bn.running_var);
  copy(replacement->num_batches_tracked, bn.num_batches_tracked);
  replacement->train(bn.is_training());
  return replacement;
}

// The replacement of `module` when it is a BatchNorm layer; null otherwise.
std::shared_ptr<MultiNodeBatchNormImpl> replace_batch_norm(const std::shared_ptr<torch::nn::Module>& module,
                                                           comm::Communicator& comm) {
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(module)) {
    return multi_node_copy_of(*bn, comm).ptr();
  }
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(module)) {
    return multi_node_copy_of(*bn, comm).ptr();
  }
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm3dImpl>(module)) {
    return multi_node_copy_of(*bn, comm).ptr();
  }
  return nullptr;
}

bool is_batch_norm(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module) != nullptr;
}

}  // namespace

torch::nn::Sequential create_mnbn_model(const torch::nn::Sequential& model, comm::Communicator& comm) {
  torch::nn::Sequential result;
  const auto children = model->named_children();
  size_t index = 0;
  for (const torch::nn::AnyModule& layer : *model) {
    const std::string& name = children[index++].key();
    const std::shared_ptr<torch::nn::Module> module = layer.ptr();
    if (auto replacement = replace_batch_norm(module, comm)) {
      result->push_back(std::string(name), MultiNodeBatchNorm(replacement));
    } else {
      for (const auto& item : module->named_modules(name, /*include_self=*/false)) {
        if (is_batch_norm(*item.value())) {
          throw std::invalid_argument(fmt::format(
              "create_mnbn_model: layer '{}' ({}) holds a BatchNorm at '{}' that cannot be replaced: only "
              "Sequential containers can be rewritten; build that module with MultiNodeBatchNorm instead",
              name, module->name(), item.key()));
        }
      }
      result->push_back(std::string(name), layer);
    }
  }
  return result;
}

}  // namespace cohort::train
