// EtcdClient against a real 3-member etcd 3.4 cluster with TLS client certificates.

#include "daemon/etcd/etcd_client.h"

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "tests/etcd/etcd_cluster.h"
#include "tests/etcd/etcd_cluster_test.h"

namespace cohort::etcd {
namespace {

using std::chrono::milliseconds;
using testing::EtcdCluster;

class EtcdClientTest : public testing::EtcdClusterTest {};

TEST(ParseEtcdUrlTest, ListsEndpointsAndNamesBadOnes) {
  auto endpoints = parse_etcd_url("etcd://a:2379,10.0.0.2:2380");
  ASSERT_TRUE(endpoints.ok()) << endpoints.status().to_string();
  EXPECT_EQ(*endpoints, (std::vector<std::string>{"a:2379", "10.0.0.2:2380"}));
  auto bad = parse_etcd_url("etcd://a:2379,b");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'b'"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(parse_etcd_url("etcd://").ok());
  EXPECT_FALSE(parse_etcd_url("etcd://a:99999").ok());
}

TEST_F(EtcdClientTest, PutRangeDeleteAndCountsRequests) {
  client_->reset_request_counts();
  auto revision = client_->put("/t/kv/a", "1");
  ASSERT_TRUE(revision.ok()) << revision.status().to_string();
  EXPECT_GT(*revision, 0);
  ASSERT_TRUE(client_->put("/t/kv/b", "2").ok());
  ASSERT_TRUE(client_->put("/t/kvz", "outside").ok());

  auto one = client_->range("/t/kv/a");
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  ASSERT_EQ(one->kvs.size(), 1u);
  EXPECT_EQ(one->kvs[0].value, "1");
  EXPECT_EQ(one->kvs[0].mod_revision, *revision);

  auto prefix = client_->range_prefix("/t/kv/");
  ASSERT_TRUE(prefix.ok());
  ASSERT_EQ(prefix->kvs.size(), 2u);
  EXPECT_EQ(prefix->kvs[0].key, "/t/kv/a");
  EXPECT_EQ(prefix->kvs[1].key, "/t/kv/b");

  auto deleted = client_->delete_prefix("/t/kv/");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 2);
  auto empty = client_->range_prefix("/t/kv/");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->kvs.empty());
  auto outside = client_->range("/t/kvz");
  ASSERT_TRUE(outside.ok());
  EXPECT_EQ(outside->kvs.size(), 1u);

  const auto counts = client_->request_counts();
  EXPECT_EQ(counts.at("Put"), 3);
  EXPECT_EQ(counts.at("Range"), 4);
  EXPECT_EQ(counts.at("DeleteRange"), 1);
  EXPECT_EQ(client_->total_requests(), 8);
}

TEST_F(EtcdClientTest, CompareAndSwapWritesOnlyOverTheExpectedRevision) {
  client_->delete_range("/t/cas").status().ignore_error();
  auto created = client_->compare_and_swap("/t/cas", 0, "first");
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  EXPECT_TRUE(*created);
  auto again = client_->compare_and_swap("/t/cas", 0, "second");
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again) << "created twice";
  auto current = client_->range("/t/cas");
  ASSERT_TRUE(current.ok());
  ASSERT_EQ(current->kvs.size(), 1u);
  const int64_t revision = current->kvs[0].mod_revision;
  auto stale = client_->compare_and_swap("/t/cas", revision - 1, "stale");
  ASSERT_TRUE(stale.ok());
  EXPECT_FALSE(*stale);
  auto swapped = client_->compare_and_swap("/t/cas", revision, "third");
  ASSERT_TRUE(swapped.ok());
  EXPECT_TRUE(*swapped);
  EXPECT_EQ(client_->range("/t/cas")->kvs.at(0).value, "third");
}

TEST_F(EtcdClientTest, LeaseKeepsKeysAliveAndRevokeDeletesThem) {
  auto lease = client_->lease_grant(std::chrono::seconds(10));
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  ASSERT_TRUE(client_->put("/t/lease/x", "v", *lease).ok());
  auto renewed = client_->lease_keep_alive_once(*lease);
  ASSERT_TRUE(renewed.ok()) << renewed.status().to_string();
  EXPECT_EQ(renewed->count(), 10);
  EXPECT_EQ(client_->range("/t/lease/x")->kvs.at(0).lease, *lease);
  ASSERT_TRUE(client_->lease_revoke(*lease).ok());
  EXPECT_TRUE(client_->range("/t/lease/x")->kvs.empty());
  auto gone = client_->lease_keep_alive_once(*lease);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound) << gone.status().to_string();
}

