#include "worker/comm/reduce/reduce_kernels.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "worker/comm/reduce/half_precision.h"

namespace cohort::comm {
namespace {

// ---- Independent references: slow, obviously correct, built on <cmath> rather than bit tricks. ----

// The value of a binary16 bit pattern, decoded from its fields.
double reference_float16_value(uint16_t bits) {
  const int sign = (bits & 0x8000) ? -1 : 1;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0x1f) return mantissa ? std::nan("") : sign * std::numeric_limits<double>::infinity();
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// Rounds `x` to a binary format with `mantissa_bits` explicit mantissa bits, minimum normal
// exponent `min_exponent` (subnormals below) and largest finite value `max_finite`: nearest,
// ties to even (nearbyint under the default rounding mode); beyond max_finite → infinity.
double reference_round(double x, int mantissa_bits, int min_exponent, double max_finite) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const double magnitude = std::fabs(x);
  const int exponent = std::max(std::ilogb(magnitude), min_exponent);
  const double quantum = std::ldexp(1.0, exponent - mantissa_bits);
  double rounded = std::nearbyint(magnitude / quantum) * quantum;
  if (rounded > max_finite) rounded = std::numeric_limits<double>::infinity();
  return std::copysign(rounded, x);
}

double reference_to_float16(double x) { return reference_round(x, 10, -14, 65504.0); }
double reference_to_bfloat16(double x) {
  return reference_round(x, 7, -126, std::ldexp(255.0, 120));  // (2 - 2^-7) · 2^127
}

// Same value, same sign (so -0 ≠ +0); any NaN equals any NaN.
bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// ---- Conversions ----

TEST(HalfPrecisionTest, Float16WidensEveryBitPatternExactly) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float wide = float16_to_float(static_cast<uint16_t>(bits));
    ASSERT_TRUE(same_value(wide, reference_float16_value(static_cast<uint16_t>(bits)))) << std::hex << bits;
  }
}

TEST(HalfPrecisionTest, Float16RoundTripsEveryBitPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t back = float_to_float16(float16_to_float(static_cast<uint16_t>(bits)));
    const bool is_nan = (bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0;
    if (is_nan) {
      // Still NaN, quiet, same sign, payload kept.
      EXPECT_EQ(back & 0x8000, bits & 0x8000);
      EXPECT_EQ(back & 0x7e00, 0x7e00);
      EXPECT_EQ(back & 0x1ff, bits & 0x1ff) << std::hex << bits;
    } else {
      ASSERT_EQ(back, bits) << std::hex << bits;
    }
  }
}

TEST(HalfPrecisionTest, Float16RoundsHalfwayCasesToEvenAndOverflowsToInfinity) {
  // Between every pair of adjacent positive finite halves: the midpoint (a tie) and its
  // neighbouring floats (just below / above the tie).
  for (uint32_t bits = 0; bits < 0x7bff; ++bits) {
    const float low = float16_to_float(static_cast<uint16_t>(bits));
    const float high = float16_to_float(static_cast<uint16_t>(bits + 1));
    const float mid = (low + high) / 2;  // exact: 12 significant bits
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid}) {
      ASSERT_TRUE(same_value(float16_to_float(float_to_float16(x)), reference_to_float16(x)))
          << "x=" << x << " bits=" << std::hex << bits;
    }
  }
  EXPECT_EQ(float_to_float16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_float16(65519.996f), 0x7bff);  // just below the tie with 65536
  EXPECT_EQ(float_to_float16(65520.0f), 0x7c00);    // the tie rounds to even: infinity
  EXPECT_EQ(float_to_float16(1e10f), 0x7c00);
  EXPECT_EQ(float_to_float16(-1e10f), 0xfc00);
  EXPECT_EQ(float_to_float16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_float16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(float_to_float16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_float16(std::ldexp(1.0f, -25)), 0x0000);     // tie between 0 and 2^-24: even (0)
  EXPECT_EQ(float_to_float16(std::ldexp(1.5f, -25)), 0x0001);     // above the tie
  EXPECT_EQ(float_to_float16(std::ldexp(3.0f, -25)), 0x0002);     // tie between 1 and 2 ulps: even (2)
  EXPECT_EQ(float_to_float16(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(float_to_float16(std::ldexp(1023.5f, -24)), 0x0400);  // subnormal rounding up into normal
  EXPECT_EQ(float_to_float16(std::nanf("")) & 0x7e00, 0x7e00);
  EXPECT_EQ(float_to_float16(-std::nanf("")) & 0xfe00, 0xfe00);
}

TEST(HalfPrecisionTest, NarrowingMatchesReferenceOnRandomFloats) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2'000'000; ++i) {
    const float x = bits_to_float(static_cast<uint32_t>(rng()));
    ASSERT_TRUE(same_value(float16_to_float(float_to_float16(x)), reference_to_float16(x))) << x;
    ASSERT_TRUE(same_value(bfloat16_to_float(float_to_bfloat16(x)), reference_to_bfloat16(x))) << x;
  }
}

