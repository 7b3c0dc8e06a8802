#include "worker/graph/graph_builder.h"

#include <exception>
#include <filesystem>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <torch/csrc/jit/serialization/import.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "worker/train/multi_node_batch_norm.h"
#include "worker/train/parallel_convolution_2d.h"

namespace cohort::graph {
namespace {

// PyTorch's defaults for parameters a Layer leaves unset.
constexpr int64_t kDefaultStride = 1;
constexpr int64_t kDefaultPadding = 0;
constexpr bool kDefaultBias = true;
constexpr double kDefaultDropout = 0.5;
constexpr double kDefaultBatchNormEps = 1e-5;
constexpr double kDefaultBatchNormMomentum = 0.1;
constexpr double kDefaultEluAlpha = 1.0;
constexpr int64_t kDefaultFlattenStart = 1;
constexpr int64_t kDefaultFlattenEnd = -1;

// Reads the parameters of one layer, turning a missing or out-of-range one into an error that
// names the layer.
class LayerReader {
 public:
  LayerReader(const v1::Layer& layer, int index) : layer_(layer), index_(index) {}

  std::string where() const {
    return fmt::format("layer {} ({} \"{}\")", index_, layer_.type(), layer_name(layer_, index_));
  }

  // A required count (features, channels, kernel size): set and >= 1.
  StatusOr<int64_t> positive(bool has, int64_t value, const char* field) const {
    if (!has) return invalid_argument_error("{}: {} is not set", where(), field);
    if (value < 1) return invalid_argument_error("{}: {} is {}; it must be >= 1", where(), field, value);
    return value;
  }
  // An optional count with a default, >= minimum when set.
  StatusOr<int64_t> optional_at_least(bool has, int64_t value, int64_t fallback, int64_t minimum,
                                      const char* field) const {
    if (!has) return fallback;
    if (value < minimum)
      return invalid_argument_error("{}: {} is {}; it must be >= {}", where(), field, value, minimum);
    return value;
  }
  // An optional real with a default, within [low, high] when set.
  StatusOr<double> optional_in(bool has, double value, double fallback, double low, double high,
                               const char* field) const {
    if (!has) return fallback;
    if (!(value >= low && value <= high)) {
      return invalid_argument_error("{}: {} is {}; it must be in [{}, {}]", where(), field, value, low, high);
    }
    return value;
  }

  const v1::Layer& layer() const { return layer_; }

