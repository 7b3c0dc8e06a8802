#pragma once

// A live secure cluster for end-to-end tests: a coordinator and two agents (two simulated nodes,
// node-a and node-b, each its own gRPC server on 127.0.0.1:0 with its own data directory), the
// agents joined with join tokens, the test acting as the first admin with the credentials file
// the coordinator wrote. Agents run the real cohort-worker from the test's runfiles
// (data = ["//worker/runner:cohort-worker"]) for graph jobs; command jobs run their own program.

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/testing/test_credentials.h"
#include "tests/control_plane/coordinator_calls.h"
#include "worker/base/tls.h"

namespace cohort::daemon::testing {

using coordinator::testing::TempDir;

// Each job here runs for seconds; the bound covers process start-up (libtorch) on a busy machine.
inline constexpr auto kJobTimeout = std::chrono::seconds(120);
inline constexpr auto kTestTickInterval = std::chrono::milliseconds(50);
// The worker binary, from the test's runfiles.
inline constexpr const char* kWorkerRunfile = "worker/runner/cohort-worker";

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Live processes started for `job_id` (their environment carries COHORT_JOB_ID=<job_id>) with
// RANK=<rank>, or with any rank when rank < 0.
inline std::vector<pid_t> worker_pids(const std::string& job_id, int rank = -1) {
  std::vector<pid_t> pids;
  const std::string job_entry = "COHORT_JOB_ID=" + job_id;
  const std::string rank_entry = "RANK=" + std::to_string(rank);
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = read_file(entry.path().string() + "/stat");
    size_t close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] == 'Z') continue;
    std::string environ = read_file(entry.path().string() + "/environ");
    bool job_matches = false;
    bool rank_matches = rank < 0;
    std::istringstream entries(environ);
    std::string variable;
    while (std::getline(entries, variable, '\0')) {
      if (variable == job_entry) job_matches = true;
      if (variable == rank_entry) rank_matches = true;
    }
    if (job_matches && rank_matches) pids.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return pids;
}

class LiveClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    worker_ = std::filesystem::absolute(kWorkerRunfile).string();
    ASSERT_TRUE(std::filesystem::exists(worker_)) << worker_;
    start_coordinator();
    for (const char* node : {"node-a", "node-b"}) {
      auto dir = std::make_unique<TempDir>();
      DaemonServerOptions options;
      options.role = DaemonRole::kAgent;
      options.listen = "127.0.0.1:0";
      options.data_dir = dir->path();
      options.coordinator_address = coordinator_->address();
      // Each agent joins as a real node does: a join token from the admin, then its certificate.
      options.join_token = join_token();
      options.node_id = node;
      options.slots = 3;
      options.worker_command = {worker_};
      options.stop_grace_period = std::chrono::seconds(3);
      configure_agent(options);
      auto agent = DaemonServer::start(options);
      ASSERT_TRUE(agent.ok()) << agent.status().to_string();
      agents_.push_back(std::move(*agent));
      agent_dirs_.push_back(std::move(dir));
    }
    wait_for_nodes(*stub_, 2);
  }

  // Hooks for a test's own settings (allowed_commands, slots...), applied before each start.
  virtual void configure_coordinator(DaemonServerOptions& /*options*/) {}
  virtual void configure_agent(DaemonServerOptions& /*options*/) {}

  void TearDown() override {
    for (auto& agent : agents_) agent->shutdown();
    if (coordinator_ != nullptr) coordinator_->shutdown();
  }

  void start_coordinator() {
    DaemonServerOptions options;
    options.listen = coordinator_port_ == 0 ? "127.0.0.1:0" : "127.0.0.1:" + std::to_string(coordinator_port_);
    options.data_dir = coordinator_dir_.path();
    options.tick_interval = kTestTickInterval;
    configure_coordinator(options);
    auto server = DaemonServer::start(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    coordinator_ = std::move(*server);
    coordinator_port_ = coordinator_->port();
    stub_ = cohort::v1::Coordinator::NewStub(
        tls::make_channel(coordinator_->address(), testing::admin_security(coordinator_dir_.path())));
  }

  std::string join_token() {
    cohort::v1::CreateJoinTokenResponse token;
    grpc::ClientContext context;
    set_deadline(&context);
    grpc::Status status = stub_->CreateJoinToken(&context, {}, &token);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return token.token();
  }

  // Job names carry this process's pid: the workers are found through /proc by their job id, which
  // must not match another instance of this test running at the same time.
  std::string submit(cohort::v1::JobSpec spec) {
    spec.set_name(spec.name() + "-" + std::to_string(getpid()));
    return submit_job(*stub_, spec);
  }
  cohort::v1::JobRecord get_job(const std::string& id) { return testing::get_job(*stub_, id); }
  cohort::v1::JobRecord wait_for_state(const std::string& id, cohort::v1::JobState state) {
    return wait_for_job_state(*stub_, id, state, kJobTimeout);
  }

  std::string read_logs(const cohort::v1::JobRecord& job, int rank) {
    // Through the coordinator, as `cohort logs` reads them (agents answer only the coordinator).
    cohort::v1::StreamLogsRequest request;
    request.set_job_id(job.id());
    request.set_rank(rank);
    grpc::ClientContext context;
    set_deadline(&context);
    auto reader = stub_->StreamLogs(&context, request);
    std::string text;
    cohort::v1::LogChunk chunk;
    while (reader->Read(&chunk)) text += chunk.data();
    grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return text;
  }

  // Waits until `count` workers of the job run (each announced itself in /proc).
  bool wait_for_workers(const std::string& id, size_t count) {
    const auto give_up = std::chrono::steady_clock::now() + kJobTimeout;
    while (std::chrono::steady_clock::now() < give_up) {
      if (worker_pids(id).size() >= count) return true;
      std::this_thread::sleep_for(kPollInterval);
    }
    return false;
  }

  // Waits until the job's workers report training progress (metrics reached the coordinator), so
  // what follows hits ranks in the middle of training, not while they start.
  bool wait_for_training(const std::string& id) {
    const auto give_up = std::chrono::steady_clock::now() + kJobTimeout;
    while (std::chrono::steady_clock::now() < give_up) {
      if (get_job(id).last_metrics().step() > 0) return true;
      std::this_thread::sleep_for(kPollInterval);
    }
    return false;
  }

  // Coordinator.CancelJob as an admin; a refused call is a test failure.
  void cancel(const std::string& id, const std::string& reason) {
    cohort::v1::CancelJobRequest request;
    request.set_job_id(id);
    request.set_reason(reason);
    cohort::v1::CancelJobResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    grpc::Status status = stub_->CancelJob(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }

  bool wait_for_no_workers(const std::string& id) {
    const auto give_up = std::chrono::steady_clock::now() + kRpcTimeout;
    while (std::chrono::steady_clock::now() < give_up) {
      if (worker_pids(id).empty()) return true;
      std::this_thread::sleep_for(kPollInterval);
    }
    return false;
  }

  std::string worker_;
  TempDir coordinator_dir_;
  int coordinator_port_ = 0;
  std::unique_ptr<DaemonServer> coordinator_;
  std::unique_ptr<cohort::v1::Coordinator::Stub> stub_;
  std::vector<std::unique_ptr<TempDir>> agent_dirs_;
  std::vector<std::unique_ptr<DaemonServer>> agents_;
};

}  // namespace cohort::daemon::testing
