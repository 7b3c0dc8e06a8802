#include "worker/comm/reduce/device_reduce.h"

#if COHORT_CUDA
#include <cuda_runtime_api.h>

#include "worker/comm/reduce/device_reduce_kernels.h"
#include "worker/comm/transport/nccl/cuda_check.h"
#endif

namespace cohort::comm {

#if COHORT_CUDA

// The .cu file mirrors these values as plain ints (it does not include types.h).
static_assert(static_cast<int>(DataType::kFloat16) == 0 && static_cast<int>(DataType::kBFloat16) == 1 &&
              static_cast<int>(DataType::kFloat32) == 2 && static_cast<int>(DataType::kFloat64) == 3 &&
              static_cast<int>(DataType::kInt8) == 4 && static_cast<int>(DataType::kUInt8) == 5 &&
              static_cast<int>(DataType::kInt32) == 6 && static_cast<int>(DataType::kInt64) == 7);
static_assert(static_cast<int>(ReduceOp::kSum) == 0 && static_cast<int>(ReduceOp::kProduct) == 1 &&
              static_cast<int>(ReduceOp::kMin) == 2 && static_cast<int>(ReduceOp::kMax) == 3 &&
              static_cast<int>(ReduceOp::kAvg) == 4);

Status device_reduce_to(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op,
                        void* stream) {
  return COHORT_CUDA_CHECK(static_cast<cudaError_t>(cuda_kernels::launch_reduce_to(
      dst, a, b, count, static_cast<int>(dtype), static_cast<int>(op), stream)));
}

Status device_scale_for_average(void* buf, size_t count, DataType dtype, int divisor, void* stream) {
  return COHORT_CUDA_CHECK(static_cast<cudaError_t>(
      cuda_kernels::launch_scale_for_average(buf, count, static_cast<int>(dtype), divisor, stream)));
}

#else  // CPU-only build

namespace {
Status needs_cuda_build() {
  return failed_precondition_error(
      "device reduction kernels need a CUDA build: bazel build --config=cuda ... (on a machine with the CUDA "
      "toolkit)");
}
}  // namespace

Status device_reduce_to(void*, const void*, const void*, size_t, DataType, ReduceOp, void*) {
  return needs_cuda_build();
}
Status device_scale_for_average(void*, size_t, DataType, int, void*) { return needs_cuda_build(); }

#endif

Status device_reduce_into(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op, void* stream) {
  return device_reduce_to(dst, dst, src, count, dtype, op, stream);
}

}  // namespace cohort::comm
