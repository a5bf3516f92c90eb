// IEEE half (fp16) and bfloat16 bits to float32, exactly: one scalar conversion for every file reader and
// reference dequantizer (the dispatched bulk bfloat16 conversion is kernels/lowp.h's bf16_to_float).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace qkv {

// Exact: subnormals scaled, ±inf kept, NaN kept with its payload (as NumPy's float16 -> float32).
inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    bits = std::bit_cast<uint32_t>(std::ldexp(static_cast<float>(mant), -24)) | sign;  // zero or subnormal
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf or NaN
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

// bfloat16 is float32's top 16 bits.
inline float bf16_bits_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

}  // namespace qkv
