#pragma once

// Job specs for the coordinator's tests: a small valid data-parallel job to start from, which a
// test then bends into the case it needs.

#include <string>

#include "cohort/v1/job.pb.h"

namespace cohort::coordinator::testing {

// A valid `nodes` × `procs_per_node` MLP job on synthetic data, no restarts.
inline cohort::v1::JobSpec valid_spec(const std::string& name = "mlp", int nodes = 1,
                                      int procs_per_node = 1) {
  cohort::v1::JobSpec spec;
  spec.set_name(name);
  spec.set_nodes(nodes);
  spec.set_procs_per_node(procs_per_node);
  spec.set_communicator("flat");
  cohort::v1::Dataset* dataset = spec.mutable_dataset();
  dataset->set_kind(cohort::v1::SYNTHETIC);
  dataset->set_train_size(1024);
  dataset->add_input_shape(784);
  dataset->set_num_classes(10);
  cohort::v1::Graph* graph = spec.mutable_data_parallel()->mutable_graph();
  cohort::v1::Layer* linear = graph->add_layers();
  linear->set_type("linear");
  linear->set_in_features(784);
  linear->set_out_features(10);
  spec.set_loss("cross_entropy");
  spec.mutable_optimizer()->set_kind(cohort::v1::SGD);
  spec.mutable_optimizer()->set_lr(0.1);
  spec.set_batch_size(32);
  spec.set_epochs(1);
  return spec;
}

}  // namespace cohort::coordinator::testing
