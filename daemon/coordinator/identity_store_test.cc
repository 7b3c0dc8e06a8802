#include "daemon/coordinator/identity_store.h"

#include <memory>

#include <gtest/gtest.h>

#include "daemon/coordinator/temp_dir.h"
#include "worker/base/crypto.h"

namespace cohort::coordinator {
namespace {

TEST(IdentityStoreTest, TokensAreCheckedByHashAndSurviveReopen) {
  testing::TempDir dir;
  std::string token;
  {
    auto store = IdentityStore::open(dir.path());
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    StatusOr<std::string> added = (*store)->add_user("alice", false);
    ASSERT_TRUE(added.ok()) << added.status().to_string();
    token = *added;
    EXPECT_EQ((*store)->add_user("alice", true).status().code(), StatusCode::kAlreadyExists);
    EXPECT_EQ((*store)->add_user("Bad Name", false).status().code(), StatusCode::kInvalidArgument);
  }
  auto store = IdentityStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  std::optional<User> alice = (*store)->user_by_token(token);
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->name, "alice");
  EXPECT_FALSE(alice->admin);
  EXPECT_FALSE((*store)->user_by_token(token + "0").has_value());
  EXPECT_FALSE((*store)->has_admin());
  ASSERT_TRUE((*store)->revoke_user("alice").ok());
  EXPECT_FALSE((*store)->user_by_token(token).has_value());
  EXPECT_EQ((*store)->revoke_user("bob").code(), StatusCode::kNotFound);
}

TEST(IdentityStoreTest, TheDatabaseHoldsNoTokenInClear) {
  testing::TempDir dir;
  auto store = IdentityStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  StatusOr<std::string> token = (*store)->add_user("root_admin", true);
  ASSERT_TRUE(token.ok());
  FILE* f = std::fopen((dir.path() + "/" + IdentityStore::kDatabaseFile).c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::string bytes;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) bytes.append(buffer, n);
  std::fclose(f);
  EXPECT_EQ(bytes.find(*token), std::string::npos);
}

TEST(IdentityStoreTest, JoinTokensExpireAndNodeCertificatesRevoke) {
  testing::TempDir dir;
  auto store = IdentityStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  StatusOr<std::string> secret = (*store)->add_join_token(std::chrono::minutes(1), 1000);
  ASSERT_TRUE(secret.ok());
  EXPECT_TRUE((*store)->join_token_valid(*secret, 1000 + 59000));
  EXPECT_FALSE((*store)->join_token_valid(*secret, 1000 + 60000));
  EXPECT_FALSE((*store)->join_token_valid("nope", 1000));
  ASSERT_TRUE((*store)->consume_join_token(*secret, 2000).ok());
  EXPECT_FALSE((*store)->join_token_valid(*secret, 2000)) << "a join token admits one node";
  EXPECT_EQ((*store)->consume_join_token(*secret, 2000).code(), StatusCode::kPermissionDenied);
  ASSERT_TRUE((*store)->add_node_certificate("AB01", "node-a").ok());
  EXPECT_TRUE((*store)->certificate_valid("AB01", "node-a"));
  EXPECT_FALSE((*store)->certificate_valid("AB01", "node-b")) << "a serial belongs to one node";
  EXPECT_FALSE((*store)->certificate_valid("CD02", "node-a")) << "unrecorded serials are not valid";
  EXPECT_TRUE((*store)->node_has_valid_certificate("node-a", 2000));
  ASSERT_TRUE((*store)->revoke_node("node-a").ok());
  EXPECT_FALSE((*store)->certificate_valid("AB01", "node-a"));
  EXPECT_FALSE((*store)->node_has_valid_certificate("node-a", 2000));
  EXPECT_EQ((*store)->revoke_node("node-b").code(), StatusCode::kNotFound);
  EXPECT_FALSE(validate_node_id("cohort-coordinator").ok());
  EXPECT_FALSE(validate_node_id("../x").ok());
  EXPECT_TRUE(validate_node_id("node-a.cluster").ok());
  EXPECT_FALSE(validate_node_id("NODE-A").ok()) << "certificate names match case-insensitively";
  EXPECT_FALSE(validate_node_id("node-a.").ok());
  EXPECT_FALSE(validate_node_id("a..b").ok());
}

// An in-memory IdentityJournal (the etcd one is tested in daemon/etcd against a real etcd): it
// records what it was told and refuses writes while `refuse` is set, as a deposed leader's are.
class FakeJournal : public IdentityJournal {
 public:
  StatusOr<std::optional<IdentityRecords>> load() override {
    return seeded ? std::optional(records) : std::nullopt;
  }
  Status seed(const IdentityRecords& seeded_records) override {
    if (refuse || seeded) return failed_precondition_error("refused");
    records = seeded_records;
    seeded = true;
    return ok_status();
  }
  Status put_user(const UserRecord& user) override {
    if (refuse) return failed_precondition_error("refused");
    for (UserRecord& record : records.users) {
      if (record.name == user.name) {
        record = user;
        return ok_status();
      }
    }
    records.users.push_back(user);
    return ok_status();
  }
  Status put_join_token(const JoinTokenRecord& token) override {
    if (refuse) return failed_precondition_error("refused");
    records.join_tokens.push_back(token);
    return ok_status();
  }
  Status consume_join_token(const std::string& secret_sha256) override {
    if (refuse) return failed_precondition_error("refused");
    for (auto it = records.join_tokens.begin(); it != records.join_tokens.end(); ++it) {
      if (it->secret_sha256 == secret_sha256) {
        records.join_tokens.erase(it);
        return ok_status();
      }
    }
    return permission_denied_error("used");
  }
  Status delete_join_tokens(const std::vector<std::string>& secret_sha256s) override {
    if (refuse) return failed_precondition_error("refused");
    for (const std::string& hash : secret_sha256s) {
      for (auto it = records.join_tokens.begin(); it != records.join_tokens.end(); ++it) {
        if (it->secret_sha256 == hash) {
          records.join_tokens.erase(it);
          break;
        }
      }
    }
    return ok_status();
  }
  Status put_certificates(const std::vector<CertificateRecord>& certificates) override {
    if (refuse) return failed_precondition_error("refused");
    for (const CertificateRecord& certificate : certificates) records.certificates.push_back(certificate);
    return ok_status();
  }
  std::string description() const override { return "fake"; }

