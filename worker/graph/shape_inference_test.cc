#include "worker/graph/shape_inference.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

namespace cohort::graph {
namespace {

// bench/ddp_fashion_mnist.py's network, with the layers named as PyTorch's attributes.
constexpr const char* kFashionLayers = R"(
  layers { type: "conv2d" name: "conv1" in_channels: 1 out_channels: 32 kernel_size: 3 padding: 1 }
  layers { type: "batchnorm2d" name: "bn1" num_features: 32 }
  layers { type: "relu" }
  layers { type: "max_pool2d" kernel_size: 2 }
  layers { type: "conv2d" name: "conv2" in_channels: 32 out_channels: 64 kernel_size: 3 padding: 1 }
  layers { type: "batchnorm2d" name: "bn2" num_features: 64 }
  layers { type: "relu" }
  layers { type: "max_pool2d" kernel_size: 2 }
  layers { type: "flatten" }
  layers { type: "linear" name: "fc1" in_features: 3136 out_features: 128 }
  layers { type: "relu" }
  layers { type: "linear" name: "fc2" in_features: 128 out_features: 10 }
)";

cohort::v1::Graph graph_of(const std::string& text) {
  cohort::v1::Graph graph;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &graph)) << text;
  return graph;
}

// A valid job around `model` (text of the JobSpec's model fields) on synthetic or Fashion-MNIST data.
cohort::v1::JobSpec job_of(const std::string& model,
                           const std::string& dataset =
                               "kind: SYNTHETIC train_size: 64 "
                               "input_shape: [1, 28, 28] "
                               "num_classes: 10",
                           int procs = 2) {
  cohort::v1::JobSpec spec;
  const std::string text = "name: 't' nodes: 1 procs_per_node: " + std::to_string(procs) + " dataset { " +
                           dataset + " } " + model +
                           " loss: 'cross_entropy' optimizer { kind: SGD lr: 0.1 } batch_size: 8 epochs: 1";
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec)) << text;
  return spec;
}

cohort::v1::JobSpec data_parallel(const std::string& layers) {
  return job_of("data_parallel { graph { " + layers + " } }");
}

// The message of a validation that must fail.
std::string problems_of(const cohort::v1::JobSpec& spec, const ModelValidationOptions& options = {}) {
  Status status = validate_model(spec, options);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  return status.message();
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(ShapeInferenceTest, FashionCnnEndsInTenScores) {
  StatusOr<Shape> out = infer_output_shape(graph_of(kFashionLayers), {1, 28, 28});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out, (Shape{10}));
  Status status = validate_model(data_parallel(kFashionLayers));
  EXPECT_TRUE(status.ok()) << status.to_string();
}

TEST(ShapeInferenceTest, ComputesConvPoolAndFlattenShapes) {
  StatusOr<Shape> out = infer_output_shape(graph_of(R"(
    layers { type: "conv2d" in_channels: 3 out_channels: 8 kernel_size: 5 stride: 2 }
    layers { type: "avg_pool2d" kernel_size: 3 stride: 1 padding: 1 }
    layers { type: "flatten" start_dim: 2 }
  )"),
                                           {3, 32, 30});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  // (32 - 5) / 2 + 1 = 14, (30 - 5) / 2 + 1 = 13; pooling keeps them; flatten from dim 2 merges H, W.
  EXPECT_EQ(*out, (Shape{8, 14 * 13}));
  EXPECT_EQ(format_shape({64, 7, 7}), "64 x 7 x 7");
}

