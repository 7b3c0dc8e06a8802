// cohortd's agent role end to end over gRPC on 127.0.0.1:0: one `--role all` DaemonServer (the
// coordinator and a 2-slot agent in one process) registers its node, runs submitted jobs as real
// processes, reports their exits, serves their logs, and stops them on cancel.

#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/agent.grpc.pb.h"
#include "cohort/v1/coordinator.grpc.pb.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/coordinator/test_specs.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/testing/test_credentials.h"
#include "worker/base/tls.h"
#include "tests/control_plane/coordinator_calls.h"

namespace cohort::daemon {
namespace {

using coordinator::testing::TempDir;
using coordinator::testing::valid_spec;

// Every RPC and every wait of these tests finishes well within this; a hang becomes a failure.
constexpr auto kTimeout = testing::kRpcTimeout;
constexpr auto kTestTickInterval = std::chrono::milliseconds(50);
using testing::kPollInterval;
using testing::set_deadline;

// The worker every task runs: it picks its behaviour from the job name (the job id's prefix).
constexpr const char* kWorkerScript =
    "case \"$COHORT_JOB_ID\" in "
    "ok-*) echo rank $RANK of $WORLD_SIZE; exit 0;; "
    "fail-*) if [ \"$RANK\" = 1 ]; then exit 3; fi; exit 0;; "
    "sleep-*) echo $$ > \"$PID_DIR/$RANK\"; exec sleep 100;; "
    "esac; exit 9";

class AgentServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("PID_DIR", pid_dir_.path().c_str(), 1);
    // The workers (run as the unprivileged job user when the test runs as root) write their pids here.
    chmod(pid_dir_.path().c_str(), 01777);
    DaemonServerOptions options;
    options.role = DaemonRole::kAll;
    options.listen = "127.0.0.1:0";
    options.data_dir = data_dir_.path();
    options.tick_interval = kTestTickInterval;
    options.node_id = "node-a";
    options.slots = 2;
    options.worker_command = {"/bin/sh", "-c", kWorkerScript};
    options.stop_grace_period = std::chrono::seconds(2);
    auto server = DaemonServer::start(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    // A user (the first admin) calls the coordinator; the Agent service obeys only the
    // coordinator's certificate, which calls it exactly like this.
    coordinator_ = cohort::v1::Coordinator::NewStub(
        tls::make_channel(server_->address(), testing::admin_security(data_dir_.path())));
    agent_ = cohort::v1::Agent::NewStub(tls::make_channel(server_->address(), server_->security().to_agent("node-a")));
    wait_for_node();
  }
  void TearDown() override {
    if (server_ != nullptr) server_->shutdown();
  }

  void wait_for_node() {
    cohort::v1::ListNodesResponse response = testing::wait_for_nodes(*coordinator_, 1);
    ASSERT_EQ(response.nodes_size(), 1);
    EXPECT_EQ(response.nodes(0).node().node_id(), "node-a");
    EXPECT_EQ(response.nodes(0).node().address(), server_->address());
    EXPECT_EQ(response.nodes(0).node().slots(), 2);
    EXPECT_GT(response.nodes(0).node().cores(), 0);
  }

  std::string submit(const std::string& name) {
    return testing::submit_job(*coordinator_, valid_spec(name, /*nodes=*/1, /*procs_per_node=*/2));
  }

  // Polls until the job is in `state` (or a final state, or the timeout); returns its last record.
  cohort::v1::JobRecord wait_for_state(const std::string& id, cohort::v1::JobState state) {
    return testing::wait_for_job_state(*coordinator_, id, state);
  }

