// Shared by the quantized product's builds (quant_gemm*.cpp): the block layouts of the integer types, the tile
// contract of the SIMD builds, and the portable per-output reference that the tiles' leftover columns run.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "qkv/kernels/quant_gemm.h"
#include "quant_k.h"

namespace qkv::kernels::quant_detail {

inline constexpr int64_t kQK = 32;  // elements per block of every integer type and of the activations

// Where a block of an integer type keeps its parts (bytes from the block's start): fp16 d at 0, fp16 m at 2 when
// has_min, the u32 of fifth bits at qh (-1: none), the 16 nibble bytes (or Q8_0's 32 int8) at qs.
// The integer value w of element j (the weight is d * w, or d * w + m): Q4_0 nibble - 8, Q4_1 nibble, Q5_0
// (nibble | bit j of qh << 4) - 16, Q5_1 that + 16, Q8_0 qs[j]; nibble = qs[j] & 15 (j < 16) or qs[j - 16] >> 4.
// The K-quants (kinds 5, 6, 7: Q4_K, Q5_K, Q6_K) are read through quant_k.h's super-block decoder instead; their
// 32-element sub-blocks (Q6_K: pairs of 16-element ones) line up with the activations' blocks.
struct BlockLayout {
  int kind = 0;  // 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0, 5 Q4_K, 6 Q5_K, 7 Q6_K
  int qs = 0, qh = -1;
  bool has_min = false;
};
inline BlockLayout block_layout(gguf::Type type) {
  switch (type) {
    case gguf::Type::Q4_0: return {0, 2, -1, false};
    case gguf::Type::Q4_1: return {1, 4, -1, true};
    case gguf::Type::Q5_0: return {2, 6, 2, false};
    case gguf::Type::Q5_1: return {3, 8, 4, true};
    case gguf::Type::Q4_K: return {5, 0, -1, true};
    case gguf::Type::Q5_K: return {6, 0, -1, true};
    case gguf::Type::Q6_K: return {7, 0, -1, false};
    default: return {4, 2, -1, false};  // Q8_0
  }
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The integer value of element j of a block (the definition the SIMD builds reproduce).
inline int block_value(const BlockLayout& l, const uint8_t* blk, int j) {
  if (l.kind == 4) return static_cast<int8_t>(blk[l.qs + j]);
  const uint8_t byte = blk[l.qs + (j & 15)];
  int v = j < 16 ? (byte & 0x0F) : (byte >> 4);
  if (l.qh >= 0) {
    uint32_t qh;
    std::memcpy(&qh, blk + l.qh, 4);
    v |= static_cast<int>((qh >> j) & 1u) << 4;
  }
  if (l.kind == 0) v -= 8;
  if (l.kind == 2) v -= 16;
  return v;
}

// One block's term of the float epilogue, as every build computes it: sumi · (dw · dx), plus mw · sx with a min.
inline float block_term(int32_t sumi, float dw, float dx, bool has_min, float mw, float sx) {
  float t = static_cast<float>(sumi) * (dw * dx);
  if (has_min) t = t + mw * sx;
  return t;
}

// The K-quants' terms of one 32-element block of activations (dx its scale, sumx = Σq, sumx_lo = Σq of its first 16),
// as every build computes them, with w the element values (quant_k.h: q, or q - 32 for Q6_K):
//   Q4_K, Q5_K: sumi = Σ w·q;  t = sumi · ((d · sc) · dx) - (dmin · mn) · (dx · sumx)
//   Q6_K:       lo, hi = Σ w·q over elements 0..15, 16..31;  t = lo · ((d · sc_lo) · dx) + hi · ((d · sc_hi) · dx)
// then acc = acc + t, blocks in order. d · sc and dmin · mn are exact in float32 (an fp16 times a 6- or 8-bit
// integer), so they are ggml's dequantized scales.
inline float k_term(int32_t sumi, float dsc, float mm, float dx, int32_t sumx) {
  const float t = static_cast<float>(sumi) * (dsc * dx);
  return t - mm * (dx * static_cast<float>(sumx));
}
inline float k6_term(int32_t lo, int32_t hi, float dsc_lo, float dsc_hi, float dx) {
  return static_cast<float>(lo) * (dsc_lo * dx) + static_cast<float>(hi) * (dsc_hi * dx);
}

// What a tile computes: y[i, j0 + c] for every row i of a and the tile's kTile columns c.
struct TileArgs {
  const QuantActivations* a = nullptr;
  const QuantMatrix* w = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
};
using TileFn = void (*)(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch);

// One block of 32 activations quantized as ggml's Q8_0 / Q8_1 (quant_gemm.h quantize_activations): q, and d, s, sum
// (NaN d and s for a block with a non-finite value). The plain loop; avx512::quantize_blocks gives its bits.
void quantize_block(const float* x, int8_t* q, float& d, float& s, int32_t& sum, int32_t& sum_lo);

// The portable reference of output column j for every row (plain loops; also the SIMD builds' leftover columns).
void reference_column(const TileArgs& t, int64_t j);

namespace avx2 {
inline constexpr int64_t kTile = 8;
void tile(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch);
}  // namespace avx2
inline constexpr int64_t kPackRows = 16;  // QuantMatrix::repacked()'s tile: the avx512vnni build's kTile

// Where a repacked K-quant tile keeps its parts (bytes from the tile's start; nb blocks of 32, nb / 8 super-blocks):
// the nibble vectors at 0 (nb * 256), the high bits at hi (Q5_K: nb * 64, Q6_K: nb * 128), the sub-block scales at
// sc (nb * 32), the fp16 super-block scales at d (nb / 8 * 64 with dmin, Q6_K nb / 8 * 32), `bytes` in all.
struct KTileLayout {
  int64_t hi = 0, sc = 0, d = 0, bytes = 0;
};
inline KTileLayout k_tile_layout(int kind, int64_t nb) {
  KTileLayout l;
  l.hi = nb * 256;
  l.sc = l.hi + (kind == 6 ? nb * 64 : kind == 7 ? nb * 128 : 0);
  l.d = l.sc + nb * 32;
  l.bytes = l.d + nb / 8 * (kind == 7 ? 32 : 64);
  return l;
}
// One tile of `rows` <= kPackRows rows (at src, row_bytes apart; cols elements) in QuantMatrix::repacked()'s
// layout at dst (64-byte aligned, packed_tile_bytes(type, cols) bytes, written whole; missing rows are zeros).
int64_t packed_tile_bytes(gguf::Type type, int64_t cols);
void pack_tile(gguf::Type type, const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols, uint8_t* dst);
namespace avx512 {
inline constexpr int64_t kTile = kPackRows;
void tile(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch);
// nb consecutive blocks of one row (x[32 b ..] -> q[32 b ..], d[b], s[b], sum[b]) as quantize_block.
void quantize_blocks(const float* x, int64_t nb, int8_t* q, float* d, float* s, int32_t* sum, int32_t* sum_lo);
}  // namespace avx512

}  // namespace qkv::kernels::quant_detail
