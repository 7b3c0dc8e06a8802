// The whole control plane end to end with the real cohort-worker: a coordinator and two agents
// (two simulated nodes, each its own gRPC server on 127.0.0.1:0 with its own data directory) run
// training jobs to their end. Workers bootstrap through cohort:// on the coordinator and move
// tensors over UCX on this machine.
//
//   - a 2 nodes × 2 ranks data-parallel job succeeds, every rank's log ends, and a restarted
//     coordinator still has the job's record;
//   - a model-parallel MLP across 3 ranks succeeds;
//   - cancel stops every worker process of the job;
//   - SIGKILL of one worker fails the job with a reason naming the rank, and the others stop.

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "tests/control_plane/coordinator_calls.h"
#include "tests/control_plane/live_cluster.h"

namespace cohort::daemon {
namespace {

using testing::kJobTimeout;
using testing::wait_for_nodes;
using testing::worker_pids;

// A small synthetic MLP job: `epochs` passes over `train_size` samples of 64 features.
cohort::v1::JobSpec mlp_job(const std::string& name, int nodes, int procs_per_node, int epochs,
                            int train_size) {
  cohort::v1::JobSpec spec;
  spec.set_name(name);
  spec.set_nodes(nodes);
  spec.set_procs_per_node(procs_per_node);
  spec.set_communicator("flat");
  cohort::v1::Dataset* dataset = spec.mutable_dataset();
  dataset->set_kind(cohort::v1::SYNTHETIC);
  dataset->set_train_size(train_size);
  dataset->set_test_size(64);
  dataset->add_input_shape(64);
  dataset->set_num_classes(4);
  spec.set_loss("cross_entropy");
  spec.mutable_optimizer()->set_kind(cohort::v1::MOMENTUM);
  spec.mutable_optimizer()->set_lr(0.05);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.set_batch_size(16);
  spec.set_epochs(epochs);
  spec.set_seed(7);
  return spec;
}

cohort::v1::Layer* add_linear(cohort::v1::Graph* graph, int64_t in, int64_t out) {
  cohort::v1::Layer* layer = graph->add_layers();
  layer->set_type("linear");
  layer->set_in_features(in);
  layer->set_out_features(out);
  return layer;
}

void add_relu(cohort::v1::Graph* graph) { graph->add_layers()->set_type("relu"); }

cohort::v1::JobSpec data_parallel_job(const std::string& name, int nodes, int procs_per_node, int epochs,
                                      int train_size) {
  cohort::v1::JobSpec spec = mlp_job(name, nodes, procs_per_node, epochs, train_size);
  cohort::v1::Graph* graph = spec.mutable_data_parallel()->mutable_graph();
  add_linear(graph, 64, 32);
  add_relu(graph);
  add_linear(graph, 32, 4);
  return spec;
}

// Three stages on ranks 0 → 1 → 2 (ChainerMN's pipeline MLP).
cohort::v1::JobSpec model_parallel_job(const std::string& name) {
  cohort::v1::JobSpec spec = mlp_job(name, /*nodes=*/1, /*procs_per_node=*/3, /*epochs=*/1, /*train_size=*/256);
  cohort::v1::ModelParallelModel* model = spec.mutable_model_parallel();
  cohort::v1::Stage* first = model->add_stages();
  first->set_rank(0);
  first->add_rank_out(1);
  add_linear(first->mutable_graph(), 64, 32);
  add_relu(first->mutable_graph());
  cohort::v1::Stage* middle = model->add_stages();
  middle->set_rank(1);
  middle->add_rank_in(0);
  middle->add_rank_out(2);
  add_linear(middle->mutable_graph(), 32, 32);
  add_relu(middle->mutable_graph());
  cohort::v1::Stage* last = model->add_stages();
  last->set_rank(2);
  last->add_rank_in(1);
  add_linear(last->mutable_graph(), 32, 4);
  return spec;
}

class EndToEndTest : public testing::LiveClusterTest {};

TEST_F(EndToEndTest, TwoNodesTimesTwoRanksTrainToSucceededAndTheRecordSurvivesACoordinatorRestart) {
  const std::string id = submit(data_parallel_job("dp", /*nodes=*/2, /*procs_per_node=*/2, /*epochs=*/2, 512));
  ASSERT_FALSE(id.empty());
  cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::SUCCEEDED);
  ASSERT_EQ(job.state(), cohort::v1::SUCCEEDED) << job.reason();
  ASSERT_EQ(job.placement().nodes_size(), 2);
  EXPECT_NE(job.placement().nodes(0).node_id(), job.placement().nodes(1).node_id());
  EXPECT_EQ(job.placement().world_size(), 4);
  // Metrics reached the coordinator from the workers.
  EXPECT_GT(job.last_metrics().step(), 0);
  EXPECT_GT(job.last_metrics().accuracy(), 0.0);
  // Rank 0 printed the final accuracy; every rank's log is there.
  EXPECT_NE(read_logs(job, 0).find("test accuracy"), std::string::npos) << read_logs(job, 0);
  for (int rank = 0; rank < 4; ++rank) {
    const std::string log = read_logs(job, rank);
    EXPECT_NE(log.find("rank " + std::to_string(rank) + " of 4 joined"), std::string::npos) << log;
    EXPECT_NE(log.find("rank " + std::to_string(rank) + " finished"), std::string::npos) << log;
  }

