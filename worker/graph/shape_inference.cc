#include "worker/graph/shape_inference.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

namespace cohort::graph {
namespace {

namespace pb = google::protobuf;

// IDX: a 4-byte magic (0, 0, element type, number of dimensions), then one big-endian uint32 per
// dimension. Images are N × H × W.
constexpr int kIdxMagicBytes = 4;
constexpr int kIdxImageDims = 3;
constexpr int kIdxMaxDims = 8;

// Collects problems, each a complete sentence naming the field and its values.
class Problems {
 public:
  template <typename... Args>
  void add(fmt::format_string<Args...> format, Args&&... args) {
    list_.push_back(fmt::format(format, std::forward<Args>(args)...));
  }
  bool empty() const { return list_.empty(); }
  Status status(std::string_view what) const {
    if (list_.empty()) return ok_status();
    return invalid_argument_error("invalid {}: {}", what, fmt::join(list_, "; "));
  }

 private:
  std::vector<std::string> list_;
};

bool file_exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

bool dir_exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

// The file `base` or `base`.gz in `dir`, whichever exists; empty when neither does.
std::string find_idx_file(const std::string& dir, const std::string& base) {
  for (const std::string& candidate : {dir + "/" + base, dir + "/" + base + ".gz"}) {
    if (file_exists(candidate)) return candidate;
  }
  return "";
}

// The dimensions in an IDX file's header (zlib reads plain and gzipped files alike).
StatusOr<std::vector<int64_t>> read_idx_dims(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return not_found_error("cannot open {}", path);
  std::array<unsigned char, kIdxMagicBytes + 4 * kIdxMaxDims> header{};
  const int got = gzread(file, header.data(), static_cast<unsigned>(header.size()));
  gzclose(file);
  if (got < kIdxMagicBytes || header[0] != 0 || header[1] != 0 || header[3] == 0 || header[3] > kIdxMaxDims) {
    return invalid_argument_error("{} is not an IDX file (its header is not 0, 0, type, dims)", path);
  }
  const int dims = header[3];
  if (got < kIdxMagicBytes + 4 * dims)
    return invalid_argument_error("{} is truncated inside its header", path);
  std::vector<int64_t> result;
  for (int d = 0; d < dims; ++d) {
    const unsigned char* p = header.data() + kIdxMagicBytes + 4 * d;
    result.push_back((int64_t{p[0]} << 24) | (int64_t{p[1]} << 16) | (int64_t{p[2]} << 8) | int64_t{p[3]});
  }
  return result;
}

// ---- layers ----------------------------------------------------------------------------------

// The parameters each layer type reads (job.proto's Layer comments); `type` and `name` belong to all.
struct LayerKind {
  const char* type;
  std::vector<const char*> required;
  std::vector<const char*> optional;
};

const std::vector<LayerKind>& layer_kinds() {
  static const std::vector<LayerKind> kinds = {
      {"linear", {"in_features", "out_features"}, {"bias"}},
      {"conv2d", {"in_channels", "out_channels", "kernel_size"}, {"stride", "padding", "bias"}},
      {"parallel_conv2d", {"in_channels", "out_channels", "kernel_size"}, {"stride", "padding", "bias"}},
      {"batchnorm1d", {"num_features"}, {"eps", "momentum"}},
      {"batchnorm2d", {"num_features"}, {"eps", "momentum"}},
      {"multi_node_batchnorm", {"num_features"}, {"eps", "momentum"}},
      {"relu", {}, {}},
      {"elu", {}, {"alpha"}},
      {"max_pool2d", {"kernel_size"}, {"stride", "padding"}},
      {"avg_pool2d", {"kernel_size"}, {"stride", "padding"}},
      {"flatten", {}, {"start_dim", "end_dim"}},
      {"dropout", {}, {"p"}},
  };
  return kinds;
}

const LayerKind* find_layer_kind(const std::string& type) {
  for (const LayerKind& kind : layer_kinds()) {
    if (type == kind.type) return &kind;
  }
  return nullptr;
}

bool contains(const std::vector<const char*>& names, const std::string& name) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return name == n; });
}

// Parameters that are sizes (>= 1) and offsets (>= 0).
constexpr const char* kPositiveParameters[] = {"in_features", "out_features", "in_channels", "out_channels",
                                               "kernel_size", "stride",       "num_features"};

