#include "daemon/coordinator/identity_store.h"

#include <gtest/gtest.h>

#include "daemon/coordinator/temp_dir.h"

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
  EXPECT_TRUE((*store)->node_has_valid_certificate("node-a"));
  ASSERT_TRUE((*store)->revoke_node("node-a").ok());
  EXPECT_FALSE((*store)->certificate_valid("AB01", "node-a"));
  EXPECT_FALSE((*store)->node_has_valid_certificate("node-a"));
  EXPECT_EQ((*store)->revoke_node("node-b").code(), StatusCode::kNotFound);
  EXPECT_FALSE(validate_node_id("cohort-coordinator").ok());
  EXPECT_FALSE(validate_node_id("../x").ok());
  EXPECT_TRUE(validate_node_id("node-a.cluster").ok());
  EXPECT_FALSE(validate_node_id("NODE-A").ok()) << "certificate names match case-insensitively";
  EXPECT_FALSE(validate_node_id("node-a.").ok());
  EXPECT_FALSE(validate_node_id("a..b").ok());
}

}  // namespace
}  // namespace cohort::coordinator