TEST_F(EtcdClientTest, LeaseExpiresWithoutKeepAlive) {
  auto lease = client_->lease_grant(std::chrono::seconds(2));
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(client_->put("/t/lease/short", "v", *lease).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!client_->range("/t/lease/short")->kvs.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_TRUE(client_->range("/t/lease/short")->kvs.empty()) << "the key outlived its 2 s lease by 8 s";
}

TEST_F(EtcdClientTest, ElectionCampaignLeaderProclaimResignObserve) {
  const std::string name = "/t/election/basic";
  auto lease_a = client_->lease_grant(std::chrono::seconds(10));
  auto lease_b = client_->lease_grant(std::chrono::seconds(10));
  ASSERT_TRUE(lease_a.ok() && lease_b.ok());

  auto a = client_->campaign(name, *lease_a, "a:1", milliseconds(5000));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto leader = client_->leader(name);
  ASSERT_TRUE(leader.ok()) << leader.status().to_string();
  ASSERT_TRUE(leader->has_value());
  EXPECT_EQ((*leader)->value, "a:1");

  // b waits while a leads.
  auto blocked = client_->campaign(name, *lease_b, "b:2", milliseconds(1000));
  ASSERT_FALSE(blocked.ok());
  EXPECT_EQ(blocked.status().code(), StatusCode::kDeadlineExceeded) << blocked.status().to_string();

  ASSERT_TRUE(client_->proclaim(*a, "a:3").ok());
  EXPECT_EQ((*client_->leader(name))->value, "a:3");

  // A fencing comparison holds while a leads.
  etcdserverpb::TxnRequest fenced;
  *fenced.add_compare() = EtcdClient::leader_compare(*a);
  auto* put = fenced.add_success()->mutable_request_put();
  put->set_key("/t/election/fenced");
  put->set_value("by a");
  auto result = client_->txn(fenced);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_TRUE(result->succeeded);

  // b campaigns in the background; a resigns; b leads.
  StatusOr<LeaderKey> b = unavailable_error("not yet");
  std::thread campaigner([&] { b = client_->campaign(name, *lease_b, "b:2", milliseconds(10000)); });
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_TRUE(client_->resign(*a).ok());
  campaigner.join();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ((*client_->leader(name))->value, "b:2");

  // The deposed leader's fenced write now fails its comparison.
  auto late = client_->txn(fenced);
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->succeeded);

  // Observe reports the current leader first.
  std::string observed;
  Status watched = client_->observe(
      name,
      [&](const KeyValue& kv) {
        observed = kv.value;
        return false;
      },
      milliseconds(5000));
  EXPECT_TRUE(watched.ok()) << watched.to_string();
  EXPECT_EQ(observed, "b:2");

  // A cancelled campaign returns CANCELLED promptly.
  CallCanceller canceller;
  auto lease_c = client_->lease_grant(std::chrono::seconds(10));
  ASSERT_TRUE(lease_c.ok());
  std::thread cancel_thread([&] {
    std::this_thread::sleep_for(milliseconds(300));
    canceller.cancel();
  });
  const auto start = std::chrono::steady_clock::now();
  auto c = client_->campaign(name, *lease_c, "c:4", milliseconds(20000), &canceller);
  cancel_thread.join();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCancelled) << c.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

  ASSERT_TRUE(client_->lease_revoke(*lease_a).ok());
  ASSERT_TRUE(client_->lease_revoke(*lease_b).ok());
  ASSERT_TRUE(client_->lease_revoke(*lease_c).ok());
  auto none = client_->leader(name);
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_FALSE(none->has_value());
}

TEST_F(EtcdClientTest, ClientWithoutCertificateIsRefused) {
  EtcdOptions options = cluster_->client_options();
  options.certificate_pem.clear();
  options.key_pem.clear();
  options.call_timeout = milliseconds(2000);
  options.attempt_timeout = milliseconds(500);
  auto anonymous = EtcdClient::create(options);
  ASSERT_TRUE(anonymous.ok());
  auto refused = (*anonymous)->put("/t/anonymous", "x");
  ASSERT_FALSE(refused.ok()) << "a client without a certificate wrote to a --client-cert-auth cluster";
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().to_string();

  // Plaintext to a TLS member is refused too.
  options.ca_pem.clear();
  auto plaintext = EtcdClient::create(options);
  ASSERT_TRUE(plaintext.ok());
  EXPECT_FALSE((*plaintext)->put("/t/plaintext", "x").ok());
  EXPECT_TRUE(client_->range("/t/anonymous")->kvs.empty());
}

// Runs last among this suite's tests (gtest runs them in order): it kills members.
TEST_F(EtcdClientTest, FailsOverToLiveMembersAndFailsFastWhenAllAreGone) {
  ASSERT_TRUE(client_->put("/t/failover", "before").ok());
  cluster_->kill_member(0);
  // Two of three members keep a quorum; the client moves on from the dead one.
  auto after = client_->put("/t/failover", "after");
  ASSERT_TRUE(after.ok()) << after.status().to_string();
  auto read = client_->range("/t/failover");
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(read->kvs.at(0).value, "after");

  // A hung member (SIGSTOP) costs one attempt timeout, not a hang.
  EtcdOptions options = cluster_->client_options();
  options.endpoints = {cluster_->endpoints()[1], cluster_->endpoints()[2]};
  options.attempt_timeout = milliseconds(500);
  auto hung_first = EtcdClient::create(options);
  ASSERT_TRUE(hung_first.ok());
  ASSERT_TRUE((*hung_first)->range("/t/failover").ok());  // connects both members' preferred one
  cluster_->stop_member(1);
  // The quorum is lost with member 0 dead and member 1 stopped: the call must fail within its budget.
  options.call_timeout = milliseconds(2000);
  auto bounded = EtcdClient::create(options);
  ASSERT_TRUE(bounded.ok());
  const auto start = std::chrono::steady_clock::now();
  auto no_quorum = (*bounded)->put("/t/failover", "no quorum");
  const auto took = std::chrono::steady_clock::now() - start;
  cluster_->continue_member(1);
  EXPECT_FALSE(no_quorum.ok());
  EXPECT_LT(took, std::chrono::seconds(4)) << "a call without quorum took longer than its 2 s budget";

  cluster_->kill_all();
  const auto gone_start = std::chrono::steady_clock::now();
  auto gone = (*bounded)->range("/t/failover");
  EXPECT_FALSE(gone.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - gone_start, std::chrono::seconds(4));
  EXPECT_NE(gone.status().message().find("no etcd member"), std::string::npos) << gone.status().to_string();
}

}  // namespace
}  // namespace cohort::etcd