// A shape flowing through a graph, and a phrase saying where it came from, for messages.
struct Flow {
  std::optional<Shape> shape;  // nullopt: unknown (after a TorchScript stage or a problem)
  std::string origin;          // "after layers[4] max_pool2d", "of the dataset's samples"
  std::string detail;          // when set, replaces "<shape> <origin>" in messages

  std::string describe() const {
    if (!detail.empty()) return detail;
    return shape ? fmt::format("{} {}", format_shape(*shape), origin) : "unknown";
  }
};

// Walks one graph, layer by layer.
class GraphChecker {
 public:
  GraphChecker(std::string path, const ShapeInferenceOptions& options, Problems& problems)
      : path_(std::move(path)), options_(options), problems_(problems) {}

  // The output flow of the graph; problems go to `problems`.
  Flow run(const cohort::v1::Graph& graph, Flow flow) {
    for (int i = 0; i < graph.layers_size(); ++i) flow = layer(i, graph.layers(i), std::move(flow));
    return flow;
  }

 private:
  template <typename... Args>
  void problem(fmt::format_string<Args...> format, Args&&... args) {
    problems_.add("{}: {}", label_, fmt::format(format, std::forward<Args>(args)...));
  }

  Flow layer(int index, const cohort::v1::Layer& layer, Flow in);
  bool check_parameters(const cohort::v1::Layer& layer, const LayerKind& kind);
  Flow linear(const cohort::v1::Layer& layer, const Flow& in);
  Flow conv(const cohort::v1::Layer& layer, const Flow& in);
  Flow pool(const cohort::v1::Layer& layer, const Flow& in);
  Flow batchnorm(const cohort::v1::Layer& layer, const Flow& in);
  Flow flatten(const cohort::v1::Layer& layer, const Flow& in);
  // out = (in + 2 padding - kernel) / stride + 1 per spatial side; nullopt (reported) when <= 0.
  std::optional<Shape> spatial(const Shape& in, int64_t channels, int64_t kernel, int64_t stride,
                               int64_t padding, const Flow& flow);

  std::string path_;
  const ShapeInferenceOptions& options_;
  Problems& problems_;
  std::string label_;  // "data_parallel.graph.layers[5] (linear 'fc1')"
  std::string short_;  // "layers[5] linear"
};

bool GraphChecker::check_parameters(const cohort::v1::Layer& layer, const LayerKind& kind) {
  const pb::Descriptor* descriptor = layer.GetDescriptor();
  const pb::Reflection* reflection = layer.GetReflection();
  bool ok = true;
  std::vector<std::string> takes;
  for (const char* name : kind.required) takes.push_back(name);
  for (const char* name : kind.optional) takes.push_back(name);
  for (int f = 0; f < descriptor->field_count(); ++f) {
    const pb::FieldDescriptor* field = descriptor->field(f);
    const std::string& name = field->name();
    if (name == "type" || name == "name") continue;
    const bool set = reflection->HasField(layer, field);
    const bool belongs = contains(kind.required, name) || contains(kind.optional, name);
    if (set && !belongs) {
      problem("{} does not belong to a {} layer; {} takes {}", name, kind.type, kind.type,
              takes.empty() ? std::string("no parameters") : fmt::format("{}", fmt::join(takes, ", ")));
      ok = false;
    } else if (!set && contains(kind.required, name)) {
      problem("{} is not set; a {} layer needs {}", name, kind.type, fmt::join(kind.required, ", "));
      ok = false;
    } else if (set && field->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64) {
      const int64_t value = reflection->GetInt64(layer, field);
      const bool positive = std::any_of(std::begin(kPositiveParameters), std::end(kPositiveParameters),
                                        [&](const char* n) { return name == n; });
      if (positive && value < 1) {
        problem("{} is {}; it must be at least 1", name, value);
        ok = false;
      } else if (name == "padding" && value < 0) {
        problem("padding is {}; it must not be negative", value);
        ok = false;
      }
    }
  }
  if (layer.has_p() && (layer.p() < 0 || layer.p() > 1)) {
    problem("p is {}; a dropout probability must be in [0, 1]", layer.p());
    ok = false;
  }
  if (layer.has_eps() && !(layer.eps() > 0)) {
    problem("eps is {}; it must be positive", layer.eps());
    ok = false;
  }
  if (layer.has_momentum() && (layer.momentum() < 0 || layer.momentum() > 1)) {
    problem("momentum is {}; it must be in [0, 1]", layer.momentum());
    ok = false;
  }
  return ok;
}

