// LeaderChannel against real gRPC servers on 127.0.0.1: a standby that names the leader, a
// standby that knows none, a dead address, every coordinator a standby (bounded by the deadline),
// errors other than UNAVAILABLE returned as they are, and a leader that holds calls without
// answering (stopped or cut off).

#include "worker/base/leader_channel.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/info.grpc.pb.h"

namespace cohort::tls {
namespace {

using std::chrono::milliseconds;
using std::chrono::system_clock;

// Answers GetVersion as a leader (version "leader at PORT"), as a standby (UNAVAILABLE with the
// cohort-leader trailer), with PERMISSION_DENIED, or not at all (kHung: the handler holds the call
// until the caller gives up or the server shuts down, as a SIGSTOPped leader whose connection stays
// up would).
class FakeCoordinator final : public cohort::v1::Info::Service {
 public:
  enum class Mode { kLeader, kStandby, kDenied, kHung };
  grpc::Status GetVersion(grpc::ServerContext* context, const cohort::v1::GetVersionRequest*,
                          cohort::v1::VersionInfo* info) override {
    ++calls;
    switch (mode.load()) {
      case Mode::kLeader:
        info->set_version("leader " + name);
        return grpc::Status::OK;
      case Mode::kStandby: {
        std::string hint;
        {
          std::lock_guard<std::mutex> lock(mu);
          hint = leader;
        }
        context->AddTrailingMetadata(kLeaderMetadata, hint);
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, name + " is a standby coordinator");
      }
      case Mode::kDenied:
        return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "no");
      case Mode::kHung:
        while (!context->IsCancelled()) std::this_thread::sleep_for(milliseconds(5));
        return grpc::Status(grpc::StatusCode::CANCELLED, "gave up");
    }
    return grpc::Status::OK;
  }
  void set_leader(const std::string& address) {
    std::lock_guard<std::mutex> lock(mu);
    leader = address;
  }

  std::atomic<Mode> mode{Mode::kLeader};
  std::atomic<int> calls{0};
  std::string name;
  std::mutex mu;
  std::string leader;
};

struct Server {
  explicit Server(FakeCoordinator::Mode mode) {
    service.mode = mode;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
    service.name = address;
  }
  ~Server() { server->Shutdown(system_clock::now() + milliseconds(100)); }
  FakeCoordinator service;
  int port = 0;
  std::string address;
  std::unique_ptr<grpc::Server> server;
};

ChannelSecurity plaintext() {
  ChannelSecurity security;
  security.insecure = true;
  return security;
}

grpc::Status get_version(LeaderChannel& leader, milliseconds timeout, std::string* version = nullptr) {
  cohort::v1::VersionInfo info;
  grpc::Status status = leader.unary<cohort::v1::Info>(system_clock::now() + timeout, &cohort::v1::Info::Stub::GetVersion,
                                                       cohort::v1::GetVersionRequest(), &info);
  if (version != nullptr) *version = info.version();
  return status;
}

// GetVersion as a call that is safe to repeat (LeaderChannel::idempotent_unary).
grpc::Status get_version_idempotent(LeaderChannel& leader, milliseconds timeout, std::string* version = nullptr) {
  cohort::v1::VersionInfo info;
  grpc::Status status = leader.idempotent_unary<cohort::v1::Info>(
      system_clock::now() + timeout, &cohort::v1::Info::Stub::GetVersion, cohort::v1::GetVersionRequest(), &info);
  if (version != nullptr) *version = info.version();
  return status;
}

// A port nothing listens on: bound once, then released.
std::string dead_address() {
  Server gone(FakeCoordinator::Mode::kLeader);
  return gone.address;
}

TEST(ParseAddressList, AcceptsListsAndNamesBadEntries) {
  auto one = parse_address_list("127.0.0.1:7070");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, std::vector<std::string>{"127.0.0.1:7070"});
  auto two = parse_address_list("a:1, b:2,a:1");
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  EXPECT_EQ(*two, (std::vector<std::string>{"a:1", "b:2"}));
  auto ipv6 = parse_address_list("[::1]:7070");
  ASSERT_TRUE(ipv6.ok());
  auto empty = parse_address_list("a:1,,b:2");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("empty entry"), std::string::npos) << empty.status().message();
  auto no_port = parse_address_list("a:1,hostonly");
  ASSERT_FALSE(no_port.ok());
  EXPECT_NE(no_port.status().message().find("\"hostonly\""), std::string::npos) << no_port.status().message();
  EXPECT_FALSE(parse_address_list("").ok());
}

TEST(LeaderChannel, FollowsTheStandbysHintToTheLeaderAndRemembersIt) {
  Server standby(FakeCoordinator::Mode::kStandby);
  Server leader(FakeCoordinator::Mode::kLeader);
  standby.service.set_leader(leader.address);
  auto channel = LeaderChannel::create(standby.address + "," + leader.address, plaintext());
  ASSERT_TRUE(channel.ok());
  std::string version;
  grpc::Status status = get_version(**channel, milliseconds(5000), &version);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(version, "leader " + leader.address);
  EXPECT_EQ((*channel)->leader_address(), leader.address);
  EXPECT_EQ(standby.service.calls.load(), 1);
  ASSERT_TRUE(get_version(**channel, milliseconds(5000)).ok());
  EXPECT_EQ(standby.service.calls.load(), 1) << "the second call must go straight to the leader";
}

