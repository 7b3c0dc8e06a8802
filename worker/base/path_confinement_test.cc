#include "worker/base/path_confinement.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace cohort {
namespace {

namespace fs = std::filesystem;

TEST(PathConfinementTest, NormalizesLexically) {
  EXPECT_EQ(normalize_path_lexically("/a/./b/../c/"), "/a/c");
  EXPECT_EQ(normalize_path_lexically("//a//b"), "/a/b");
  EXPECT_EQ(normalize_path_lexically("/../../etc"), "/etc");
  EXPECT_EQ(normalize_path_lexically("a/../../b"), "../b");
  EXPECT_EQ(normalize_path_lexically("a/.."), ".");
  EXPECT_EQ(normalize_path_lexically(""), "");
}

TEST(PathConfinementTest, WithinComparesWholeComponents) {
  EXPECT_TRUE(path_is_within("/data", "/data"));
  EXPECT_TRUE(path_is_within("/data/x", "/data"));
  EXPECT_FALSE(path_is_within("/data2/x", "/data"));
  EXPECT_TRUE(path_is_within("/anything", "/"));
}

TEST(PathConfinementTest, SubmitTimeChecksAreLexical) {
  PathConfinement confinement;  // no job dir yet, default roots
  EXPECT_EQ(*confine_path("checkpoint.dir", "ckpt/./a/..", confinement), "ckpt");
  EXPECT_EQ(*confine_path("dataset.path", "/usr/share/datasets/fashion-mnist/", confinement),
            "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(*confine_path("checkpoint.dir", "", confinement), "");
  for (const char* bad :
       {"/etc", "../x", "ckpt/../../x", "/usr/share/datasets/../../../etc/shadow", "/usr/share/datasets2"}) {
    SCOPED_TRACE(bad);
    StatusOr<std::string> path = confine_path("checkpoint.dir", bad, confinement);
    ASSERT_FALSE(path.ok());
    EXPECT_EQ(path.status().code(), StatusCode::kInvalidArgument);
    const std::string message = path.status().message();
    EXPECT_NE(message.find("checkpoint.dir '" + std::string(bad) + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("/usr/share/datasets"), std::string::npos) << message;
    EXPECT_NE(message.find(kAllowedPathRootsSetting), std::string::npos) << message;
  }
}

TEST(PathConfinementTest, SameMessageWhetherOrNotThePathExists) {
  PathConfinement confinement;
  confinement.resolve_symlinks = true;
  StatusOr<std::string> exists = confine_path("dataset.path", "/etc", confinement);
  StatusOr<std::string> missing = confine_path("dataset.path", "/etc-no-such-dir-cohort", confinement);
  ASSERT_FALSE(exists.ok());
  ASSERT_FALSE(missing.ok());
  std::string a = exists.status().message();
  std::string b = missing.status().message();
  a.replace(a.find("/etc"), 4, "PATH");
  b.replace(b.find("/etc-no-such-dir-cohort"), 23, "PATH");
  EXPECT_EQ(a, b);
}

class WorkerConfinementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "path_confinement_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    fs::create_directories(dir_ + "/jobs/job-1");
    fs::create_directories(dir_ + "/outside");
    confinement_.job_dir = dir_ + "/jobs/job-1";
    confinement_.roots = {dir_ + "/datasets"};
    confinement_.resolve_symlinks = true;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string dir_;
  PathConfinement confinement_;
};

TEST_F(WorkerConfinementTest, RelativePathsResolveUnderTheJobDirectory) {
  StatusOr<std::string> path = confine_path("checkpoint.dir", "ckpt", confinement_);
  ASSERT_TRUE(path.ok()) << path.status().to_string();
  EXPECT_EQ(*path, fs::weakly_canonical(dir_ + "/jobs/job-1/ckpt").string());
}

TEST_F(WorkerConfinementTest, SymlinkOutOfTheJobDirectoryIsRefused) {
  fs::create_directory_symlink(dir_ + "/outside", dir_ + "/jobs/job-1/escape");
  StatusOr<std::string> path = confine_path("checkpoint.dir", "escape/ckpt", confinement_);
  ASSERT_FALSE(path.ok());
  EXPECT_NE(path.status().message().find("checkpoint.dir 'escape/ckpt' lies outside"), std::string::npos)
      << path.status().message();
  // A symlink that stays inside is fine, and the resolved path is what the worker uses.
  fs::create_directories(dir_ + "/jobs/job-1/real");
  fs::create_directory_symlink(dir_ + "/jobs/job-1/real", dir_ + "/jobs/job-1/inside");
  StatusOr<std::string> inside = confine_path("checkpoint.dir", "inside/ckpt", confinement_);
  ASSERT_TRUE(inside.ok()) << inside.status().to_string();
  EXPECT_EQ(*inside, fs::weakly_canonical(dir_ + "/jobs/job-1/real/ckpt").string());
}

TEST_F(WorkerConfinementTest, AbsolutePathUnderARootIsAllowed) {
  fs::create_directories(dir_ + "/datasets/mnist");
  EXPECT_TRUE(confine_path("dataset.path", dir_ + "/datasets/mnist", confinement_).ok());
  EXPECT_FALSE(confine_path("dataset.path", dir_ + "/outside", confinement_).ok());
}

TEST(PathConfinementTest, RootsSplitAndValidate) {
  EXPECT_EQ(split_path_roots("/a::/b:"), (std::vector<std::string>{"/a", "/b"}));
  EXPECT_TRUE(validate_path_roots({"/a", "/"}).ok());
  Status relative = validate_path_roots({"data"});
  ASSERT_FALSE(relative.ok());
  EXPECT_NE(relative.message().find(kAllowedPathRootsSetting), std::string::npos);
}

}  // namespace
}  // namespace cohort
