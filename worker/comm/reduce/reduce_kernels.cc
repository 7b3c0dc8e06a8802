#include "worker/comm/reduce/reduce_kernels.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "worker/comm/reduce/half_precision.h"

namespace cohort::comm {
namespace {

// ---- Operators: one scalar `apply` each, written so GCC vectorises the loops that call it. ----

template <typename T>
constexpr bool kIsInteger = std::is_integral_v<T>;

struct SumOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (kIsInteger<T>) {
      // Signed overflow is undefined in C++; unsigned arithmetic wraps, which is what we want.
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};

struct ProductOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (kIsInteger<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};

struct MinOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (kIsInteger<T>) {
      return b < a ? b : a;
    } else {
      // NaN in either operand wins (a != a only for NaN); otherwise the smaller one.
      return (a < b || a != a) ? a : b;
    }
  }
};

struct MaxOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (kIsInteger<T>) {
      return a < b ? b : a;
    } else {
      return (a > b || a != a) ? a : b;
    }
  }
};

// ---- Loops over native types. ----

// The loops below are compiled twice, for AVX2 and for the x86-64 baseline, and the dynamic
// loader picks one for the CPU at hand (GCC function multi-versioning, an ifunc): AVX2 doubles
// the width of every vector loop, which matters while blocks are in cache.
#if defined(__x86_64__)
#define COHORT_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define COHORT_VECTOR_CLONES
#endif

template <typename T, typename Op>
COHORT_VECTOR_CLONES void reduce_in_place(T* __restrict dst, const T* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = Op::apply(dst[i], src[i]);
}

template <typename T, typename Op>
COHORT_VECTOR_CLONES void reduce_out_of_place(T* __restrict dst, const T* __restrict a, const T* __restrict b,
                                              size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = Op::apply(a[i], b[i]);
}

// ---- 16-bit floats: widen a block to float, reduce, narrow back. ----

// Elements per block: two float blocks (2 KiB) stay in L1 next to the 16-bit operands.
constexpr size_t kHalfBlock = 256;

template <typename Half>
struct HalfTraits;
template <>
struct HalfTraits<Float16> {
  static float widen(uint16_t bits) { return float16_to_float(bits); }
  static uint16_t narrow(float value) { return float_to_float16(value); }
};
template <>
struct HalfTraits<BFloat16> {
  static float widen(uint16_t bits) { return bfloat16_to_float(bits); }
  static uint16_t narrow(float value) { return float_to_bfloat16(value); }
};

template <typename Half>
COHORT_VECTOR_CLONES void widen_loop(const Half* in, float* __restrict out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = HalfTraits<Half>::widen(in[i].bits);
}

template <typename Half>
COHORT_VECTOR_CLONES void narrow_loop(const float* __restrict in, Half* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i].bits = HalfTraits<Half>::narrow(in[i]);
}

#if defined(__x86_64__)
// F16C converts eight f16 values per instruction (vcvtph2ps / vcvtps2ph with round-to-nearest-
// even), with the same results as the portable conversions, NaN quieting included.
__attribute__((target("avx,f16c"))) void widen_float16_f16c(const Float16* in, float* out, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  for (; i < count; ++i) out[i] = float16_to_float(in[i].bits);
}

__attribute__((target("avx,f16c"))) void narrow_float16_f16c(const float* in, Float16* out, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < count; ++i) out[i].bits = float_to_float16(in[i]);
}

bool have_f16c() {
  static const bool have = [] {
    __builtin_cpu_init();  // may run before libgcc's own initialisation of the CPU model
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return have;
}
#endif

template <typename Half>
void widen_block(const Half* in, float* out, size_t count) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<Half, Float16>) {
    if (have_f16c()) return widen_float16_f16c(in, out, count);
  }
#endif
  widen_loop(in, out, count);
}

template <typename Half>
void narrow_block(const float* in, Half* out, size_t count) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<Half, Float16>) {
    if (have_f16c()) return narrow_float16_f16c(in, out, count);
  }
#endif
  narrow_loop(in, out, count);
}

