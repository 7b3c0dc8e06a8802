#include "worker/graph/graph_builder.h"

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/nn/modules/dropout.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/loopback_world.h"

namespace cohort::graph {
namespace {

// The Fashion-MNIST CNN of worker/examples/fashion_cnn.h, as a job graph.
constexpr const char* kFashionCnn = R"pb(
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
  layers { type: "dropout" }
  layers { type: "linear" name: "fc2" in_features: 128 out_features: 10 }
)pb";

v1::Graph parse(const std::string& text) {
  v1::Graph graph;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &graph)) << text;
  return graph;
}

std::map<std::string, std::vector<int64_t>> parameter_shapes(torch::nn::Module& module) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : module.named_parameters()) shapes[p.key()] = p.value().sizes().vec();
  return shapes;
}

std::string error_of(const std::string& graph_text, const GraphBuildOptions& options = {}) {
  StatusOr<torch::nn::Sequential> built = build_graph(parse(graph_text), options);
  return built.ok() ? "OK" : built.status().to_string();
}

TEST(GraphBuilderTest, FashionCnnHasTheExpectedParametersAndOutput) {
  StatusOr<torch::nn::Sequential> built = build_graph(parse(kFashionCnn));
  ASSERT_TRUE(built.ok()) << built.status().to_string();
  torch::nn::Sequential model = *built;
  std::map<std::string, std::vector<int64_t>> expected = {
      {"conv1.weight", {32, 1, 3, 3}},  {"conv1.bias", {32}}, {"bn1.weight", {32}},      {"bn1.bias", {32}},
      {"conv2.weight", {64, 32, 3, 3}}, {"conv2.bias", {64}}, {"bn2.weight", {64}},      {"bn2.bias", {64}},
      {"fc1.weight", {128, 3136}},      {"fc1.bias", {128}},  {"fc2.weight", {10, 128}}, {"fc2.bias", {10}},
  };
  EXPECT_EQ(parameter_shapes(*model), expected);
  // Unnamed layers are "<type><index>"; dropout took PyTorch's default p.
  auto dropout = model->named_children()["dropout11"];
  ASSERT_NE(dropout, nullptr);
  EXPECT_DOUBLE_EQ(dynamic_cast<torch::nn::DropoutImpl&>(*dropout).options.p(), 0.5);
  // Pooling strides default to the kernel size: 28 → 14 → 7, so fc1 sees 64·7·7 = 3136.
  model->eval();
  at::Tensor y = model->forward(at::randn({4, 1, 28, 28}));
  EXPECT_EQ(y.sizes().vec(), (std::vector<int64_t>{4, 10}));
}