TEST(ShapeInferenceTest, LinearMismatchNamesLayerValuesAndOrigin) {
  const std::string message = problems_of(data_parallel(R"(
    layers { type: "conv2d" in_channels: 1 out_channels: 32 kernel_size: 3 padding: 1 }
    layers { type: "relu" }
    layers { type: "max_pool2d" kernel_size: 2 }
    layers { type: "max_pool2d" kernel_size: 2 }
    layers { type: "flatten" }
    layers { type: "linear" name: "fc1" in_features: 3136 out_features: 10 }
  )"));
  EXPECT_HAS(message,
             "data_parallel.graph.layers[5] (linear 'fc1'): in_features is 3136 but its input has 1568 "
             "features (32 x 7 x 7 flattened by layers[4] flatten)");
}

TEST(ShapeInferenceTest, LinearWithoutFlattenSaysSo) {
  const std::string message =
      problems_of(data_parallel(R"(layers { type: "linear" in_features: 784 out_features: 10 })"));
  EXPECT_HAS(message, "layers[0] (linear 'linear0'): in_features is 784 but its input has 28 features");
  EXPECT_HAS(message, "add a flatten layer before it");
}

TEST(ShapeInferenceTest, ConvChannelMismatchAndTooSmallInput) {
  const std::string message = problems_of(data_parallel(R"(
    layers { type: "conv2d" name: "c1" in_channels: 3 out_channels: 8 kernel_size: 3 }
    layers { type: "max_pool2d" kernel_size: 13 }
    layers { type: "conv2d" name: "c2" in_channels: 8 out_channels: 8 kernel_size: 5 }
  )"));
  EXPECT_HAS(message,
             "layers[0] (conv2d 'c1'): in_channels is 3 but its input has 1 channel (1 x 28 x 28 of the "
             "dataset's samples)");
  // 26 / 13 = 2 x 2 left; a 5 x 5 kernel does not fit.
  EXPECT_HAS(message,
             "layers[2] (conv2d 'c2'): its output would be -2 x -2 ((size + 2 x padding 0 - kernel_size 5) "
             "/ stride 1 + 1 per side): the input 8 x 2 x 2 after layers[1] max_pool2d is too small");
}

TEST(ShapeInferenceTest, ParameterChecks) {
  const std::string message = problems_of(data_parallel(R"(
    layers { type: "conv" }
    layers { type: "relu" kernel_size: 3 }
    layers { type: "linear" in_features: 784 }
    layers { type: "max_pool2d" kernel_size: 0 }
    layers { type: "dropout" p: 1.5 }
    layers { type: "max_pool2d" kernel_size: 2 padding: 2 }
  )"));
  EXPECT_HAS(message,
             "layers[0] (conv 'conv0'): unknown layer type 'conv'; the layer types are linear, conv2d, "
             "parallel_conv2d");
  EXPECT_HAS(
      message,
      "layers[1] (relu 'relu1'): kernel_size does not belong to a relu layer; relu takes no parameters");
  EXPECT_HAS(message,
             "layers[2] (linear 'linear2'): out_features is not set; a linear layer needs in_features, "
             "out_features");
  EXPECT_HAS(message, "layers[3] (max_pool2d 'max_pool2d3'): kernel_size is 0; it must be at least 1");
  EXPECT_HAS(message, "layers[4] (dropout 'dropout4'): p is 1.5");
  EXPECT_HAS(message, "layers[5] (max_pool2d 'max_pool2d5'): padding is 2 but kernel_size is 2");
}

TEST(ShapeInferenceTest, BatchNormAndFlattenChecks) {
  const std::string message = problems_of(data_parallel(R"(
    layers { type: "batchnorm2d" num_features: 3 }
    layers { type: "batchnorm1d" num_features: 1 }
    layers { type: "flatten" start_dim: 0 }
  )"));
  EXPECT_HAS(message,
             "layers[0] (batchnorm2d 'batchnorm2d0'): num_features is 3 but its input has 1 channel ");
  EXPECT_HAS(
      message,
      "layers[1] (batchnorm1d 'batchnorm1d1'): batchnorm1d needs a features or channels x length input");
  // Inference stopped at layers[1]; the flatten's own mistake still needs a shape, so it is not reported.
  EXPECT_EQ(message.find("layers[2]"), std::string::npos) << message;
  const std::string flat = problems_of(data_parallel(R"(layers { type: "flatten" start_dim: 0 })"));
  EXPECT_HAS(flat, "start_dim 0 would merge the batch dimension");
}

TEST(ShapeInferenceTest, OutputMustMatchTheClasses) {
  EXPECT_HAS(
      problems_of(data_parallel(R"(
    layers { type: "flatten" }
    layers { type: "linear" name: "out" in_features: 784 out_features: 12 }
  )")),
      "data_parallel.graph: the output has 12 scores (12 after layers[1] linear), but the synthetic dataset "
      "has 10 classes");
  EXPECT_HAS(
      problems_of(data_parallel(R"(layers { type: "relu" })")),
      "the output is 1 x 28 x 28 after layers[0] relu, but cross_entropy needs one score per class ([10])");
  cohort::v1::JobSpec spec = data_parallel(kFashionLayers);
  spec.set_loss("hinge");
  EXPECT_HAS(problems_of(spec), "loss 'hinge' is not a loss; use one of cross_entropy, nll, mse");
  spec.set_loss("mse");  // no class-count rule
  EXPECT_TRUE(validate_model(spec).ok());
}

TEST(ShapeInferenceTest, EmptyGraphIsLeftToValidateJobSpec) {
  Status status = validate_model(data_parallel(""));
  EXPECT_TRUE(status.ok()) << status.to_string();
}

TEST(ShapeInferenceTest, ReportsEveryProblem) {
  cohort::v1::JobSpec spec = data_parallel(R"(
    layers { type: "conv2d" in_channels: 2 out_channels: 4 kernel_size: 3 padding: 1 }
    layers { type: "flatten" }
    layers { type: "linear" in_features: 100 out_features: 3 }
  )");
  spec.set_loss("bogus");
  const std::string message = problems_of(spec);
  EXPECT_HAS(message, "loss 'bogus'");
  EXPECT_HAS(message, "in_channels is 2");
  EXPECT_HAS(message,
             "in_features is 100 but its input has 3136 features");  // inference went on with 4 channels
}

TEST(ShapeInferenceTest, ParallelConvNeedsAChannelPerRank) {
  cohort::v1::JobSpec spec =
      job_of(R"(data_parallel { graph {
    layers { type: "parallel_conv2d" in_channels: 1 out_channels: 2 kernel_size: 3 }
    layers { type: "flatten" } layers { type: "linear" in_features: 1352 out_features: 10 } } })",
             "kind: SYNTHETIC train_size: 8 input_shape: [1, 28, 28] num_classes: 10", 4);
  EXPECT_HAS(problems_of(spec), "out_channels is 2 but parallel_conv2d splits them over 4 ranks");
}

// ---- model parallel ----

// The 3-stage MLP of worker/examples/train_mlp_model_parallel, input on rank 2, loss on rank 0.
constexpr const char* kPipeline = R"(model_parallel {
  stages { rank: 2 rank_out: 1 graph { layers { type: "flatten" } layers { type: "linear" in_features: 784 out_features: 100 } } }
  stages { rank: 1 rank_in: 2 rank_out: 0 graph { layers { type: "linear" in_features: 100 out_features: 100 } } }
  stages { rank: 0 rank_in: 1 graph { layers { type: "linear" in_features: 100 out_features: 10 } } }
})";