Flow GraphChecker::layer(int index, const cohort::v1::Layer& layer, Flow in) {
  const std::string name = layer.name().empty() ? fmt::format("{}{}", layer.type(), index) : layer.name();
  label_ = fmt::format("{}layers[{}] ({} '{}')", path_, index, layer.type(), name);
  short_ = fmt::format("layers[{}] {}", index, layer.type());
  const LayerKind* kind = find_layer_kind(layer.type());
  if (kind == nullptr) {
    problem("unknown layer type '{}'; the layer types are {}", layer.type(),
            fmt::join(std::begin(kLayerTypes), std::end(kLayerTypes), ", "));
    return Flow{std::nullopt, "", ""};
  }
  if (!check_parameters(layer, *kind)) {
    // The parameters the shapes depend on may be missing or meaningless: stop inferring here.
    return Flow{std::nullopt, "", ""};
  }
  const std::string& type = layer.type();
  if (type == "linear") return linear(layer, in);
  if (type == "conv2d" || type == "parallel_conv2d") return conv(layer, in);
  if (type == "max_pool2d" || type == "avg_pool2d") return pool(layer, in);
  if (type == "batchnorm1d" || type == "batchnorm2d" || type == "multi_node_batchnorm")
    return batchnorm(layer, in);
  if (type == "flatten") return flatten(layer, in);
  // relu, elu, dropout: elementwise.
  return Flow{in.shape, in.shape ? "after " + short_ : "", ""};
}

Flow GraphChecker::linear(const cohort::v1::Layer& layer, const Flow& in) {
  if (!in.shape) return Flow{std::nullopt, "", ""};
  Shape out = *in.shape;
  const int64_t features = out.back();
  if (features != layer.in_features()) {
    problem("in_features is {} but its input has {} feature{} ({}){}", layer.in_features(), features,
            features == 1 ? "" : "s", in.describe(), out.size() > 1 ? "; add a flatten layer before it" : "");
  }
  out.back() = layer.out_features();
  return Flow{out, "after " + short_, ""};
}

std::optional<Shape> GraphChecker::spatial(const Shape& in, int64_t channels, int64_t kernel, int64_t stride,
                                           int64_t padding, const Flow& flow) {
  // floor((size + 2 padding - kernel) / stride) + 1 per side, as PyTorch (dilation 1, no ceil mode).
  auto side = [&](int64_t size) {
    const int64_t span = size + 2 * padding - kernel;
    return (span >= 0 ? span / stride : -((-span + stride - 1) / stride)) + 1;
  };
  const int64_t height = side(in[1]);
  const int64_t width = side(in[2]);
  if (height < 1 || width < 1) {
    problem(
        "its output would be {} x {} ((size + 2 x padding {} - kernel_size {}) / stride {} + 1 per side): "
        "the input {} is too small; add padding, shrink the kernel or remove an earlier pooling layer",
        height, width, padding, kernel, stride, flow.describe());
    return std::nullopt;
  }
  return Shape{channels, height, width};
}

Flow GraphChecker::conv(const cohort::v1::Layer& layer, const Flow& in) {
  if (options_.world_size > 0 && layer.type() == "parallel_conv2d" &&
      layer.out_channels() < options_.world_size) {
    problem("out_channels is {} but parallel_conv2d splits them over {} ranks; each rank needs at least one",
            layer.out_channels(), options_.world_size);
  }
  if (!in.shape) return Flow{std::nullopt, "", ""};
  const Shape& shape = *in.shape;
  if (shape.size() != 3) {
    problem("{} needs a channels x height x width input, but its input is {}", layer.type(), in.describe());
    return Flow{std::nullopt, "", ""};
  }
  if (shape[0] != layer.in_channels()) {
    problem("in_channels is {} but its input has {} channel{} ({})", layer.in_channels(), shape[0],
            shape[0] == 1 ? "" : "s", in.describe());
  }
  std::optional<Shape> out = spatial(shape, layer.out_channels(), layer.kernel_size(),
                                     layer.has_stride() ? layer.stride() : 1, layer.padding(), in);
  return Flow{out, out ? "after " + short_ : "", ""};
}

