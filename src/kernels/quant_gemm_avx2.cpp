// The quantized product's AVX2 build: tiles of 8 weight rows unpacked once to u8 operands (int8 for Q8_0) and
// float32 scales (the K-quants: half of a repacked 16-row tile); per activation row and block the exact int32 sums
// (up to 4 rows: each row's products reduced; more rows: quant_gemm_simd.h's column-interleaved tile, sums in
// lanes), and quant_gemm_impl.h's float epilogue in 8 lanes.
// vpmaddubsw never saturates here: nibble types 2 · 31 · 127 < 32767 (the offset taken back as offset · Σx), Q8_0
// on |w| and sign(x, w): 2 · 128 · 127 < 32767.
#include "quant_gemm_simd.h"

namespace qkv::kernels::quant_detail::avx2 {
namespace {

// The avx2 build's lane traits for quant_gemm_simd.h's kernels: 8 rows per vector (rows_packed: half of a repacked
// 16-row tile). vpmaddubsw never saturates there: 2 · 63 · 127 < 32767.
struct V256 {
  using I = __m256i;
  using F = __m256;
  static constexpr int kLanes = 8;
  static I zero() { return _mm256_setzero_si256(); }
  static F fzero() { return _mm256_setzero_ps(); }
  static I load(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
  static I low_nibbles(I v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
  static I high_nibbles(I v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
  static I with_fifth_bits(I v, const uint8_t* mask) { return _mm256_or_si256(v, fifth_bits(mask)); }
  static I with_top_bits(I v, I top, int h) {  // as the avx512vnni build's
    const I s = h == 0 ? _mm256_slli_epi16(top, 4) : h == 1 ? _mm256_slli_epi16(top, 2)
                : h == 2 ? top : _mm256_srli_epi16(top, 2);
    return _mm256_or_si256(v, _mm256_and_si256(s, _mm256_set1_epi8(0x30)));
  }
  static I dot(I acc, I w, int32_t group) {
    const I pairs = _mm256_maddubs_epi16(w, _mm256_set1_epi32(group));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  // The operands as block_operand gives them (Q8_0 signed: multiplied as |w| and sign(x, w), offset 0).
  static constexpr auto& kOffset = quant_detail::kOffset;
  template <int kKind>
  static void operand(const uint8_t* blk, uint8_t* out) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), block_operand<kKind>(blk));
  }
  template <int kKind>
  static I dot_kind(I acc, I w, int32_t group) {
    if constexpr (kKind != 4) return dot(acc, w, group);
    const I pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(_mm256_set1_epi32(group), w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  static I offsets(int64_t stride) {  // r · stride in lane r
    return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(static_cast<int>(stride)));
  }
  static I gather(const uint8_t* base, I offsets) {
    return _mm256_i32gather_epi32(reinterpret_cast<const int*>(base), offsets, 1);
  }
  static void store_i(uint8_t* p, I v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
  static F load_f(const float* p) { return _mm256_load_ps(p); }
  static void store_f(float* p, F v) { _mm256_store_ps(p, v); }
  static F half_lo(I v) { return fp16_lanes_to_float(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF))); }
  static F half_hi(I v) { return fp16_lanes_to_float(_mm256_srli_epi32(v, 16)); }
  static I add_i(I a, I b) { return _mm256_add_epi32(a, b); }
  static I sub_i(I a, int32_t b) { return _mm256_sub_epi32(a, _mm256_set1_epi32(b)); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F scales_u8(const uint8_t* p) {
    return cvt(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static F scales_s8(const uint8_t* p) {
    return cvt(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static F fp16(const uint8_t* p) {
    return fp16_lanes_to_float(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void prefetch(const uint8_t*, int64_t, int64_t, int64_t) {}
  static void store(float* y, F v, const float* bias) {
    _mm256_storeu_ps(y, bias ? _mm256_add_ps(v, _mm256_loadu_ps(bias)) : v);
  }
};

// Up to 4 activation rows: the 8 rows' operands unpacked row by row, each row's products reduced; more rows:
// quant_gemm_simd.h's column-interleaved tile.
template <int kKind>
void tile_kind(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) {
  const QuantMatrix& w = *t.w;
  const QuantActivations& a = *t.a;
  if (a.rows > 4) return tile_interleaved<V256, kKind>(t, j0, scratch);
  const int64_t nb = w.cols / kQK, bs = gguf::type_size(w.type);
  constexpr bool kMin = kKind == 1 || kKind == 3;
  // Unpacked tile: per block, 8 rows x 32 operand bytes, then the rows' d and m as float32.
  const size_t vbytes = static_cast<size_t>(nb) * 8 * 32, fbytes = static_cast<size_t>(nb) * 8 * sizeof(float);
  if (scratch.size() < vbytes + 2 * fbytes + 64) scratch.resize(vbytes + 2 * fbytes + 64);
  uint8_t* vals = scratch.data() + (-reinterpret_cast<uintptr_t>(scratch.data()) & 31);
  float* dw = reinterpret_cast<float*>(vals + vbytes);
  float* mw = dw + nb * 8;
  const uint8_t* row0 = w.data + j0 * w.row_bytes;
  const __m256i rows = V256::offsets(w.row_bytes);
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < 8; ++r) V256::operand<kKind>(row0 + r * w.row_bytes + b * bs, vals + (b * 8 + r) * 32);
    const __m256i head = V256::gather(row0 + b * bs, rows);  // each row's first 4 bytes: d, and m above it
    _mm256_store_ps(dw + b * 8, V256::half_lo(head));
    if constexpr (kMin) _mm256_store_ps(mw + b * 8, V256::half_hi(head));
  }
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
        p[r] = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
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
    V256::store(t.y + i * t.ldy + j0, acc, t.bias ? t.bias + j0 : nullptr);
  }
}

}  // namespace

void tile(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) {
  switch (block_layout(t.w->type).kind) {
    case 0: return tile_kind<0>(t, j0, scratch);
    case 1: return tile_kind<1>(t, j0, scratch);
    case 2: return tile_kind<2>(t, j0, scratch);
    case 3: return tile_kind<3>(t, j0, scratch);
    case 4: return tile_kind<4>(t, j0, scratch);
    case 5: return tile_packed<V256, 5>(t, j0, scratch);
    case 6: return tile_packed<V256, 6>(t, j0, scratch);
    default: return tile_packed<V256, 7>(t, j0, scratch);
  }
}

}  // namespace qkv::kernels::quant_detail::avx2
