// LeaderElection against a real 3-member etcd 3.4 cluster with TLS client certificates: two
// candidates, one leads; resignation and lease loss hand over to the other; a leader cut off from
// etcd steps down before its successor is elected.

#include "daemon/etcd/leader_election.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "tests/etcd/etcd_cluster.h"
#include "tests/etcd/etcd_cluster_test.h"

namespace cohort::etcd {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::EtcdCluster;

constexpr std::chrono::seconds kTtl{2};

// A candidate with its own client (as two coordinators would have) and a record of its callbacks.
struct Candidate {
  Candidate(const EtcdOptions& etcd, const std::string& name, const std::string& value) {
    auto created = EtcdClient::create(etcd);
    EXPECT_TRUE(created.ok()) << created.status().to_string();
    client = std::move(created).value();
    LeaderElectionOptions options;
    options.name = name;
    options.value = value;
    options.lease_ttl = kTtl;
    options.on_elected = [this](const LeaderKey&) {
      std::lock_guard<std::mutex> lock(mutex);
      elected_at = Clock::now();
    };
    options.on_lost = [this](const Status& why) {
      std::lock_guard<std::mutex> lock(mutex);
      lost_at = Clock::now();
      lost_reason = why;
    };
    election = std::make_unique<LeaderElection>(client.get(), options);
  }

  // Stops the election before the members its callbacks write are destroyed.
  ~Candidate() { election->stop(); }

  std::unique_ptr<EtcdClient> client;
  std::unique_ptr<LeaderElection> election;
  std::mutex mutex;
  Clock::time_point elected_at{};
  Clock::time_point lost_at{};
  Status lost_reason;
};

// Waits until `predicate` holds or `timeout` passes.
template <typename Predicate>
bool eventually(Predicate predicate, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return predicate();
}

// One cluster for the suite (each test campaigns under its own name): starting a cluster costs
// seconds, and the suite stays short.
class LeaderElectionTest : public testing::EtcdClusterTest {};

TEST_F(LeaderElectionTest, RejectsBadOptions) {
  auto client = EtcdClient::create(cluster_->client_options());
  ASSERT_TRUE(client.ok());
  LeaderElectionOptions options;
  options.value = "";
  LeaderElection no_value(client->get(), options);
  EXPECT_EQ(no_value.start().code(), StatusCode::kInvalidArgument);
  options.value = "a:1";
  options.lease_ttl = std::chrono::seconds(1);
  LeaderElection short_lease(client->get(), options);
  EXPECT_EQ(short_lease.start().code(), StatusCode::kInvalidArgument);
}

TEST_F(LeaderElectionTest, OneLeadsTheOtherFollowsAndTakesOverOnResign) {
  Candidate a(cluster_->client_options(), "/t/resign", "10.0.0.1:7070");
  Candidate b(cluster_->client_options(), "/t/resign", "10.0.0.2:7070");
  ASSERT_TRUE(a.election->start().ok());
  ASSERT_TRUE(a.election->wait_until_leader(milliseconds(10000)));
  ASSERT_TRUE(b.election->start().ok());
  EXPECT_FALSE(b.election->wait_until_leader(milliseconds(1500))) << "two leaders";
  EXPECT_TRUE(a.election->is_leader());
  EXPECT_GT(a.election->leadership()->rev, 0);
  // The standby learns the leader's address (for its UNAVAILABLE hint).
  EXPECT_TRUE(eventually([&] { return b.election->leader_address() == "10.0.0.1:7070"; }, milliseconds(3000)))
      << "standby sees '" << b.election->leader_address() << "'";

  const auto stop_start = Clock::now();
  a.election->stop();  // resigns: b leads at once, not after the TTL
  EXPECT_FALSE(a.election->is_leader());
  ASSERT_TRUE(b.election->wait_until_leader(milliseconds(5000)));
  EXPECT_LT(Clock::now() - stop_start, kTtl)
      << "the takeover waited for the lease instead of the resignation";
  EXPECT_EQ(b.election->leader_address(), "10.0.0.2:7070");
  EXPECT_EQ(b.election->terms(), 1);
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    EXPECT_EQ(a.lost_reason.code(), StatusCode::kCancelled) << a.lost_reason.to_string();
  }
}

TEST_F(LeaderElectionTest, RevokedLeaseStepsTheLeaderDownAndTheOtherLeads) {
  Candidate a(cluster_->client_options(), "/t/revoke", "a:1");
  Candidate b(cluster_->client_options(), "/t/revoke", "b:2");
  ASSERT_TRUE(a.election->start().ok());
  ASSERT_TRUE(a.election->wait_until_leader(milliseconds(10000)));
  ASSERT_TRUE(b.election->start().ok());
  std::this_thread::sleep_for(milliseconds(500));  // b is campaigning
  const LeaderKey held = *a.election->leadership();
  // The leader's lease vanishes (what etcd does when a leader stops renewing it).
  ASSERT_TRUE(a.client->lease_revoke(held.lease).ok());
  ASSERT_TRUE(b.election->wait_until_leader(milliseconds(5000)));
  EXPECT_TRUE(eventually([&] { return !a.election->is_leader(); }, milliseconds(2000)))
      << "the deposed leader still believes it leads";
  // on_lost runs just after the state flips.
  EXPECT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> lock(a.mutex);
        return !a.lost_reason.ok();
      },
      milliseconds(2000)))
      << "on_lost was not called";
  // a campaigns again as a standby and sees b lead.
  EXPECT_TRUE(eventually([&] { return a.election->leader_address() == "b:2"; }, milliseconds(3000)));
  EXPECT_FALSE(a.election->is_leader());
}

