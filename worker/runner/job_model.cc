#include "worker/runner/job_run.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/adam.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "worker/autograd/tensor_comm.h"
#include "worker/graph/graph_builder.h"
#include "worker/train/multi_node_chain_list.h"
#include "worker/train/parallel_convolution_2d.h"

// JobRun's model: the data- or model-parallel model of this rank, its loss, its optimizer and the
// learning-rate schedule (worker/runner/job_run.h).

namespace cohort::worker {
namespace job_run {
namespace {

// Adam's defaults, for beta1 / beta2 left at 0 in the spec.
constexpr double kDefaultBeta1 = 0.9;
constexpr double kDefaultBeta2 = 0.999;

// Model construction draws from libtorch's process-wide RNG; ranks running as threads of one
// process (tests) would interleave their draws. Seeding and building under one lock gives every
// run the same initial weights.
std::mutex& model_init_mutex() {
  static std::mutex mutex;
  return mutex;
}

StatusOr<std::unique_ptr<torch::optim::Optimizer>> make_optimizer(const v1::Optimizer& spec,
                                                                  std::vector<at::Tensor> params) {
  if (!(spec.lr() > 0)) return invalid_argument_error("optimizer: lr is {}; it must be > 0", spec.lr());
  if (spec.weight_decay() < 0) {
    return invalid_argument_error("optimizer: weight_decay is {}; it must be >= 0", spec.weight_decay());
  }
  switch (spec.kind()) {
    case v1::SGD:
    case v1::MOMENTUM: {
      double momentum = spec.kind() == v1::MOMENTUM ? spec.momentum() : 0.0;
      if (momentum < 0 || momentum >= 1) {
        return invalid_argument_error("optimizer: momentum is {}; it must be in [0, 1)", momentum);
      }
      return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::SGD>(
          std::move(params),
          torch::optim::SGDOptions(spec.lr()).momentum(momentum).weight_decay(spec.weight_decay())));
    }
    case v1::ADAM: {
      double beta1 = spec.beta1() > 0 ? spec.beta1() : kDefaultBeta1;
      double beta2 = spec.beta2() > 0 ? spec.beta2() : kDefaultBeta2;
      return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::Adam>(
          std::move(params),
          torch::optim::AdamOptions(spec.lr()).betas({beta1, beta2}).weight_decay(spec.weight_decay())));
    }
    default:
      return invalid_argument_error("optimizer: kind is not set (SGD, MOMENTUM or ADAM)");
  }
}

// Data parallel: the whole graph. Parameters outside ParallelConvolution2D layers are broadcast
// from rank 0 by the caller when the graph has such layers (then ranks do not average gradients).
StatusOr<Model> build_data_parallel(const v1::Graph& graph, comm::Communicator& comm) {
  graph::GraphBuildOptions options;
  options.comm = &comm;
  COHORT_ASSIGN_OR_RETURN(torch::nn::Sequential seq, graph::build_graph(graph, options));
  Model model;
  model.module = seq.ptr();
  model.forward = [m = seq.ptr()](const at::Tensor& x) { return m->forward(x); };
  return model;
}

Status check_stage_ranks(const v1::ModelParallelModel& spec, int world_size) {
  if (spec.stages_size() == 0) return invalid_argument_error("model_parallel: no stages");
  std::map<int, int> output_stage;  // rank → its stage without rank_out (MultiNodeChainList allows one)
  for (int i = 0; i < spec.stages_size(); ++i) {
    const v1::Stage& stage = spec.stages(i);
    if (stage.rank_out().empty() && !output_stage.emplace(stage.rank(), i).second) {
      return invalid_argument_error("stages {} and {} both run on rank {} without rank_out; a rank gives one output",
                                    output_stage[stage.rank()], i, stage.rank());
    }
    auto bad = [&](int r) { return r < 0 || r >= world_size || r == stage.rank(); };
    if (stage.rank() < 0 || stage.rank() >= world_size) {
      return invalid_argument_error("stage {}: rank {} is outside the world of {} ranks", i, stage.rank(),
                                    world_size);
    }
    for (int r : stage.rank_in()) {
      if (bad(r))
        return invalid_argument_error("stage {} (rank {}): rank_in {} is not another rank of {}", i,
                                      stage.rank(), r, world_size);
    }
    for (int r : stage.rank_out()) {
      if (bad(r))
        return invalid_argument_error("stage {} (rank {}): rank_out {} is not another rank of {}", i,
                                      stage.rank(), r, world_size);
    }
  }
  return ok_status();
}

// Model parallel: this rank's stages as links of a MultiNodeChainList, in spec order. A stage
// with several rank_in gets their outputs concatenated along dimension 1 (features / channels).
StatusOr<Model> build_model_parallel(const v1::ModelParallelModel& spec, comm::Communicator& comm) {
  COHORT_RETURN_IF_ERROR(check_stage_ranks(spec, comm.size()));
  auto chain = std::make_shared<train::MultiNodeChainList>(comm);
  graph::GraphBuildOptions options;
  options.comm = &comm;
  for (int i = 0; i < spec.stages_size(); ++i) {
    const v1::Stage& stage = spec.stages(i);
    if (stage.rank() != comm.rank()) continue;
    StatusOr<graph::StageBody> body = graph::build_stage_body(stage, options);
    if (!body.ok()) return body.status().with_context(fmt::format("stage {} (rank {})", i, stage.rank()));
    train::LinkFunction fn = [forward = body->forward](const std::vector<at::Tensor>& inputs) {
      return forward(inputs.size() == 1 ? inputs[0] : at::cat(inputs, 1));
    };
    chain->add_link(body->module, std::move(fn),
                    train::LinkRanks(std::vector<int>(stage.rank_in().begin(), stage.rank_in().end())),
                    train::LinkRanks(std::vector<int>(stage.rank_out().begin(), stage.rank_out().end())));
  }
  Model model;
  model.module = chain;
  model.forward = [chain](const at::Tensor& x) { return chain->forward(x); };
  model.is_chain = true;
  // The stage without rank_out gives the output, wherever it stands (ChainerMN's NonConnectedGraph2).
  model.computes_loss = chain->has_output();
  return model;
}

// Rank 0's values of every parameter that is replicated (not a ParallelConvolution2D share).
void broadcast_replicated_parameters(torch::nn::Module& model, comm::Communicator& comm) {
  at::NoGradGuard no_grad;
  for (const auto& child : model.children()) {
    if (dynamic_cast<train::ParallelConvolution2DImpl*>(child.get()) != nullptr) continue;
    for (at::Tensor& param : child->parameters()) {
      at::Tensor buf = param.detach().contiguous();
      autograd::sync_before_comm(buf);
      autograd::wait_or_throw(comm.broadcast(buf.data_ptr(), static_cast<size_t>(buf.numel()),
                                             autograd::to_data_type(buf.scalar_type()), 0),
                              "broadcasting the initial parameters");
      param.detach().copy_(buf);
    }
  }
}

}  // namespace