TEST(HalfPrecisionTest, BFloat16RoundsToNearestEvenAndKeepsSpecials) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    const bool is_nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
    const uint16_t back = float_to_bfloat16(bfloat16_to_float(b));
    if (is_nan) {
      EXPECT_EQ(back & 0xffc0, (b & 0xff80) | 0x40) << std::hex << bits;
    } else {
      ASSERT_EQ(back, b) << std::hex << bits;
    }
    if (is_nan || (b & 0x7fff) >= 0x7f7f) continue;
    // Ties and their neighbours between b and the next pattern up (same sign).
    const float low = bfloat16_to_float(b);
    const float high = bfloat16_to_float(static_cast<uint16_t>(b + 1));
    const float mid = bits_to_float(float_to_bits(low) + 0x8000u);
    ASSERT_TRUE(low != high);
    for (float x : {mid, std::nextafter(mid, low), std::nextafter(mid, high)}) {
      ASSERT_TRUE(same_value(bfloat16_to_float(float_to_bfloat16(x)), reference_to_bfloat16(x)))
          << "x=" << x << " bits=" << std::hex << bits;
    }
  }
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past max: inf
  EXPECT_EQ(float_to_bfloat16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16(-0.0f), 0x8000);
}

// ---- Kernels against scalar references ----

constexpr DataType kAllDataTypes[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                                      DataType::kFloat64, DataType::kInt8,     DataType::kUInt8,
                                      DataType::kInt32,   DataType::kInt64};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
constexpr size_t kCounts[] = {0, 1, 7, 1000, (size_t{1} << 20) + 3};

// A typed view of one element of a byte buffer, as double (floats) or int64 (integers).
double load_float(const std::vector<uint8_t>& buf, DataType dtype, size_t i) {
  uint16_t h;
  switch (dtype) {
    case DataType::kFloat16:
      std::memcpy(&h, &buf[2 * i], 2);
      return reference_float16_value(h);
    case DataType::kBFloat16:
      std::memcpy(&h, &buf[2 * i], 2);
      return bits_to_float(uint32_t{h} << 16);
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, &buf[4 * i], 4);
      return f;
    }
    case DataType::kFloat64: {
      double d;
      std::memcpy(&d, &buf[8 * i], 8);
      return d;
    }
    default:
      ADD_FAILURE() << "not a float type";
      return 0;
  }
}

int64_t load_int(const std::vector<uint8_t>& buf, DataType dtype, size_t i) {
  switch (dtype) {
    case DataType::kInt8:
      return static_cast<int8_t>(buf[i]);
    case DataType::kUInt8:
      return buf[i];
    case DataType::kInt32: {
      int32_t v;
      std::memcpy(&v, &buf[4 * i], 4);
      return v;
    }
    case DataType::kInt64: {
      int64_t v;
      std::memcpy(&v, &buf[8 * i], 8);
      return v;
    }
    default:
      ADD_FAILURE() << "not an integer type";
      return 0;
  }
}