TEST_F(LeaderElectionTest, LeaderCutOffFromEtcdStepsDownBeforeTheOtherLeads) {
  // a talks only to member 0; b to members 1 and 2. Stopping member 0 cuts a off from etcd while
  // the other two keep a quorum.
  EtcdOptions a_options = cluster_->client_options();
  a_options.endpoints = {cluster_->endpoints()[0]};
  a_options.call_timeout = milliseconds(500);
  a_options.attempt_timeout = milliseconds(500);
  EtcdOptions b_options = cluster_->client_options();
  b_options.endpoints = {cluster_->endpoints()[1], cluster_->endpoints()[2]};
  Candidate a(a_options, "/t/cut", "a:1");
  ASSERT_TRUE(a.election->start().ok());
  ASSERT_TRUE(a.election->wait_until_leader(milliseconds(10000)));
  Candidate b(b_options, "/t/cut", "b:2");
  ASSERT_TRUE(b.election->start().ok());
  std::this_thread::sleep_for(milliseconds(500));
  ASSERT_TRUE(a.election->is_leader());

  const auto cut = Clock::now();
  cluster_->stop_member(0);
  EXPECT_TRUE(eventually([&] { return !a.election->is_leader(); }, milliseconds(kTtl) + milliseconds(1000)))
      << "a leader without etcd kept leading past its lease TTL";
  ASSERT_TRUE(b.election->wait_until_leader(milliseconds(10000)));
  const auto took_over = Clock::now() - cut;
  cluster_->continue_member(0);
  Clock::time_point a_lost;
  Clock::time_point b_elected;
  // The callbacks run just after the state flips.
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> lock(b.mutex);
        b_elected = b.elected_at;
        return b_elected != Clock::time_point{};
      },
      milliseconds(2000)));
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    a_lost = a.lost_at;
    EXPECT_EQ(a.lost_reason.code(), StatusCode::kUnavailable) << a.lost_reason.to_string();
  }
  ASSERT_NE(a_lost, Clock::time_point{});
  EXPECT_LT(a_lost, b_elected) << "two leaders at once: a stepped down after b was elected";
  // etcd expires the lease within its TTL (plus its own expiry check) after the last renewal.
  EXPECT_LT(took_over, kTtl * 3) << "the standby took over "
                                 << std::chrono::duration_cast<milliseconds>(took_over).count()
                                 << " ms after the cut";
}

TEST_F(LeaderElectionTest, StandbyWhoseCampaignMemberHangsTakesOverThroughAnother) {
  // b's campaign waits on member 0 (a fresh client's first choice); a talks to members 1 and 2.
  // Member 0 hangs, then a resigns: b must lead through another member while member 0 still
  // hangs, not once it answers again (its campaign round is 60 s).
  EtcdOptions a_options = cluster_->client_options();
  a_options.endpoints = {cluster_->endpoints()[1], cluster_->endpoints()[2]};
  Candidate a(a_options, "/t/hung-member", "a:1");
  ASSERT_TRUE(a.election->start().ok());
  ASSERT_TRUE(a.election->wait_until_leader(milliseconds(10000)));
  Candidate b(cluster_->client_options(), "/t/hung-member", "b:2");
  ASSERT_TRUE(b.election->start().ok());
  ASSERT_TRUE(eventually([&] { return b.election->leader_address() == "a:1"; }, milliseconds(3000)));
  ASSERT_EQ(b.client->preferred_member(), 0u);

  struct Continue {
    EtcdCluster* cluster;
    ~Continue() { cluster->continue_member(0); }  // the suite's cluster serves the other tests
  } continue_member{cluster_};
  cluster_->stop_member(0);
  const auto hung = Clock::now();
  a.election->stop();  // resigns through member 1 or 2
  ASSERT_TRUE(b.election->wait_until_leader(milliseconds(10000)))
      << "the standby did not take over while the member its campaign waited on hung";
  const auto took_over = Clock::now() - hung;
  EXPECT_NE(b.client->preferred_member(), 0u);
  // Its renewal times out on member 0 (attempt_timeout), then it campaigns anew elsewhere.
  EXPECT_LT(took_over, b.client->options().attempt_timeout + kTtl * 2)
      << std::chrono::duration_cast<milliseconds>(took_over).count() << " ms";
}

TEST_F(LeaderElectionTest, StopIsBoundedWhileNoEtcdMemberAnswers) {
  // A coordinator stopping while etcd hangs (stopped, cut off, or dying with it) must not wait out
  // the whole call timeout for the resignation, the revocation and an in-flight renewal each.
  Candidate a(cluster_->client_options(), "/t/stop-hung", "a:1");
  ASSERT_TRUE(a.election->start().ok());
  ASSERT_TRUE(a.election->wait_until_leader(milliseconds(10000)));
  ASSERT_GE(a.client->options().call_timeout, milliseconds(5000)) << "the bound below would prove nothing";

  struct Continue {
    EtcdCluster* cluster;
    ~Continue() {
      for (int i = 0; i < cluster->size(); ++i) cluster->continue_member(i);
    }
  } continue_members{cluster_};
  for (int i = 0; i < cluster_->size(); ++i) cluster_->stop_member(i);
  const auto stop_start = Clock::now();
  a.election->stop();
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - stop_start);
  EXPECT_FALSE(a.election->is_leader());
  // The resignation and the revocation share 1.5 s; a renewal in flight is cancelled.
  EXPECT_LT(took, milliseconds(2500)) << "stop() took " << took.count() << " ms while etcd hung";
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    EXPECT_EQ(a.lost_reason.code(), StatusCode::kCancelled) << a.lost_reason.to_string();
  }
}

}  // namespace
}  // namespace cohort::etcd
