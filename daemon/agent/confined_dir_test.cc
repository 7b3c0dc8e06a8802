// ConfinedDir and validate_job_id: nothing the agent writes leaves its directory, whatever links
// are planted in it or whatever job id it is sent.

#include "daemon/agent/confined_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/agent/job_id.h"
#include "daemon/agent/test_util.h"

namespace cohort::agent {
namespace {

using testing::read_file;
using testing::TempDir;

TEST(JobIdTest, AcceptsCoordinatorIds) {
  EXPECT_TRUE(validate_job_id("mnist-1", "test").ok());
  EXPECT_TRUE(validate_job_id("a.b_c-12", "test").ok());
  EXPECT_TRUE(validate_job_id(std::string(kMaxJobIdLength, 'x'), "test").ok());
}

TEST(JobIdTest, RefusesPathsAndOddIds) {
  const std::vector<std::string> ids = {"",    ".",   "..", "../../x", "a/b", "/etc", "x\ny",
                                       "a b", "é", std::string(kMaxJobIdLength + 1, 'x')};
  for (const std::string& id : ids) {
    Status status = validate_job_id(id, "LaunchTasks");
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << id;
    EXPECT_NE(status.message().find("LaunchTasks"), std::string::npos) << status.message();
  }
  EXPECT_NE(validate_job_id("../../x", "t").message().find("../../x"), std::string::npos);
}

TEST(ConfinedDirTest, CreatesNestedDirectoriesWithTheirMode) {
  TempDir temp;
  auto root = ConfinedDir::open(temp.path() + "/logs", 0711);
  ASSERT_TRUE(root.ok()) << root.status().message();
  auto dir = root->subdir({"job-1", "attempt-1"}, 0711);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  EXPECT_EQ(dir->path(), temp.path() + "/logs/job-1/attempt-1");
  struct stat info {};
  ASSERT_EQ(::stat((temp.path() + "/logs/job-1").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0711u);
  ASSERT_TRUE(dir->write_file_atomically("spec.pb", "v1", 0400, std::nullopt).ok());
  ASSERT_TRUE(dir->write_file_atomically("spec.pb", "v2", 0400, std::nullopt).ok());
  EXPECT_EQ(read_file(dir->path() + "/spec.pb"), "v2");
  ASSERT_EQ(::stat((dir->path() + "/spec.pb").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0400u);
  // Only the file itself remains: the temporary names are gone.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir->path()), {}), 1);
}

TEST(ConfinedDirTest, RefusesComponentsThatLeave) {
  TempDir temp;
  auto root = ConfinedDir::open(temp.path(), 0711);
  ASSERT_TRUE(root.ok());
  for (const std::string name : {"..", ".", "", "a/b", "../x"}) {
    EXPECT_EQ(root->subdir({name}, 0711).status().code(), StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(root->open_file(name, O_RDONLY, 0).status().code(), StatusCode::kInvalidArgument) << name;
  }
}

TEST(ConfinedDirTest, NeverFollowsAPlantedLink) {
  TempDir temp;
  TempDir elsewhere;
  const std::string root_path = temp.path() + "/data";
  auto root = ConfinedDir::open(root_path, 0711);
  ASSERT_TRUE(root.ok());
  // A directory link and a file link, both pointing outside the tree.
  ASSERT_EQ(::symlink(elsewhere.path().c_str(), (root_path + "/job-1").c_str()), 0);
  ASSERT_EQ(::symlink((elsewhere.path() + "/target").c_str(), (root_path + "/file").c_str()), 0);

  Status dir = root->subdir({"job-1", "attempt-1"}, 0711).status();
  EXPECT_EQ(dir.code(), StatusCode::kFailedPrecondition) << dir.message();
  EXPECT_NE(dir.message().find("symbolic link"), std::string::npos) << dir.message();
  Status file = root->open_file("file", O_WRONLY | O_CREAT, 0600).status();
  EXPECT_EQ(file.code(), StatusCode::kFailedPrecondition) << file.message();
  // Replacing a planted link replaces the link, not what it points to.
  ASSERT_TRUE(root->write_file_atomically("file", "bytes", 0600, std::nullopt).ok());
  EXPECT_FALSE(std::filesystem::is_symlink(root_path + "/file"));
  EXPECT_TRUE(std::filesystem::is_empty(elsewhere.path()));
}

}  // namespace
}  // namespace cohort::agent
