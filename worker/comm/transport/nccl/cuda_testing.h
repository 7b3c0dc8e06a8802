#pragma once

// Helpers of the GPU tests: skipping visibly when there is no GPU (or no CUDA build), and device
// buffers. A test that needs GPUs starts with COHORT_SKIP_UNLESS_GPUS(n): without them it prints
// the reason and reports itself SKIPPED (tests/run_all.sh counts such a target as skipped, never
// as passed).

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "worker/comm/transport/nccl/device_memory.h"

#if COHORT_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cohort::comm::testing {

// Why a test needing `gpus` GPUs cannot run here, or "" when it can.
inline std::string missing_gpus(int gpus) {
  if (!cuda_build()) {
    return "CPU-only build: GPU tests need `bazel test --config=cuda` (tests/run_all.sh does this when nvcc is "
           "installed) and a GPU";
  }
  int seen = cuda_device_count();
  if (seen >= gpus) return "";
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return fmt::format("needs {} GPU(s) but this machine shows {} (CUDA_VISIBLE_DEVICES='{}')", gpus, seen,
                     visible != nullptr ? visible : "");
}

}  // namespace cohort::comm::testing

#define COHORT_SKIP_UNLESS_GPUS(gpus)                                              \
  do {                                                                             \
    std::string cohort_skip_reason = ::cohort::comm::testing::missing_gpus(gpus);  \
    if (!cohort_skip_reason.empty()) {                                             \
      std::fprintf(stderr, "SKIPPED: %s\n", cohort_skip_reason.c_str());           \
      GTEST_SKIP() << cohort_skip_reason;                                          \
    }                                                                              \
  } while (0)

#if COHORT_CUDA
namespace cohort::comm::testing {

// `count` elements of T in device memory of the current device; freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (cudaMalloc(&data_, count == 0 ? 1 : count * sizeof(T)) != cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc of " << count * sizeof(T) << " bytes failed";
      data_ = nullptr;
    }
  }
  explicit DeviceBuffer(const std::vector<T>& values) : DeviceBuffer(values.size()) { upload(values); }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() { return static_cast<T*>(data_); }
  size_t size() const { return count_; }
  void upload(const std::vector<T>& values) {
    EXPECT_EQ(cudaMemcpy(data_, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> values(count_);
    EXPECT_EQ(cudaMemcpy(values.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return values;
  }

 private:
  void* data_ = nullptr;
  size_t count_;
};

}  // namespace cohort::comm::testing
#endif
