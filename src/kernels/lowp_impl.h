// Private (not installed): the scalar bfloat16 rounding and the int8 dot-product tail shared by lowp.cpp (portable)
// and lowp_avx2.cpp (the tails there), so both builds give the same bits.
#pragma once

#include <cstdint>
#include <cmath>
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

inline int32_t int8_dot(const int16_t* a, const int16_t* b, int64_t n) {
  int32_t s = 0;
  for (int64_t k = 0; k < n; ++k) s += int32_t{a[k]} * int32_t{b[k]};
  return s;
}

// Block g's exact int32 sum scaled into the running float sum (the same expression on every path).
inline float int8_accumulate(float acc, int32_t block_sum, float a_scale) {
  return std::fma(static_cast<float>(block_sum), a_scale, acc);
}

// One c entry from the float sum over the blocks (the same expression on every path).
inline float int8_finish(float acc, float b_scale, const float* bias, int64_t j) {
  const float v = acc * b_scale;
  return bias ? v + bias[j] : v;
}

// c[i][j] of gemm_int8_nt from scalar loops: rows a_row (its block scales a_scale) and b_row.
inline float int8_entry(const int16_t* a_row, const float* a_scale, int64_t group, int64_t blocks,
                        const int16_t* b_row, float b_scale, const float* bias, int64_t j) {
  float acc = 0.0f;
  for (int64_t g = 0; g < blocks; ++g)
    acc = int8_accumulate(acc, int8_dot(a_row + g * group, b_row + g * group, group), a_scale[g]);
  return int8_finish(acc, b_scale, bias, j);
}

}  // namespace
}  // namespace qkv::kernels::detail