  bool seeded = false;
  bool refuse = false;
  IdentityRecords records;
};

TEST(IdentityStoreTest, AnEmptyJournalIsSeededAndASeededOneReplacesTheLocalIdentities) {
  testing::TempDir dir_a, dir_b;
  auto a = IdentityStore::open(dir_a.path());
  auto b = IdentityStore::open(dir_b.path());
  ASSERT_TRUE(a.ok() && b.ok());
  StatusOr<std::string> admin = (*a)->add_user("admin", true);
  StatusOr<std::string> local = (*b)->add_user("local", true);
  ASSERT_TRUE(admin.ok() && local.ok());
  auto journal = std::make_shared<FakeJournal>();
  auto seeded = (*a)->follow_journal(journal);
  ASSERT_TRUE(seeded.ok()) << seeded.status().to_string();
  EXPECT_TRUE(seeded->seeded);
  ASSERT_EQ(journal->records.users.size(), 1u);
  EXPECT_EQ(journal->records.users[0].name, "admin");
  EXPECT_NE(journal->records.users[0].token_sha256, *admin) << "the journal got the token in clear";

  StatusOr<std::string> alice = (*a)->add_user("alice", false);
  ASSERT_TRUE(alice.ok());
  EXPECT_EQ(journal->records.users.size(), 2u) << "a change did not reach the journal";
  auto loaded = (*b)->follow_journal(journal);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_FALSE(loaded->seeded);
  EXPECT_TRUE((*b)->user_by_token(*alice).has_value());
  EXPECT_TRUE((*b)->user_by_token(*admin).has_value());
  EXPECT_FALSE((*b)->user_by_token(*local).has_value()) << "the journal wins over the local identity.db";
}

TEST(IdentityStoreTest, AChangeTheJournalRefusesChangesNothingLocally) {
  testing::TempDir dir;
  auto store = IdentityStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  auto journal = std::make_shared<FakeJournal>();
  ASSERT_TRUE((*store)->follow_journal(journal).ok());
  StatusOr<std::string> alice = (*store)->add_user("alice", false);
  StatusOr<std::string> token = (*store)->add_join_token(std::chrono::hours(1), 1000);
  ASSERT_TRUE(alice.ok() && token.ok());
  ASSERT_TRUE((*store)->add_node_certificate("01", "node-a").ok());

  journal->refuse = true;
  EXPECT_EQ((*store)->add_user("bob", false).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store)->list_users().size(), 1u);
  EXPECT_EQ((*store)->revoke_user("alice").code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*store)->user_by_token(*alice).has_value());
  EXPECT_EQ((*store)->consume_join_token(*token, 2000).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*store)->join_token_valid(*token, 2000));
  EXPECT_EQ((*store)->revoke_node("node-a").code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*store)->certificate_valid("01", "node-a"));

  // The journal says the token is used (another coordinator used it): refused, and forgotten here.
  journal->refuse = false;
  journal->records.join_tokens.clear();
  EXPECT_EQ((*store)->consume_join_token(*token, 2000).code(), StatusCode::kPermissionDenied);
  EXPECT_FALSE((*store)->join_token_valid(*token, 2000));
}