 private:
  const v1::Layer& layer_;
  int index_;
};

struct ConvParams {
  int64_t in = 0, out = 0, kernel = 0, stride = 0, padding = 0;
  bool bias = true;
};

StatusOr<ConvParams> conv_params(const LayerReader& r) {
  const v1::Layer& l = r.layer();
  ConvParams p;
  COHORT_ASSIGN_OR_RETURN(p.in, r.positive(l.has_in_channels(), l.in_channels(), "in_channels"));
  COHORT_ASSIGN_OR_RETURN(p.out, r.positive(l.has_out_channels(), l.out_channels(), "out_channels"));
  COHORT_ASSIGN_OR_RETURN(p.kernel, r.positive(l.has_kernel_size(), l.kernel_size(), "kernel_size"));
  COHORT_ASSIGN_OR_RETURN(p.stride,
                          r.optional_at_least(l.has_stride(), l.stride(), kDefaultStride, 1, "stride"));
  COHORT_ASSIGN_OR_RETURN(p.padding,
                          r.optional_at_least(l.has_padding(), l.padding(), kDefaultPadding, 0, "padding"));
  p.bias = l.has_bias() ? l.bias() : kDefaultBias;
  return p;
}

torch::nn::Conv2dOptions conv_options(const ConvParams& p) {
  return torch::nn::Conv2dOptions(p.in, p.out, p.kernel).stride(p.stride).padding(p.padding).bias(p.bias);
}

StatusOr<torch::nn::BatchNormOptions> batch_norm_options(const LayerReader& r) {
  const v1::Layer& l = r.layer();
  COHORT_ASSIGN_OR_RETURN(int64_t features,
                          r.positive(l.has_num_features(), l.num_features(), "num_features"));
  COHORT_ASSIGN_OR_RETURN(double eps, r.optional_in(l.has_eps(), l.eps(), kDefaultBatchNormEps, 0, 1, "eps"));
  if (eps <= 0) return invalid_argument_error("{}: eps is {}; it must be > 0", r.where(), eps);
  COHORT_ASSIGN_OR_RETURN(double momentum, r.optional_in(l.has_momentum(), l.momentum(),
                                                         kDefaultBatchNormMomentum, 0, 1, "momentum"));
  return torch::nn::BatchNormOptions(features).eps(eps).momentum(momentum);
}

struct PoolParams {
  int64_t kernel = 0, stride = 0, padding = 0;
};

StatusOr<PoolParams> pool_params(const LayerReader& r) {
  const v1::Layer& l = r.layer();
  PoolParams p;
  COHORT_ASSIGN_OR_RETURN(p.kernel, r.positive(l.has_kernel_size(), l.kernel_size(), "kernel_size"));
  COHORT_ASSIGN_OR_RETURN(p.stride, r.optional_at_least(l.has_stride(), l.stride(), p.kernel, 1, "stride"));
  COHORT_ASSIGN_OR_RETURN(p.padding,
                          r.optional_at_least(l.has_padding(), l.padding(), kDefaultPadding, 0, "padding"));
  // PyTorch refuses padding above half the kernel; say so here with the layer's name.
  if (2 * p.padding > p.kernel) {
    return invalid_argument_error("{}: padding {} is more than half of kernel_size {}", r.where(), p.padding,
                                  p.kernel);
  }
  return p;
}

comm::Communicator* need_comm(const LayerReader& r, const GraphBuildOptions& options, Status* error) {
  if (options.comm == nullptr) {
    *error = invalid_argument_error("{}: needs a communicator (build the graph inside a job)", r.where());
  }
  return options.comm;
}

// Sequential's named push_back overloads lose to a private variadic one for some argument forms;
// going through AnyModule picks the public (std::string, AnyModule) overload.
template <typename M>
void add(torch::nn::Sequential& seq, const std::string& name, M module) {
  seq->push_back(std::string(name), torch::nn::AnyModule(std::move(module)));
}

// One layer appended to `seq` under `name`.
Status append_layer(torch::nn::Sequential& seq, const LayerReader& r, const std::string& name,
                    const GraphBuildOptions& options) {
  const v1::Layer& l = r.layer();
  const std::string& type = l.type();
  if (type == "linear") {
    COHORT_ASSIGN_OR_RETURN(int64_t in, r.positive(l.has_in_features(), l.in_features(), "in_features"));
    COHORT_ASSIGN_OR_RETURN(int64_t out, r.positive(l.has_out_features(), l.out_features(), "out_features"));
    add(seq, name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(l.has_bias() ? l.bias() : true)));
  } else if (type == "conv2d") {
    COHORT_ASSIGN_OR_RETURN(ConvParams p, conv_params(r));
    add(seq, name, torch::nn::Conv2d(conv_options(p)));
  } else if (type == "parallel_conv2d") {
    COHORT_ASSIGN_OR_RETURN(ConvParams p, conv_params(r));
    Status error;
    comm::Communicator* comm = need_comm(r, options, &error);
    if (comm == nullptr) return error;
    if (p.out < comm->size()) {
      return invalid_argument_error("{}: out_channels {} is fewer than the {} ranks that share it", r.where(),
                                    p.out, comm->size());
    }
    // The spec's parallel_conv2d is a full Conv2d split by output channels (shape inference and
    // the memory estimate count it so); ChainerMN's input-channel split is a library option.
    add(seq, name, train::ParallelConvolution2D(*comm, conv_options(p), train::ChannelSplit::kOutput));
  } else if (type == "batchnorm1d" || type == "batchnorm2d" || type == "multi_node_batchnorm") {
    COHORT_ASSIGN_OR_RETURN(torch::nn::BatchNormOptions bn, batch_norm_options(r));
    if (type == "batchnorm1d") {
      add(seq, name, torch::nn::BatchNorm1d(bn));
    } else if (type == "batchnorm2d") {
      add(seq, name, torch::nn::BatchNorm2d(bn));
    } else {
      Status error;
      comm::Communicator* comm = need_comm(r, options, &error);
      if (comm == nullptr) return error;
      add(seq, name, train::MultiNodeBatchNorm(*comm, bn));
    }
  } else if (type == "relu") {
    add(seq, name, torch::nn::ReLU());
  } else if (type == "elu") {
    COHORT_ASSIGN_OR_RETURN(double alpha,
                            r.optional_in(l.has_alpha(), l.alpha(), kDefaultEluAlpha, 0, 1e9, "alpha"));
    add(seq, name, torch::nn::ELU(torch::nn::ELUOptions().alpha(alpha)));
  } else if (type == "max_pool2d" || type == "avg_pool2d") {
    COHORT_ASSIGN_OR_RETURN(PoolParams p, pool_params(r));
    if (type == "max_pool2d") {
      add(seq, name,
          torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(p.kernel).stride(p.stride).padding(p.padding)));
    } else {
      add(seq, name,
          torch::nn::AvgPool2d(torch::nn::AvgPool2dOptions(p.kernel).stride(p.stride).padding(p.padding)));
    }
  } else if (type == "flatten") {
    int64_t start = l.has_start_dim() ? l.start_dim() : kDefaultFlattenStart;
    int64_t end = l.has_end_dim() ? l.end_dim() : kDefaultFlattenEnd;
    add(seq, name, torch::nn::Flatten(torch::nn::FlattenOptions().start_dim(start).end_dim(end)));
  } else if (type == "dropout") {
    COHORT_ASSIGN_OR_RETURN(double p, r.optional_in(l.has_p(), l.p(), kDefaultDropout, 0, 1, "p"));
    add(seq, name, torch::nn::Dropout(torch::nn::DropoutOptions(p)));
  } else {
    return invalid_argument_error("{}: unknown layer type \"{}\"; known types: {}", r.where(), type,
                                  fmt::join(layer_types(), ", "));
  }
  return ok_status();
}

}  // namespace

