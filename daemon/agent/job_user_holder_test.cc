// JobUserHolder: the first owner holds job_user, another owner is refused naming both and the fix,
// the hold survives a new holder object (an agent restart), shared_job_user turns it off, and the
// file is the agent's alone and never followed through a link.

#include "daemon/agent/job_user_holder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/agent/test_util.h"

namespace cohort::agent {
namespace {

using testing::read_file;
using testing::TempDir;

TEST(JobUserHolderTest, FirstOwnerHoldsTheJobUserAndAnotherIsRefusedNamingBothAndTheFix) {
  TempDir dir;
  JobUserHolder holder(dir.path(), "cohort-job", /*shared=*/false);
  ASSERT_TRUE(holder.claim("alice").ok());
  EXPECT_TRUE(holder.claim("alice").ok());  // her next job
  Status refused = holder.claim("bob");
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  for (const std::string expected :
       {"owner 'bob' cannot run jobs as job_user 'cohort-job'", "owner 'alice' holds it",
        "map 'bob' to their own Unix user in user_map", "shared_job_user: true"}) {
    EXPECT_NE(refused.message().find(expected), std::string::npos) << expected << " in " << refused.message();
  }
  EXPECT_EQ(read_file(dir.path() + "/job_user.holder"), "alice\n");
  struct stat info {};
  ASSERT_EQ(::stat((dir.path() + "/job_user.holder").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, kJobUserHolderFileMode);
  EXPECT_EQ(info.st_uid, ::geteuid());
}

TEST(JobUserHolderTest, TheHoldSurvivesARestartUntilTheOperatorRemovesTheFile) {
  TempDir dir;
  ASSERT_TRUE(JobUserHolder(dir.path(), "cohort-job", false).claim("alice").ok());
  JobUserHolder restarted(dir.path(), "cohort-job", false);
  StatusOr<std::optional<std::string>> held = restarted.holder();
  ASSERT_TRUE(held.ok()) << held.status().to_string();
  EXPECT_EQ(held->value_or("(nobody)"), "alice");
  EXPECT_EQ(restarted.claim("bob").code(), StatusCode::kFailedPrecondition);
  // The documented manual release.
  ASSERT_EQ(::unlink(restarted.path().c_str()), 0);
  EXPECT_TRUE(restarted.claim("bob").ok());
  EXPECT_EQ(restarted.claim("alice").code(), StatusCode::kFailedPrecondition);
}

// A launch without an owner (an older coordinator's) must not take job_user: "" would then hold it
// for every owner-less launch while each real owner is refused.
TEST(JobUserHolderTest, AnEmptyOwnerIsRefusedAndHoldsNothing) {
  TempDir dir;
  JobUserHolder holder(dir.path(), "cohort-job", /*shared=*/false);
  Status refused = holder.claim("");
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  for (const std::string expected : {"names no owner", "job_user 'cohort-job'", "upgrade the coordinator"}) {
    EXPECT_NE(refused.message().find(expected), std::string::npos) << expected << " in " << refused.message();
  }
  EXPECT_FALSE(std::filesystem::exists(holder.path()));
  EXPECT_EQ(holder.claim("").code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(holder.claim("alice").ok());
  EXPECT_EQ(read_file(holder.path()), "alice\n");
  EXPECT_EQ(JobUserHolder(dir.path(), "cohort-job", /*shared=*/true).claim("").code(),
            StatusCode::kInvalidArgument);
}

TEST(JobUserHolderTest, SharedJobUserRecordsAndRefusesNothing) {
  TempDir dir;
  JobUserHolder holder(dir.path(), "cohort-job", /*shared=*/true);
  EXPECT_TRUE(holder.claim("alice").ok());
  EXPECT_TRUE(holder.claim("bob").ok());
  EXPECT_FALSE(std::filesystem::exists(holder.path()));
}

// Two owners racing for a free job_user: exactly one wins.
TEST(JobUserHolderTest, ConcurrentClaimsOfTwoOwnersLetExactlyOneIn) {
  TempDir dir;
  JobUserHolder holder(dir.path(), "cohort-job", false);
  Status results[2];
  std::thread alice([&] { results[0] = holder.claim("alice"); });
  std::thread bob([&] { results[1] = holder.claim("bob"); });
  alice.join();
  bob.join();
  EXPECT_NE(results[0].ok(), results[1].ok()) << results[0].to_string() << " / " << results[1].to_string();
}

TEST(JobUserHolderTest, ALinkOrADamagedFileRefusesRatherThanFreesTheJobUser) {
  TempDir dir;
  TempDir elsewhere;
  const std::string planted = elsewhere.path() + "/holder";
  std::ofstream(planted) << "mallory\n";
  JobUserHolder holder(dir.path(), "cohort-job", false);
  ASSERT_EQ(::symlink(planted.c_str(), holder.path().c_str()), 0);
  Status linked = holder.claim("mallory");
  EXPECT_EQ(linked.code(), StatusCode::kFailedPrecondition) << linked.to_string();
  EXPECT_NE(linked.message().find("symbolic link"), std::string::npos) << linked.message();
  ASSERT_EQ(::unlink(holder.path().c_str()), 0);
  std::ofstream(holder.path()) << "alice";  // no newline: not what claim writes
  Status damaged = holder.claim("alice");
  EXPECT_EQ(damaged.code(), StatusCode::kFailedPrecondition) << damaged.to_string();
  EXPECT_NE(damaged.message().find("damaged"), std::string::npos) << damaged.message();
}

}  // namespace
}  // namespace cohort::agent