TEST(GraphBuilderTest, OptionalParametersOverrideDefaults) {
  StatusOr<torch::nn::Sequential> built = build_graph(parse(R"pb(
    layers { type: "conv2d" in_channels: 3 out_channels: 4 kernel_size: 3 stride: 2 bias: false }
    layers { type: "elu" alpha: 0.5 }
    layers { type: "avg_pool2d" kernel_size: 2 stride: 1 }
    layers { type: "flatten" start_dim: 1 }
    layers { type: "batchnorm1d" num_features: 144 eps: 0.001 momentum: 0.2 }
  )pb"));
  ASSERT_TRUE(built.ok()) << built.status().to_string();
  std::map<std::string, std::vector<int64_t>> expected = {
      {"conv2d0.weight", {4, 3, 3, 3}}, {"batchnorm1d4.weight", {144}}, {"batchnorm1d4.bias", {144}}};
  EXPECT_EQ(parameter_shapes(**built), expected);  // no conv bias
  // 15×15 → stride 2, kernel 3: 7×7 → avg pool 2 stride 1: 6×6; 4·6·6 = 144.
  at::Tensor y = (*built)->forward(at::randn({2, 3, 15, 15}));
  EXPECT_EQ(y.sizes().vec(), (std::vector<int64_t>{2, 144}));
}

TEST(GraphBuilderTest, ErrorsNameTheLayer) {
  EXPECT_EQ(error_of(R"pb(layers { type: "relu" }
                          layers { type: "conv2d" name: "c" in_channels: 1 out_channels: 2 })pb"),
            "INVALID_ARGUMENT: layer 1 (conv2d \"c\"): kernel_size is not set");
  EXPECT_NE(error_of(R"pb(layers { type: "lstm" })pb")
                .find("layer 0 (lstm \"lstm0\"): unknown layer type \"lstm\""),
            std::string::npos);
  EXPECT_EQ(error_of(R"pb(layers { type: "linear" in_features: 0 out_features: 2 })pb"),
            "INVALID_ARGUMENT: layer 0 (linear \"linear0\"): in_features is 0; it must be >= 1");
  EXPECT_EQ(error_of(R"pb(layers { type: "dropout" p: 1.5 })pb"),
            "INVALID_ARGUMENT: layer 0 (dropout \"dropout0\"): p is 1.5; it must be in [0, 1]");
  EXPECT_NE(error_of(R"pb(layers { type: "relu" name: "a" }
                          layers { type: "relu" name: "a" })pb")
                .find("already named"),
            std::string::npos);
  EXPECT_NE(
      error_of(R"pb(layers { type: "parallel_conv2d" in_channels: 1 out_channels: 2 kernel_size: 3 })pb")
          .find("layer 0 (parallel_conv2d \"parallel_conv2d0\"): needs a communicator"),
      std::string::npos);
  EXPECT_EQ(error_of(""), "INVALID_ARGUMENT: graph has no layers");
}

TEST(GraphBuilderTest, CommunicatorLayersBuildWithACommunicator) {
  auto worlds = comm::testing::loopback_worlds(1);
  auto comm = comm::create_communicator("flat", worlds[0]);
  ASSERT_TRUE(comm.ok()) << comm.status().to_string();
  GraphBuildOptions options;
  options.comm = comm->get();
  StatusOr<torch::nn::Sequential> built = build_graph(
      parse(R"pb(
        layers { type: "parallel_conv2d" name: "pc" in_channels: 1 out_channels: 8 kernel_size: 3 padding: 1 }
        layers { type: "multi_node_batchnorm" name: "bn" num_features: 8 }
      )pb"),
      options);
  ASSERT_TRUE(built.ok()) << built.status().to_string();
  std::map<std::string, std::vector<int64_t>> shapes = parameter_shapes(**built);
  EXPECT_EQ(shapes["bn.weight"], (std::vector<int64_t>{8}));
  at::Tensor y = (*built)->forward(at::randn({2, 1, 5, 5}));
  EXPECT_EQ(y.sizes().vec(), (std::vector<int64_t>{2, 8, 5, 5}));
}

TEST(GraphBuilderTest, TorchScriptStageLoadsRunsAndExposesParameters) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/stage.pt";
  {
    torch::jit::Module script("Stage");
    script.register_parameter("weight", at::full({3, 2}, 2.0).requires_grad_(), /*is_buffer=*/false);
    script.define("def forward(self, x):\n  return x.matmul(self.weight)\n");
    script.save(path);
  }
  v1::Stage stage;
  stage.set_torchscript_file(path);
  StatusOr<StageBody> body = build_stage_body(stage);
  ASSERT_TRUE(body.ok()) << body.status().to_string();
  at::Tensor y = body->forward(at::ones({4, 3}));
  EXPECT_TRUE(y.equal(at::full({4, 2}, 6.0)));
  std::map<std::string, std::vector<int64_t>> expected = {{"weight", {3, 2}}};
  EXPECT_EQ(parameter_shapes(*body->module), expected);
  // The registered parameter is the script's: an update shows in its output.
  {
    at::NoGradGuard no_grad;
    body->module->parameters()[0].fill_(1.0);
  }
  EXPECT_TRUE(body->forward(at::ones({1, 3})).equal(at::full({1, 2}, 3.0)));

  stage.set_torchscript_file(path + ".missing");
  EXPECT_EQ(build_stage_body(stage).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace cohort::graph
