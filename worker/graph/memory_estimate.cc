#include "worker/graph/memory_estimate.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "worker/graph/shape_inference.h"

namespace cohort::graph {

namespace {

constexpr int64_t kSaturated = std::numeric_limits<int64_t>::max();

int64_t mul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (a < 0 || b < 0) return 0;
  return __builtin_mul_overflow(a, b, &out) ? kSaturated : out;
}

int64_t add(int64_t a, int64_t b) {
  int64_t out = 0;
  return __builtin_add_overflow(a, b, &out) ? kSaturated : out;
}

int64_t elements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n = mul(n, d);
  return n;
}

// Trainable parameters and buffers of one layer, from its declared sizes (no input shape needed).
int64_t layer_parameters(const cohort::v1::Layer& layer, int64_t world_size) {
  const std::string& type = layer.type();
  const bool bias = !layer.has_bias() || layer.bias();
  if (type == "linear") {
    return add(mul(layer.in_features(), layer.out_features()), bias ? layer.out_features() : 0);
  }
  if (type == "conv2d" || type == "parallel_conv2d") {
    int64_t out_channels = layer.out_channels();
    // parallel_conv2d splits its output channels over the ranks.
    if (type == "parallel_conv2d" && world_size > 0)
      out_channels = (out_channels + world_size - 1) / world_size;
    const int64_t weights =
        mul(mul(layer.in_channels(), out_channels), mul(layer.kernel_size(), layer.kernel_size()));
    return add(weights, bias ? out_channels : 0);
  }
  if (type == "batchnorm1d" || type == "batchnorm2d" || type == "multi_node_batchnorm") {
    return mul(4, layer.num_features());  // weight, bias, running mean and variance
  }
  return 0;
}

// Optimizer state per parameter: momentum keeps one buffer, Adam two moments.
int64_t optimizer_states(const cohort::v1::Optimizer& optimizer) {
  switch (optimizer.kind()) {
    case cohort::v1::MOMENTUM:
      return 1;
    case cohort::v1::ADAM:
      return 2;
    default:
      return optimizer.momentum() > 0 ? 1 : 0;
  }
}

struct GraphCost {
  int64_t parameters = 0;
  int64_t activations_per_sample = 0;  // every layer's output, kept for backward
};

GraphCost graph_cost(const cohort::v1::Graph& graph, std::optional<Shape> input, int64_t world_size) {
  GraphCost cost;
  ShapeInferenceOptions options;
  options.world_size = world_size;
  for (const cohort::v1::Layer& layer : graph.layers()) {
    cost.parameters = add(cost.parameters, layer_parameters(layer, world_size));
    if (!input) continue;
    cohort::v1::Graph one;
    *one.add_layers() = layer;
    StatusOr<Shape> out = infer_output_shape(one, *input, options);
    if (!out.ok()) {
      input.reset();  // later layers' activations are unknown; their parameters still count
      continue;
    }
    cost.activations_per_sample = add(cost.activations_per_sample, elements(*out));
    input = *out;
  }
  return cost;
}

int64_t bytes_of(const GraphCost& cost, const cohort::v1::JobSpec& spec) {
  // Parameters, their gradients and the optimizer's state; activations forward and their
  // gradients backward, for one batch.
  const int64_t parameter_values = mul(cost.parameters, 2 + optimizer_states(spec.optimizer()));
  const int64_t activation_values = mul(mul(cost.activations_per_sample, std::max(1, spec.batch_size())), 2);
  return mul(add(parameter_values, activation_values), kBytesPerValue);
}

}  // namespace

StatusOr<int64_t> estimate_rank_memory_bytes(const cohort::v1::JobSpec& spec) {
  const int64_t world_size = static_cast<int64_t>(spec.nodes()) * spec.procs_per_node();
  std::optional<Shape> sample;
  if (StatusOr<Shape> shape = dataset_sample_shape(spec.dataset()); shape.ok()) sample = *shape;
  switch (spec.model_case()) {
    case cohort::v1::JobSpec::kDataParallel:
      return bytes_of(graph_cost(spec.data_parallel().graph(), sample, world_size), spec);
    case cohort::v1::JobSpec::kModelParallel: {
      // Stages fed by the dataset have known input shapes; the others count their parameters.
      std::map<int, GraphCost> per_rank;
      for (const cohort::v1::Stage& stage : spec.model_parallel().stages()) {
        if (!stage.has_graph()) continue;  // TorchScript: unknown without loading it
        GraphCost cost =
            graph_cost(stage.graph(), stage.rank_in().empty() ? sample : std::nullopt, world_size);
        GraphCost& rank = per_rank[stage.rank()];
        rank.parameters = add(rank.parameters, cost.parameters);
        rank.activations_per_sample = add(rank.activations_per_sample, cost.activations_per_sample);
      }
      int64_t most = 0;
      for (const auto& item : per_rank) most = std::max(most, bytes_of(item.second, spec));
      return most;
    }
    case cohort::v1::JobSpec::MODEL_NOT_SET:
      break;
  }
  return invalid_argument_error("cannot estimate the memory of a job without a model");
}

}  // namespace cohort::graph