  // The pids the job's two sleeping ranks wrote (the shell execs sleep, so they are sleep's), each
  // checked running; fails the test if one never comes.
  std::vector<pid_t> running_pids() {
    std::vector<pid_t> pids;
    const auto give_up = std::chrono::steady_clock::now() + kTimeout;
    for (int rank = 0; rank < 2; ++rank) {
      const std::string path = pid_dir_.path() + "/" + std::to_string(rank);
      pid_t pid = 0;
      while (pid == 0 && std::chrono::steady_clock::now() < give_up) {
        if (FILE* file = std::fopen(path.c_str(), "r")) {
          if (std::fscanf(file, "%d", &pid) != 1) pid = 0;
          std::fclose(file);
        }
        if (pid == 0) std::this_thread::sleep_for(kPollInterval);
      }
      EXPECT_GT(pid, 0) << "rank " << rank << " never wrote its pid";
      EXPECT_EQ(kill(pid, 0), 0) << "rank " << rank << " is not running";
      if (pid > 0) pids.push_back(pid);
    }
    return pids;
  }

  // Waits (kTimeout at most) until none of `pids` exists any more: the agent reaps what it stops.
  void expect_gone(const std::vector<pid_t>& pids, const std::string& after) {
    const auto give_up = std::chrono::steady_clock::now() + kTimeout;
    for (pid_t pid : pids) {
      while (kill(pid, 0) == 0 && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(kPollInterval);
      EXPECT_NE(kill(pid, 0), 0) << "pid " << pid << " still runs after " << after;
    }
  }

  // Waits (kTimeout at most) until the agent has both slots free again.
  void expect_slots_free() {
    cohort::v1::NodeInfo node;
    const auto give_up = std::chrono::steady_clock::now() + kTimeout;
    do {
      grpc::ClientContext poll;
      set_deadline(&poll);
      ASSERT_TRUE(agent_->NodeInfo(&poll, {}, &node).ok());
      if (node.free_slots() == 2) break;
      std::this_thread::sleep_for(kPollInterval);
    } while (std::chrono::steady_clock::now() < give_up);
    EXPECT_EQ(node.free_slots(), 2);
  }

  std::string read_logs(const std::string& id, int rank) {
    cohort::v1::StreamLogsRequest request;
    request.set_job_id(id);
    request.set_rank(rank);
    request.set_follow(true);  // until the task's output closes
    grpc::ClientContext context;
    set_deadline(&context);
    auto reader = agent_->StreamLogs(&context, request);
    std::string text;
    cohort::v1::LogChunk chunk;
    while (reader->Read(&chunk)) {
      EXPECT_EQ(chunk.rank(), rank);
      EXPECT_EQ(chunk.offset(), static_cast<int64_t>(text.size()));
      text += chunk.data();
    }
    grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return text;
  }

  TempDir data_dir_;
  TempDir pid_dir_;
  std::unique_ptr<DaemonServer> server_;
  std::unique_ptr<cohort::v1::Coordinator::Stub> coordinator_;
  std::unique_ptr<cohort::v1::Agent::Stub> agent_;
};

TEST_F(AgentServerTest, JobOfTwoRanksSucceedsAndItsLogsStream) {
  const std::string id = submit("ok");
  cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::SUCCEEDED);
  ASSERT_EQ(job.state(), cohort::v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(read_logs(id, 1), "rank 1 of 2\n");
  EXPECT_EQ(read_logs(id, 0), "rank 0 of 2\n");
}

TEST_F(AgentServerTest, RankExitingNonZeroFailsTheJobNamingTheRank) {
  const std::string id = submit("fail");
  cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::FAILED);
  ASSERT_EQ(job.state(), cohort::v1::FAILED) << job.reason();
  EXPECT_NE(job.reason().find("rank 1"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("3"), std::string::npos) << job.reason();
}

TEST_F(AgentServerTest, CancelStopsBothRanks) {
  const std::string id = submit("sleep");
  ASSERT_EQ(wait_for_state(id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
  const std::vector<pid_t> pids = running_pids();
  ASSERT_EQ(pids.size(), 2u);

  cohort::v1::CancelJobRequest request;
  request.set_job_id(id);
  request.set_reason("test cancel");
  cohort::v1::CancelJobResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  grpc::Status status = coordinator_->CancelJob(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(wait_for_state(id, cohort::v1::CANCELLED).state(), cohort::v1::CANCELLED);
  expect_gone(pids, "the cancel");
  expect_slots_free();
}

// The backstop for a stop that never arrived: the job is cancelled in the coordinator but its
// StopTasks order is dropped (as when every try failed). The node stays registered, and the reply
// to its next heartbeat, which lists both ranks, stops them: the real processes end within about
// one heartbeat interval (lease / 3, 5 s), far before their sleep would.
TEST_F(AgentServerTest, RanksWhoseStopNeverArrivedAreStoppedByTheNextHeartbeatsReply) {
  const std::string id = submit("sleep");
  ASSERT_EQ(wait_for_state(id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
  const std::vector<pid_t> pids = running_pids();
  ASSERT_EQ(pids.size(), 2u);
  StatusOr<coordinator::AgentOrders> orders = server_->coordinator().cancel(id, "test: its stop is lost");
  ASSERT_TRUE(orders.ok()) << orders.status().to_string();
  ASSERT_EQ(orders->stops.size(), 1u);  // never sent
  EXPECT_EQ(wait_for_state(id, cohort::v1::CANCELLED).state(), cohort::v1::CANCELLED);
  expect_gone(pids, "the heartbeat that reported them");
  expect_slots_free();
  // Their exits were reported, so the coordinator holds the node's slots no longer either.
  const auto give_up = std::chrono::steady_clock::now() + kTimeout;
  while (server_->coordinator().list_nodes().at(0).free_slots != 2 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(kPollInterval);
  EXPECT_EQ(server_->coordinator().list_nodes().at(0).free_slots, 2);
}

// The two roles in separate servers: an agent registers with a coordinator elsewhere, which
// launches the job on it over Agent.LaunchTasks.
TEST(AgentRoleTest, SeparateAgentRegistersAndRunsJobs) {
  TempDir coordinator_dir;
  TempDir agent_dir;
  DaemonServerOptions coordinator_options;
  coordinator_options.listen = "127.0.0.1:0";
  coordinator_options.data_dir = coordinator_dir.path();
  coordinator_options.tick_interval = kTestTickInterval;
  auto coordinator_server = DaemonServer::start(coordinator_options);
  ASSERT_TRUE(coordinator_server.ok()) << coordinator_server.status().to_string();

  auto stub = cohort::v1::Coordinator::NewStub(
      tls::make_channel((*coordinator_server)->address(), testing::admin_security(coordinator_dir.path())));
  cohort::v1::CreateJoinTokenResponse token;
  {
    grpc::ClientContext context;
    set_deadline(&context);
    ASSERT_TRUE(stub->CreateJoinToken(&context, {}, &token).ok());
  }
  DaemonServerOptions agent_options;
  agent_options.role = DaemonRole::kAgent;
  agent_options.join_token = token.token();
  agent_options.listen = "127.0.0.1:0";
  agent_options.data_dir = agent_dir.path();
  agent_options.coordinator_address = (*coordinator_server)->address();
  agent_options.node_id = "node-b";
  agent_options.slots = 2;
  agent_options.worker_command = {"/bin/sh", "-c", kWorkerScript};
  auto agent_server = DaemonServer::start(agent_options);
  ASSERT_TRUE(agent_server.ok()) << agent_server.status().to_string();
  EXPECT_EQ((*agent_server)->node_id(), "node-b");

  cohort::v1::ListNodesResponse nodes = testing::wait_for_nodes(*stub, 1);
  ASSERT_EQ(nodes.nodes_size(), 1) << "node-b did not register with the coordinator";
  EXPECT_EQ(nodes.nodes(0).node().address(), (*agent_server)->address());

  const std::string id = testing::submit_job(*stub, valid_spec("ok", /*nodes=*/1, /*procs_per_node=*/2));
  cohort::v1::JobRecord job = testing::wait_for_job_state(*stub, id, cohort::v1::SUCCEEDED);
  EXPECT_EQ(job.state(), cohort::v1::SUCCEEDED) << job.reason();
  (*agent_server)->shutdown();
  (*coordinator_server)->shutdown();
}

}  // namespace
}  // namespace cohort::daemon