// ---- Loss ----------------------------------------------------------------------------------

StatusOr<LossKind> parse_loss(const std::string& name) {
  if (name.empty() || name == "cross_entropy") return LossKind::kCrossEntropy;
  if (name == "nll") return LossKind::kNll;
  if (name == "mse") return LossKind::kMse;
  return invalid_argument_error("loss \"{}\" is not one of cross_entropy, nll, mse", name);
}

at::Tensor compute_loss(LossKind kind, const at::Tensor& output, const at::Tensor& targets) {
  switch (kind) {
    case LossKind::kNll:
      return at::nll_loss(output, targets);
    case LossKind::kMse:
      if (!c10::isFloatingType(targets.scalar_type()) && output.dim() == 2) {
        return at::mse_loss(output, at::one_hot(targets, output.size(1)).to(output.scalar_type()));
      }
      return at::mse_loss(output, targets.to(output.scalar_type()).view_as(output));
    case LossKind::kCrossEntropy:
      break;
  }
  return at::cross_entropy_loss(output, targets);
}

// ---- Model and optimizer -----------------------------------------------------------------------

Status JobRun::build_model() {
  Status built;
  {
    // Building is local; the agreement below is collective and must run outside the lock (a
    // rank thread holding it would wait for peers that wait for the lock).
    std::lock_guard<std::mutex> lock(model_init_mutex());
    at::manual_seed(spec_.seed());
    StatusOr<Model> model = spec_.model_case() == v1::JobSpec::kDataParallel
                                ? build_data_parallel(spec_.data_parallel().graph(), comm_)
                                : build_model_parallel(spec_.model_parallel(), comm_);
    if (model.ok()) {
      model_ = std::move(model).value();
    } else {
      built = model.status();
    }
  }
  // Every rank builds; a rank whose stage failed must not leave the others waiting.
  return agree(comm_, built, "building the model");
}

Status JobRun::build_optimizer() {
  // Built on the CPU from the seed (the same weights as a CPU run), then moved.
  if (!options_.device.is_cpu()) model_.module->to(options_.device);
  COHORT_ASSIGN_OR_RETURN(optimizer_, make_optimizer(spec_.optimizer(), model_.module->parameters()));
  if (sharded_) {
    multi_node_optimizer_ = train::create_multi_node_optimizer(*optimizer_, comm_);
    multi_node_optimizer_->broadcast_parameters();
    sync_buffers_ = std::make_unique<train::AllreducePersistent>(*model_.module, comm_);
  } else if (!model_.is_chain) {
    broadcast_replicated_parameters(*model_.module, comm_);
  }
  return ok_status();
}

// ---- Learning-rate schedule --------------------------------------------------------------------

void JobRun::set_learning_rate(int64_t step) {
  double lr = scheduled_learning_rate(spec_.optimizer(), spec_.epochs(), steps_per_epoch_, step);
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
}

}  // namespace job_run

namespace {

// StepLR's default decay, for gamma left at 0.
constexpr double kDefaultStepGamma = 0.1;
constexpr double kPi = 3.14159265358979323846;

}  // namespace

double scheduled_learning_rate(const v1::Optimizer& optimizer, int epochs, int64_t steps_per_epoch,
                               int64_t step) {
  const double base = optimizer.lr();
  const v1::LearningRateSchedule& schedule = optimizer.schedule();
  steps_per_epoch = std::max<int64_t>(1, steps_per_epoch);
  const int64_t warmup_steps = std::max(0, schedule.warmup_epochs()) * steps_per_epoch;
  // Linear warm-up: step s of w uses (s + 1) / w of the rate, so the first step already moves.
  if (step < warmup_steps) return base * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const int64_t after = step - warmup_steps;  // steps since the warm-up ended
  switch (schedule.kind()) {
    case v1::STEP: {
      const int64_t every = std::max(1, schedule.step_epochs()) * steps_per_epoch;
      const double gamma = schedule.gamma() > 0 ? schedule.gamma() : kDefaultStepGamma;
      return base * std::pow(gamma, static_cast<double>(after / every));
    }
    case v1::COSINE: {
      const int64_t span =
          std::max<int64_t>(1, (epochs - std::max(0, schedule.warmup_epochs())) * steps_per_epoch);
      const double t = std::min(1.0, static_cast<double>(after) / static_cast<double>(span));
      return base * 0.5 * (1.0 + std::cos(kPi * t));
    }
    default:
      return base;
  }
}

}  // namespace cohort::worker
