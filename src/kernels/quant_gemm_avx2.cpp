// The quantized product's AVX2 build: tiles of 8 weight rows unpacked once to u8 operands (int8 for Q8_0) and
// float32 scales, then per activation row and block the exact int32 sums reduced per row, and quant_gemm_impl.h's
// float epilogue in 8 lanes. vpmaddubsw never saturates here: nibble types 2 · 31 · 127 < 32767 (the offset taken
// back as offset · Σx), Q8_0 on |w| and sign(x, w): 2 · 128 · 127 < 32767.
#include "quant_gemm_simd.h"

namespace qkv::kernels::quant_detail::avx2 {
namespace {

template <int kKind>
void tile_kind(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) {
  const QuantMatrix& w = *t.w;
  const QuantActivations& a = *t.a;
  const int64_t nb = w.cols / kQK, bs = gguf::type_size(w.type);
  constexpr bool kMin = kKind == 1 || kKind == 3;
  // Unpacked tile: per block, 8 rows x 32 operand bytes, then the rows' d and m as float32.
  const size_t vbytes = static_cast<size_t>(nb) * 8 * 32, fbytes = static_cast<size_t>(nb) * 8 * sizeof(float);
  if (scratch.size() < vbytes + 2 * fbytes + 64) scratch.resize(vbytes + 2 * fbytes + 64);
  uint8_t* base = scratch.data() + (-reinterpret_cast<uintptr_t>(scratch.data()) & 31);
  uint8_t* vals = base;
  float* dw = reinterpret_cast<float*>(base + vbytes);
  float* mw = dw + nb * 8;
  const uint8_t* row0 = w.data + j0 * w.row_bytes;
  const __m256i rows = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                          _mm256_set1_epi32(static_cast<int>(w.row_bytes)));
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < 8; ++r) {
      const __m256i v = block_operand<kKind>(row0 + r * w.row_bytes + b * bs);
      _mm256_store_si256(reinterpret_cast<__m256i*>(vals + (b * 8 + r) * 32), v);
    }
    // The first 4 bytes of each row's block: d, and m where the type has one.
    const __m256i head = _mm256_i32gather_epi32(reinterpret_cast<const int*>(row0 + b * bs), rows, 1);
    _mm256_store_ps(dw + b * 8, fp16_lanes_to_float(_mm256_and_si256(head, low16)));
    if constexpr (kMin) _mm256_store_ps(mw + b * 8, fp16_lanes_to_float(_mm256_srli_epi32(head, 16)));
  }

  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < a.rows; ++i) {
    const int8_t* xq = a.q.data() + i * a.cols;
    const float* dx = a.d.data() + i * a.blocks;
    const float* sx = a.s.data() + i * a.blocks;
    const int32_t* xs = a.sum.data() + i * a.blocks;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kQK));
      __m256i p[8];
      for (int r = 0; r < 8; ++r) {
        const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(vals + (b * 8 + r) * 32));
        const __m256i pairs = kKind == 4 ? _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv))
                                         : _mm256_maddubs_epi16(wv, xv);
        p[r] = _mm256_madd_epi16(pairs, ones);
      }
      const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
      const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
      __m256i sumi = _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                                      _mm256_permute2x128_si256(h0123, h4567, 0x31));
      if constexpr (kOffset[kKind] != 0) sumi = _mm256_sub_epi32(sumi, _mm256_set1_epi32(kOffset[kKind] * xs[b]));
      __m256 term = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(_mm256_load_ps(dw + b * 8),
                                                                          _mm256_set1_ps(dx[b])));
      if constexpr (kMin) term = _mm256_add_ps(term, _mm256_mul_ps(_mm256_load_ps(mw + b * 8), _mm256_set1_ps(sx[b])));
      acc = _mm256_add_ps(acc, term);
    }
    if (t.bias) acc = _mm256_add_ps(acc, _mm256_loadu_ps(t.bias + j0));
    _mm256_storeu_ps(t.y + i * t.ldy + j0, acc);
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

}  // namespace qkv::kernels::quant_detail::avx2
