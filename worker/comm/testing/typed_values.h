#pragma once

// Test helper: reads and writes elements of any DataType as double, so one reference loop checks
// every dtype. f16/bf16 conversions are exact for the small integers and halves tests use.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "worker/comm/types.h"

namespace cohort::comm::testing {

inline uint16_t float_to_half_bits(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exponent = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mantissa ? 0x200 : 0));
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (exponent <= 0) {
    if (exponent < -10) return static_cast<uint16_t>(sign);
    mantissa |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - exponent);
    uint32_t half = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1);
    uint32_t midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(half);
}

inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t x;
  if (exponent == 0) {
    if (mantissa == 0) {
      x = sign;
    } else {
      float value = std::ldexp(static_cast<float>(mantissa), -24);
      std::memcpy(&x, &value, 4);
      x |= sign;
    }
  } else if (exponent == 31) {
    x = sign | 0x7f800000 | (mantissa << 13);
  } else {
    x = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &x, 4);
  return out;
}

inline void write_value(void* buf, DataType dtype, size_t i, double value) {
  switch (dtype) {
    case DataType::kFloat16: static_cast<uint16_t*>(buf)[i] = float_to_half_bits(static_cast<float>(value)); break;
    case DataType::kBFloat16: {
      float f = static_cast<float>(value);
      uint32_t x;
      std::memcpy(&x, &f, 4);
      static_cast<uint16_t*>(buf)[i] = static_cast<uint16_t>((x + 0x7fff + ((x >> 16) & 1)) >> 16);
      break;
    }
    case DataType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(value); break;
    case DataType::kFloat64: static_cast<double*>(buf)[i] = value; break;
    case DataType::kInt8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(value); break;
    case DataType::kUInt8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(value); break;
    case DataType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(value); break;
    case DataType::kInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(value); break;
  }
}

inline double read_value(const void* buf, DataType dtype, size_t i) {
  switch (dtype) {
    case DataType::kFloat16: return half_bits_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kBFloat16: {
      uint32_t x = static_cast<uint32_t>(static_cast<const uint16_t*>(buf)[i]) << 16;
      float f;
      std::memcpy(&f, &x, 4);
      return f;
    }
    case DataType::kFloat32: return static_cast<const float*>(buf)[i];
    case DataType::kFloat64: return static_cast<const double*>(buf)[i];
    case DataType::kInt8: return static_cast<const int8_t*>(buf)[i];
    case DataType::kUInt8: return static_cast<const uint8_t*>(buf)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
  }
  return 0;
}

}  // namespace cohort::comm::testing
