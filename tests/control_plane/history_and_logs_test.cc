// Metric history and rank logs through a live secure cluster (a coordinator and two agents, see
// live_cluster.h), issue 15:
//   - every metrics report of a training job is stored; GetMetrics returns the same series after
//     the coordinator restarts, and `cohort metrics -o csv|json` prints it;
//   - each attempt's rank logs stay readable (--attempt), an older attempt and a restarted agent's
//     jobs are served from the files on disk, --tail picks the last lines, and `cohort logs` shows
//     every rank with a [rank N] prefix.

#include <sys/types.h>
#include <unistd.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "client/cli/cli.h"
#include "cohort/v1/coordinator.grpc.pb.h"
#include "tests/control_plane/coordinator_calls.h"
#include "tests/control_plane/live_cluster.h"

namespace cohort::daemon {
namespace {

using testing::set_deadline;
using testing::wait_for_nodes;

// A small synthetic MLP, data-parallel: a few seconds of training with a report per epoch.
cohort::v1::JobSpec mlp_job(const std::string& name, int epochs) {
  cohort::v1::JobSpec spec;
  spec.set_name(name);
  spec.set_nodes(1);
  spec.set_procs_per_node(2);
  spec.set_communicator("flat");
  cohort::v1::Dataset* dataset = spec.mutable_dataset();
  dataset->set_kind(cohort::v1::SYNTHETIC);
  dataset->set_train_size(256);
  dataset->set_test_size(64);
  dataset->add_input_shape(16);
  dataset->set_num_classes(4);
  spec.set_loss("cross_entropy");
  spec.mutable_optimizer()->set_kind(cohort::v1::SGD);
  spec.mutable_optimizer()->set_lr(0.05);
  spec.set_batch_size(16);
  spec.set_epochs(epochs);
  spec.set_seed(7);
  cohort::v1::Layer* layer = spec.mutable_data_parallel()->mutable_graph()->add_layers();
  layer->set_type("linear");
  layer->set_in_features(16);
  layer->set_out_features(4);
  return spec;
}

cohort::v1::JobSpec shell_job(const std::string& name, int nodes, const std::string& script) {
  cohort::v1::JobSpec spec;
  spec.set_name(name);
  spec.set_nodes(nodes);
  spec.set_procs_per_node(1);
  spec.add_command("sh");
  spec.add_command("-c");
  spec.add_command(script);
  return spec;
}

class HistoryAndLogsTest : public testing::LiveClusterTest {
 protected:
  std::vector<cohort::v1::MetricsPoint> metrics(const std::string& id) {
    cohort::v1::GetMetricsRequest request;
    request.set_job_id(id);
    cohort::v1::GetMetricsResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    grpc::Status status = stub_->GetMetrics(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {response.points().begin(), response.points().end()};
  }

  // StreamLogs with an attempt and a tail, through the coordinator; the status code comes back.
  std::string logs(const std::string& id, int rank, int attempt, int tail_lines = 0,
                   grpc::StatusCode* code = nullptr) {
    cohort::v1::StreamLogsRequest request;
    request.set_job_id(id);
    request.set_rank(rank);
    request.set_attempt(attempt);
    request.set_tail_lines(tail_lines);
    grpc::ClientContext context;
    set_deadline(&context);
    auto reader = stub_->StreamLogs(&context, request);
    std::string text;
    cohort::v1::LogChunk chunk;
    while (reader->Read(&chunk)) text += chunk.data();
    grpc::Status status = reader->Finish();
    if (code != nullptr) {
      *code = status.error_code();
    } else {
      EXPECT_TRUE(status.ok()) << status.error_message();
    }
    return text;
  }

  // `cohort ARGS` in-process as the first admin; returns stdout (the exit status must be 0).
  std::string cohort(std::vector<std::string> args) {
    args.insert(args.end(), {"--credentials", coordinator_dir_.path() + "/admin.credentials", "--coordinator",
                             coordinator_->address()});
    std::ostringstream out, err;
    const int status = client::cli::run_cli(args, {&out, &err, /*tty=*/false, /*program_path=*/""});
    EXPECT_EQ(status, 0) << err.str();
    return out.str();
  }

  // Stops the agent of node-b and starts it again on the same data directory: it knows no job.
  void restart_node_b() {
    // The same port: the job's placement names the agent's address.
    const int port = agents_[1]->port();
    agents_[1]->shutdown();
    agents_[1].reset();
    DaemonServerOptions options;
    options.role = DaemonRole::kAgent;
    options.listen = "127.0.0.1:" + std::to_string(port);
    options.data_dir = agent_dirs_[1]->path();
    options.coordinator_address = coordinator_->address();
    options.join_token = join_token();
    options.node_id = "node-b";
    options.slots = 3;
    options.worker_command = {worker_};
    auto agent = DaemonServer::start(options);
    ASSERT_TRUE(agent.ok()) << agent.status().to_string();
    agents_[1] = std::move(*agent);
    wait_for_nodes(*stub_, 2);
  }
};

TEST_F(HistoryAndLogsTest, TheMetricsSeriesIsStoredAndSurvivesACoordinatorRestart) {
  const std::string id = submit(mlp_job("curve", /*epochs=*/3));
  ASSERT_FALSE(id.empty());
  const cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::SUCCEEDED);
  ASSERT_EQ(job.state(), cohort::v1::SUCCEEDED) << job.reason();
  const std::vector<cohort::v1::MetricsPoint> before = metrics(id);
  // At least one report per epoch end, oldest first, the last one being the job's last metrics.
  ASSERT_GE(before.size(), 3u);
  for (size_t i = 1; i < before.size(); ++i) {
    EXPECT_GT(before[i].seq(), before[i - 1].seq());
    EXPECT_GE(before[i].metrics().step(), before[i - 1].metrics().step());
  }
  EXPECT_EQ(before.back().metrics().step(), job.last_metrics().step());
  EXPECT_EQ(before.back().attempt(), 1);