const std::vector<std::string>& layer_types() {
  static const std::vector<std::string> kTypes = {
      "linear", "conv2d", "parallel_conv2d", "batchnorm1d", "batchnorm2d", "multi_node_batchnorm",
      "relu",   "elu",    "max_pool2d",      "avg_pool2d",  "flatten",     "dropout"};
  return kTypes;
}

std::string layer_name(const v1::Layer& layer, int index) {
  return layer.name().empty() ? layer.type() + std::to_string(index) : layer.name();
}

StatusOr<torch::nn::Sequential> build_graph(const v1::Graph& graph, const GraphBuildOptions& options) {
  if (graph.layers_size() == 0) return invalid_argument_error("graph has no layers");
  torch::nn::Sequential seq;
  std::set<std::string> names;
  for (int i = 0; i < graph.layers_size(); ++i) {
    LayerReader reader(graph.layers(i), i);
    std::string name = layer_name(graph.layers(i), i);
    // libtorch joins child names with '.' in parameter paths; a dot inside one would be ambiguous.
    if (name.find('.') != std::string::npos) {
      return invalid_argument_error("{}: a layer name may not contain '.'", reader.where());
    }
    if (!names.insert(name).second) {
      return invalid_argument_error("{}: another layer is already named \"{}\"", reader.where(), name);
    }
    try {
      COHORT_RETURN_IF_ERROR(append_layer(seq, reader, name, options));
    } catch (const std::exception& e) {
      // libtorch's own checks (e.g. a constructor refusing a combination of options).
      return invalid_argument_error("{}: {}", reader.where(), e.what());
    }
  }
  return seq;
}

TorchScriptStageImpl::TorchScriptStageImpl(std::shared_ptr<void> script) : script_(std::move(script)) {
  auto* module = static_cast<torch::jit::Module*>(script_.get());
  for (const auto& param : module->named_parameters(/*recurse=*/true)) {
    std::string name = param.name;
    for (char& c : name) {
      if (c == '.') c = '_';
    }
    register_parameter(name, param.value, param.value.requires_grad());
  }
}

at::Tensor TorchScriptStageImpl::forward(const at::Tensor& x) {
  auto* module = static_cast<torch::jit::Module*>(script_.get());
  // The script's own train/eval flag follows this module's (dropout, batch norm inside it).
  if (module->is_training() != is_training()) module->train(is_training());
  return module->forward({x}).toTensor();
}

StatusOr<TorchScriptStage> load_torchscript_stage(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return not_found_error("TorchScript file {} does not exist (or is not a file)", path);
  }
  try {
    auto script = std::make_shared<torch::jit::Module>(torch::jit::load(path));
    return TorchScriptStage(std::static_pointer_cast<void>(script));
  } catch (const std::exception& e) {
    return invalid_argument_error("TorchScript file {}: torch::jit::load failed: {}", path, e.what());
  }
}

StatusOr<StageBody> build_stage_body(const v1::Stage& stage, const GraphBuildOptions& options) {
  switch (stage.body_case()) {
    case v1::Stage::kGraph: {
      COHORT_ASSIGN_OR_RETURN(torch::nn::Sequential seq, build_graph(stage.graph(), options));
      return StageBody{seq.ptr(), [m = seq.ptr()](const at::Tensor& x) { return m->forward(x); }};
    }
    case v1::Stage::kTorchscriptFile: {
      COHORT_ASSIGN_OR_RETURN(TorchScriptStage script, load_torchscript_stage(stage.torchscript_file()));
      return StageBody{script.ptr(), [m = script.ptr()](const at::Tensor& x) { return m->forward(x); }};
    }
    case v1::Stage::BODY_NOT_SET:
      break;
  }
  return invalid_argument_error("stage of rank {} has neither a graph nor a torchscript_file", stage.rank());
}

}  // namespace cohort::graph
