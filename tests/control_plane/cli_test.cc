// The `cohort` CLI against an in-process `--role all` DaemonServer on 127.0.0.1:0, with a shell
// script standing in for cohort-worker (the server's worker_command), so these tests exercise the
// CLI, the client library and the agent's launch contract without the real worker:
// submit → status → list → logs → cancel, `-o json`, a launch that fails, a drain, and `cohort run`.

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include "client/cli/cli.h"
#include "client/cli/command.h"
#include "client/cli/job_follower.h"
#include "client/client.h"
#include "cohort/v1/agent.pb.h"
#include "cohort/v1/coordinator.pb.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/testing/test_credentials.h"
#include "worker/base/leader_channel.h"

namespace cohort::client::cli {
namespace {

using coordinator::testing::TempDir;

constexpr auto kTimeout = std::chrono::seconds(20);
constexpr auto kPollInterval = std::chrono::milliseconds(20);

// The test double of cohort-worker. By job name: ok-* prints what the agent handed it (the launch
// contract) and a result line; sleep-* runs until stopped; anything else fails.
constexpr const char* kWorkerScript = R"(#!/bin/sh
case "$COHORT_JOB_ID" in
ok-*)
  echo "rank $RANK of $WORLD_SIZE local $LOCAL_RANK attempt $COHORT_ATTEMPT port $MASTER_PORT"
  echo "init $COHORT_INIT"
  echo "coordinator $COHORT_COORDINATOR"
  echo "spec $COHORT_JOB_SPEC"
  if [ -s "$COHORT_JOB_SPEC" ]; then echo "spec file present"; fi
  echo "resume ${COHORT_RESUME:-unset} cuda ${CUDA_VISIBLE_DEVICES:-unset}"
  echo "test accuracy 0.9${RANK}00"
  exit 0;;
sleep-*) echo started; exec sleep 100;;
big-*) head -c 1200000 /dev/zero | tr '\0' x; echo; echo last line; exit 0;;
resume-*)
  if [ "$COHORT_ATTEMPT" = 1 ]; then exit 5; fi
  echo "attempt $COHORT_ATTEMPT resume ${COHORT_RESUME:-unset}"
  exit 0;;
esac
echo "unexpected job $COHORT_JOB_ID" >&2
exit 7
)";

// A valid job file: `nodes` x `procs` ranks of a small MLP on synthetic data; `extra` is appended.
std::string job_yaml(const std::string& name, int nodes, int procs, const std::string& extra = "") {
  return extra + "name: " + name + "\nnodes: " + std::to_string(nodes) +
         "\nprocs_per_node: " + std::to_string(procs) +
         R"(
communicator: flat
dataset: {kind: synthetic, train_size: 64, input_shape: [784], num_classes: 10}
data_parallel:
  graph:
    layers:
      - {type: linear, in_features: 784, out_features: 10}
loss: cross_entropy
optimizer: {kind: sgd, lr: 0.1}
batch_size: 8
epochs: 1
)";
}

struct CliResult {
  int status = -1;
  std::string out;
  std::string err;
};

CliResult cli(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  CliResult result;
  result.status = run_cli(args, {&out, &err, /*tty=*/false, /*program_path=*/""});
  result.out = out.str();
  result.err = err.str();
  return result;
}

