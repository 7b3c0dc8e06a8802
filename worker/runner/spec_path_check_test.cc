#include "worker/runner/spec_path_check.h"

#include <stdlib.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace cohort::worker {
namespace {

namespace fs = std::filesystem;

class SpecPathCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "spec_path_check_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = fs::canonical(pattern).string();
    fs::create_directories(dir_ + "/jobs/j-1");
    fs::create_directories(dir_ + "/datasets/mnist");
    fs::create_directories(dir_ + "/secret");
    confinement_.job_dir = dir_ + "/jobs/j-1";
    confinement_.roots = {dir_ + "/datasets"};
    confinement_.resolve_symlinks = true;
  }
  void TearDown() override {
    fs::remove_all(dir_);
    unsetenv(kJobDirEnv);
    unsetenv(kAllowedPathRootsEnv);
  }

  std::string dir_;
  PathConfinement confinement_;
};

TEST_F(SpecPathCheckTest, RewritesPathsToTheirResolvedForm) {
  cohort::v1::JobSpec spec;
  spec.mutable_checkpoint()->set_dir("ckpt");
  spec.mutable_dataset()->set_path(dir_ + "/datasets/./mnist/");
  ASSERT_TRUE(confine_spec_paths(spec, confinement_).ok());
  EXPECT_EQ(spec.checkpoint().dir(), dir_ + "/jobs/j-1/ckpt");
  EXPECT_EQ(spec.dataset().path(), dir_ + "/datasets/mnist");
}

TEST_F(SpecPathCheckTest, ASymlinkPlantedUnderARootCannotLeadOut) {
  fs::create_directory_symlink(dir_ + "/secret", dir_ + "/datasets/link");
  cohort::v1::JobSpec spec;
  spec.mutable_dataset()->set_path(dir_ + "/datasets/link");
  spec.mutable_model_parallel()->add_stages()->set_torchscript_file("/etc/passwd");
  const cohort::v1::JobSpec before = spec;
  Status status = confine_spec_paths(spec, confinement_);
  ASSERT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("dataset.path '" + dir_ + "/datasets/link' lies outside"),
            std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("model_parallel.stages[0].torchscript_file '/etc/passwd' lies outside"),
            std::string::npos)
      << status.message();
  EXPECT_EQ(spec.dataset().path(), before.dataset().path());  // unchanged on failure
}

TEST_F(SpecPathCheckTest, PolicyComesFromTheAgentsEnvironment) {
  unsetenv(kJobDirEnv);
  unsetenv(kAllowedPathRootsEnv);
  EXPECT_FALSE(spec_path_confinement_from_environment().has_value());
  setenv(kJobDirEnv, confinement_.job_dir.c_str(), 1);
  setenv(kAllowedPathRootsEnv, (dir_ + "/datasets:/usr/share/datasets").c_str(), 1);
  std::optional<PathConfinement> confinement = spec_path_confinement_from_environment();
  ASSERT_TRUE(confinement.has_value());
  EXPECT_EQ(confinement->job_dir, confinement_.job_dir);
  EXPECT_EQ(confinement->roots, (std::vector<std::string>{dir_ + "/datasets", "/usr/share/datasets"}));
  EXPECT_TRUE(confinement->resolve_symlinks);
}

}  // namespace
}  // namespace cohort::worker
