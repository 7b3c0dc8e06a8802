// CUDA reduction kernels: the device twin of reduce_kernels.cc, with the same semantics so a
// result never depends on where it was reduced (see reduce_kernels.h):
// - integers wrap on SUM/PRODUCT overflow (computed in the unsigned type);
// - floating MIN/MAX propagate NaN, with the host kernels' exact selects;
// - f16/bf16 widen to float, combine, and round back to nearest even once;
// - AVG reduces as SUM; scale_for_average divides afterwards (float factor for f16/bf16/f32,
//   double for f64, truncating integer division for integers).
//
// One grid-stride kernel per (type, op); the dtype and op switches run on the host.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "worker/comm/reduce/device_reduce_kernels.h"

namespace cohort::comm::cuda_kernels {
namespace {

// Must match DataType and ReduceOp in worker/comm/types.h (checked by device_reduce.cc).
enum DType { kF16 = 0, kBF16 = 1, kF32 = 2, kF64 = 3, kI8 = 4, kU8 = 5, kI32 = 6, kI64 = 7 };
enum Op { kSum = 0, kProduct = 1, kMin = 2, kMax = 3, kAvg = 4 };

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU; the grid-stride loop covers larger counts.
constexpr size_t kMaxBlocks = 4096;

// The arithmetic type of a storage type: float for the half types, the type itself otherwise.
template <typename T> struct Wide { using type = T; };
template <> struct Wide<__half> { using type = float; };
template <> struct Wide<__nv_bfloat16> { using type = float; };

template <typename T> __device__ __forceinline__ typename Wide<T>::type widen(T v) { return v; }
template <> __device__ __forceinline__ float widen<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float widen<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T narrow(typename Wide<T>::type v) { return v; }
template <> __device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <int kOp, typename W>
__device__ __forceinline__ W combine(W a, W b) {
  if constexpr (std::is_integral_v<W>) {
    using U = std::make_unsigned_t<W>;
    if constexpr (kOp == kSum || kOp == kAvg) return static_cast<W>(static_cast<U>(a) + static_cast<U>(b));
    if constexpr (kOp == kProduct) return static_cast<W>(static_cast<U>(a) * static_cast<U>(b));
    if constexpr (kOp == kMin) return b < a ? b : a;
    if constexpr (kOp == kMax) return a < b ? b : a;
  } else {
    if constexpr (kOp == kSum || kOp == kAvg) return a + b;
    if constexpr (kOp == kProduct) return a * b;
    // NaN in either operand wins (a != a only for NaN), as on the host.
    if constexpr (kOp == kMin) return (a < b || a != a) ? a : b;
    if constexpr (kOp == kMax) return (a > b || a != a) ? a : b;
  }
}

template <typename T, int kOp>
__global__ void reduce_kernel(T* dst, const T* a, const T* b, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = narrow<T>(combine<kOp>(widen(a[i]), widen(b[i])));
  }
}

template <typename T>
__global__ void scale_kernel(T* buf, size_t count, int divisor) {
  using W = typename Wide<T>::type;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_integral_v<W>) {
      buf[i] = static_cast<T>(static_cast<int64_t>(buf[i]) / static_cast<int64_t>(divisor));
    } else {
      const W factor = W(1) / static_cast<W>(divisor);
      buf[i] = narrow<T>(widen(buf[i]) * factor);
    }
  }
}

unsigned blocks_for(size_t count) {
  size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

template <typename T>
int launch_reduce_typed(void* dst, const void* a, const void* b, size_t count, int op, cudaStream_t stream) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  const unsigned blocks = blocks_for(count);
  switch (op) {
    case kSum:
    case kAvg:
      reduce_kernel<T, kSum><<<blocks, kThreads, 0, stream>>>(d, x, y, count);
      break;
    case kProduct:
      reduce_kernel<T, kProduct><<<blocks, kThreads, 0, stream>>>(d, x, y, count);
      break;
    case kMin:
      reduce_kernel<T, kMin><<<blocks, kThreads, 0, stream>>>(d, x, y, count);
      break;
    case kMax:
      reduce_kernel<T, kMax><<<blocks, kThreads, 0, stream>>>(d, x, y, count);
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int launch_scale_typed(void* buf, size_t count, int divisor, cudaStream_t stream) {
  scale_kernel<T><<<blocks_for(count), kThreads, 0, stream>>>(static_cast<T*>(buf), count, divisor);
  return static_cast<int>(cudaGetLastError());
}

// Calls fn(T{}) with the storage type of `dtype`; cudaErrorInvalidValue for an unknown code.
template <typename Fn>
int with_type(int dtype, Fn&& fn) {
  switch (dtype) {
    case kF16: return fn(__half{});
    case kBF16: return fn(__nv_bfloat16{});
    case kF32: return fn(float{});
    case kF64: return fn(double{});
    case kI8: return fn(int8_t{});
    case kU8: return fn(uint8_t{});
    case kI32: return fn(int32_t{});
    case kI64: return fn(int64_t{});
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace

int launch_reduce_to(void* dst, const void* a, const void* b, size_t count, int dtype, int op, void* stream) {
  if (count == 0) return static_cast<int>(cudaSuccess);
  auto s = static_cast<cudaStream_t>(stream);
  return with_type(dtype, [&](auto tag) {
    return launch_reduce_typed<decltype(tag)>(dst, a, b, count, op, s);
  });
}

int launch_scale_for_average(void* buf, size_t count, int dtype, int divisor, void* stream) {
  if (count == 0 || divisor <= 1) return static_cast<int>(cudaSuccess);
  auto s = static_cast<cudaStream_t>(stream);
  return with_type(dtype, [&](auto tag) { return launch_scale_typed<decltype(tag)>(buf, count, divisor, s); });
}

}  // namespace cohort::comm::cuda_kernels
