#include "worker/graph/memory_estimate.h"

#include <gtest/gtest.h>

namespace cohort::graph {
namespace {

cohort::v1::JobSpec mlp(int64_t hidden) {
  cohort::v1::JobSpec spec;
  spec.set_nodes(1);
  spec.set_procs_per_node(1);
  spec.set_batch_size(10);
  spec.mutable_optimizer()->set_kind(cohort::v1::SGD);
  cohort::v1::Dataset* dataset = spec.mutable_dataset();
  dataset->set_kind(cohort::v1::SYNTHETIC);
  dataset->add_input_shape(100);
  dataset->set_num_classes(10);
  cohort::v1::Graph* graph = spec.mutable_data_parallel()->mutable_graph();
  cohort::v1::Layer* fc1 = graph->add_layers();
  fc1->set_type("linear");
  fc1->set_in_features(100);
  fc1->set_out_features(hidden);
  graph->add_layers()->set_type("relu");
  cohort::v1::Layer* fc2 = graph->add_layers();
  fc2->set_type("linear");
  fc2->set_in_features(hidden);
  fc2->set_out_features(10);
  return spec;
}

TEST(MemoryEstimateTest, CountsParametersGradientsAndActivations) {
  // Parameters: 100*50+50 + 50*10+10 = 5560; SGD: x2 (gradients). Activations per sample:
  // 50 + 50 + 10 = 110, x batch 10, x2 (their gradients). float32.
  StatusOr<int64_t> bytes = estimate_rank_memory_bytes(mlp(50));
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  EXPECT_EQ(*bytes, (5560 * 2 + 110 * 10 * 2) * kBytesPerValue);
  cohort::v1::JobSpec adam = mlp(50);
  adam.mutable_optimizer()->set_kind(cohort::v1::ADAM);
  EXPECT_EQ(*estimate_rank_memory_bytes(adam), (5560 * 4 + 110 * 10 * 2) * kBytesPerValue);
}

TEST(MemoryEstimateTest, ATwoBillionUnitLinearLayerIsTerabytes) {
  StatusOr<int64_t> bytes = estimate_rank_memory_bytes(mlp(2'000'000'000));
  ASSERT_TRUE(bytes.ok());
  EXPECT_GT(*bytes, int64_t{1} << 40);
}

TEST(MemoryEstimateTest, HugeSizesSaturateInsteadOfOverflowing) {
  cohort::v1::JobSpec spec = mlp(50);
  spec.mutable_data_parallel()->mutable_graph()->mutable_layers(0)->set_in_features(int64_t{1} << 62);
  spec.mutable_data_parallel()->mutable_graph()->mutable_layers(0)->set_out_features(int64_t{1} << 62);
  StatusOr<int64_t> bytes = estimate_rank_memory_bytes(spec);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, std::numeric_limits<int64_t>::max());
}

}  // namespace
}  // namespace cohort::graph
