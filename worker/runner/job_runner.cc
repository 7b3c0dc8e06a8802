#include "worker/runner/job_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "worker/autograd/tensor_comm.h"
#include "worker/graph/graph_builder.h"
#include "worker/graph/shape_inference.h"
#include "worker/train/allreduce_persistent.h"
#include "worker/train/idx_dataset.h"
#include "worker/train/multi_node_chain_list.h"
#include "worker/train/multi_node_checkpointer.h"
#include "worker/train/multi_node_evaluator.h"
#include "worker/train/multi_node_iterator.h"
#include "worker/train/multi_node_optimizer.h"
#include "worker/train/parallel_convolution_2d.h"
#include "worker/train/scatter_dataset.h"
#include "worker/train/synthetic_dataset.h"

namespace cohort::worker {
namespace {

using Clock = std::chrono::steady_clock;
using train::TensorDataset;

// Evaluation keeps no gradients, so large batches only save per-batch overhead.
constexpr int64_t kEvalBatch = 1000;
// Adam's defaults, for beta1 / beta2 left at 0 in the spec.
constexpr double kDefaultBeta1 = 0.9;
constexpr double kDefaultBeta2 = 0.999;
// StepLR's default decay, for gamma left at 0.
constexpr double kDefaultStepGamma = 0.1;
constexpr double kPi = 3.14159265358979323846;
// The checkpoint name when the spec has none.
constexpr const char* kDefaultCheckpointName = "job";

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Model construction draws from libtorch's process-wide RNG; ranks running as threads of one
// process (tests) would interleave their draws. Seeding and building under one lock gives every
// run the same initial weights.
std::mutex& model_init_mutex() {
  static std::mutex mutex;
  return mutex;
}

// OK on every rank iff `local` is OK on every rank (one allreduce MAX of a failure flag), so a
// step that only some ranks do (rank 0 reading the data) fails everywhere instead of leaving the
// others waiting in their next collective.
Status agree(comm::Communicator& comm, const Status& local, const char* what) {
  COHORT_ASSIGN_OR_RETURN(double failed, comm.allreduce_obj(local.ok() ? 0.0 : 1.0, comm::ReduceOp::kMax));
  if (!local.ok()) return local;
  if (failed > 0) return aborted_error("{} failed on another rank (its log says why)", what);
  return ok_status();
}

// ---- Data ---------------------------------------------------------------------------------

struct Splits {
  TensorDataset train;
  TensorDataset test;
};

// `dir`/`stem`.gz, else `dir`/`stem`.
StatusOr<std::string> idx_file(const std::string& dir, const std::string& stem) {
  std::error_code ec;
  for (const std::string& name : {stem + ".gz", stem}) {
    std::string path = (std::filesystem::path(dir) / name).string();
    if (std::filesystem::is_regular_file(path, ec)) return path;
  }
  return not_found_error("dataset: neither {0}/{1}.gz nor {0}/{1} exists", dir, stem);
}

StatusOr<TensorDataset> read_split(const std::string& dir, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  COHORT_ASSIGN_OR_RETURN(std::string images, idx_file(dir, prefix + "-images-idx3-ubyte"));
  COHORT_ASSIGN_OR_RETURN(std::string labels, idx_file(dir, prefix + "-labels-idx1-ubyte"));
  return train::read_idx_dataset(images, labels);
}

TensorDataset first(const TensorDataset& data, int64_t n) {
  return n > 0 && n < data.size() ? data.slice(0, n) : data;
}

StatusOr<Splits> load_dataset(const v1::Dataset& spec, uint64_t seed, const std::string& default_dir) {
  switch (spec.kind()) {
    case v1::SYNTHETIC: {
      if (spec.train_size() <= 0) return invalid_argument_error("dataset: SYNTHETIC needs train_size > 0");
      if (spec.num_classes() < 1) return invalid_argument_error("dataset: SYNTHETIC needs num_classes >= 1");
      if (spec.input_shape_size() == 0) return invalid_argument_error("dataset: SYNTHETIC needs input_shape");
      train::SyntheticDatasetOptions options;
      options.size = spec.train_size();
      options.sample_shape.assign(spec.input_shape().begin(), spec.input_shape().end());
      for (int64_t d : options.sample_shape) {
        if (d < 1) return invalid_argument_error("dataset: input_shape has a dimension {} < 1", d);
      }
      options.num_classes = spec.num_classes();
      options.seed = seed;
      Splits splits;
      splits.train = train::make_synthetic_dataset(options);
      // Held-out samples of the same classes: another seed, the same class means.
      options.size = spec.test_size() > 0 ? spec.test_size() : spec.train_size();
      options.seed = seed + 1;
      splits.test = train::make_synthetic_dataset(options);
      return splits;
    }
    case v1::FASHION_MNIST:
    case v1::IDX_DIR: {
      std::string dir = spec.path();
      if (dir.empty()) {
        if (spec.kind() == v1::IDX_DIR) return invalid_argument_error("dataset: IDX_DIR needs a path");
        dir = default_dir.empty() ? train::kFashionMnistDir : default_dir;
      }
      COHORT_ASSIGN_OR_RETURN(TensorDataset train_set, read_split(dir, true));
      COHORT_ASSIGN_OR_RETURN(TensorDataset test_set, read_split(dir, false));
      return Splits{first(train_set, spec.train_size()), first(test_set, spec.test_size())};
    }
    default:
      return invalid_argument_error("dataset: kind is not set (FASHION_MNIST, IDX_DIR or SYNTHETIC)");
  }
}

// ---- Loss and optimizer ------------------------------------------------------------------------

enum class LossKind { kCrossEntropy, kNll, kMse };

StatusOr<LossKind> parse_loss(const std::string& name) {
  if (name.empty() || name == "cross_entropy") return LossKind::kCrossEntropy;
  if (name == "nll") return LossKind::kNll;
  if (name == "mse") return LossKind::kMse;
  return invalid_argument_error("loss \"{}\" is not one of cross_entropy, nll, mse", name);
}

// The mean loss of a batch. MSE against class labels compares with their one-hot encoding.
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

// ---- Model ---------------------------------------------------------------------------------

struct Model {
  std::shared_ptr<torch::nn::Module> module;             // parameters, train/eval, checkpoints
  std::function<at::Tensor(const at::Tensor&)> forward;  // this rank's forward
  bool is_chain = false;                                 // model parallel: forward sends and receives
  bool computes_loss = true;                             // this rank's forward output goes to the loss
};

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
  for (int i = 0; i < spec.stages_size(); ++i) {
    const v1::Stage& stage = spec.stages(i);
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
  bool last_has_rank_out = false;
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
    last_has_rank_out = stage.rank_out_size() > 0;
  }
  Model model;
  model.module = chain;
  model.forward = [chain](const at::Tensor& x) { return chain->forward(x); };
  model.is_chain = true;
  model.computes_loss = chain->num_links() > 0 && !last_has_rank_out;
  return model;
}

bool has_layer(const v1::Graph& graph, const std::string& type) {
  return std::any_of(graph.layers().begin(), graph.layers().end(),
                     [&](const v1::Layer& layer) { return layer.type() == type; });
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

// ---- The run -------------------------------------------------------------------------------

class JobRun {
 public:
  JobRun(const v1::JobSpec& spec, comm::Communicator& comm, const JobRunnerOptions& options)
      : spec_(spec), comm_(comm), options_(options) {}

  StatusOr<JobResult> run();

 private:
  Status setup();
  Status load_data();
  Status build_model();
  StatusOr<int64_t> resume();
  Status train_epoch(int epoch);
  Status evaluate(int epoch, double epoch_loss_sum, int64_t epoch_loss_steps, int64_t epoch_samples,
                  double seconds);
  StatusOr<std::optional<TensorDataset>> next_train_batch();
  // `batch` on options.device (itself on the CPU).
  TensorDataset on_device(const TensorDataset& batch) const;
  void set_learning_rate(int64_t step);
  // To options.metrics on rank 0, with rank and totals filled in.
  void report(v1::Metrics metrics, bool epoch_end);
  void print(const std::string& line);
  // Global means of this rank's (value, count) pairs: one collective.
  StatusOr<std::map<std::string, double>> global(train::Metrics local);

  bool is_reporter() const { return comm_.rank() == 0; }

  const v1::JobSpec& spec_;
  comm::Communicator& comm_;
  const JobRunnerOptions& options_;

  LossKind loss_ = LossKind::kCrossEntropy;
  Model model_;
  // Sharded: each rank trains on its own shard (data parallel without split layers). Otherwise
  // rank 0 draws every batch and broadcasts it, so all ranks see the same batch.
  bool sharded_ = true;
  TensorDataset train_data_;  // sharded: this rank's shard; else rank 0's whole set (empty elsewhere)
  TensorDataset test_data_;
  std::unique_ptr<train::BatchIterator> train_batches_;
  std::unique_ptr<train::MultiNodeIterator> broadcast_train_;
  std::unique_ptr<train::BatchIterator> test_batches_;  // broadcast mode: rank 0's test batches
  std::unique_ptr<train::MultiNodeIterator> broadcast_test_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<train::MultiNodeOptimizer> multi_node_optimizer_;  // sharded only
  std::unique_ptr<train::AllreducePersistent> sync_buffers_;         // sharded only
  std::unique_ptr<train::MultiNodeCheckpointer> checkpointer_;
  int64_t steps_per_epoch_ = 0;
  int64_t step_ = 0;
  double last_accuracy_ = 0;
  JobResult result_;
};

Status JobRun::setup() {
  if (spec_.batch_size() < 1)
    return invalid_argument_error("batch_size is {}; it must be >= 1", spec_.batch_size());
  if (spec_.epochs() < 1) return invalid_argument_error("epochs is {}; it must be >= 1", spec_.epochs());
  COHORT_ASSIGN_OR_RETURN(loss_, parse_loss(spec_.loss()));
  // The coordinator validated the spec already, but a worker started by hand (mpirun, a shell
  // loop) gets the same layer-by-layer shape errors here instead of a libtorch exception at step
  // 0. Deterministic, so every rank fails alike; files are checked where they are read instead.
  graph::ModelValidationOptions validation;
  validation.check_stage_ranks = false;  // against the real world size below
  validation.check_files = false;
  COHORT_RETURN_IF_ERROR(graph::validate_model(spec_, validation));
  switch (spec_.model_case()) {
    case v1::JobSpec::kDataParallel:
      // ParallelConvolution2D needs the same input on every rank: such graphs see broadcast batches.
      sharded_ = !has_layer(spec_.data_parallel().graph(), "parallel_conv2d");
      break;
    case v1::JobSpec::kModelParallel:
      sharded_ = false;
      break;
    default:
      return invalid_argument_error("model: neither data_parallel nor model_parallel is set");
  }
  COHORT_RETURN_IF_ERROR(load_data());
  COHORT_RETURN_IF_ERROR(build_model());
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
  if (!spec_.checkpoint().dir().empty()) {
    if (spec_.checkpoint().interval_epochs() < 1) {
      return invalid_argument_error("checkpoint: interval_epochs is {}; it must be >= 1 when dir is set",
                                    spec_.checkpoint().interval_epochs());
    }
    checkpointer_ = train::create_multi_node_checkpointer(
        spec_.name().empty() ? kDefaultCheckpointName : spec_.name(), comm_, spec_.checkpoint().dir());
    checkpointer_->add_module("model", *model_.module);
    checkpointer_->add_optimizer("optimizer", *optimizer_);
    checkpointer_->add_iterator("train", *train_batches_);
  }
  return ok_status();
}

Status JobRun::load_data() {
  // Rank 0 alone reads (or generates) the data; the others receive their part from it.
  Splits all;
  Status loaded;
  if (comm_.rank() == 0) {
    StatusOr<Splits> splits = load_dataset(spec_.dataset(), spec_.seed(), options_.fashion_mnist_dir);
    if (splits.ok()) {
      all = std::move(splits).value();
    } else {
      loaded = splits.status();
    }
  }
  COHORT_RETURN_IF_ERROR(agree(comm_, loaded, "loading the dataset"));
  if (sharded_) {
    // Equal shards: every rank takes the same number of steps (the optimizer's allreduces pair up).
    COHORT_ASSIGN_OR_RETURN(train_data_,
                            train::scatter_dataset(all.train, comm_, 0, /*shuffle=*/true, spec_.seed(),
                                                   /*force_equal_length=*/true));
    COHORT_ASSIGN_OR_RETURN(test_data_, train::scatter_dataset(all.test, comm_, 0, /*shuffle=*/false, 0,
                                                               /*force_equal_length=*/false));
  } else {
    train_data_ = all.train;
    test_data_ = all.test;
  }
  COHORT_ASSIGN_OR_RETURN(double train_size,
                          comm_.allreduce_obj(static_cast<double>(train_data_.size()), comm::ReduceOp::kMax));
  if (train_size < 1) return invalid_argument_error("dataset: the training set is empty");
  steps_per_epoch_ = (static_cast<int64_t>(train_size) + spec_.batch_size() - 1) / spec_.batch_size();

  const uint64_t shuffle_seed = spec_.seed() + (sharded_ ? static_cast<uint64_t>(comm_.rank()) : 0);
  train_batches_ =
      std::make_unique<train::BatchIterator>(train_data_, spec_.batch_size(), /*shuffle=*/true, shuffle_seed);
  if (!sharded_) {
    train::BatchIterator* batches = train_batches_.get();
    broadcast_train_ = train::create_multi_node_iterator([batches] { return batches->next(); }, comm_, 0);
    test_batches_ = std::make_unique<train::BatchIterator>(test_data_, kEvalBatch, /*shuffle=*/false);
    train::BatchIterator* tests = test_batches_.get();
    broadcast_test_ = train::create_multi_node_iterator([tests] { return tests->next(); }, comm_, 0);
  }
  return ok_status();
}

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

StatusOr<int64_t> JobRun::resume() {
  if (!options_.resume) return int64_t{0};
  if (checkpointer_ == nullptr) {
    if (is_reporter())
      spdlog::warn("resume requested but the job has no checkpoint.dir; starting from scratch");
    return int64_t{0};
  }
  COHORT_ASSIGN_OR_RETURN(std::optional<int64_t> step, checkpointer_->resume());
  if (!step.has_value()) {
    if (is_reporter()) spdlog::info("no checkpoint in {}; starting from scratch", spec_.checkpoint().dir());
    return int64_t{0};
  }
  result_.resumed_from = *step;
  if (is_reporter()) spdlog::info("resumed from the checkpoint of step {}", *step);
  return *step;
}

StatusOr<std::map<std::string, double>> JobRun::global(train::Metrics local) {
  return train::create_multi_node_evaluator([&]() -> StatusOr<train::Metrics> { return local; }, comm_)
      ->evaluate();
}

StatusOr<std::optional<TensorDataset>> JobRun::next_train_batch() {
  if (sharded_) return train_batches_->next();
  return broadcast_train_->next();
}

TensorDataset JobRun::on_device(const TensorDataset& batch) const {
  if (options_.device.is_cpu()) return batch;
  return TensorDataset{batch.inputs.to(options_.device), batch.targets.to(options_.device)};
}

void JobRun::set_learning_rate(int64_t step) {
  double lr = scheduled_learning_rate(spec_.optimizer(), spec_.epochs(), steps_per_epoch_, step);
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
}

void JobRun::print(const std::string& line) {
  if (!is_reporter() || options_.out == nullptr) return;
  std::fputs(line.c_str(), options_.out);
  std::fputc('\n', options_.out);
  std::fflush(options_.out);
}

void JobRun::report(v1::Metrics metrics, bool epoch_end) {
  if (!is_reporter() || options_.metrics == nullptr) return;
  metrics.set_rank(comm_.rank());
  metrics.set_total_steps(steps_per_epoch_ * spec_.epochs());
  metrics.set_total_epochs(spec_.epochs());
  // Sharded data: each rank a batch of its own; broadcast batches: one batch for all ranks.
  metrics.set_samples_per_step(static_cast<int64_t>(spec_.batch_size()) * (sharded_ ? comm_.size() : 1));
  options_.metrics->report(metrics, epoch_end);
}

Status JobRun::train_epoch(int epoch) {
  model_.module->train();
  train_batches_->set_position({epoch, 0});
  double window_loss = 0, epoch_loss = 0;
  int64_t window_loss_steps = 0, epoch_loss_steps = 0, window_samples = 0, epoch_samples = 0, in_epoch = 0;
  Clock::time_point epoch_start = Clock::now();
  Clock::time_point window_start = epoch_start;
  while (true) {
    COHORT_ASSIGN_OR_RETURN(std::optional<TensorDataset> batch, next_train_batch());
    if (!batch.has_value()) break;
    batch = on_device(*batch);
    set_learning_rate(step_);
    if (multi_node_optimizer_) {
      multi_node_optimizer_->zero_grad();
    } else {
      optimizer_->zero_grad();
    }
    at::Tensor y = model_.forward(batch->inputs);
    if (model_.computes_loss) {
      at::Tensor loss = compute_loss(loss_, y, batch->targets);
      loss.backward();
      double value = loss.item<double>();
      window_loss += value;
      epoch_loss += value;
      ++window_loss_steps;
      ++epoch_loss_steps;
    } else if (y.defined() && y.requires_grad()) {
      y.backward();  // a delegate: runs this rank's part of the pipeline's backward
    }
    if (multi_node_optimizer_) {
      multi_node_optimizer_->step();
    } else {
      optimizer_->step();
    }
    ++step_;
    ++in_epoch;
    window_samples += batch->size();
    epoch_samples += batch->size();

    // Progress every log_every_steps (every rank reaches the same step counts: collective).
    if (options_.log_every_steps > 0 && in_epoch % options_.log_every_steps == 0 &&
        in_epoch < steps_per_epoch_) {
      COHORT_ASSIGN_OR_RETURN(
          auto g,
          global({{"loss", {window_loss_steps ? window_loss / window_loss_steps : 0.0, window_loss_steps}},
                  {"samples", {static_cast<double>(window_samples), 1}}}));
      double rate =
          g["samples"] * (sharded_ ? comm_.size() : 1) / std::max(1e-9, seconds_since(window_start));
      print(fmt::format("epoch {}/{} step {}/{} loss {:.4f} samples/s {:.0f}", epoch + 1, spec_.epochs(),
                        in_epoch, steps_per_epoch_, g["loss"], rate));
      v1::Metrics metrics;
      metrics.set_step(step_);
      metrics.set_epoch(epoch);
      metrics.set_loss(g["loss"]);
      metrics.set_accuracy(last_accuracy_);
      metrics.set_samples_per_s(rate);
      report(metrics, /*epoch_end=*/false);
      window_loss = 0;
      window_loss_steps = 0;
      window_samples = 0;
      window_start = Clock::now();
    }
  }
  return evaluate(epoch, epoch_loss, epoch_loss_steps, epoch_samples, seconds_since(epoch_start));
}

Status JobRun::evaluate(int epoch, double epoch_loss_sum, int64_t epoch_loss_steps, int64_t epoch_samples,
                        double seconds) {
  if (sync_buffers_) COHORT_RETURN_IF_ERROR((*sync_buffers_)());
  model_.module->eval();
  double loss_sum = 0, correct = 0;
  int64_t n = 0;
  auto score = [&](const TensorDataset& host_batch) {
    const TensorDataset batch = on_device(host_batch);
    at::Tensor y = model_.forward(batch.inputs);
    if (!model_.computes_loss) return;
    y = y.detach();
    loss_sum += compute_loss(loss_, y, batch.targets).item<double>() * static_cast<double>(batch.size());
    if (y.dim() == 2 && !c10::isFloatingType(batch.targets.scalar_type())) {
      correct += y.argmax(1).eq(batch.targets).sum().item<double>();
    }
    n += batch.size();
  };
  if (sharded_) {
    at::NoGradGuard no_grad;
    for (int64_t begin = 0; begin < test_data_.size(); begin += kEvalBatch) {
      score(test_data_.slice(begin, std::min(test_data_.size(), begin + kEvalBatch)));
    }
  } else {
    test_batches_->set_position({0, 0});
    // The pipeline's transfers are autograd functions; the chain runs with grad mode on and the
    // outputs are detached (as the examples do).
    std::optional<at::NoGradGuard> no_grad;
    if (!model_.is_chain) no_grad.emplace();
    while (true) {
      COHORT_ASSIGN_OR_RETURN(std::optional<TensorDataset> batch, broadcast_test_->next());
      if (!batch.has_value()) break;
      score(*batch);
    }
  }
  double denom = n > 0 ? static_cast<double>(n) : 1.0;
  COHORT_ASSIGN_OR_RETURN(
      auto g,
      global({{"accuracy", {correct / denom, n}},
              {"test_loss", {loss_sum / denom, n}},
              {"train_loss", {epoch_loss_steps ? epoch_loss_sum / epoch_loss_steps : 0.0, epoch_loss_steps}},
              {"samples", {static_cast<double>(epoch_samples), 1}},
              {"seconds", {seconds, 1}}}));
  EpochResult epoch_result;
  epoch_result.epoch = epoch;
  epoch_result.train_loss = g["train_loss"];
  epoch_result.test_loss = g["test_loss"];
  epoch_result.test_accuracy = g["accuracy"];
  epoch_result.samples_per_s = g["samples"] * (sharded_ ? comm_.size() : 1) / std::max(1e-9, g["seconds"]);
  last_accuracy_ = epoch_result.test_accuracy;
  result_.test_accuracy = epoch_result.test_accuracy;
  result_.test_loss = epoch_result.test_loss;
  if (epoch_samples > 0) {  // not the evaluation of a run resumed after its last epoch
    result_.epochs.push_back(epoch_result);
    print(
        fmt::format("epoch {}/{} loss {:.4f} test_loss {:.4f} test_acc {:.4f} samples/s {:.0f} time {:.1f}s",
                    epoch + 1, spec_.epochs(), epoch_result.train_loss, epoch_result.test_loss,
                    epoch_result.test_accuracy, epoch_result.samples_per_s, seconds));
  }
  v1::Metrics metrics;
  metrics.set_step(step_);
  metrics.set_epoch(epoch);
  metrics.set_loss(epoch_result.train_loss);
  metrics.set_accuracy(epoch_result.test_accuracy);
  metrics.set_samples_per_s(epoch_result.samples_per_s);
  report(metrics, /*epoch_end=*/true);
  return ok_status();
}

StatusOr<JobResult> JobRun::run() {
  int epoch = 0;
  try {
    COHORT_RETURN_IF_ERROR(setup());
    COHORT_ASSIGN_OR_RETURN(step_, resume());
    result_.steps_per_epoch = steps_per_epoch_;
    // Checkpoints are written at epoch ends, so a resumed step starts an epoch.
    for (epoch = static_cast<int>(step_ / steps_per_epoch_); epoch < spec_.epochs(); ++epoch) {
      step_ = epoch * steps_per_epoch_;
      COHORT_RETURN_IF_ERROR(train_epoch(epoch));
      if (checkpointer_ && (epoch + 1) % spec_.checkpoint().interval_epochs() == 0) {
        COHORT_RETURN_IF_ERROR(
            checkpointer_->save(step_).with_context(fmt::format("checkpoint of epoch {}", epoch + 1)));
      }
    }
    if (result_.epochs.empty()) {
      // Resumed after the last epoch: evaluate once so the result (and the final line) exist.
      COHORT_RETURN_IF_ERROR(evaluate(spec_.epochs() - 1, 0, 0, 0, 0));
    }
  } catch (const std::exception& e) {
    return internal_error("training failed in epoch {} at step {}: {}", epoch + 1, step_, e.what());
  }
  result_.steps = step_;
  print(fmt::format("test accuracy {:.4f}", result_.test_accuracy));
  return result_;
}

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

StatusOr<JobResult> run_job(const v1::JobSpec& spec, comm::Communicator& comm,
                            const JobRunnerOptions& options) {
  JobRun run(spec, comm, options);
  return run.run();
}

}  // namespace cohort::worker
