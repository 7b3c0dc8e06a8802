#pragma once

// IEEE binary16 ("f16", torch.half) and bfloat16 ("bf16") as storage types, and their exact
// conversions to and from float.
//
// Reductions on 16-bit floats run in float (as torch and NCCL do): a block is widened, reduced,
// and narrowed once. The conversions here are branch-free (every case is computed and one is
// selected), so loops over blocks vectorise without F16C. Narrowing rounds to nearest, ties to
// even; NaN stays a quiet NaN with its sign; infinities stay infinite; finite values beyond the
// largest finite value round to infinity as IEEE 754 requires. Widening is exact.

#include <cstdint>
#include <cstring>

namespace cohort::comm {

// 16-bit storage types, distinct so that templates dispatch on them. Trivially copyable, same
// size and layout as the wire format.
struct Float16 {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
static_assert(sizeof(Float16) == 2 && sizeof(BFloat16) == 2);

inline uint32_t float_to_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float bits_to_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// `condition ? a : b` as bit arithmetic: GCC if-converts and vectorises this where nested
// conditional expressions would leave branches in the loop.
inline uint32_t select_bits(bool condition, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return b ^ ((a ^ b) & mask);
}

inline float float16_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t magnitude = half & 0x7fffu;
  // Normal numbers: move exponent and mantissa into place and rebias the exponent (15 → 127).
  const uint32_t normal = (magnitude << 13) + 0x38000000u;
  // Infinity / NaN: all-ones exponent, mantissa (NaN payload, quiet bit included) kept.
  const uint32_t special = (magnitude << 13) | 0x7f800000u;
  // Zero and subnormals: the value is magnitude × 2^-24, which float represents exactly.
  const uint32_t subnormal = float_to_bits(static_cast<float>(magnitude) * 0x1p-24f);
  const uint32_t finite = select_bits(magnitude < 0x0400u, subnormal, normal);
  return bits_to_float(sign | select_bits(magnitude >= 0x7c00u, special, finite));
}

inline uint16_t float_to_float16(float value) {
  const uint32_t bits = float_to_bits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  // NaN: a quiet NaN that keeps the top mantissa bits of the payload.
  const uint32_t nan = 0x7e00u | ((magnitude >> 13) & 0x3ffu);
  // Normal results: rebias (127 → 15, i.e. add (15 - 127) << 23 modulo 2^32) and round the 13
  // dropped bits to nearest even (add 0xfff, plus 1 when the kept part is odd). A carry out of
  // the mantissa bumps the exponent, which is exactly right, up to and including infinity for
  // values in [65520, 65536).
  const uint32_t normal = (magnitude + 0xc8000fffu + ((magnitude >> 13) & 1u)) >> 13;
  // Results below 2^-14 (subnormal or zero): adding 0.5 places the units of 2^-24 at the bottom
  // of the float's mantissa and lets the FPU round to nearest even; subtracting 0.5's bits
  // leaves the half's bits (0x400, the smallest normal, when it rounds up).
  const uint32_t subnormal = float_to_bits(bits_to_float(magnitude) + 0.5f) - 0x3f000000u;
  // ≥ 2^16 (0x47800000), infinity included: infinity.
  uint32_t result = select_bits(magnitude < 0x38800000u, subnormal, normal);
  result = select_bits(magnitude >= 0x47800000u, 0x7c00u, result);
  result = select_bits(magnitude > 0x7f800000u, nan, result);
  return static_cast<uint16_t>(sign | result);
}

inline float bfloat16_to_float(uint16_t bf16) { return bits_to_float(static_cast<uint32_t>(bf16) << 16); }

inline uint16_t float_to_bfloat16(float value) {
  const uint32_t bits = float_to_bits(value);
  // Round the 16 dropped bits to nearest even; a carry bumps the exponent (up to infinity).
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  // NaN: keep sign and top payload bits, force the quiet bit (rounding could turn it into inf).
  const uint32_t nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

}  // namespace cohort::comm
