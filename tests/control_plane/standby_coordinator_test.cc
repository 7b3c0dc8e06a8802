// A standby coordinator (issue 16) against a real leader, both TLS DaemonServers on 127.0.0.1:0
// sharing the cluster CA and the identities (the standby's data directory starts as a copy of the
// leader's ca/ and identity.db: these coordinators share no etcd, so the identities cannot follow
// the leader as they do with `job_store: etcd://`, README's "High availability"):
//   - the standby answers every Coordinator and Rendezvous call UNAVAILABLE, naming itself and the
//     leader, with the `cohort-leader` trailer; its health for cohort.v1.Coordinator is NOT_SERVING;
//   - a client given "standby,leader" reaches the leader (submit, get, list), also with a token the
//     standby does not know (a user added after it was seeded: UNAVAILABLE naming the leader, not
//     UNAUTHENTICATED);
//   - an agent given the same list joins (with a join token the standby does not know) and registers
//     with the leader;
//   - when the leader is gone and the standby is made leader, the same client moves to it; losing
//     the leadership closes the gate again at once.

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "client/client.h"
#include "cohort/v1/coordinator.grpc.pb.h"
#include "cohort/v1/rendezvous.grpc.pb.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/coordinator/test_specs.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/testing/test_credentials.h"
#include "worker/base/leader_channel.h"
#include "worker/base/tls.h"

namespace cohort::daemon {
namespace {

using coordinator::testing::TempDir;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr milliseconds kTick{50};

DaemonServerOptions coordinator_options(const std::string& data_dir) {
  DaemonServerOptions options;
  options.role = DaemonRole::kCoordinator;
  options.listen = "127.0.0.1:0";
  options.data_dir = data_dir;
  options.tick_interval = kTick;
  options.node_lease = seconds(15);
  return options;
}

// What a second coordinator needs of the first: the cluster CA (and job-secret key) and the users,
// tokens and node certificates.
void copy_cluster_identity(const std::string& from, const std::string& to) {
  namespace fs = std::filesystem;
  fs::create_directories(to);
  fs::copy(from + "/ca", to + "/ca", fs::copy_options::recursive);
  for (const char* file : {"identity.db", "identity.db-wal", "identity.db-shm"}) {
    if (fs::exists(from + "/" + file)) fs::copy_file(from + "/" + file, to + "/" + file);
  }
}

template <typename Predicate>
bool eventually(Predicate predicate, milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (predicate()) return true;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return predicate();
}

class StandbyCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto leader = DaemonServer::start(coordinator_options(leader_dir_.path()));
    ASSERT_TRUE(leader.ok()) << leader.status().to_string();
    leader_ = std::move(*leader);
    copy_cluster_identity(leader_dir_.path(), standby_dir_.path());
    DaemonServerOptions options = coordinator_options(standby_dir_.path());
    options.standby = true;
    options.standby_leader = leader_->address();
    options.on_leadership_lost = [this] { ++lost_; };
    auto standby = DaemonServer::start(options);
    ASSERT_TRUE(standby.ok()) << standby.status().to_string();
    standby_ = std::move(*standby);
    admin_ = testing::admin_security(leader_dir_.path());
  }

  TempDir leader_dir_;
  TempDir standby_dir_;
  std::unique_ptr<DaemonServer> leader_;
  std::unique_ptr<DaemonServer> standby_;
  tls::ChannelSecurity admin_;
  std::atomic<int> lost_{0};
};