// Random inputs: floats spread over many magnitudes with a few specials (inf, NaN, ±0) in fixed
// places; integers over their whole range so SUM and PRODUCT wrap.
std::vector<uint8_t> random_buffer(DataType dtype, size_t count, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> buf(count * element_size(dtype));
  std::uniform_real_distribution<double> mantissa(-2.0, 2.0);
  std::uniform_int_distribution<int> exponent(-12, 12);
  for (size_t i = 0; i < count; ++i) {
    double value = std::ldexp(mantissa(rng), exponent(rng));
    if (i % 97 == 5) value = std::numeric_limits<double>::infinity();
    if (i % 101 == 7) value = std::nan("");
    if (i % 89 == 3) value = -0.0;
    const uint64_t raw = rng();
    switch (dtype) {
      case DataType::kFloat16: {
        uint16_t h = float_to_float16(static_cast<float>(value));
        std::memcpy(&buf[2 * i], &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        uint16_t h = float_to_bfloat16(static_cast<float>(value));
        std::memcpy(&buf[2 * i], &h, 2);
        break;
      }
      case DataType::kFloat32: {
        float f = static_cast<float>(value);
        std::memcpy(&buf[4 * i], &f, 4);
        break;
      }
      case DataType::kFloat64:
        std::memcpy(&buf[8 * i], &value, 8);
        break;
      default:
        std::memcpy(&buf[i * element_size(dtype)], &raw, element_size(dtype));
        break;
    }
  }
  return buf;
}

template <typename F>
F reference_op(F a, F b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return (std::isnan(a) || std::isnan(b)) ? std::numeric_limits<F>::quiet_NaN() : std::min(a, b);
    case ReduceOp::kMax:
      return (std::isnan(a) || std::isnan(b)) ? std::numeric_limits<F>::quiet_NaN() : std::max(a, b);
  }
  return 0;
}

uint64_t reference_int_op(uint64_t a, uint64_t b, int64_t sa, int64_t sb, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return static_cast<uint64_t>(std::min(sa, sb));
    case ReduceOp::kMax:
      return static_cast<uint64_t>(std::max(sa, sb));
  }
  return 0;
}

// Checks out[i] == a[i] op b[i] for every element, with the arithmetic of the kernels' contract.
void expect_reduced(const std::vector<uint8_t>& out, const std::vector<uint8_t>& a,
                    const std::vector<uint8_t>& b, size_t count, DataType dtype, ReduceOp op) {
  for (size_t i = 0; i < count; ++i) {
    if (is_floating(dtype)) {
      double expected;
      if (dtype == DataType::kFloat64) {
        expected = reference_op(load_float(a, dtype, i), load_float(b, dtype, i), op);
      } else {
        // f16 / bf16 / f32: computed in float, then rounded to the storage type.
        const float wide = reference_op(static_cast<float>(load_float(a, dtype, i)),
                                        static_cast<float>(load_float(b, dtype, i)), op);
        expected = dtype == DataType::kFloat16    ? reference_to_float16(wide)
                   : dtype == DataType::kBFloat16 ? reference_to_bfloat16(wide)
                                                  : wide;
      }
      const double actual = load_float(out, dtype, i);
      ASSERT_TRUE(same_value(actual, expected))
          << data_type_name(dtype) << " " << reduce_op_name(op) << " element " << i << ": "
          << load_float(a, dtype, i) << " op " << load_float(b, dtype, i) << " = " << actual << ", expected "
          << expected;
    } else {
      const int64_t sa = load_int(a, dtype, i);
      const int64_t sb = load_int(b, dtype, i);
      const uint64_t wide =
          reference_int_op(static_cast<uint64_t>(sa), static_cast<uint64_t>(sb), sa, sb, op);
      const size_t width = element_size(dtype);
      // Wrap to the element width (little-endian: the low bytes).
      ASSERT_EQ(std::memcmp(&out[i * width], &wide, width), 0)
          << data_type_name(dtype) << " " << reduce_op_name(op) << " element " << i << ": " << sa << " op "
          << sb << " = " << load_int(out, dtype, i);
    }
  }
}

TEST(ReduceKernelsTest, ReduceIntoMatchesScalarReferenceForEveryTypeOpAndCount) {
  for (DataType dtype : kAllDataTypes) {
    for (ReduceOp op : kAllOps) {
      for (size_t count : kCounts) {
        SCOPED_TRACE(fmt::format("{} {} count={}", data_type_name(dtype), reduce_op_name(op), count));
        const auto a = random_buffer(dtype, count, 1 + static_cast<uint32_t>(count));
        const auto b = random_buffer(dtype, count, 2 + static_cast<uint32_t>(count));
        auto dst = a;
        reduce_into(dst.data(), b.data(), count, dtype, op);
        expect_reduced(dst, a, b, count, dtype, op);
      }
    }
  }
}