TEST(LeaderChannel, MovesOnPastADeadAddressAndAStandbyThatKnowsNoLeader) {
  Server standby(FakeCoordinator::Mode::kStandby);  // no hint: the trailer is empty
  Server leader(FakeCoordinator::Mode::kLeader);
  const auto start = system_clock::now();
  auto channel = LeaderChannel::create(dead_address() + "," + standby.address + "," + leader.address, plaintext());
  ASSERT_TRUE(channel.ok());
  std::string version;
  grpc::Status status = get_version(**channel, milliseconds(8000), &version);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(version, "leader " + leader.address);
  EXPECT_LT(system_clock::now() - start, milliseconds(3000)) << "a refused connection must cost no wait";
}

TEST(LeaderChannel, FailsOverWhenTheLeaderDiesAndTheStandbyTakesOver) {
  auto first = std::make_unique<Server>(FakeCoordinator::Mode::kLeader);
  Server second(FakeCoordinator::Mode::kStandby);
  second.service.set_leader(first->address);
  auto channel = LeaderChannel::create(first->address + "," + second.address, plaintext());
  ASSERT_TRUE(channel.ok());
  ASSERT_TRUE(get_version(**channel, milliseconds(5000)).ok());
  const std::string first_address = first->address;
  first.reset();  // the leader dies; the standby learns nothing for a while, then leads
  second.service.set_leader("");
  std::thread election([&] {
    std::this_thread::sleep_for(milliseconds(700));
    second.service.mode = FakeCoordinator::Mode::kLeader;
  });
  std::string version;
  grpc::Status status = get_version(**channel, milliseconds(8000), &version);
  election.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(version, "leader " + second.address);
  EXPECT_EQ((*channel)->leader_address(), second.address);
  EXPECT_NE(first_address, second.address);
}