Flow GraphChecker::pool(const cohort::v1::Layer& layer, const Flow& in) {
  const int64_t kernel = layer.kernel_size();
  // PyTorch rejects padding wider than half the kernel.
  if (layer.padding() > kernel / 2) {
    problem("padding is {} but kernel_size is {}; pooling padding must be at most half the kernel ({})",
            layer.padding(), kernel, kernel / 2);
  }
  if (!in.shape) return Flow{std::nullopt, "", ""};
  const Shape& shape = *in.shape;
  if (shape.size() != 3) {
    problem("{} needs a channels x height x width input, but its input is {}", layer.type(), in.describe());
    return Flow{std::nullopt, "", ""};
  }
  std::optional<Shape> out =
      spatial(shape, shape[0], kernel, layer.has_stride() ? layer.stride() : kernel, layer.padding(), in);
  return Flow{out, out ? "after " + short_ : "", ""};
}

Flow GraphChecker::batchnorm(const cohort::v1::Layer& layer, const Flow& in) {
  if (!in.shape) return Flow{std::nullopt, "", ""};
  const Shape& shape = *in.shape;
  const std::string& type = layer.type();
  // Per sample: batchnorm1d takes [C] or [C, L]; batchnorm2d [C, H, W]; multi_node_batchnorm [C, *].
  const bool rank_ok = type == "batchnorm1d"   ? (shape.size() == 1 || shape.size() == 2)
                       : type == "batchnorm2d" ? shape.size() == 3
                                               : !shape.empty();
  if (!rank_ok) {
    problem("{} needs a {} input, but its input is {}", type,
            type == "batchnorm1d" ? "features or channels x length" : "channels x height x width",
            in.describe());
    return Flow{std::nullopt, "", ""};
  }
  if (shape[0] != layer.num_features()) {
    problem("num_features is {} but its input has {} {}{} ({})", layer.num_features(), shape[0],
            shape.size() == 1 ? "feature" : "channel", shape[0] == 1 ? "" : "s", in.describe());
  }
  return Flow{shape, "after " + short_, ""};
}

Flow GraphChecker::flatten(const cohort::v1::Layer& layer, const Flow& in) {
  if (!in.shape) return Flow{std::nullopt, "", ""};
  const Shape& shape = *in.shape;
  // start_dim / end_dim count the batch dimension (PyTorch's), so sample dimension d is d + 1.
  const int64_t full_rank = static_cast<int64_t>(shape.size()) + 1;
  auto normalize = [&](int64_t d) { return d < 0 ? d + full_rank : d; };
  const int64_t start = normalize(layer.has_start_dim() ? layer.start_dim() : 1);
  const int64_t end = normalize(layer.has_end_dim() ? layer.end_dim() : -1);
  if (start < 0 || start >= full_rank || end < 0 || end >= full_rank) {
    problem("start_dim {} / end_dim {} are outside the {} dimensions (batch included) of its input {}",
            layer.has_start_dim() ? layer.start_dim() : 1, layer.has_end_dim() ? layer.end_dim() : -1,
            full_rank, in.describe());
    return Flow{std::nullopt, "", ""};
  }
  if (start == 0) {
    problem("start_dim 0 would merge the batch dimension into the features; use 1 (the default)");
    return Flow{std::nullopt, "", ""};
  }
  if (start > end) {
    problem("start_dim {} comes after end_dim {}", start, end);
    return Flow{std::nullopt, "", ""};
  }
  Shape out(shape.begin(), shape.begin() + (start - 1));
  int64_t merged = 1;
  for (int64_t d = start - 1; d <= end - 1; ++d) merged *= shape[d];
  out.push_back(merged);
  out.insert(out.end(), shape.begin() + end, shape.end());
  return Flow{out, "after " + short_, fmt::format("{} flattened by {}", format_shape(shape), short_)};
}

// ---- dataset ---------------------------------------------------------------------------------

