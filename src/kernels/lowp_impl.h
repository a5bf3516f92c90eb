// Private (not installed): the scalar bfloat16 rounding and the int8 dot-product tail shared by lowp.cpp (portable)
// and lowp_avx2.cpp (the tails there), so both builds give the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#include "qkv/kernels/lowp.h"

namespace qkv::kernels::detail {
namespace {

// Round to nearest even on the top 16 bits; NaN made quiet with its sign kept (never rounded into inf).
inline uint32_t bf16_round_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u | 0x00400000u) & 0xffff0000u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u & 0xffff0000u;
}

inline float bf16_round_one(float x) {
  const uint32_t u = bf16_round_bits(x);
  float y;
  std::memcpy(&y, &u, sizeof y);
  return y;
}

// One c entry from the exact int32 sum (the same expression on every path).
inline float int8_dequant(int32_t acc, float sa, float sb, const float* bias, int64_t j) {
  const float v = static_cast<float>(acc) * (sa * sb);
  return bias ? v + bias[j] : v;
}

inline int32_t int8_dot(const int16_t* a, const int16_t* b, int64_t ld) {
  int32_t s = 0;
  for (int64_t k = 0; k < ld; ++k) s += int32_t{a[k]} * int32_t{b[k]};
  return s;
}

}  // namespace
}  // namespace qkv::kernels::detail
