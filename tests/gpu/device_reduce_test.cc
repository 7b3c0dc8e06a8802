// The CUDA reduction kernels against the host kernels, element for element: every dtype, every
// op (PRODUCT and integer wrap-around included), NaN through MIN/MAX, and AVG's scale. Equality
// is bitwise except NaN payloads. Without a GPU (or in a CPU-only build) every case is SKIPPED.

#include <gtest/gtest.h>

#include "worker/comm/transport/nccl/cuda_testing.h"

#if COHORT_CUDA

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <cuda_runtime_api.h>

#include "worker/comm/reduce/device_reduce.h"
#include "worker/comm/reduce/reduce_kernels.h"
#include "worker/comm/testing/typed_values.h"

namespace cohort::comm {
namespace {

using testing::DeviceBuffer;
using testing::read_value;
using testing::write_value;

constexpr DataType kAllTypes[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
                                  DataType::kInt8,    DataType::kUInt8,    DataType::kInt32,   DataType::kInt64};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg};

// Deterministic mixed values: negatives, fractions (floats), large magnitudes that overflow i8
// products, and a NaN every 97 elements for floating types.
std::vector<uint8_t> values(DataType dtype, size_t count, int seed) {
  std::vector<uint8_t> bytes(count * element_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    double v = static_cast<double>(static_cast<int64_t>((i * 2654435761u + seed * 40503u) % 251) - 125);
    if (is_floating(dtype)) {
      v /= 8.0;
      if (i % 97 == static_cast<size_t>(seed)) v = std::nan("");
    }
    write_value(bytes.data(), dtype, i, v);
  }
  return bytes;
}

bool same(const uint8_t* a, const uint8_t* b, DataType dtype, size_t i) {
  double x = read_value(a, dtype, i), y = read_value(b, dtype, i);
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  size_t e = element_size(dtype);
  return std::memcmp(a + i * e, b + i * e, e) == 0;
}

TEST(DeviceReduceTest, MatchesTheHostKernelsForEveryDtypeAndOp) {
  COHORT_SKIP_UNLESS_GPUS(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const size_t count = 100003;  // not a multiple of the block size
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      SCOPED_TRACE(fmt::format("{} {}", data_type_name(dtype), reduce_op_name(op)));
      std::vector<uint8_t> a = values(dtype, count, 1), b = values(dtype, count, 2);
      std::vector<uint8_t> expected = a;
      reduce_into(expected.data(), b.data(), count, dtype, op);
      DeviceBuffer<uint8_t> da(a), db(b);
      ASSERT_TRUE(device_reduce_into(da.data(), db.data(), count, dtype, op, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint8_t> got = da.download();
      size_t mismatches = 0, first = count;
      for (size_t i = 0; i < count; ++i) {
        if (!same(got.data(), expected.data(), dtype, i)) {
          if (mismatches++ == 0) first = i;
        }
      }
      EXPECT_EQ(mismatches, 0u) << "first at " << first << ": device " << read_value(got.data(), dtype, first)
                                << ", host " << read_value(expected.data(), dtype, first);
    }
  }
}

TEST(DeviceReduceTest, ScaleForAverageMatchesTheHost) {
  COHORT_SKIP_UNLESS_GPUS(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const size_t count = 4099;
  for (DataType dtype : kAllTypes) {
    for (int divisor : {2, 3, 7}) {
      SCOPED_TRACE(fmt::format("{} / {}", data_type_name(dtype), divisor));
      std::vector<uint8_t> a = values(dtype, count, 3);
      std::vector<uint8_t> expected = a;
      scale_for_average(expected.data(), count, dtype, divisor);
      DeviceBuffer<uint8_t> da(a);
      ASSERT_TRUE(device_scale_for_average(da.data(), count, dtype, divisor, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint8_t> got = da.download();
      for (size_t i = 0; i < count; ++i) {
        ASSERT_TRUE(same(got.data(), expected.data(), dtype, i))
            << "element " << i << ": device " << read_value(got.data(), dtype, i) << ", host "
            << read_value(expected.data(), dtype, i);
      }
    }
  }
}

}  // namespace
}  // namespace cohort::comm

#else  // CPU-only build

TEST(DeviceReduceTest, NeedsACudaBuildAndAGpu) { COHORT_SKIP_UNLESS_GPUS(1); }

#endif