void check_dataset_files(const cohort::v1::Dataset& dataset, Problems& problems) {
  if (dataset.kind() != cohort::v1::FASHION_MNIST && dataset.kind() != cohort::v1::IDX_DIR) return;
  if (dataset.kind() == cohort::v1::IDX_DIR && dataset.path().empty()) return;  // validate_job_spec's
  const std::string dir = dataset_dir(dataset);
  if (!dir_exists(dir)) {
    if (dataset.path().empty()) {
      problems.add(
          "dataset.path is empty and the default Fashion-MNIST directory {} does not exist; install Debian's "
          "dataset-fashion-mnist or set dataset.path to a directory with the four IDX files",
          dir);
    } else {
      problems.add(
          "dataset.path '{}' does not exist or is not a directory; give a directory with {} (plain or .gz)",
          dir, fmt::join(std::begin(kIdxFiles), std::end(kIdxFiles), ", "));
    }
    return;
  }
  std::vector<std::string> missing;
  for (const char* base : kIdxFiles) {
    if (find_idx_file(dir, base).empty()) missing.push_back(base);
  }
  if (!missing.empty()) {
    problems.add("dataset.path '{}' has no {} (plain or .gz); a {} directory needs all of {}", dir,
                 fmt::join(missing, ", "),
                 dataset.kind() == cohort::v1::FASHION_MNIST ? "fashion_mnist" : "idx_dir",
                 fmt::join(std::begin(kIdxFiles), std::end(kIdxFiles), ", "));
    return;
  }
  const std::string images = find_idx_file(dir, kIdxFiles[0]);
  StatusOr<std::vector<int64_t>> dims = read_idx_dims(images);
  if (!dims.ok()) {
    problems.add("dataset: {}", dims.status().message());
  } else if (dims->size() != kIdxImageDims) {
    problems.add("dataset: {} has {} dimensions; image files hold count x height x width (3)", images,
                 dims->size());
  }
}

// ---- model parallel --------------------------------------------------------------------------

// One step of a rank's program: the stages it runs, in list order, each receiving from its rank_in
// (in order), computing, then sending to its rank_out (in order).
struct Step {
  enum Kind { kRecv, kCompute, kSend } kind;
  int stage;
  int peer;     // kRecv / kSend
  int64_t seq;  // the message's number on the (sender → receiver) channel
};

class PipelineChecker {
 public:
  PipelineChecker(const cohort::v1::JobSpec& spec, const ModelValidationOptions& options, Problems& problems)
      : model_(spec.model_parallel()),
        options_(options),
        problems_(problems),
        world_(static_cast<int64_t>(spec.nodes()) * spec.procs_per_node()) {}

  // Stage outputs that go to the loss (empty rank_out), with their paths.
  std::vector<std::pair<std::string, Flow>> run(const Flow& dataset);

 private:
  bool in_world(int64_t rank) const { return rank >= 0 && rank < world_; }
  bool check_wiring();
  void build_programs();
  void simulate(const Flow& dataset);
  void compute(int stage, const Flow& dataset);
  std::string stage_path(int i) const { return fmt::format("model_parallel.stages[{}]", i); }

  const cohort::v1::ModelParallelModel& model_;
  const ModelValidationOptions& options_;
  Problems& problems_;
  int64_t world_;
  // Stage indexes sending / receiving on each (sender, receiver) channel, in program order.
  std::map<std::pair<int, int>, std::vector<int>> sends_, recvs_;
  std::map<int, std::vector<Step>> programs_;
  std::map<int, std::vector<Flow>> inputs_;  // stage → flows received, in rank_in order
  std::map<int, Flow> outputs_;
  std::vector<bool> computed_;
};