TEST(ReduceKernelsTest, ReduceToWritesAThirdBufferOrEitherInput) {
  const size_t count = 1003;
  for (DataType dtype : kAllDataTypes) {
    for (ReduceOp op : kAllOps) {
      SCOPED_TRACE(fmt::format("{} {}", data_type_name(dtype), reduce_op_name(op)));
      const auto a = random_buffer(dtype, count, 11);
      const auto b = random_buffer(dtype, count, 12);
      std::vector<uint8_t> out(a.size(), 0xcd);
      reduce_to(out.data(), a.data(), b.data(), count, dtype, op);
      expect_reduced(out, a, b, count, dtype, op);
      auto into_a = a;
      reduce_to(into_a.data(), into_a.data(), b.data(), count, dtype, op);
      expect_reduced(into_a, a, b, count, dtype, op);
      auto into_b = b;
      reduce_to(into_b.data(), a.data(), into_b.data(), count, dtype, op);
      expect_reduced(into_b, a, b, count, dtype, op);
    }
  }
}

TEST(ReduceKernelsTest, ZeroCountTouchesNothing) {
  for (DataType dtype : kAllDataTypes) {
    reduce_into(nullptr, nullptr, 0, dtype, ReduceOp::kSum);
    reduce_to(nullptr, nullptr, nullptr, 0, dtype, ReduceOp::kMax);
    scale_for_average(nullptr, 0, dtype, 3);
  }
}

TEST(ReduceKernelsTest, AvgReducesAsSum) {
  std::vector<int32_t> dst = {1, -2, 3};
  const std::vector<int32_t> src = {10, 20, -30};
  reduce_into(dst.data(), src.data(), dst.size(), DataType::kInt32, ReduceOp::kAvg);
  EXPECT_EQ(dst, (std::vector<int32_t>{11, 18, -27}));
}

TEST(ReduceKernelsTest, MinMaxPropagateNaNFromEitherSide) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a = {nan, 1.0f, nan, -3.0f};
  const std::vector<float> b = {1.0f, nan, nan, -4.0f};
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    auto dst = a;
    reduce_into(dst.data(), b.data(), dst.size(), DataType::kFloat32, op);
    EXPECT_TRUE(std::isnan(dst[0]) && std::isnan(dst[1]) && std::isnan(dst[2]));
    EXPECT_EQ(dst[3], op == ReduceOp::kMin ? -4.0f : -3.0f);
  }
}

TEST(ReduceKernelsTest, Float16SumRoundsThroughFloatToNearestEven) {
  // 2048 + 1 is a tie between 2048 and 2050 in f16 (ulp 2 there): even mantissa → 2048.
  // 2050 + 1 = 2051: tie between 2050 and 2052 → 2052 (even).
  std::vector<uint16_t> dst = {float_to_float16(2048), float_to_float16(2050), float_to_float16(65504)};
  const std::vector<uint16_t> src = {float_to_float16(1), float_to_float16(1), float_to_float16(32)};
  reduce_into(dst.data(), src.data(), dst.size(), DataType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(float16_to_float(dst[0]), 2048.0f);
  EXPECT_EQ(float16_to_float(dst[1]), 2052.0f);
  // 65504 + 32 = 65536, beyond the tie at 65520 between the largest half and 2^16: infinity.
  EXPECT_EQ(dst[2], 0x7c00) << "65504 + 32 must overflow to infinity";
}

// The kernels may convert with hardware (F16C) or with half_precision.h; either way every bit
// pattern, NaN payloads included, must come out exactly as the portable conversions give it.
TEST(ReduceKernelsTest, HalfKernelsMatchThePortableConversionsBitForBit) {
  std::vector<uint16_t> a(65536), b(65536);
  std::mt19937 rng(3);
  for (uint32_t i = 0; i < 65536; ++i) {
    a[i] = static_cast<uint16_t>(i);
    b[i] = static_cast<uint16_t>(rng());
  }
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    auto widen = dtype == DataType::kFloat16 ? float16_to_float : bfloat16_to_float;
    auto narrow = dtype == DataType::kFloat16 ? float_to_float16 : float_to_bfloat16;
    for (ReduceOp op : kAllOps) {
      auto out = a;
      reduce_into(out.data(), b.data(), out.size(), dtype, op);
      for (size_t i = 0; i < a.size(); ++i) {
        const float x = widen(a[i]), y = widen(b[i]);
        float wide = 0;
        switch (op) {
          case ReduceOp::kSum:
            wide = x + y;
            break;
          case ReduceOp::kProduct:
            wide = x * y;
            break;
          case ReduceOp::kMin:
            wide = (x < y || x != x) ? x : y;
            break;
          case ReduceOp::kMax:
            wide = (x > y || x != x) ? x : y;
            break;
          default:
            break;
        }
        ASSERT_EQ(out[i], narrow(wide)) << data_type_name(dtype) << " " << reduce_op_name(op) << std::hex
                                        << " a=" << a[i] << " b=" << b[i];
      }
    }
    auto scaled = a;
    scale_for_average(scaled.data(), scaled.size(), dtype, 7);
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(scaled[i], narrow(widen(a[i]) * (1.0f / 7))) << std::hex << a[i];
  }
}