  // The coordinator restarts on the same data directory and port: the record is unchanged.
  coordinator_->shutdown();
  coordinator_.reset();
  start_coordinator();
  cohort::v1::JobRecord after = get_job(id);
  EXPECT_EQ(after.state(), cohort::v1::SUCCEEDED);
  EXPECT_EQ(after.spec().name(), "dp-" + std::to_string(getpid()));
  EXPECT_EQ(after.placement().world_size(), 4);
  // The agents find the restarted coordinator again.
  wait_for_nodes(*stub_, 2);
}

TEST_F(EndToEndTest, ModelParallelMlpAcrossThreeRanksSucceeds) {
  const std::string id = submit(model_parallel_job("pipeline"));
  ASSERT_FALSE(id.empty());
  cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::SUCCEEDED);
  ASSERT_EQ(job.state(), cohort::v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.placement().world_size(), 3);
}

TEST_F(EndToEndTest, CancelStopsEveryWorkerProcess) {
  // Long enough to be still training when cancelled.
  const std::string id = submit(data_parallel_job("long", /*nodes=*/2, /*procs_per_node=*/1, /*epochs=*/10000, 4096));
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(wait_for_state(id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
  ASSERT_TRUE(wait_for_workers(id, 2));
  ASSERT_TRUE(wait_for_training(id)) << get_job(id).reason();

  cancel(id, "e2e cancel");
  EXPECT_EQ(wait_for_state(id, cohort::v1::CANCELLED).state(), cohort::v1::CANCELLED);
  EXPECT_TRUE(wait_for_no_workers(id)) << worker_pids(id).size() << " workers still run";
}

TEST_F(EndToEndTest, KillingOneWorkerFailsTheJobNamingTheRank) {
  const std::string id = submit(data_parallel_job("victim", /*nodes=*/2, /*procs_per_node=*/1, /*epochs=*/10000, 4096));
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(wait_for_state(id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
  ASSERT_TRUE(wait_for_workers(id, 2));
  ASSERT_TRUE(wait_for_training(id)) << get_job(id).reason();
  std::vector<pid_t> victims = worker_pids(id, /*rank=*/1);
  ASSERT_EQ(victims.size(), 1u);
  ASSERT_EQ(kill(victims[0], SIGKILL), 0);

  cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::FAILED);
  ASSERT_EQ(job.state(), cohort::v1::FAILED) << job.reason();
  EXPECT_NE(job.reason().find("rank 1"), std::string::npos) << job.reason();
  // No rank waits forever for the dead one.
  EXPECT_TRUE(wait_for_no_workers(id)) << worker_pids(id).size() << " workers still run";
}

}  // namespace
}  // namespace cohort::daemon