bool PipelineChecker::check_wiring() {
  bool ok = true;
  for (int i = 0; i < model_.stages_size(); ++i) {
    const cohort::v1::Stage& stage = model_.stages(i);
    if (!in_world(stage.rank())) {
      if (options_.check_stage_ranks) {
        problems_.add("{}.rank is {}; the world has ranks 0 .. {} (nodes x procs_per_node)", stage_path(i),
                      stage.rank(), world_ - 1);
      }
      ok = false;
      continue;
    }
    for (int j = 0; j < stage.rank_in_size(); ++j) {
      if (in_world(stage.rank_in(j))) {
        recvs_[{stage.rank_in(j), stage.rank()}].push_back(i);
      } else {
        if (options_.check_stage_ranks) {
          problems_.add("{}.rank_in[{}] is {}; the world has ranks 0 .. {}", stage_path(i), j,
                        stage.rank_in(j), world_ - 1);
        }
        ok = false;
      }
    }
    for (int j = 0; j < stage.rank_out_size(); ++j) {
      if (in_world(stage.rank_out(j))) {
        sends_[{stage.rank(), stage.rank_out(j)}].push_back(i);
      } else {
        if (options_.check_stage_ranks) {
          problems_.add("{}.rank_out[{}] is {}; the world has ranks 0 .. {}", stage_path(i), j,
                        stage.rank_out(j), world_ - 1);
        }
        ok = false;
      }
    }
  }
  auto stage_list = [](const std::vector<int>& stages) {
    std::vector<std::string> names;
    for (int s : stages) names.push_back(fmt::format("stages[{}]", s));
    return fmt::format("{}", fmt::join(names, ", "));
  };
  std::set<std::pair<int, int>> channels;
  for (const auto& entry : sends_) channels.insert(entry.first);
  for (const auto& entry : recvs_) channels.insert(entry.first);
  for (const std::pair<int, int>& channel : channels) {
    const auto [from, to] = channel;
    const std::vector<int>& sent = sends_[channel];
    const std::vector<int>& received = recvs_[channel];
    if (sent.size() == received.size()) continue;
    ok = false;
    if (sent.empty()) {
      if (options_.check_stage_ranks) {
        problems_.add(
            "model_parallel.{} receives from rank {} (rank_in), but rank {} sends nothing to rank {}: no "
            "stage on rank {} lists {} in rank_out",
            stage_list(received), from, from, to, from, to);
      }
    } else if (received.empty()) {
      if (options_.check_stage_ranks) {
        problems_.add(
            "model_parallel.{} sends to rank {} (rank_out), but rank {} receives nothing from rank {}: no "
            "stage on rank {} lists {} in rank_in",
            stage_list(sent), to, to, from, to, from);
      }
    } else {
      problems_.add(
          "model_parallel: rank {} sends {} outputs to rank {} ({}) but rank {} receives {} ({}); every "
          "rank_out needs a matching rank_in, in the same order",
          from, sent.size(), to, stage_list(sent), to, received.size(), stage_list(received));
    }
  }
  return ok;
}

void PipelineChecker::build_programs() {
  std::map<std::pair<int, int>, int64_t> sent, received;
  for (int i = 0; i < model_.stages_size(); ++i) {
    const cohort::v1::Stage& stage = model_.stages(i);
    if (!in_world(stage.rank())) continue;
    std::vector<Step>& program = programs_[stage.rank()];
    for (int src : stage.rank_in()) {
      if (in_world(src)) program.push_back({Step::kRecv, i, src, received[{src, stage.rank()}]++});
    }
    program.push_back({Step::kCompute, i, -1, 0});
    for (int dst : stage.rank_out()) {
      if (in_world(dst)) program.push_back({Step::kSend, i, dst, sent[{stage.rank(), dst}]++});
    }
  }
}

void PipelineChecker::compute(int i, const Flow& dataset) {
  const cohort::v1::Stage& stage = model_.stages(i);
  Flow in;
  const std::vector<Flow>& received = inputs_[i];
  if (stage.rank_in().empty()) {
    in = dataset;
  } else if (received.size() == 1) {
    in = received[0];
  } else {
    // Several inputs: how the stage combines them is the stage's business; infer no further.
    in = Flow{std::nullopt, "", ""};
  }
  Flow out;
  if (stage.has_graph() && stage.graph().layers_size() > 0) {
    ShapeInferenceOptions shape_options;
    shape_options.world_size = world_;
    GraphChecker checker(stage_path(i) + ".graph.", shape_options, problems_);
    out = checker.run(stage.graph(), in);
    if (out.shape) {
      out.origin = fmt::format("from {} on rank {}", stage_path(i), stage.rank());
      out.detail.clear();
    }
  } else {
    if (options_.check_files && stage.body_case() == cohort::v1::Stage::kTorchscriptFile &&
        !file_exists(stage.torchscript_file())) {
      problems_.add(
          "{}.torchscript_file '{}' does not exist; save the module with torch.jit.save and give its path",
          stage_path(i), stage.torchscript_file());
    }
    // A TorchScript module's output shape is unknown until it runs (an empty graph is
    // validate_job_spec's to report).
    out = Flow{std::nullopt, "", ""};
  }
  outputs_[i] = out;
  computed_[i] = true;
}