TEST(ReduceKernelsTest, ScaleForAverageTruncatesIntegersTowardZero) {
  std::vector<int32_t> i32 = {-7, 7, -1, 5, std::numeric_limits<int32_t>::min()};
  scale_for_average(i32.data(), i32.size(), DataType::kInt32, 2);
  EXPECT_EQ(i32, (std::vector<int32_t>{-3, 3, 0, 2, std::numeric_limits<int32_t>::min() / 2}));
  std::vector<int8_t> i8 = {-128, 127, -5};
  scale_for_average(i8.data(), i8.size(), DataType::kInt8, 3);
  EXPECT_EQ(i8, (std::vector<int8_t>{-42, 42, -1}));
  std::vector<uint8_t> u8 = {255, 1};
  scale_for_average(u8.data(), u8.size(), DataType::kUInt8, 4);
  EXPECT_EQ(u8, (std::vector<uint8_t>{63, 0}));
  std::vector<int64_t> i64 = {-9, int64_t{1} << 62};
  scale_for_average(i64.data(), i64.size(), DataType::kInt64, 4);
  EXPECT_EQ(i64, (std::vector<int64_t>{-2, int64_t{1} << 60}));
}

TEST(ReduceKernelsTest, ScaleForAverageMultipliesFloatsByTheReciprocal) {
  for (size_t count : kCounts) {
    std::vector<float> f32(count);
    std::vector<double> f64(count);
    std::vector<uint16_t> f16(count), bf16(count);
    for (size_t i = 0; i < count; ++i) {
      f32[i] = static_cast<float>(i % 1000) * 0.37f - 50;
      f64[i] = static_cast<double>(i % 1000) * 0.37 - 50;
      f16[i] = float_to_float16(f32[i]);
      bf16[i] = float_to_bfloat16(f32[i]);
    }
    auto f32_in = f32;
    auto f64_in = f64;
    auto f16_in = f16;
    auto bf16_in = bf16;
    scale_for_average(f32.data(), count, DataType::kFloat32, 3);
    scale_for_average(f64.data(), count, DataType::kFloat64, 3);
    scale_for_average(f16.data(), count, DataType::kFloat16, 3);
    scale_for_average(bf16.data(), count, DataType::kBFloat16, 3);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(f32[i], f32_in[i] * (1.0f / 3.0f));
      ASSERT_EQ(f64[i], f64_in[i] * (1.0 / 3.0));
      ASSERT_TRUE(same_value(reference_float16_value(f16[i]),
                             reference_to_float16(float16_to_float(f16_in[i]) * (1.0f / 3.0f))));
      ASSERT_TRUE(same_value(bfloat16_to_float(bf16[i]),
                             reference_to_bfloat16(bfloat16_to_float(bf16_in[i]) * (1.0f / 3.0f))));
    }
  }
  std::vector<float> one = {5.0f};
  scale_for_average(one.data(), 1, DataType::kFloat32, 1);
  EXPECT_EQ(one[0], 5.0f);
}

}  // namespace
}  // namespace cohort::comm