template <typename Message>
Message parse_json(const std::string& json) {
  Message message;
  auto status = google::protobuf::util::JsonStringToMessage(json, &message);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return message;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    worker_ = scratch_.path() + "/fake-worker.sh";
    std::ofstream(worker_) << kWorkerScript;
    chmod(worker_.c_str(), 0755);
    start_server({worker_});
  }
  void TearDown() override {
    if (server_ != nullptr) server_->shutdown();
  }

  void start_server(std::vector<std::string> worker_command, const std::string& listen = "127.0.0.1:0") {
    daemon::DaemonServerOptions options;
    options.role = daemon::DaemonRole::kAll;
    options.listen = listen;
    options.data_dir = data_dir_.path();
    options.tick_interval = std::chrono::milliseconds(50);
    options.node_id = "node-a";
    options.slots = 2;
    options.worker_command = std::move(worker_command);
    options.stop_grace_period = std::chrono::seconds(2);
    auto server = daemon::DaemonServer::start(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    Client client = admin_client();
    const auto give_up = std::chrono::steady_clock::now() + kTimeout;
    while (std::chrono::steady_clock::now() < give_up) {
      auto nodes = client.nodes();
      if (nodes.ok() && nodes->size() == 1) return;
      std::this_thread::sleep_for(kPollInterval);
    }
    FAIL() << "the agent did not register";
  }

  std::string write_job(const std::string& name, int nodes = 1, int procs = 2,
                        const std::string& extra = "") {
    const std::string path = scratch_.path() + "/" + name + ".yaml";
    std::ofstream(path) << job_yaml(name, nodes, procs, extra);
    return path;
  }

  // A client holding the first admin's credentials (the file cohortd wrote in its data dir).
  Client admin_client() const {
    ClientOptions admin;
    admin.security = daemon::testing::admin_security(data_dir_.path());
    return Client(server_->address(), admin);
  }

  // `cohort ARGS --credentials <the first admin's file> --coordinator <the server>`, as an admin
  // types it (the file names the address of the first start; a restarted test server on port 0
  // listens elsewhere).
  CliResult cohort(std::vector<std::string> args) {
    args.push_back("--credentials");
    args.push_back(data_dir_.path() + "/admin.credentials");
    args.push_back("--coordinator");
    args.push_back(server_->address());
    return cli(args);
  }

  std::string submit(const std::string& name) {
    CliResult submitted = cohort({"submit", write_job(name), "-o", "json"});
    EXPECT_EQ(submitted.status, kExitOk) << submitted.err;
    std::smatch match;
    EXPECT_TRUE(std::regex_search(submitted.out, match, std::regex("\"job_id\": \"([^\"]+)\"")))
        << submitted.out;
    return match.size() > 1 ? match[1].str() : "";
  }

  cohort::v1::JobRecord wait_for_state(const std::string& id, cohort::v1::JobState state) {
    Client client = admin_client();
    const auto give_up = std::chrono::steady_clock::now() + kTimeout;
    cohort::v1::JobRecord job;
    while (std::chrono::steady_clock::now() < give_up) {
      auto record = client.get(id);
      if (record.ok()) job = *record;
      if (job.state() == state) break;
      std::this_thread::sleep_for(kPollInterval);
    }
    return job;
  }

  TempDir scratch_;
  TempDir data_dir_;
  std::string worker_;
  std::unique_ptr<daemon::DaemonServer> server_;
};