TEST(IdentityStoreTest, ExpiredJoinTokensArePrunedWhenANewOneIsMade) {
  testing::TempDir dir;
  auto store = IdentityStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  auto journal = std::make_shared<FakeJournal>();
  ASSERT_TRUE((*store)->follow_journal(journal).ok());
  StatusOr<std::string> short_lived = (*store)->add_join_token(std::chrono::minutes(1), 1000);
  StatusOr<std::string> long_lived = (*store)->add_join_token(std::chrono::hours(1), 1000);
  ASSERT_TRUE(short_lived.ok() && long_lived.ok());
  ASSERT_EQ(journal->records.join_tokens.size(), 2u);

  // Still valid at the last millisecond before its expiry: nothing is pruned.
  StatusOr<std::string> third = (*store)->add_join_token(std::chrono::hours(1), 1000 + 59999);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(journal->records.join_tokens.size(), 3u);
  EXPECT_EQ((*store)->records().join_tokens.size(), 3u);

  // Expired: a journal that refuses the prune makes the new token fail, and nothing goes locally.
  journal->refuse = true;
  EXPECT_EQ((*store)->add_join_token(std::chrono::hours(1), 1000 + 60000).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store)->records().join_tokens.size(), 3u);
  journal->refuse = false;

  StatusOr<std::string> fourth = (*store)->add_join_token(std::chrono::hours(1), 1000 + 60000);
  ASSERT_TRUE(fourth.ok()) << fourth.status().to_string();
  const std::string pruned_hash = sha256_hex(*short_lived);
  EXPECT_EQ((*store)->records().join_tokens.size(), 3u) << "the expired token was not pruned locally";
  EXPECT_EQ(journal->records.join_tokens.size(), 3u) << "the expired token was not pruned from the journal";
  for (const JoinTokenRecord& token : journal->records.join_tokens)
    EXPECT_NE(token.secret_sha256, pruned_hash);
  EXPECT_TRUE((*store)->join_token_valid(*long_lived, 1000 + 60000));

  // identity.db lost it too, and pruning again finds nothing until the next expiry.
  store->reset();
  store = IdentityStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->records().join_tokens.size(), 3u);
  for (const JoinTokenRecord& token : (*store)->records().join_tokens)
    EXPECT_NE(token.secret_sha256, pruned_hash);
  StatusOr<size_t> none = (*store)->prune_expired_join_tokens(1000 + 60000);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0u);
  StatusOr<size_t> all = (*store)->prune_expired_join_tokens(1000 + 60000 + 3600000);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, 3u);
  EXPECT_TRUE((*store)->records().join_tokens.empty());
}

// A node whose certificate expired (a year after it joined, with no renewal) may join again with
// a new token: its expired certificate holds no claim on the node id. One that has not expired
// still does, and so does a record made before expiries were kept (0). The expiry survives a reopen.
TEST(IdentityStoreTest, AnExpiredCertificateNoLongerHoldsItsNodeId) {
  testing::TempDir dir;
  constexpr int64_t kNotAfter = 1'700'000'000'000;
  {
    auto store = IdentityStore::open(dir.path());
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    ASSERT_TRUE((*store)->add_node_certificate("01", "node-a", kNotAfter).ok());
    ASSERT_TRUE((*store)->add_node_certificate("02", "node-old").ok());
    EXPECT_TRUE((*store)->node_has_valid_certificate("node-a", kNotAfter - 1));
    EXPECT_FALSE((*store)->node_has_valid_certificate("node-a", kNotAfter));
    EXPECT_TRUE((*store)->node_has_valid_certificate("node-old", kNotAfter * 2)) << "unknown expiry";
  }
  auto reopened = IdentityStore::open(dir.path());
  ASSERT_TRUE(reopened.ok()) << reopened.status().to_string();
  EXPECT_TRUE((*reopened)->node_has_valid_certificate("node-a", kNotAfter - 1));
  EXPECT_FALSE((*reopened)->node_has_valid_certificate("node-a", kNotAfter + 1));
  // Renewed: a second, later certificate holds the id again.
  ASSERT_TRUE((*reopened)->add_node_certificate("03", "node-a", kNotAfter * 2).ok());
  EXPECT_TRUE((*reopened)->node_has_valid_certificate("node-a", kNotAfter + 1));
  bool found = false;
  for (const CertificateRecord& record : (*reopened)->records().certificates)
    if (record.serial == "01") found = record.not_after_unix_ms == kNotAfter;
  EXPECT_TRUE(found) << "the expiry is in the records a journal is seeded with";
}

// An identity.db from before node_certificates kept expiries opens, and its certificates keep
// their claim (expiry unknown).
TEST(IdentityStoreTest, OpensAnIdentityDatabaseWithoutExpiries) {
  testing::TempDir dir;
  {
    auto db = SqliteDb::open(dir.path() + "/" + IdentityStore::kDatabaseFile);
    ASSERT_TRUE(db.ok()) << db.status().to_string();
    ASSERT_TRUE((*db)->exec("CREATE TABLE node_certificates (serial TEXT PRIMARY KEY, node_id TEXT NOT NULL, "
                            "revoked INTEGER NOT NULL); INSERT INTO node_certificates VALUES ('0A', 'node-a', 0)")
                    .ok());
  }
  auto store = IdentityStore::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_TRUE((*store)->certificate_valid("0A", "node-a"));
  EXPECT_TRUE((*store)->node_has_valid_certificate("node-a", 1'700'000'000'000));
  ASSERT_TRUE((*store)->add_node_certificate("0B", "node-b", 5).ok());
  EXPECT_FALSE((*store)->node_has_valid_certificate("node-b", 5));
}

}  // namespace
}  // namespace cohort::coordinator