TEST(ShapeInferenceTest, PipelinePasses) {
  Status status = validate_model(job_of(kPipeline,
                                        "kind: SYNTHETIC train_size: 8 input_shape: [1, 28, 28] "
                                        "num_classes: 10",
                                        3));
  EXPECT_TRUE(status.ok()) << status.to_string();
}

TEST(ShapeInferenceTest, ShapesFlowBetweenStages) {
  cohort::v1::JobSpec spec = job_of(R"(model_parallel {
    stages { rank: 0 rank_out: 1 graph { layers { type: "flatten" } layers { type: "linear" in_features: 784 out_features: 64 } } }
    stages { rank: 1 rank_in: 0 graph { layers { type: "linear" name: "head" in_features: 100 out_features: 10 } } }
  })");
  EXPECT_HAS(problems_of(spec),
             "model_parallel.stages[1].graph.layers[0] (linear 'head'): in_features is 100 but its "
             "input has 64 features (64 from model_parallel.stages[0] on rank 0)");
}

TEST(ShapeInferenceTest, StageRanksAndOneSidedWiring) {
  cohort::v1::JobSpec spec = job_of(R"(model_parallel {
    stages { rank: 0 rank_out: 1 graph { layers { type: "relu" } } }
    stages { rank: 1 rank_in: 0 rank_in: 1 graph { layers { type: "relu" } } }
    stages { rank: 5 graph { layers { type: "relu" } } }
  })");
  const std::string message = problems_of(spec);
  EXPECT_HAS(message, "model_parallel.stages[2].rank is 5; the world has ranks 0 .. 1");
  EXPECT_HAS(message, "stages[1] receives from rank 1 (rank_in), but rank 1 sends nothing to rank 1");
  ModelValidationOptions options;
  options.check_stage_ranks = false;  // validate_job_spec reports these
  const std::string quiet = validate_model(spec, options).message();
  EXPECT_EQ(quiet.find("rank is 5"), std::string::npos) << quiet;
  EXPECT_EQ(quiet.find("sends nothing"), std::string::npos) << quiet;
}

