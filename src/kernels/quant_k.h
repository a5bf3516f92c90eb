// ggml's K-quant super-blocks (Q4_K, Q5_K, Q6_K: 256 elements) read into their parts once: the unsigned element
// values, the sub-block scales (and mins) and the fp16 super-block scales. The dequantizers (quant_reference.cpp),
// the integer product's reference and the repacking (quant_gemm.cpp) all read the bytes through this one decoder.
#pragma once

#include <cstdint>
#include <cstring>

namespace qkv::kernels::quant_detail {

inline constexpr int kQKK = 256;  // elements per K-quant super-block

// The parts of one super-block. q[k] is element k's unsigned value: Q4_K its nibble (0..15), Q5_K the nibble with
// its fifth bit (0..31), Q6_K its 6 bits (0..63). The element is (d · sc) · q - (dmin · mn) with sc, mn those of its
// 32-element sub-block k / 32 (Q4_K, Q5_K: 6-bit, sc[0..8), mn[0..8)), or (d · sc) · (q - 32) with sc that of its
// 16-element sub-block k / 16 (Q6_K: int8, sc[0..16)). d and dmin are fp16 bits (dmin 0 for Q6_K).
struct KSuperBlock {
  uint8_t q[kQKK];
  int sc[16];
  int mn[8];
  uint16_t d = 0, dmin = 0;
};

enum class KType { kQ4, kQ5, kQ6 };

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j from the 12 packed scale bytes.
inline void scale_min_k4(int j, const uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Block layouts (bytes from the super-block's start):
//   Q4_K {d, dmin, scales[12], qs[128]}: each 64 elements read 32 bytes of qs, low nibbles the first 32 elements
//     (sub-block 2i), high nibbles the next 32 (2i + 1).
//   Q5_K {d, dmin, scales[12], qh[32], qs[128]}: as Q4_K, the fifth bit of element k is bit k / 32 of qh[k % 32].
//   Q6_K {ql[128], qh[64], scales[16] int8, d}: per 128 elements (half h) ql[64 h ..] and qh[32 h ..]; element
//     32 g + l of the half (g = 0..3) has its low 4 bits in ql[64 h + l + 32 (g % 2)] (low nibble for g < 2, high
//     for g >= 2) and its high 2 bits at shift 2 g of qh[32 h + l].
inline void k_super_block(KType type, const uint8_t* b, KSuperBlock& s) {
  if (type == KType::kQ6) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    for (int k = 0; k < kQKK; ++k) {
      const int h = k / 128, g = (k % 128) / 32, l = k % 32;
      const uint8_t lbyte = ql[64 * h + l + 32 * (g % 2)];
      const int lo = g < 2 ? (lbyte & 0x0F) : (lbyte >> 4);
      const int hi = (qh[32 * h + l] >> (2 * g)) & 3;
      s.q[k] = static_cast<uint8_t>(lo | (hi << 4));
    }
    for (int i = 0; i < 16; ++i) s.sc[i] = static_cast<int8_t>(b[192 + i]);
    std::memcpy(&s.d, b + 208, 2);
    s.dmin = 0;
    return;
  }
  std::memcpy(&s.d, b, 2);
  std::memcpy(&s.dmin, b + 2, 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = type == KType::kQ5 ? b + 48 : b + 16;
  for (int j = 0; j < 8; ++j) scale_min_k4(j, scales, s.sc[j], s.mn[j]);
  for (int k = 0; k < kQKK; ++k) {
    const uint8_t byte = qs[32 * (k / 64) + k % 32];
    int v = (k / 32) % 2 == 0 ? (byte & 0x0F) : (byte >> 4);
    if (type == KType::kQ5) v |= ((qh[k % 32] >> (k / 32)) & 1) << 4;
    s.q[k] = static_cast<uint8_t>(v);
  }
}

}  // namespace qkv::kernels::quant_detail
