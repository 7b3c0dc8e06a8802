// EtcdIdentityJournal against a real 3-member etcd 3.4 cluster with TLS client certificates: two
// coordinators' IdentityStores (each with its own identity.db, nothing copied between them) follow
// the same journal in turn, as an elected leader and its successor do (issue 16).

#include "daemon/etcd/etcd_identity_journal.h"

#include <chrono>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "daemon/coordinator/identity_store.h"
#include "daemon/coordinator/temp_dir.h"
#include "tests/etcd/etcd_cluster.h"
#include "tests/etcd/etcd_cluster_test.h"

namespace cohort::etcd {
namespace {

using coordinator::IdentityStore;
using coordinator::testing::TempDir;
using namespace std::chrono_literals;

constexpr int64_t kNow = 1'700'000'000'000;  // unix ms; tokens live kDefaultJoinTokenTtl from it

std::unique_ptr<IdentityStore> open_store(const TempDir& dir) {
  auto store = IdentityStore::open(dir.path());
  EXPECT_TRUE(store.ok()) << store.status().to_string();
  return store.ok() ? std::move(*store) : nullptr;
}

class EtcdIdentityJournalTest : public testing::EtcdClusterTest {
 protected:
  // A won election under `election` (its own lease, so revoking it deposes only this leader).
  LeaderKey elect(const std::string& election, const std::string& who, int64_t* lease) {
    auto granted = client_->lease_grant(10s);
    EXPECT_TRUE(granted.ok()) << granted.status().to_string();
    *lease = granted.ok() ? *granted : 0;
    auto key = client_->campaign(election, *lease, who, 5000ms);
    EXPECT_TRUE(key.ok()) << key.status().to_string();
    return key.ok() ? *key : LeaderKey{};
  }