TEST(ShapeInferenceTest, SendWithoutReceiveAndCountMismatch) {
  EXPECT_HAS(problems_of(job_of(R"(model_parallel {
    stages { rank: 0 rank_out: 1 graph { layers { type: "relu" } } }
    stages { rank: 1 graph { layers { type: "relu" } } }
  })")),
             "stages[0] sends to rank 1 (rank_out), but rank 1 receives nothing from rank 0");
  EXPECT_HAS(problems_of(job_of(R"(model_parallel {
    stages { rank: 0 rank_out: 1 graph { layers { type: "relu" } } }
    stages { rank: 0 rank_out: 1 graph { layers { type: "relu" } } }
    stages { rank: 1 rank_in: 0 graph { layers { type: "relu" } } }
  })")),
             "rank 0 sends 2 outputs to rank 1 (stages[0], stages[1]) but rank 1 receives 1 (stages[2])");
}

// ChainerMN's NonConnectedGraph2 as stages (as //worker/runner:job_runner_test trains it): rank
// 0's output stage comes before a stage that sends, and each rank ends with its own classifier.
// The submit-time check accepts it, and still follows shapes through it.
TEST(ShapeInferenceTest, NonConnectedGraph2StagesPass) {
  const std::string ncg2 = R"(model_parallel {
    stages { rank: 1 rank_out: 0 graph { layers { type: "flatten" } layers { type: "linear" in_features: 64 out_features: 32 } } }
    stages { rank: 0 rank_in: 1 graph { layers { type: "linear" in_features: 32 out_features: 4 } } }
    stages { rank: 0 rank_out: 1 graph { layers { type: "flatten" } layers { type: "linear" in_features: 64 out_features: 32 } } }
    stages { rank: 1 rank_in: 0 graph { layers { type: "linear" in_features: IN out_features: 4 } } }
  })";
  const std::string dataset = "kind: SYNTHETIC train_size: 64 input_shape: [1, 8, 8] num_classes: 4";
  std::string good = ncg2;
  good.replace(good.find("IN"), 2, "32");
  Status status = validate_model(job_of(good, dataset));
  EXPECT_TRUE(status.ok()) << status.to_string();
  std::string bad = ncg2;
  bad.replace(bad.find("IN"), 2, "33");
  EXPECT_HAS(problems_of(job_of(bad, dataset)),
             "model_parallel.stages[3].graph.layers[0] (linear 'linear0'): in_features is 33 but its input has 32 features "
             "(32 from model_parallel.stages[2] on rank 0)");
}

TEST(ShapeInferenceTest, DeadlockIsFound) {
  // Rank 0 first waits for rank 1's output, while rank 1 first waits for rank 0's: a cycle.
  const std::string message = problems_of(job_of(R"(model_parallel {
    stages { rank: 0 rank_in: 1 graph { layers { type: "relu" } } }
    stages { rank: 1 rank_in: 0 rank_out: 0 graph { layers { type: "relu" } } }
    stages { rank: 0 rank_out: 1 graph { layers { type: "relu" } } }
  })"));
  EXPECT_HAS(message, "the stage wiring cannot complete");
  EXPECT_HAS(message, "rank 0 waits at model_parallel.stages[0] to receive from rank 1");
  EXPECT_HAS(message, "rank 1 waits at model_parallel.stages[1] to receive from rank 0");
  // The same stages in a workable order pass (rank 0 runs a stage, sends, and gets the result back).
  Status status = validate_model(job_of(R"(model_parallel {
    stages { rank: 0 rank_out: 1 graph { layers { type: "flatten" } } }
    stages { rank: 1 rank_in: 0 rank_out: 0 graph { layers { type: "linear" in_features: 784 out_features: 10 } } }
    stages { rank: 0 rank_in: 1 graph { layers { type: "relu" } } }
  })"));
  EXPECT_TRUE(status.ok()) << status.to_string();
}

