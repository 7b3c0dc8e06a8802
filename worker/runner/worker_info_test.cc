#include "worker/runner/worker_info.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace cohort::worker {
namespace {

TEST(WorkerInfoTest, VersionNamesLibtorchAndUcx) {
  std::string version = version_string();
  EXPECT_NE(version.find("cohort-worker "), std::string::npos);
  EXPECT_NE(version.find("libtorch 1."), std::string::npos) << version;
  EXPECT_NE(version.find("UCX 1."), std::string::npos) << version;
}

TEST(WorkerInfoTest, LibtorchComputes) {
  at::Tensor t = at::arange(1, 5, at::kFloat);  // 1 2 3 4
  EXPECT_FLOAT_EQ(t.sum().item<float>(), 10.0f);
}

}  // namespace
}  // namespace cohort::worker
