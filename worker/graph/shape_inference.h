#pragma once

// Dry shape inference over job graphs: what a JobSpec's model would do to one sample's shape,
// layer by layer, without libtorch. The coordinator runs validate_model at submit time so a job
// whose layers do not fit together is rejected before anything is queued; the CLI runs it before
// submitting; the worker can reuse infer_output_shape.
//
//   Status status = cohort::graph::validate_model(spec);
//   // INVALID_ARGUMENT: "invalid model: data_parallel.graph.layers[5] (linear 'fc1'): in_features is
//   // 3136 but its input has 1568 features (32 x 7 x 7 flattened by layers[4] flatten)"
//
// Shapes are per sample, without the batch dimension: Fashion-MNIST's is [1, 28, 28]. Every problem
// is reported, not only the first; each names the field path, the layer (index, type, name) and the
// values. After a problem, inference goes on with the shape the layer declares where it can
// (a conv2d with the wrong in_channels still outputs out_channels), so later mistakes show too.
//
// Structural checks (counts, names, stage ranks inside the world, each rank_in matched by a
// rank_out at the rank level) are cohort::coordinator::validate_job_spec's; this file adds the
// layer, shape, dataset, class-count, loss and stage-wiring (message counts, deadlock) checks.
// Pure functions except for the file-system checks (dataset directory, IDX headers, TorchScript
// files), which read the local disk; thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/v1/job.pb.h"
#include "worker/base/status.h"

namespace cohort::graph {

// Where Fashion-MNIST is read from when dataset.path is empty: Debian's dataset-fashion-mnist
// install directory (the same as cohort::train::kFashionMnistDir, which needs libtorch to include).
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Fashion-MNIST's sample shape and class count.
inline constexpr int64_t kFashionMnistChannels = 1;
inline constexpr int64_t kFashionMnistSide = 28;
inline constexpr int64_t kFashionMnistClasses = 10;

// The four IDX files a fashion_mnist or idx_dir directory holds, each plain or with ".gz".
inline constexpr const char* kIdxFiles[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                            "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

// The layer types of cohort.v1.Layer (job.proto), as graph_builder builds them.
inline constexpr const char* kLayerTypes[] = {
    "linear", "conv2d", "parallel_conv2d", "batchnorm1d", "batchnorm2d", "multi_node_batchnorm",
    "relu",   "elu",    "max_pool2d",      "avg_pool2d",  "flatten",     "dropout"};

// The losses JobSpec.loss names.
inline constexpr const char* kLosses[] = {"cross_entropy", "nll", "mse"};

// One sample's shape, without the batch dimension.
using Shape = std::vector<int64_t>;

// "64 x 7 x 7".
std::string format_shape(const Shape& shape);

// The directory a fashion_mnist / idx_dir dataset is read from: dataset.path, or
// kDefaultFashionMnistDir for fashion_mnist when it is empty.
std::string dataset_dir(const cohort::v1::Dataset& dataset);

// The shape of one sample of `dataset`: [1, 28, 28] for fashion_mnist; for idx_dir [1, H, W] from the
// train-images IDX header when the file is readable (else [1, 28, 28], the layout idx_dir promises);
// input_shape for synthetic. INVALID_ARGUMENT for an unspecified kind or an empty input_shape.
StatusOr<Shape> dataset_sample_shape(const cohort::v1::Dataset& dataset);

// The number of label classes, or 0 when it is not known without reading the labels (idx_dir).
int64_t dataset_num_classes(const cohort::v1::Dataset& dataset);

struct ShapeInferenceOptions {
  // Ranks a parallel_conv2d's output channels are split over (each needs at least one); 0 skips the check.
  int64_t world_size = 0;
};

// The output shape of `graph` for one sample of shape `input`; INVALID_ARGUMENT listing every
// problem, paths relative to the graph ("layers[3] (conv2d 'conv2'): ...").
StatusOr<Shape> infer_output_shape(const cohort::v1::Graph& graph, const Shape& input,
                                   const ShapeInferenceOptions& options = {});

struct ModelValidationOptions {
  // Also check that stage ranks lie inside the world and that every rank_in has a matching
  // rank_out at the rank level (and the reverse). validate_job_spec makes these checks too; callers
  // that run both (the coordinator's SubmitJob) turn this off so each problem is reported once.
  bool check_stage_ranks = true;
  // Check the local file system: the dataset directory and its IDX files, TorchScript stage files.
  bool check_files = true;
};

// OK, or INVALID_ARGUMENT ("invalid model: ...; ...") listing every problem with the model, the
// dataset it reads and the loss. Blocking only for the file-system checks.
Status validate_model(const cohort::v1::JobSpec& spec, const ModelValidationOptions& options = {});

}  // namespace cohort::graph