TEST(ShapeInferenceTest, TorchScriptStageMustExistAndStopsInference) {
  const std::string message = problems_of(job_of(R"(model_parallel {
    stages { rank: 0 rank_out: 1 torchscript_file: "/nonexistent/stage.pt" }
    stages { rank: 1 rank_in: 0 graph { layers { type: "linear" in_features: 3 out_features: 10 } } }
  })"));
  EXPECT_HAS(message, "model_parallel.stages[0].torchscript_file '/nonexistent/stage.pt' does not exist");
  EXPECT_EQ(message.find("in_features"), std::string::npos) << message;  // shape unknown past the script
}

// ---- datasets ----

class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/shape_inference_test.XXXXXX";
    path_ = mkdtemp(name);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_idx_header(const std::string& path, std::vector<uint32_t> dims) {
  std::ofstream file(path, std::ios::binary);
  const char magic[] = {0, 0, 8, static_cast<char>(dims.size())};
  file.write(magic, 4);
  for (uint32_t d : dims) {
    const char bytes[] = {static_cast<char>(d >> 24), static_cast<char>(d >> 16), static_cast<char>(d >> 8),
                          static_cast<char>(d)};
    file.write(bytes, 4);
  }
}

TEST(ShapeInferenceTest, MissingDatasetDirectoryAndFiles) {
  cohort::v1::JobSpec spec = job_of("data_parallel { graph { " + std::string(kFashionLayers) + " } }",
                                    "kind: FASHION_MNIST path: '/nonexistent/fashion'");
  EXPECT_HAS(problems_of(spec), "dataset.path '/nonexistent/fashion' does not exist or is not a directory");
  TempDir dir;
  spec.mutable_dataset()->set_path(dir.path());
  write_idx_header(dir.path() + "/train-images-idx3-ubyte", {10, 28, 28});
  const std::string message = problems_of(spec);
  EXPECT_HAS(message,
             "has no train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (plain or .gz)");
  ModelValidationOptions options;
  options.check_files = false;
  EXPECT_TRUE(validate_model(spec, options).ok());
}

TEST(ShapeInferenceTest, IdxDirSampleShapeComesFromTheHeader) {
  TempDir dir;
  write_idx_header(dir.path() + "/train-images-idx3-ubyte", {10, 32, 32});
  write_idx_header(dir.path() + "/train-labels-idx1-ubyte", {10});
  write_idx_header(dir.path() + "/t10k-images-idx3-ubyte", {5, 32, 32});
  write_idx_header(dir.path() + "/t10k-labels-idx1-ubyte.gz", {5});  // named .gz, read plain by zlib
  cohort::v1::Dataset dataset;
  dataset.set_kind(cohort::v1::IDX_DIR);
  dataset.set_path(dir.path());
  StatusOr<Shape> shape = dataset_sample_shape(dataset);
  ASSERT_TRUE(shape.ok()) << shape.status().to_string();
  EXPECT_EQ(*shape, (Shape{1, 32, 32}));
  cohort::v1::JobSpec spec = job_of(R"(data_parallel { graph { layers { type: "flatten" }
      layers { type: "linear" in_features: 784 out_features: 10 } } })",
                                    "kind: IDX_DIR path: '" + dir.path() + "'");
  EXPECT_HAS(problems_of(spec), "in_features is 784 but its input has 1024 features");
}

TEST(ShapeInferenceTest, DefaultFashionMnistDirectory) {
  cohort::v1::Dataset dataset;
  dataset.set_kind(cohort::v1::FASHION_MNIST);
  EXPECT_EQ(dataset_dir(dataset), kDefaultFashionMnistDir);
  EXPECT_EQ(dataset_num_classes(dataset), 10);
}

}  // namespace
}  // namespace cohort::graph