// `dst` may be exactly `a` or `b`: each block is read completely before it is written.
template <typename Half, typename Op>
void reduce_half(Half* dst, const Half* a, const Half* b, size_t count) {
  float wide_a[kHalfBlock];
  float wide_b[kHalfBlock];
  for (size_t start = 0; start < count; start += kHalfBlock) {
    const size_t n = std::min(kHalfBlock, count - start);
    widen_block(a + start, wide_a, n);
    widen_block(b + start, wide_b, n);
    reduce_in_place<float, Op>(wide_a, wide_b, n);
    narrow_block(wide_a, dst + start, n);
  }
}

template <typename T>
constexpr bool kIsHalf = std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;

template <typename T, typename Op>
void reduce_typed(T* dst, const T* a, const T* b, size_t count) {
  if constexpr (kIsHalf<T>) {
    reduce_half<T, Op>(dst, a, b, count);
  } else if (dst == a) {
    reduce_in_place<T, Op>(dst, b, count);
  } else if (dst == b) {
    reduce_in_place<T, Op>(dst, a, count);  // every op is commutative
  } else {
    reduce_out_of_place<T, Op>(dst, a, b, count);
  }
}

template <typename T>
COHORT_VECTOR_CLONES void scale_typed(T* buf, size_t count, int divisor) {
  if constexpr (kIsHalf<T>) {
    const float factor = 1.0f / static_cast<float>(divisor);
    float wide[kHalfBlock];
    for (size_t start = 0; start < count; start += kHalfBlock) {
      const size_t n = std::min(kHalfBlock, count - start);
      widen_block(buf + start, wide, n);
      for (size_t i = 0; i < n; ++i) wide[i] *= factor;
      narrow_block(wide, buf + start, n);
    }
  } else if constexpr (kIsInteger<T>) {
    // Integer division truncates toward zero, as torch's integer AVG does. Dividing in int64
    // keeps i8/u8 exact (T(-128) / 1 etc.) without relying on promotions.
    const int64_t d = divisor;
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<T>(static_cast<int64_t>(buf[i]) / d);
  } else {
    const T factor = T(1) / static_cast<T>(divisor);
    for (size_t i = 0; i < count; ++i) buf[i] *= factor;
  }
}

// ---- Dispatch: the one switch from (DataType, ReduceOp) to types. ----

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename Fn>
void visit_data_type(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kFloat16:
      return fn(TypeTag<Float16>{});
    case DataType::kBFloat16:
      return fn(TypeTag<BFloat16>{});
    case DataType::kFloat32:
      return fn(TypeTag<float>{});
    case DataType::kFloat64:
      return fn(TypeTag<double>{});
    case DataType::kInt8:
      return fn(TypeTag<int8_t>{});
    case DataType::kUInt8:
      return fn(TypeTag<uint8_t>{});
    case DataType::kInt32:
      return fn(TypeTag<int32_t>{});
    case DataType::kInt64:
      return fn(TypeTag<int64_t>{});
  }
}

template <typename Fn>
void visit_reduce_op(ReduceOp op, Fn&& fn) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // SUM here; the caller scales the final result (see the header).
      return fn(TypeTag<SumOp>{});
    case ReduceOp::kProduct:
      return fn(TypeTag<ProductOp>{});
    case ReduceOp::kMin:
      return fn(TypeTag<MinOp>{});
    case ReduceOp::kMax:
      return fn(TypeTag<MaxOp>{});
  }
}

}  // namespace

void reduce_to(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return;
  visit_data_type(dtype, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    visit_reduce_op(op, [&](auto op_tag) {
      using Op = typename decltype(op_tag)::type;
      reduce_typed<T, Op>(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count);
    });
  });
}

void reduce_into(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  reduce_to(dst, dst, src, count, dtype, op);
}

void scale_for_average(void* buf, size_t count, DataType dtype, int divisor) {
  if (count == 0 || divisor <= 1) return;
  visit_data_type(dtype, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    scale_typed<T>(static_cast<T*>(buf), count, divisor);
  });
}

}  // namespace cohort::comm