void PipelineChecker::simulate(const Flow& dataset) {
  // Rendezvous semantics: a send completes only together with its receive (large tensors go
  // that way over UCX), so an order that would only work with buffered sends is a deadlock.
  std::map<int, size_t> pc;
  auto current = [&](int rank) -> const Step* {
    auto program = programs_.find(rank);
    if (program == programs_.end() || pc[rank] >= program->second.size()) return nullptr;
    return &program->second[pc[rank]];
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (const auto& entry : programs_) {
      const int rank = entry.first;
      while (const Step* step = current(rank)) {
        if (step->kind == Step::kCompute) {
          compute(step->stage, dataset);
          ++pc[rank];
          progress = true;
          continue;
        }
        const Step* peer = current(step->peer);
        const Step::Kind wanted = step->kind == Step::kRecv ? Step::kSend : Step::kRecv;
        if (peer == nullptr || peer->kind != wanted || peer->peer != rank || peer->seq != step->seq) break;
        const Step& send = step->kind == Step::kSend ? *step : *peer;
        const Step& recv = step->kind == Step::kRecv ? *step : *peer;
        inputs_[recv.stage].push_back(outputs_[send.stage]);
        ++pc[rank];
        ++pc[step->peer];
        progress = true;
      }
    }
  }
  std::vector<std::string> stuck;
  for (const auto& entry : programs_) {
    const int rank = entry.first;
    if (const Step* step = current(rank)) {
      stuck.push_back(fmt::format("rank {} waits at {} to {} rank {}", rank, stage_path(step->stage),
                                  step->kind == Step::kRecv ? "receive from" : "send to", step->peer));
    }
  }
  if (!stuck.empty()) {
    problems_.add(
        "model_parallel: the stage wiring cannot complete: each rank runs its stages in list order and a "
        "send waits for its receive, so {}; reorder the stages or their rank_in / rank_out",
        fmt::join(stuck, ", "));
  }
}

std::vector<std::pair<std::string, Flow>> PipelineChecker::run(const Flow& dataset) {
  computed_.assign(model_.stages_size(), false);
  const bool wired = check_wiring();
  build_programs();
  if (wired) {
    simulate(dataset);
  }
  // Stages the wiring never reached still get their layers checked, without an input shape.
  for (int i = 0; i < model_.stages_size(); ++i) {
    if (computed_[i]) continue;
    inputs_[i].clear();  // a stage with rank_in and nothing received infers from an unknown input
    compute(i, dataset);
  }
  std::vector<std::pair<std::string, Flow>> ends;
  for (int i = 0; i < model_.stages_size(); ++i) {
    if (model_.stages(i).rank_out().empty()) ends.emplace_back(stage_path(i), outputs_[i]);
  }
  return ends;
}

// ---- loss ------------------------------------------------------------------------------------

void check_output(const std::string& path, const Flow& out, const cohort::v1::JobSpec& spec,
                  Problems& problems) {
  const std::string& loss = spec.loss();
  if (!out.shape || (loss != "cross_entropy" && loss != "nll")) return;
  const int64_t classes = dataset_num_classes(spec.dataset());
  const std::string dataset_name =
      spec.dataset().kind() == cohort::v1::FASHION_MNIST ? "fashion_mnist" : "the synthetic dataset";
  const Shape& shape = *out.shape;
  if (shape.size() != 1) {
    problems.add(
        "{}: the output is {}, but {} needs one score per class ([{}]); end with a flatten and a linear "
        "layer",
        path, out.describe(), loss, classes > 0 ? std::to_string(classes) : "classes");
  } else if (classes > 0 && shape[0] != classes) {
    problems.add(
        "{}: the output has {} scores ({}), but {} has {} classes; set the last layer's output size to {}",
        path, shape[0], out.describe(), dataset_name, classes, classes);
  }
}

}  // namespace

std::string format_shape(const Shape& shape) {
  if (shape.empty()) return "a scalar";
  return fmt::format("{}", fmt::join(shape, " x "));
}

