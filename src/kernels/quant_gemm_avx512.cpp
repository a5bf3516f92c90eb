// The quantized product's AVX512-VNNI build: tiles of 16 weight rows unpacked once into vpdpbusd's operand order
// (u8 = w + 128), then per activation row and block the exact int32 sums Σ (w + 128) · x - 128 · Σx reduced per
// row, and quant_gemm_impl.h's float epilogue in 16 lanes.
#include "quant_gemm_simd.h"

namespace qkv::kernels::quant_detail::avx512 {
namespace {

// The unpacked tile holds per block 8 vectors of 64 bytes; vector v pairs rows ra = v (v < 4) or v + 4 (v >= 4) and
// rb = ra + 4 as [ra 0..15 | rb 0..15 | ra 16..31 | rb 16..31] against the activations' [x 0..15 | x 0..15 |
// x 16..31 | x 16..31], so that after the reduction below the 16 sums come out in row order.
inline int row_a(int v) { return v < 4 ? v : v + 4; }

inline __m512 fp16x16_to_float(const uint8_t* row0, int64_t row_bytes, int64_t offset) {
  const __m256 lo = scales8(row0, row_bytes, offset);
  const __m256 hi = scales8(row0 + 8 * row_bytes, row_bytes, offset);
  return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

template <int kKind>
void tile_kind(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) {
  const QuantMatrix& w = *t.w;
  const QuantActivations& a = *t.a;
  const int64_t nb = w.cols / kQK, bs = gguf::type_size(w.type);
  const BlockLayout layout = block_layout(w.type);
  const size_t vbytes = static_cast<size_t>(nb) * 8 * 64, fbytes = static_cast<size_t>(nb) * 16 * sizeof(float);
  if (scratch.size() < vbytes + 2 * fbytes + 64) scratch.resize(vbytes + 2 * fbytes + 64);
  uint8_t* base = scratch.data() + (-reinterpret_cast<uintptr_t>(scratch.data()) & 63);
  uint8_t* vals = base;
  float* dw = reinterpret_cast<float*>(base + vbytes);
  float* mw = dw + nb * 16;
  const uint8_t* row0 = w.data + j0 * w.row_bytes;
  const __m512i bias128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b) {
    for (int v = 0; v < 8; ++v) {
      const int ra = row_a(v);
      const __m256i va = block_values<kKind>(row0 + ra * w.row_bytes + b * bs);
      const __m256i vb = block_values<kKind>(row0 + (ra + 4) * w.row_bytes + b * bs);
      __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(va), vb, 1);  // [a lo | a hi | b lo | b hi]
      z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));            // [a lo | b lo | a hi | b hi]
      _mm512_store_si512(vals + (b * 8 + v) * 64, _mm512_xor_si512(z, bias128));
    }
    _mm512_store_ps(dw + b * 16, fp16x16_to_float(row0, w.row_bytes, b * bs));
    if (layout.has_min) _mm512_store_ps(mw + b * 16, fp16x16_to_float(row0, w.row_bytes, b * bs + 2));
  }

  for (int64_t i = 0; i < a.rows; ++i) {
    const int8_t* xq = a.q.data() + i * a.cols;
    const float* dx = a.d.data() + i * a.blocks;
    const float* sx = a.s.data() + i * a.blocks;
    const int32_t* xs = a.sum.data() + i * a.blocks;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kQK));
      __m512i xz = _mm512_inserti64x4(_mm512_castsi256_si512(xv), xv, 1);  // [x lo | x hi | x lo | x hi]
      xz = _mm512_shuffle_i64x2(xz, xz, _MM_SHUFFLE(3, 1, 2, 0));          // [x lo | x lo | x hi | x hi]
      __m512i p[8];
      for (int v = 0; v < 8; ++v) {
        p[v] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_load_si512(vals + (b * 8 + v) * 64), xz);
      }
      // Per 128-bit lane, the 4 lanes of p[0..3] (and p[4..7]) summed: [p0 p1 p2 p3] in each lane.
      const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
      const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
      const __m512i t45 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[4], p[5]), _mm512_unpackhi_epi32(p[4], p[5]));
      const __m512i t67 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[6], p[7]), _mm512_unpackhi_epi32(p[6], p[7]));
      const __m512i u0 = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
      const __m512i u1 = _mm512_add_epi32(_mm512_unpacklo_epi64(t45, t67), _mm512_unpackhi_epi64(t45, t67));
      // Lanes 0 + 2 (elements 0..15 and 16..31 of the "a" rows), 1 + 3 (the "b" rows): rows 0..15 in order.
      __m512i sumi = _mm512_add_epi32(_mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(1, 0, 1, 0)),
                                      _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(3, 2, 3, 2)));
      sumi = _mm512_sub_epi32(sumi, _mm512_set1_epi32(128 * xs[b]));
      __m512 term = _mm512_mul_ps(_mm512_cvtepi32_ps(sumi), _mm512_mul_ps(_mm512_load_ps(dw + b * 16),
                                                                          _mm512_set1_ps(dx[b])));
      if (layout.has_min) term = _mm512_add_ps(term, _mm512_mul_ps(_mm512_load_ps(mw + b * 16), _mm512_set1_ps(sx[b])));
      acc = _mm512_add_ps(acc, term);
    }
    if (t.bias) acc = _mm512_add_ps(acc, _mm512_loadu_ps(t.bias + j0));
    _mm512_storeu_ps(t.y + i * t.ldy + j0, acc);
  }
}

}  // namespace

void tile(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) {
  switch (block_layout(t.w->type).kind) {
    case 0: return tile_kind<0>(t, j0, scratch);
    case 1: return tile_kind<1>(t, j0, scratch);
    case 2: return tile_kind<2>(t, j0, scratch);
    case 3: return tile_kind<3>(t, j0, scratch);
    default: return tile_kind<4>(t, j0, scratch);
  }
}

}  // namespace qkv::kernels::quant_detail::avx512