  coordinator_->shutdown();
  coordinator_.reset();
  start_coordinator();
  const std::vector<cohort::v1::MetricsPoint> after = metrics(id);
  // The CLI prints the same series: a header and one CSV row per report; one JSON object each.
  std::istringstream csv(cohort({"metrics", id, "-o", "csv"}));
  std::vector<std::string> rows;
  for (std::string row; std::getline(csv, row);) rows.push_back(row);
  ASSERT_EQ(rows.size(), before.size() + 1);
  EXPECT_EQ(rows[0], "seq,attempt,unix_ms,step,epoch,loss,accuracy,samples_per_s,rank,comm_wait_s,comm_wait_ratio");
  EXPECT_EQ(rows[1].rfind(std::to_string(before[0].seq()) + ",1,", 0), 0u) << rows[1];
  const std::string json = cohort({"metrics", id, "-o", "json", "-f"});  // -f ends: the job is over
  size_t objects = 0;
  for (size_t at = json.find("{\"seq\": "); at != std::string::npos; at = json.find("{\"seq\": ", at + 1)) ++objects;
  EXPECT_EQ(objects, before.size()) << json;
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].seq(), before[i].seq());
    EXPECT_EQ(after[i].attempt(), before[i].attempt());
    EXPECT_EQ(after[i].time().seconds(), before[i].time().seconds());
    EXPECT_EQ(after[i].metrics().step(), before[i].metrics().step());
    EXPECT_EQ(after[i].metrics().epoch(), before[i].metrics().epoch());
    EXPECT_DOUBLE_EQ(after[i].metrics().loss(), before[i].metrics().loss());
    EXPECT_DOUBLE_EQ(after[i].metrics().accuracy(), before[i].metrics().accuracy());
  }
}

TEST_F(HistoryAndLogsTest, EveryAttemptsLogsStayReadableAlsoFromDiskAfterTheAgentRestarts) {
  cohort::v1::JobSpec spec = shell_job("twice", 2,
                                       "for i in 1 2 3 4 5; do echo \"attempt=$COHORT_ATTEMPT rank=$RANK line $i\"; "
                                       "done; if [ \"$COHORT_ATTEMPT\" = 1 ] && [ \"$RANK\" = 1 ]; then exit 3; fi");
  spec.mutable_restart_policy()->set_max_restarts(1);
  const std::string id = submit(spec);
  ASSERT_FALSE(id.empty());
  const cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::SUCCEEDED);
  ASSERT_EQ(job.state(), cohort::v1::SUCCEEDED) << job.reason();
  ASSERT_EQ(job.attempt(), 2);
  ASSERT_EQ(job.placement().nodes_size(), 2);

  auto lines = [](int attempt, int rank, int from, int to) {
    std::string text;
    for (int i = from; i <= to; ++i)
      text += "attempt=" + std::to_string(attempt) + " rank=" + std::to_string(rank) + " line " + std::to_string(i) + "\n";
    return text;
  };
  EXPECT_EQ(logs(id, 1, /*attempt=*/0), lines(2, 1, 1, 5));
  EXPECT_EQ(logs(id, 1, /*attempt=*/2), lines(2, 1, 1, 5));
  // The failed first attempt: read from its files on disk.
  EXPECT_EQ(logs(id, 1, /*attempt=*/1), lines(1, 1, 1, 5));
  EXPECT_EQ(logs(id, 0, /*attempt=*/1, /*tail_lines=*/2), lines(1, 0, 4, 5));
  EXPECT_EQ(logs(id, 0, /*attempt=*/0, /*tail_lines=*/2), lines(2, 0, 4, 5));
  // The CLI: every rank, prefixed; --tail per rank; --attempt.
  EXPECT_EQ(cohort({"logs", id, "--tail", "1"}),
            "[rank 0] attempt=2 rank=0 line 5\n[rank 1] attempt=2 rank=1 line 5\n");
  EXPECT_EQ(cohort({"logs", id, "--attempt", "1", "--rank", "1", "-n", "2"}), lines(1, 1, 4, 5));
  EXPECT_EQ(cohort({"logs", id, "--since", "1h", "--rank", "0"}), lines(2, 0, 1, 5));
  {
    std::ostringstream out, err;
    EXPECT_EQ(client::cli::run_cli({"logs", id, "--attempt", "3", "--credentials",
                                    coordinator_dir_.path() + "/admin.credentials", "--coordinator",
                                    coordinator_->address()},
                                   {&out, &err, false, ""}),
              1);
    EXPECT_NE(err.str().find("has no attempt 3; its attempts are 1..2"), std::string::npos) << err.str();
  }
  grpc::StatusCode code = grpc::StatusCode::OK;
  logs(id, 0, /*attempt=*/7, 0, &code);
  EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND);

  // Rank 1 ran on node-b; its agent restarts and no longer holds the job: the files answer.
  const bool rank1_on_b = job.placement().nodes(1).node_id() == "node-b";
  ASSERT_TRUE(rank1_on_b || job.placement().nodes(0).node_id() == "node-b");
  const int rank_on_b = rank1_on_b ? 1 : 0;
  restart_node_b();
  EXPECT_EQ(logs(id, rank_on_b, /*attempt=*/0), lines(2, rank_on_b, 1, 5));
  EXPECT_EQ(logs(id, rank_on_b, /*attempt=*/0, /*tail_lines=*/1), lines(2, rank_on_b, 5, 5));
  EXPECT_EQ(logs(id, rank_on_b, /*attempt=*/1), lines(1, rank_on_b, 1, 5));
}

}  // namespace
}  // namespace cohort::daemon