TEST_F(StandbyCoordinatorTest, StandbyRefusesEveryCallNamingTheLeader) {
  EXPECT_TRUE(leader_->leading());
  EXPECT_FALSE(standby_->leading());
  auto stub = cohort::v1::Coordinator::NewStub(tls::make_channel(standby_->address(), admin_));
  cohort::v1::SubmitJobRequest request;
  *request.mutable_spec() = coordinator::testing::valid_spec();
  cohort::v1::SubmitJobResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + seconds(10));
  grpc::Status status = stub->SubmitJob(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(status.error_message().find("cohortd at " + standby_->address() + " is a standby coordinator; the leader is " +
                                        leader_->address()),
            std::string::npos)
      << status.error_message();
  EXPECT_EQ(tls::leader_hint(context), leader_->address());

  // The rendezvous too (worker ranks), with a job secret the standby can check only once it leads.
  auto rendezvous = cohort::v1::Rendezvous::NewStub(
      tls::make_channel(standby_->address(), testing::job_security(*standby_, "job-1", 1)));
  cohort::v1::JoinRequest join;
  join.mutable_attempt()->set_job_id("job-1");
  join.mutable_attempt()->set_attempt(1);
  cohort::v1::JoinResponse joined;
  grpc::ClientContext join_context;
  join_context.set_deadline(std::chrono::system_clock::now() + seconds(10));
  EXPECT_EQ(rendezvous->Join(&join_context, join, &joined).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(tls::leader_hint(join_context), leader_->address());

  // A user added after the standby was seeded is unknown to it, and is still sent to the leader.
  client::ClientOptions late;
  late.security = testing::user_security(*leader_, "late-user");
  late.rpc_timeout = seconds(5);
  client::Client late_client(standby_->address() + "," + leader_->address(), late);
  StatusOr<std::vector<cohort::v1::JobRecord>> listed = late_client.list();
  EXPECT_TRUE(listed.ok()) << listed.status().to_string();
  auto unknown_stub = cohort::v1::Coordinator::NewStub(tls::make_channel(standby_->address(), late.security));
  cohort::v1::ListJobsResponse jobs;
  grpc::ClientContext unknown_context;
  unknown_context.set_deadline(std::chrono::system_clock::now() + seconds(10));
  // Refused before any handler (the standby cannot verify the token): UNAVAILABLE naming the leader,
  // not UNAUTHENTICATED, so the client tries the next coordinator.
  grpc::Status unknown = unknown_stub->ListJobs(&unknown_context, cohort::v1::ListJobsRequest(), &jobs);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNAVAILABLE) << unknown.error_message();
  EXPECT_NE(unknown.error_message().find("the leader is " + leader_->address()), std::string::npos)
      << unknown.error_message();

  EXPECT_FALSE(standby_->health().serving(kCoordinatorService));
  EXPECT_FALSE(standby_->health().serving(kRendezvousService));
  EXPECT_TRUE(standby_->health().serving(kInfoService));
  EXPECT_TRUE(leader_->health().serving(kCoordinatorService));
}

TEST_F(StandbyCoordinatorTest, ClientsAndAgentsGivenBothAddressesFollowTheLeaderAndThenTheNewOne) {
  const std::string both = standby_->address() + "," + leader_->address();
  client::ClientOptions client_options;
  client_options.security = admin_;
  client_options.rpc_timeout = seconds(5);
  client::Client client(both, client_options);
  StatusOr<std::string> submitted = client.submit(coordinator::testing::valid_spec(), /*wait_for_capacity=*/true);
  ASSERT_TRUE(submitted.ok()) << submitted.status().to_string();
  EXPECT_TRUE(leader_->coordinator().get_job(*submitted).ok()) << "the job must be on the leader";
  StatusOr<cohort::v1::JobRecord> record = client.get(*submitted);
  ASSERT_TRUE(record.ok()) << record.status().to_string();

  // An agent given both addresses, the standby first: it registers with the leader.
  TempDir agent_dir;
  DaemonServerOptions agent;
  agent.role = DaemonRole::kAgent;
  agent.listen = "127.0.0.1:0";
  agent.data_dir = agent_dir.path();
  agent.coordinator_address = both;
  agent.node_id = "node-a";
  agent.slots = 1;
  agent.worker_command = {"/bin/true"};
  // A join token made after the standby was seeded: the standby sends the join to the leader.
  StatusOr<std::string> token = leader_->security().identities()->add_join_token(
      seconds(60), std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  ASSERT_TRUE(token.ok()) << token.status().to_string();
  agent.join_token = leader_->security().join_token_text(*token);
  auto agent_server = DaemonServer::start(agent);
  ASSERT_TRUE(agent_server.ok()) << agent_server.status().to_string();
  ASSERT_TRUE(eventually([&] { return leader_->coordinator().list_nodes().size() == 1; }, seconds(10)))
      << "the agent did not register with the leader";

  // The leader goes away; the standby is elected (here by hand: the etcd election calls the same).
  leader_->shutdown();
  leader_.reset();
  const auto started = std::chrono::steady_clock::now();
  Status elected = standby_->become_leader();
  ASSERT_TRUE(elected.ok()) << elected.to_string();
  EXPECT_TRUE(standby_->leading());
  EXPECT_TRUE(standby_->health().serving(kCoordinatorService));
  EXPECT_EQ(standby_->become_leader().code(), StatusCode::kOk) << "leading already is not an error";

  StatusOr<std::string> after = client.submit(coordinator::testing::valid_spec(), /*wait_for_capacity=*/true);
  ASSERT_TRUE(after.ok()) << after.status().to_string();
  EXPECT_TRUE(standby_->coordinator().get_job(*after).ok());
  std::printf("client reached the new leader %.0f ms after it was elected\n",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  EXPECT_EQ(lost_.load(), 0);

  // Losing the leadership closes the gate at once and tells the daemon (cohortd then exits).
  standby_->follow_leader("127.0.0.1:1");
  EXPECT_FALSE(standby_->leading());
  EXPECT_EQ(lost_.load(), 1);
  EXPECT_FALSE(standby_->health().serving(kCoordinatorService));
  StatusOr<cohort::v1::JobRecord> refused = client.get(*after);
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(standby_->become_leader().code(), StatusCode::kFailedPrecondition);
  agent_server->reset();
}

}  // namespace
}  // namespace cohort::daemon
