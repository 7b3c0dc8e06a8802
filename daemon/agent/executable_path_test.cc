#include "daemon/agent/executable_path.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace cohort::agent {
namespace {

class ExecutablePathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/executable_path_test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    std::filesystem::create_directory(dir_ + "/a");
    std::filesystem::create_directory(dir_ + "/b");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void write(const std::string& path, mode_t mode) {
    std::ofstream(path) << "#!/bin/sh\n";
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
  }

  std::string dir_;
};

TEST_F(ExecutablePathTest, FindsTheFirstExecutableAlongPath) {
  write(dir_ + "/a/tool", 0644);  // not executable: skipped
  write(dir_ + "/b/tool", 0755);
  StatusOr<std::string> found = find_executable("tool", dir_ + "/a:" + dir_ + "/b");
  ASSERT_TRUE(found.ok()) << found.status().to_string();
  EXPECT_EQ(*found, dir_ + "/b/tool");
}

TEST_F(ExecutablePathTest, DirectoriesAndRelativeEntriesAreSkipped) {
  std::filesystem::create_directory(dir_ + "/a/tool");  // a directory named like the program
  write(dir_ + "/b/tool", 0755);
  StatusOr<std::string> found = find_executable("tool", "relative::" + dir_ + "/a:" + dir_ + "/b");
  ASSERT_TRUE(found.ok()) << found.status().to_string();
  EXPECT_EQ(*found, dir_ + "/b/tool");
}

// The search uses the job user's permissions, not the agent's: a program only root may run, or one
// in a directory the user cannot search, is passed over as execvp as that user would.
TEST_F(ExecutablePathTest, SearchesWithTheJobUsersPermissions) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  write(dir_ + "/a/tool", 0700);  // root's only
  write(dir_ + "/b/tool", 0755);
  const SearchIdentity nobody{65534, 65534};
  StatusOr<std::string> found = find_executable("tool", dir_ + "/a:" + dir_ + "/b", nobody);
  ASSERT_TRUE(found.ok()) << found.status().to_string();
  EXPECT_EQ(*found, dir_ + "/b/tool");
  ASSERT_EQ(::chmod((dir_ + "/b").c_str(), 0700), 0);  // not searchable by nobody
  EXPECT_EQ(find_executable("tool", dir_ + "/a:" + dir_ + "/b", nobody).status().code(), StatusCode::kNotFound);
  // The agent's own identity comes back afterwards.
  StatusOr<std::string> as_root = find_executable("tool", dir_ + "/a:" + dir_ + "/b");
  ASSERT_TRUE(as_root.ok());
  EXPECT_EQ(*as_root, dir_ + "/a/tool");
}

TEST_F(ExecutablePathTest, NamesWithASlashAreLeftToExecve) {
  StatusOr<std::string> found = find_executable("./run.sh", "/nowhere");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, "./run.sh");
}

TEST_F(ExecutablePathTest, MissingProgramNamesTheCommandAndTheSearchedDirectories) {
  StatusOr<std::string> found = find_executable("no-such-tool", dir_ + "/a:" + dir_ + "/b");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), StatusCode::kNotFound);
  EXPECT_NE(found.status().message().find("\"no-such-tool\""), std::string::npos) << found.status().message();
  EXPECT_NE(found.status().message().find(dir_ + "/a:" + dir_ + "/b"), std::string::npos);
  EXPECT_NE(found.status().message().find("absolute path"), std::string::npos);
}

}  // namespace
}  // namespace cohort::agent