  // Elects `who` under `prefix` and makes `store` follow the journal there as that leader.
  Status lead(IdentityStore& store, const std::string& prefix, const std::string& who, int64_t* lease) {
    const LeaderKey key = elect(prefix + "/election", who, lease);
    return store.follow_journal(std::make_shared<EtcdIdentityJournal>(client_.get(), prefix, key)).status();
  }
};

TEST_F(EtcdIdentityJournalTest, TheNextLeaderKnowsWhatThePreviousOneChangedAndNothingElse) {
  const std::string prefix = "/identity-test-1";
  TempDir dir_a, dir_b;
  auto a = open_store(dir_a);
  ASSERT_NE(a, nullptr);
  // Made at A's first start, before it led: the journal is empty, so A's identities are uploaded.
  auto admin = a->add_user("admin", /*admin=*/true);
  ASSERT_TRUE(admin.ok());
  int64_t lease_a = 0;
  const LeaderKey key_a = elect(prefix + "/election", "a", &lease_a);
  auto sync_a = a->follow_journal(std::make_shared<EtcdIdentityJournal>(client_.get(), prefix, key_a));
  ASSERT_TRUE(sync_a.ok()) << sync_a.status().to_string();
  EXPECT_TRUE(sync_a->seeded);
  EXPECT_EQ(sync_a->users, 1u);

  // A leads: users, a revocation, join tokens (one used), node certificates (one node revoked).
  auto alice = a->add_user("alice", false);
  auto bob = a->add_user("bob", false);
  ASSERT_TRUE(alice.ok() && bob.ok());
  ASSERT_TRUE(a->revoke_user("bob").ok());
  auto used = a->add_join_token(1h, kNow);
  auto unused = a->add_join_token(1h, kNow);
  ASSERT_TRUE(used.ok() && unused.ok());
  ASSERT_TRUE(a->consume_join_token(*used, kNow).ok());
  ASSERT_TRUE(a->add_node_certificate("01aa", "node-a").ok());
  ASSERT_TRUE(a->add_node_certificate("02bb", "node-b").ok());
  ASSERT_TRUE(a->revoke_node("node-b").ok());

  // B's own identity.db holds something etcd does not (made while it stood by): etcd wins.
  auto b = open_store(dir_b);
  ASSERT_NE(b, nullptr);
  auto stray = b->add_user("stray", /*admin=*/true);
  ASSERT_TRUE(stray.ok());

  // A is deposed (its lease is gone); B is elected and loads the journal.
  ASSERT_TRUE(client_->lease_revoke(lease_a).ok());
  int64_t lease_b = 0;
  const LeaderKey key_b = elect(prefix + "/election", "b", &lease_b);
  auto sync_b = b->follow_journal(std::make_shared<EtcdIdentityJournal>(client_.get(), prefix, key_b));
  ASSERT_TRUE(sync_b.ok()) << sync_b.status().to_string();
  EXPECT_FALSE(sync_b->seeded) << "the journal was seeded by A; B must load it, not upload its own";
  EXPECT_EQ(sync_b->users, 3u);
  EXPECT_EQ(sync_b->join_tokens, 1u);
  EXPECT_EQ(sync_b->certificates, 2u);
  auto check_b = [&](IdentityStore& store, const std::string& when) {
    auto who = store.user_by_token(*admin);
    ASSERT_TRUE(who.has_value()) << when;
    EXPECT_EQ(who->name, "admin") << when;
    EXPECT_TRUE(who->admin) << when;
    ASSERT_TRUE(store.user_by_token(*alice).has_value()) << when;
    EXPECT_EQ(store.user_by_token(*alice)->name, "alice") << when;
    EXPECT_FALSE(store.user_by_token(*bob).has_value()) << when << ": bob was revoked on A";
    EXPECT_FALSE(store.user_by_token(*stray).has_value()) << when << ": B's local user is not in etcd";
    EXPECT_FALSE(store.join_token_valid(*used, kNow)) << when << ": the token A consumed";
    EXPECT_TRUE(store.join_token_valid(*unused, kNow)) << when;
    EXPECT_TRUE(store.certificate_valid("01aa", "node-a")) << when;
    EXPECT_FALSE(store.certificate_valid("02bb", "node-b")) << when << ": node-b was revoked on A";
  };
  check_b(*b, "B after loading");
  EXPECT_EQ(b->consume_join_token(*used, kNow).code(), StatusCode::kPermissionDenied);

  // identity.db is B's cache of etcd: reopened without the journal (a restart), it knows the same.
  b.reset();
  b = open_store(dir_b);
  ASSERT_NE(b, nullptr);
  check_b(*b, "B reopened from its identity.db");

  // The deposed A writes: refused, and nothing changes on either side.
  auto mallory = a->add_user("mallory", /*admin=*/true);
  EXPECT_EQ(mallory.status().code(), StatusCode::kFailedPrecondition) << mallory.status().to_string();
  EXPECT_NE(mallory.status().message().find("no longer leads"), std::string::npos)
      << mallory.status().message();
  for (const auto& user : a->list_users())
    EXPECT_NE(user.name, "mallory") << "a refused change landed locally";
  EXPECT_EQ(a->consume_join_token(*unused, kNow).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(a->join_token_valid(*unused, kNow)) << "a refused consumption dropped the token locally";
  auto b_journal = std::make_shared<EtcdIdentityJournal>(client_.get(), prefix, key_b);
  auto reloaded = b->follow_journal(b_journal);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().to_string();
  EXPECT_EQ(reloaded->users, 3u) << "mallory reached etcd";
  EXPECT_TRUE(b->join_token_valid(*unused, kNow));

  // B leads and uses the token A made; a seeding by anyone else is refused now.
  EXPECT_TRUE(b->consume_join_token(*unused, kNow).ok());
  EXPECT_EQ(b_journal->seed(coordinator::IdentityRecords{}).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(client_->lease_revoke(lease_b).ok());
}

TEST_F(EtcdIdentityJournalTest, AJoinTokenAdmitsOneNodeEvenWhenTwoCoordinatorsHoldIt) {
  // Unfenced journals (no election), so only the comparison on the token's own record stands
  // between the two: both stores loaded the token, both try to use it.
  const std::string prefix = "/identity-test-2";
  TempDir dir_a, dir_b;
  auto a = open_store(dir_a);
  auto b = open_store(dir_b);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ASSERT_TRUE(
      a->follow_journal(std::make_shared<EtcdIdentityJournal>(client_.get(), prefix, std::nullopt)).ok());
  auto token = a->add_join_token(1h, kNow);
  ASSERT_TRUE(token.ok());
  auto sync_b = b->follow_journal(std::make_shared<EtcdIdentityJournal>(client_.get(), prefix, std::nullopt));
  ASSERT_TRUE(sync_b.ok()) << sync_b.status().to_string();
  ASSERT_TRUE(b->join_token_valid(*token, kNow));

  ASSERT_TRUE(a->consume_join_token(*token, kNow).ok());
  Status second = b->consume_join_token(*token, kNow);
  EXPECT_EQ(second.code(), StatusCode::kPermissionDenied) << second.to_string();
  EXPECT_FALSE(b->join_token_valid(*token, kNow)) << "B still offers a token etcd says is used";
  auto remaining = client_->range_prefix(prefix + "/identity/join_tokens/");
  ASSERT_TRUE(remaining.ok());
  EXPECT_EQ(remaining->kvs.size(), 0u);
}

TEST_F(EtcdIdentityJournalTest, AConsumeSentAgainAfterItsReplyWasLostIsNotRefusedAsUsed) {
  // EtcdClient::call sends a Txn again to another member when the first does not answer in time;
  // the first may have applied it. The same consume (same attempt id) twice is that retry: it must
  // succeed, while any other consume of the token is refused.
  const std::string prefix = "/identity-test-retry";
  int64_t lease = 0;
  EtcdIdentityJournal journal(client_.get(), prefix, elect(prefix + "/election", "a", &lease));
  const std::string hash = std::string(64, 'c');
  ASSERT_TRUE(journal.put_join_token(coordinator::JoinTokenRecord{hash, kNow + 3600'000}).ok());
  ASSERT_TRUE(journal.consume_join_token(hash, "attempt-1").ok());  // applied; say its reply was lost
  Status retry = journal.consume_join_token(hash, "attempt-1");
  EXPECT_TRUE(retry.ok()) << "the retry of a consume that took effect was refused: " << retry.to_string();
  Status other = journal.consume_join_token(hash, "attempt-2");
  EXPECT_EQ(other.code(), StatusCode::kPermissionDenied) << other.to_string();
  auto remaining = client_->range_prefix(journal.join_token_key(hash));
  ASSERT_TRUE(remaining.ok());
  EXPECT_EQ(remaining->kvs.size(), 0u);
  // The marker goes with the leader's lease.
  ASSERT_TRUE(client_->lease_revoke(lease).ok());
  auto marker = client_->range_prefix(journal.used_join_token_key(hash));
  ASSERT_TRUE(marker.ok());
  EXPECT_EQ(marker->kvs.size(), 0u);
}

TEST_F(EtcdIdentityJournalTest, ANodeWithMoreCertificatesThanOneTxnHoldsIsRevokedWhole) {
  // etcd refuses a Txn of more than --max-txn-ops operations (128 by default, as this cluster
  // runs): 150 certificates of one node take two fenced transactions.
  const std::string prefix = "/identity-test-3";
  constexpr int kCertificates = 150;
  static_assert(kCertificates > 128, "must exceed etcd's default --max-txn-ops");
  TempDir dir_a, dir_b;
  auto a = open_store(dir_a);
  auto b = open_store(dir_b);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  int64_t lease_a = 0;
  const Status led = lead(*a, prefix, "a", &lease_a);
  ASSERT_TRUE(led.ok()) << led.to_string();
  for (int i = 0; i < kCertificates; ++i)
    ASSERT_TRUE(a->add_node_certificate(fmt::format("{:04x}", i), "node-many").ok()) << i;
  ASSERT_TRUE(a->add_node_certificate("ffff", "node-other").ok());
  client_->reset_request_counts();
  Status revoked = a->revoke_node("node-many");
  ASSERT_TRUE(revoked.ok()) << revoked.to_string();
  EXPECT_EQ(client_->request_counts()["Txn"], 2) << "150 records: one Txn of 100 and one of 50";
  for (int i = 0; i < kCertificates; ++i)
    EXPECT_FALSE(a->certificate_valid(fmt::format("{:04x}", i), "node-many")) << i;
  EXPECT_TRUE(a->certificate_valid("ffff", "node-other"));

  // The next leader loads every certificate revoked.
  ASSERT_TRUE(client_->lease_revoke(lease_a).ok());
  int64_t lease_b = 0;
  const LeaderKey key_b = elect(prefix + "/election", "b", &lease_b);
  auto sync_b = b->follow_journal(std::make_shared<EtcdIdentityJournal>(client_.get(), prefix, key_b));
  ASSERT_TRUE(sync_b.ok()) << sync_b.status().to_string();
  EXPECT_EQ(sync_b->certificates, static_cast<size_t>(kCertificates + 1));
  int valid = 0;
  for (int i = 0; i < kCertificates; ++i)
    valid += b->certificate_valid(fmt::format("{:04x}", i), "node-many");
  EXPECT_EQ(valid, 0) << "certificates of the revoked node still valid on the next leader";
  EXPECT_FALSE(b->node_has_valid_certificate("node-many", kNow));
  EXPECT_TRUE(b->certificate_valid("ffff", "node-other"));

  // The deposed A's batched write is refused in its first transaction: nothing lands.
  Status refused = a->revoke_node("node-other");
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.to_string();
  ASSERT_TRUE(b->follow_journal(std::make_shared<EtcdIdentityJournal>(client_.get(), prefix, key_b)).ok());
  EXPECT_TRUE(b->certificate_valid("ffff", "node-other"));
  EXPECT_TRUE(client_->lease_revoke(lease_b).ok());
}

TEST_F(EtcdIdentityJournalTest, ExpiredJoinTokensArePrunedFromEtcdWhenTheLeaderMakesANewOne) {
  const std::string prefix = "/identity-test-4";
  constexpr int kExpiring = 130;  // more than one Txn's worth (etcd's default --max-txn-ops: 128)
  TempDir dir_a, dir_b;
  auto a = open_store(dir_a);
  auto b = open_store(dir_b);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  int64_t lease_a = 0;
  const Status led = lead(*a, prefix, "a", &lease_a);
  ASSERT_TRUE(led.ok()) << led.to_string();
  for (int i = 0; i < kExpiring; ++i) ASSERT_TRUE(a->add_join_token(1min, kNow).ok()) << i;
  auto lasting = a->add_join_token(1h, kNow);
  ASSERT_TRUE(lasting.ok());
  const std::string tokens = prefix + "/identity/join_tokens/";
  auto before = client_->range_prefix(tokens, 1);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->count, kExpiring + 1);

  // Two minutes later the 130 are expired: making a token deletes them from etcd and identity.db.
  auto fresh = a->add_join_token(1h, kNow + 2 * 60 * 1000);
  ASSERT_TRUE(fresh.ok()) << fresh.status().to_string();
  auto after = client_->range_prefix(tokens, 1);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->count, 2) << "expired join tokens left in etcd";
  EXPECT_EQ(a->records().join_tokens.size(), 2u);

  // The next leader knows the two live ones only.
  ASSERT_TRUE(client_->lease_revoke(lease_a).ok());
  int64_t lease_b = 0;
  const LeaderKey key_b = elect(prefix + "/election", "b", &lease_b);
  auto sync_b = b->follow_journal(std::make_shared<EtcdIdentityJournal>(client_.get(), prefix, key_b));
  ASSERT_TRUE(sync_b.ok()) << sync_b.status().to_string();
  EXPECT_EQ(sync_b->join_tokens, 2u);
  EXPECT_TRUE(b->join_token_valid(*lasting, kNow + 2 * 60 * 1000));
  EXPECT_TRUE(b->join_token_valid(*fresh, kNow + 2 * 60 * 1000));

  // A deposed leader's prune is refused, and it keeps its tokens.
  EXPECT_EQ(a->prune_expired_join_tokens(kNow + 2 * 3600 * 1000).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->records().join_tokens.size(), 2u);
  auto kept = client_->range_prefix(tokens, 1);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->count, 2);
  EXPECT_TRUE(client_->lease_revoke(lease_b).ok());
}

}  // namespace
}  // namespace cohort::etcd