TEST(LeaderChannel, NoLeaderAtAllEndsUnavailableAtTheDeadline) {
  Server a(FakeCoordinator::Mode::kStandby);
  Server b(FakeCoordinator::Mode::kStandby);
  auto channel = LeaderChannel::create(a.address + "," + b.address, plaintext());
  ASSERT_TRUE(channel.ok());
  const auto start = system_clock::now();
  grpc::Status status = get_version(**channel, milliseconds(1500));
  const auto took = system_clock::now() - start;
  EXPECT_TRUE(status.error_code() == grpc::StatusCode::UNAVAILABLE ||
              status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
      << status.error_message();
  EXPECT_GE(took, milliseconds(1000));
  EXPECT_LT(took, milliseconds(3500));
  EXPECT_GT(a.service.calls.load() + b.service.calls.load(), 2) << "it retries within the deadline";
}

TEST(LeaderChannel, OtherErrorsAreReturnedWithoutTryingElsewhere) {
  Server denied(FakeCoordinator::Mode::kDenied);
  Server leader(FakeCoordinator::Mode::kLeader);
  auto channel = LeaderChannel::create(denied.address + "," + leader.address, plaintext());
  ASSERT_TRUE(channel.ok());
  EXPECT_EQ(get_version(**channel, milliseconds(5000)).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(leader.service.calls.load(), 0);
}

TEST(LeaderChannel, AnIdempotentCallLeavesALeaderThatHoldsItWithoutAnswering) {
  // The old leader is stopped (its connection stays READY, so it looks reachable) and a standby took
  // over. An agent's heartbeat (1 s deadline here) must reach the new leader in time, and the
  // channel must stay there, not go back to the hung one with every call.
  Server hung(FakeCoordinator::Mode::kHung);
  Server leader(FakeCoordinator::Mode::kLeader);
  auto channel = LeaderChannel::create(hung.address + "," + leader.address, plaintext());
  ASSERT_TRUE(channel.ok());
  const auto start = system_clock::now();
  std::string version;
  grpc::Status first = get_version_idempotent(**channel, milliseconds(1000), &version);
  ASSERT_TRUE(first.ok()) << first.error_message();
  EXPECT_EQ(version, "leader " + leader.address);
  EXPECT_EQ((*channel)->leader_address(), leader.address);
  grpc::Status second = get_version_idempotent(**channel, milliseconds(1000), &version);
  ASSERT_TRUE(second.ok()) << second.error_message();
  EXPECT_EQ(version, "leader " + leader.address);
  EXPECT_EQ(hung.service.calls.load(), 1) << "the second call must go straight to the live leader";
  EXPECT_EQ(leader.service.calls.load(), 2);
  EXPECT_LT(system_clock::now() - start, milliseconds(1500)) << "the hung leader may cost one try's share only";
}

TEST(LeaderChannel, ACallThatMayNotRunTwiceWaitsOutItsDeadlineAtAHungLeader) {
  // SubmitJob-like calls are not sent elsewhere once a coordinator may have received them.
  Server hung(FakeCoordinator::Mode::kHung);
  Server leader(FakeCoordinator::Mode::kLeader);
  auto channel = LeaderChannel::create(hung.address + "," + leader.address, plaintext());
  ASSERT_TRUE(channel.ok());
  EXPECT_EQ(get_version(**channel, milliseconds(500)).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(leader.service.calls.load(), 0);
  EXPECT_EQ((*channel)->leader_address(), hung.address);
}

// A renewed node certificate: set_credentials while calls run on other threads (the daemon's
// agent thread renews, drain() heartbeats from the SIGTERM path). Calls under way finish, later
// calls present the new credentials (here: TLS towards a plaintext server fails, plaintext again
// succeeds) and the known leader is kept.
TEST(LeaderChannel, CredentialsSwitchWhileCallsRunOnOtherThreads) {
  Server standby(FakeCoordinator::Mode::kStandby);
  Server leader(FakeCoordinator::Mode::kLeader);
  standby.service.set_leader(leader.address);
  auto channel = LeaderChannel::create(standby.address + "," + leader.address, plaintext());
  ASSERT_TRUE(channel.ok());
  ASSERT_TRUE(get_version(**channel, milliseconds(5000)).ok());
  ASSERT_EQ((*channel)->leader_address(), leader.address);

  std::atomic<bool> done{false};
  std::atomic<int> calls{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < 3; ++i) {
    callers.emplace_back([&] {
      while (!done) {
        if (!get_version(**channel, milliseconds(5000)).ok()) ++failed;
        ++calls;
      }
    });
  }
  const auto until = std::chrono::steady_clock::now() + milliseconds(500);
  int switches = 0;
  while (std::chrono::steady_clock::now() < until) {
    (*channel)->set_credentials(plaintext());
    ++switches;
    std::this_thread::sleep_for(milliseconds(1));
  }
  done = true;
  for (std::thread& caller : callers) caller.join();
  EXPECT_GT(switches, 10);
  EXPECT_GT(calls.load(), 0);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ((*channel)->leader_address(), leader.address);

  // The new credentials are used: TLS against the plaintext servers fails, plaintext works again.
  const std::shared_ptr<grpc::Channel> before = (*channel)->leader_channel();
  ChannelSecurity tls_security;
  tls_security.ca_pem = "not a certificate";
  (*channel)->set_credentials(tls_security);
  EXPECT_NE((*channel)->leader_channel(), before);
  EXPECT_FALSE(get_version(**channel, milliseconds(1000)).ok());
  (*channel)->set_credentials(plaintext());
  grpc::Status again = get_version(**channel, milliseconds(5000));
  EXPECT_TRUE(again.ok()) << again.error_message();
}

TEST(LeaderChannel, OneAddressFailsFastOrFollowsANamedLeaderOnce) {
  const auto start = system_clock::now();
  auto dead = LeaderChannel::create(dead_address(), plaintext());
  ASSERT_TRUE(dead.ok());
  EXPECT_EQ(get_version(**dead, milliseconds(5000)).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_LT(system_clock::now() - start, milliseconds(2500));

  Server standby(FakeCoordinator::Mode::kStandby);
  Server leader(FakeCoordinator::Mode::kLeader);
  standby.service.set_leader(leader.address);
  auto channel = LeaderChannel::create(standby.address, plaintext());
  ASSERT_TRUE(channel.ok());
  ASSERT_TRUE(get_version(**channel, milliseconds(5000)).ok());
  EXPECT_EQ(leader.service.calls.load(), 1);
}

TEST(LeaderChannel, OneAddressThatWasNotUpAtTheFirstTryGetsOneMoreOnceItIs) {
  // The coordinator's port accepts nothing when the call starts (as when a connection or its
  // handshake fails), and is served 300 ms later: the call succeeds on the reconnect, once.
  auto probe = std::make_unique<Server>(FakeCoordinator::Mode::kLeader);
  const std::string address = probe->address;
  const int port = probe->port;
  probe.reset();  // nothing listens there now
  auto channel = LeaderChannel::create(address, plaintext());
  ASSERT_TRUE(channel.ok());
  std::unique_ptr<grpc::Server> late;
  FakeCoordinator service;
  service.name = address;
  std::thread starter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials());
    builder.RegisterService(&service);
    late = builder.BuildAndStart();
  });
  std::string version;
  grpc::Status status = get_version(**channel, milliseconds(5000), &version);
  starter.join();
  ASSERT_NE(late, nullptr) << "port " << port << " was taken in between";
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(version, "leader " + address);
  EXPECT_EQ(service.calls.load(), 1);
  late->Shutdown(system_clock::now() + milliseconds(100));
}

}  // namespace
}  // namespace cohort::tls