TEST_F(CliTest, SubmitFollowStatusListLogsAndJson) {
  CliResult followed = cohort({"submit", write_job("ok"), "--follow"});
  ASSERT_EQ(followed.status, kExitOk) << followed.out << followed.err;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(followed.out, match, std::regex("submitted job (ok-[0-9]+)")))
      << followed.out;
  const std::string id = match[1].str();
  EXPECT_NE(followed.out.find("job " + id + ": SUCCEEDED"), std::string::npos) << followed.out;
  EXPECT_NE(followed.out.find("RUNNING"), std::string::npos) << followed.out;

  CliResult status = cohort({"status", id});
  ASSERT_EQ(status.status, kExitOk) << status.err;
  EXPECT_NE(status.out.find("SUCCEEDED"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("node-a"), std::string::npos) << status.out;
  auto record = parse_json<cohort::v1::JobRecord>(cohort({"status", id, "-o", "json"}).out);
  EXPECT_EQ(record.id(), id);
  EXPECT_EQ(record.state(), cohort::v1::SUCCEEDED);
  EXPECT_EQ(record.spec().procs_per_node(), 2);

  CliResult list = cohort({"list"});
  ASSERT_EQ(list.status, kExitOk) << list.err;
  EXPECT_EQ(list.out.rfind("JOB ", 0), 0u) << list.out;
  EXPECT_NE(list.out.find(id), std::string::npos) << list.out;
  auto jobs = parse_json<cohort::v1::ListJobsResponse>(cohort({"list", "-o", "json"}).out);
  ASSERT_EQ(jobs.jobs_size(), 1);
  EXPECT_EQ(jobs.jobs(0).id(), id);
  EXPECT_EQ(parse_json<cohort::v1::ListJobsResponse>(cohort({"list", "--state", "running", "-o", "json"}).out)
                .jobs_size(),
            0);

  CliResult nodes = cohort({"nodes"});
  ASSERT_EQ(nodes.status, kExitOk) << nodes.err;
  EXPECT_NE(nodes.out.find("node-a"), std::string::npos) << nodes.out;
  auto node_list = parse_json<cohort::v1::ListNodesResponse>(cohort({"nodes", "-o", "json"}).out);
  ASSERT_EQ(node_list.nodes_size(), 1);
  EXPECT_EQ(node_list.nodes(0).node().slots(), 2);

  // The launch contract, as the worker saw it.
  CliResult logs = cohort({"logs", id, "--rank", "1"});
  ASSERT_EQ(logs.status, kExitOk) << logs.err;
  EXPECT_NE(logs.out.find("rank 1 of 2 local 1 attempt 1 port "), std::string::npos) << logs.out;
  EXPECT_EQ(logs.out.find(" port 0\n"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("init cohort://" + server_->address() + "/" + id + "?attempt=1&local_rank=1"),
            std::string::npos)
      << logs.out;
  EXPECT_NE(logs.out.find("coordinator " + server_->address() + "\n"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("spec file present"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("resume unset cuda unset"), std::string::npos) << logs.out;
  const std::string spec_path = data_dir_.path() + "/logs/" + id + "/attempt-1/job_spec.pb";
  EXPECT_NE(logs.out.find("spec " + spec_path), std::string::npos) << logs.out;
  cohort::v1::JobSpec spec;
  std::ifstream spec_file(spec_path, std::ios::binary);
  ASSERT_TRUE(spec.ParseFromIstream(&spec_file)) << spec_path;
  EXPECT_EQ(spec.name(), "ok");
  EXPECT_EQ(spec.procs_per_node(), 2);
  // Both ranks of the attempt got the same MASTER_PORT.
  std::smatch port0, port1;
  const std::string rank0 = cohort({"logs", id}).out;
  ASSERT_TRUE(std::regex_search(rank0, port0, std::regex("port ([0-9]+)"))) << rank0;
  ASSERT_TRUE(std::regex_search(logs.out, port1, std::regex("port ([0-9]+)")));
  EXPECT_EQ(port0[1].str(), port1[1].str());

  CliResult json_logs = cohort({"logs", id, "-o", "json"});
  EXPECT_NE(json_logs.out.find("\"rank\": 0"), std::string::npos) << json_logs.out;
}

TEST_F(CliTest, MessagesSayWhatHappened) {
  CliResult no_value = cohort({"list", "--state"});
  EXPECT_NE(no_value.status, kExitOk);
  EXPECT_NE(no_value.err.find("--state needs a value"), std::string::npos) << no_value.err;

  // Two nodes on a one-node cluster: refused, naming both numbers; with --wait-for-capacity,
  // PENDING until cancelled, never placed.
  CliResult refused = cohort({"submit", write_job("ok", /*nodes=*/2)});
  EXPECT_EQ(refused.status, kExitFailure);
  EXPECT_NE(refused.err.find("needs 2 node(s)"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("the cluster has 1 live node(s)"), std::string::npos) << refused.err;
  CliResult submitted = cohort({"submit", write_job("ok", /*nodes=*/2), "-o", "json", "--wait-for-capacity"});
  ASSERT_EQ(submitted.status, kExitOk) << submitted.err;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(submitted.out, match, std::regex("\"job_id\": \"([^\"]+)\"")));
  const std::string id = match[1].str();
  ASSERT_EQ(cohort({"cancel", id}).status, kExitOk);
  CliResult logs = cohort({"logs", id, "-f"});
  EXPECT_EQ(logs.status, kExitFailure);
  EXPECT_NE(logs.err.find("without running"), std::string::npos) << logs.err;
  EXPECT_EQ(logs.err.find("once it runs"), std::string::npos) << logs.err;
}

// More output than the agent's in-memory ring: `cohort logs` says how much is missing and where
// the whole log is, then prints the rest.
TEST_F(CliTest, LogsSaysWhatTheAgentAlreadyDropped) {
  const std::string id = submit("big");
  ASSERT_EQ(wait_for_state(id, cohort::v1::SUCCEEDED).state(), cohort::v1::SUCCEEDED);
  CliResult logs = cohort({"logs", id, "--rank", "0"});
  ASSERT_EQ(logs.status, kExitOk) << logs.err;
  EXPECT_NE(logs.out.find("last line"), std::string::npos);
  EXPECT_LT(logs.out.size(), 1200000u);
  EXPECT_NE(logs.err.find(" bytes skipped; the full log is " + data_dir_.path() + "/logs/"),
            std::string::npos)
      << logs.err;
  EXPECT_NE(logs.err.find("rank-0.log on node node-a]"), std::string::npos) << logs.err;
}

// `submit -f` outlives a coordinator restart: it says so once and picks up from the last event.
TEST_F(CliTest, FollowRetriesWhileTheCoordinatorRestarts) {
  const std::string id = submit("sleep");
  ASSERT_EQ(wait_for_state(id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
  std::ostringstream out, err;
  CommandContext context;
  context.coordinator = server_->address();
  context.out = &out;
  context.err = &err;
  Client client = admin_client();
  std::optional<StatusOr<cohort::v1::JobRecord>> followed;
  std::thread follower([&] { followed = follow_job(client, id, context); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string listen = "127.0.0.1:" + std::to_string(server_->port());
  server_->shutdown();
  server_.reset();
  // The follower finds nobody there: longer than a single call's own reconnect try (the client
  // channel rides out a blip of up to kLeaderConnectTimeout by itself), so the follower's loop
  // has to retry.
  std::this_thread::sleep_for(tls::kLeaderConnectTimeout + std::chrono::milliseconds(1000));
  start_server({worker_}, listen);
  // The restarted coordinator fails the attempt it no longer tracks; the follower, which watches
  // again from the last event it saw, reports that end instead of giving up at the restart.
  follower.join();
  ASSERT_TRUE(followed.has_value());
  ASSERT_TRUE(followed->ok()) << followed->status().to_string() << "\n" << err.str();
  EXPECT_EQ((*followed)->state(), cohort::v1::FAILED) << (*followed)->DebugString();
  EXPECT_NE((*followed)->reason().find("coordinator restarted"), std::string::npos) << (*followed)->reason();
  EXPECT_NE(out.str().find("job " + id + ": FAILED"), std::string::npos) << out.str();
  EXPECT_NE(err.str().find("coordinator unreachable, retrying"), std::string::npos) << err.str();
}

TEST_F(CliTest, CancelStopsARunningJob) {
  const std::string id = submit("sleep");
  ASSERT_EQ(wait_for_state(id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
  CliResult cancelled = cohort({"cancel", id, "--reason", "test says stop"});
  ASSERT_EQ(cancelled.status, kExitOk) << cancelled.err;
  EXPECT_NE(cancelled.out.find("CANCELLED"), std::string::npos) << cancelled.out;
  cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::CANCELLED);
  EXPECT_EQ(job.state(), cohort::v1::CANCELLED);
  EXPECT_NE(job.reason().find("test says stop"), std::string::npos) << job.reason();
  EXPECT_NE(cohort({"logs", id, "--rank", "1"}).out.find("started"), std::string::npos);
  // A finished job cannot be cancelled again: exit 1 with the coordinator's reason.
  CliResult again = cohort({"cancel", id});
  EXPECT_EQ(again.status, kExitFailure);
  EXPECT_FALSE(again.err.empty());
}

TEST_F(CliTest, RestartedAttemptResumesFromCheckpointWhenTheSpecAsks) {
  CliResult followed = cohort({"submit",
                               write_job("resume", 1, 1,
                                         "restart_policy: {max_restarts: 1, from_checkpoint: true}\n"
                                         "checkpoint: {dir: ckpt, interval_epochs: 1}\n"),
                               "-f"});
  ASSERT_EQ(followed.status, kExitOk) << followed.out << followed.err;
  EXPECT_NE(followed.out.find("[attempt 2]"), std::string::npos) << followed.out;
  CliResult logs = cohort({"logs", "resume-1"});
  EXPECT_NE(logs.out.find("attempt 2 resume 1"), std::string::npos) << logs.out;
  EXPECT_TRUE(std::filesystem::exists(data_dir_.path() + "/logs/resume-1/attempt-2/job_spec.pb"));
}

TEST_F(CliTest, UsersOwnTheirJobsAndAdminsManageUsersAndNodes) {
  // The admin makes a user; the credentials file it prints is all the user needs.
  CliResult added = cohort({"user", "add", "alice"});
  ASSERT_EQ(added.status, kExitOk) << added.err;
  EXPECT_NE(added.out.find("ca_certificate:"), std::string::npos) << added.out;
  EXPECT_NE(added.out.find("token:"), std::string::npos) << added.out;
  const std::string alice_file = scratch_.path() + "/alice.credentials";
  std::ofstream(alice_file) << added.out;
  ASSERT_EQ(cohort({"user", "add", "bob"}).status, kExitOk);
  const std::string bob_file = scratch_.path() + "/bob.credentials";
  std::ofstream(bob_file) << cohort({"user", "add", "bob2"}).out;
  auto as = [&](const std::string& file, std::vector<std::string> args) {
    args.insert(args.end(), {"--credentials", file, "--coordinator", server_->address()});
    return cli(args);
  };

  CliResult submitted = as(alice_file, {"submit", write_job("ok"), "--follow"});
  ASSERT_EQ(submitted.status, kExitOk) << submitted.out << submitted.err;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(submitted.out, match, std::regex("submitted job (ok-[0-9]+)")));
  const std::string id = match[1].str();
  EXPECT_NE(as(alice_file, {"list"}).out.find(id), std::string::npos);
  EXPECT_EQ(as(bob_file, {"list"}).out, "no jobs\n");
  CliResult denied = as(bob_file, {"status", id});
  EXPECT_EQ(denied.status, kExitFailure);
  EXPECT_NE(denied.err.find("PERMISSION_DENIED"), std::string::npos) << denied.err;
  EXPECT_NE(denied.err.find("belongs to alice"), std::string::npos) << denied.err;
  CliResult not_admin = as(bob_file, {"list", "--all"});
  EXPECT_NE(not_admin.err.find("for admins"), std::string::npos) << not_admin.err;
  EXPECT_NE(cohort({"list", "--all"}).out.find(id), std::string::npos);
  EXPECT_NE(cohort({"user", "add", "mallory"}).status, kExitUsage);
  CliResult users = cohort({"user", "list"});
  EXPECT_NE(users.out.find("alice"), std::string::npos) << users.out;
  EXPECT_NE(as(bob_file, {"user", "add", "eve"}).err.find("for admins only"), std::string::npos);

  // A join token pins this cluster's CA.
  CliResult token = cohort({"node", "token", "--ttl", "1"});
  ASSERT_EQ(token.status, kExitOk) << token.err;
  EXPECT_TRUE(std::regex_match(token.out, std::regex("K1-[0-9a-f]{64}-[0-9a-f]{64}\n"))) << token.out;

  // Revoked: alice's token stops working at once.
  ASSERT_EQ(cohort({"user", "revoke", "alice"}).status, kExitOk);
  CliResult revoked = as(alice_file, {"list"});
  EXPECT_EQ(revoked.status, kExitFailure);
  EXPECT_NE(revoked.err.find("UNAUTHENTICATED"), std::string::npos) << revoked.err;
  EXPECT_NE(revoked.err.find("revoked"), std::string::npos) << revoked.err;
}

TEST_F(CliTest, NoCredentialsSaysHowToGetThem) {
  const std::string missing = scratch_.path() + "/none.credentials";
  CliResult result = cli({"list", "--credentials", missing});
  EXPECT_EQ(result.status, kExitUsage);
  EXPECT_NE(result.err.find(missing), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("cohort user add"), std::string::npos) << result.err;
  // Plaintext to the TLS port (no credentials file anywhere): the message says what to pass.
  ::setenv("HOME", scratch_.path().c_str(), 1);
  CliResult plaintext = cli({"list", "--coordinator", server_->address()});
  EXPECT_EQ(plaintext.status, kExitFailure);
  EXPECT_NE(plaintext.err.find("--credentials"), std::string::npos) << plaintext.err;
}

TEST_F(CliTest, UnreachableCoordinatorSaysWhatToDo) {
  CliResult result = cli({"status", "x-1", "--coordinator", "127.0.0.1:1"});
  EXPECT_EQ(result.status, kExitFailure);
  EXPECT_NE(result.err.find("127.0.0.1:1"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("is cohortd running?"), std::string::npos) << result.err;
}

TEST_F(CliTest, LaunchThatCannotStartFailsTheJobNamingNodeAndError) {
  server_->shutdown();
  server_.reset();
  start_server({"/nonexistent/cohort-worker"});
  CliResult followed = cohort({"submit", write_job("ok"), "--follow"});
  EXPECT_EQ(followed.status, kExitJobFailed) << followed.out;  // the job failed, not the call
  auto jobs = admin_client().list();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  const cohort::v1::JobRecord& job = jobs->front();
  EXPECT_EQ(job.state(), cohort::v1::FAILED) << job.reason();
  EXPECT_NE(job.reason().find("node-a"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("/nonexistent/cohort-worker"), std::string::npos) << job.reason();
  EXPECT_NE(followed.out.find("FAILED"), std::string::npos) << followed.out;
}

TEST_F(CliTest, DrainStopsRunningTasksAndRefusesNewJobs) {
  const std::string id = submit("sleep");
  ASSERT_EQ(wait_for_state(id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
  server_->drain();
  // Its tasks were stopped, so the job is over (no restarts in its policy).
  cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::FAILED);
  EXPECT_EQ(job.state(), cohort::v1::FAILED) << job.reason();
  CliResult refused = cohort({"submit", write_job("ok")});
  EXPECT_EQ(refused.status, kExitFailure);
  EXPECT_NE(refused.err.find("draining"), std::string::npos) << refused.err;
  // The daemon still answers reads while it drains.
  EXPECT_EQ(cohort({"status", id}).status, kExitOk);
}

TEST(CliRunTest, RunsOneJobInProcessAndExitsWithItsResult) {
  TempDir scratch;
  const std::string worker = scratch.path() + "/fake-worker.sh";
  std::ofstream(worker) << kWorkerScript;
  chmod(worker.c_str(), 0755);
  const std::string job = scratch.path() + "/ok.yaml";
  std::ofstream(job) << job_yaml("ok", /*nodes=*/2, /*procs=*/1);
  const std::string data_dir = scratch.path() + "/data";
  CliResult ran = cli({"run", job, "--worker", worker, "--data-dir", data_dir});
  ASSERT_EQ(ran.status, kExitOk) << ran.out << ran.err;
  EXPECT_NE(ran.out.find("SUCCEEDED"), std::string::npos) << ran.out;
  EXPECT_NE(ran.out.find("test accuracy 0.9000"), std::string::npos) << ran.out;
  EXPECT_TRUE(std::filesystem::exists(data_dir + "/logs/ok-1/attempt-1/job_spec.pb"));

  const std::string bad = scratch.path() + "/bad.yaml";
  std::ofstream(bad) << job_yaml("bad", 1, 1);
  CliResult failed = cli({"run", bad, "--worker", worker, "--data-dir", scratch.path() + "/data2"});
  EXPECT_EQ(failed.status, kExitJobFailed) << failed.out;
  EXPECT_NE(failed.out.find("FAILED"), std::string::npos) << failed.out;
  EXPECT_NE(failed.out.find("unexpected job bad-1"), std::string::npos) << failed.out;

  CliResult no_worker = cli({"run", job, "--worker", scratch.path() + "/nope"});
  EXPECT_EQ(no_worker.status, kExitFailure);
  EXPECT_NE(no_worker.err.find("nope does not exist"), std::string::npos) << no_worker.err;

  // More GPUs than any machine has: refused up front (not PENDING forever), saying what to change.
  const std::string greedy = scratch.path() + "/greedy.yaml";
  std::ofstream(greedy) << job_yaml("ok", /*nodes=*/1, /*procs=*/2, "gpus_per_proc: 4096\n");
  CliResult too_many = cli({"run", greedy, "--worker", worker});
  EXPECT_EQ(too_many.status, kExitFailure);
  EXPECT_NE(too_many.err.find("needs 8192 GPU(s)"), std::string::npos) << too_many.err;
  EXPECT_NE(too_many.err.find("gpus_per_proc: 0"), std::string::npos) << too_many.err;
}

// A command job needs no worker binary: `cohort run` runs the command on every rank and shows the
// last lines of rank 0's output; a failing command's exit code fails the run.
TEST(CliRunTest, RunsACommandJobWithoutAWorker) {
  TempDir scratch;
  const std::string job = scratch.path() + "/hello.yaml";
  std::ofstream(job) << "name: hello\nnodes: 2\nprocs_per_node: 1\n"
                        "command: [sh, -c, 'echo \"hello from rank $RANK of $WORLD_SIZE\"']\n";
  CliResult ran = cli({"run", job, "--worker", scratch.path() + "/no-such-worker"});
  ASSERT_EQ(ran.status, kExitOk) << ran.out << ran.err;
  EXPECT_NE(ran.out.find("command sh -c"), std::string::npos) << ran.out;
  EXPECT_NE(ran.out.find("SUCCEEDED"), std::string::npos) << ran.out;
  EXPECT_NE(ran.out.find("hello from rank 0 of 2"), std::string::npos) << ran.out;

  const std::string failing = scratch.path() + "/failing.yaml";
  std::ofstream(failing) << "name: failing\nnodes: 1\nprocs_per_node: 1\ncommand: [sh, -c, 'echo oops; exit 4']\n";
  CliResult failed = cli({"run", failing});
  EXPECT_EQ(failed.status, kExitJobFailed) << failed.out;
  EXPECT_NE(failed.out.find("FAILED"), std::string::npos) << failed.out;
  EXPECT_NE(failed.out.find("oops"), std::string::npos) << failed.out;
}

// More ranks or simulated nodes than this machine can host: refused before anything starts, naming
// the numbers and --oversubscribe.
TEST(CliRunTest, RefusesMoreRanksOrNodesThanTheMachineCanHost) {
  TempDir scratch;
  const std::string worker = scratch.path() + "/fake-worker.sh";
  std::ofstream(worker) << kWorkerScript;
  chmod(worker.c_str(), 0755);
  const std::string wide = scratch.path() + "/wide.yaml";
  std::ofstream(wide) << job_yaml("wide", /*nodes=*/1, /*procs=*/4096);
  CliResult ranks = cli({"run", wide, "--worker", worker, "--data-dir", scratch.path() + "/data"});
  EXPECT_EQ(ranks.status, kExitFailure);
  EXPECT_NE(ranks.err.find("asks for 4096 ranks"), std::string::npos) << ranks.err;
  EXPECT_NE(ranks.err.find("--oversubscribe"), std::string::npos) << ranks.err;
  const std::string many = scratch.path() + "/many.yaml";
  std::ofstream(many) << job_yaml("many", /*nodes=*/100000, /*procs=*/1);
  CliResult nodes = cli({"run", many, "--worker", worker, "--data-dir", scratch.path() + "/data"});
  EXPECT_EQ(nodes.status, kExitFailure);
  EXPECT_NE(nodes.err.find("asks for 100000 nodes"), std::string::npos) << nodes.err;
  EXPECT_NE(nodes.err.find("--oversubscribe"), std::string::npos) << nodes.err;
  // Refused before anything started: no job database was created.
  EXPECT_FALSE(std::filesystem::exists(scratch.path() + "/data"));
}

}  // namespace
}  // namespace cohort::client::cli