std::string dataset_dir(const cohort::v1::Dataset& dataset) {
  if (dataset.path().empty() && dataset.kind() == cohort::v1::FASHION_MNIST) return kDefaultFashionMnistDir;
  return dataset.path();
}

StatusOr<Shape> dataset_sample_shape(const cohort::v1::Dataset& dataset) {
  const Shape image = {kFashionMnistChannels, kFashionMnistSide, kFashionMnistSide};
  switch (dataset.kind()) {
    case cohort::v1::FASHION_MNIST:
      return image;
    case cohort::v1::IDX_DIR: {
      const std::string images = find_idx_file(dataset_dir(dataset), kIdxFiles[0]);
      if (images.empty()) return image;
      StatusOr<std::vector<int64_t>> dims = read_idx_dims(images);
      if (!dims.ok() || dims->size() != kIdxImageDims) return image;
      return Shape{1, (*dims)[1], (*dims)[2]};
    }
    case cohort::v1::SYNTHETIC:
      if (dataset.input_shape().empty()) {
        return invalid_argument_error("dataset.input_shape is empty; synthetic data needs a sample shape");
      }
      return Shape(dataset.input_shape().begin(), dataset.input_shape().end());
    default:
      return invalid_argument_error("dataset.kind is not set; use fashion_mnist, idx_dir or synthetic");
  }
}

int64_t dataset_num_classes(const cohort::v1::Dataset& dataset) {
  switch (dataset.kind()) {
    case cohort::v1::FASHION_MNIST:
      return kFashionMnistClasses;
    case cohort::v1::SYNTHETIC:
      return dataset.num_classes();
    default:
      return 0;
  }
}

StatusOr<Shape> infer_output_shape(const cohort::v1::Graph& graph, const Shape& input,
                                   const ShapeInferenceOptions& options) {
  Problems problems;
  GraphChecker checker("", options, problems);
  Flow out = checker.run(graph, Flow{input, "of the input", ""});
  COHORT_RETURN_IF_ERROR(problems.status("graph"));
  if (!out.shape) return invalid_argument_error("invalid graph: the output shape cannot be inferred");
  return *out.shape;
}

Status validate_model(const cohort::v1::JobSpec& spec, const ModelValidationOptions& options) {
  Problems problems;
  const std::string& loss = spec.loss();
  const bool known_loss =
      std::any_of(std::begin(kLosses), std::end(kLosses), [&](const char* l) { return loss == l; });
  if (!known_loss) {
    problems.add("loss {} is not a loss; use one of {}",
                 loss.empty() ? std::string("is empty and") : "'" + loss + "'",
                 fmt::join(std::begin(kLosses), std::end(kLosses), ", "));
  }
  if (options.check_files) check_dataset_files(spec.dataset(), problems);

  Flow dataset{std::nullopt, "of the dataset's samples", ""};
  // An unusable dataset (no kind, bad input_shape) is validate_job_spec's to report; infer nothing.
  const bool shape_valid = std::all_of(spec.dataset().input_shape().begin(),
                                       spec.dataset().input_shape().end(), [](int64_t d) { return d >= 1; });
  if (StatusOr<Shape> shape = dataset_sample_shape(spec.dataset()); shape.ok() && shape_valid)
    dataset.shape = *shape;

  switch (spec.model_case()) {
    case cohort::v1::JobSpec::kDataParallel: {
      ShapeInferenceOptions shape_options;
      shape_options.world_size = static_cast<int64_t>(spec.nodes()) * spec.procs_per_node();
      GraphChecker checker("data_parallel.graph.", shape_options, problems);
      const Flow out = checker.run(spec.data_parallel().graph(), dataset);
      // An empty graph is validate_job_spec's to report; its "output" is only the input.
      if (spec.data_parallel().graph().layers_size() > 0)
        check_output("data_parallel.graph", out, spec, problems);
      break;
    }
    case cohort::v1::JobSpec::kModelParallel: {
      if (static_cast<int64_t>(spec.nodes()) * spec.procs_per_node() < 1) break;  // validate_job_spec's
      PipelineChecker pipeline(spec, options, problems);
      for (const auto& [path, out] : pipeline.run(dataset)) check_output(path, out, spec, problems);
      break;
    }
    default:
      break;  // no model: validate_job_spec reports it
  }
  return problems.status("model");
}

}  // namespace cohort::graph
