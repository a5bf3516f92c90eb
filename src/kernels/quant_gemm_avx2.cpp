// The quantized product's AVX2 build: tiles of 8 weight rows unpacked once to u8 operands (int8 for Q8_0) and
// float32 scales (the K-quants: half of a repacked 16-row tile); per activation row and block the exact int32 sums (up to 4 rows: each row's products reduced;
// more rows: the tile column-interleaved, sums in lanes), and quant_gemm_impl.h's float epilogue in 8 lanes.
// vpmaddubsw never saturates here: nibble types 2 · 31 · 127 < 32767 (the offset taken back as offset · Σx), Q8_0
// on |w| and sign(x, w): 2 · 128 · 127 < 32767.
#include "quant_gemm_simd.h"

namespace qkv::kernels::quant_detail::avx2 {
namespace {

// R activation rows against a column-interleaved tile (8 rows' block sums in the lanes), with the epilogue.
template <int kKind, int R>
void rows_interleaved(const TileArgs& t, int64_t j0, int64_t i0, const uint8_t* vals, const float* dw,
                      const float* mw) {
  const QuantActivations& a = *t.a;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.blocks; ++b) {
    const __m256 d = _mm256_load_ps(dw + b * 8);
    for (int r = 0; r < R; ++r) {
      const int64_t i = i0 + r;
      const int8_t* xq = a.q.data() + i * a.cols + b * kQK;
      __m256i sumi = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        int32_t group;
        std::memcpy(&group, xq + 4 * g, 4);
        const __m256i xb = _mm256_set1_epi32(group);
        const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(vals + (b * 8 + g) * 32));
        const __m256i pairs = kKind == 4 ? _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xb, wv))
                                         : _mm256_maddubs_epi16(wv, xb);
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, ones));
      }
      const size_t o = static_cast<size_t>(i * a.blocks + b);
      if constexpr (kOffset[kKind] != 0) sumi = _mm256_sub_epi32(sumi, _mm256_set1_epi32(kOffset[kKind] * a.sum[o]));
      __m256 term = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(d, _mm256_set1_ps(a.d[o])));
      if constexpr (kKind == 1 || kKind == 3)
        term = _mm256_add_ps(term, _mm256_mul_ps(_mm256_load_ps(mw + b * 8), _mm256_set1_ps(a.s[o])));
      acc[r] = _mm256_add_ps(acc[r], term);
    }
  }
  for (int r = 0; r < R; ++r) {
    __m256 v = acc[r];
    if (t.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(t.bias + j0));
    _mm256_storeu_ps(t.y + (i0 + r) * t.ldy + j0, v);
  }
}

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
  // Up to 4 activation rows read the operands row by row (8 rows x 32 bytes per block) and reduce each row's
  // products; more rows read them column-interleaved (per block, vector g holds elements 4g..4g+3 of the 8 rows in
  // its 32-bit lanes), so the 8 block sums come out of 8 vpmaddubsw / vpmaddwd in lanes with no reduction.
  const bool interleaved = a.rows > 4;
  alignas(32) uint8_t block[8][32];
  const __m256i transpose = _mm256_setr_epi32(0, 32, 64, 96, 128, 160, 192, 224);
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < 8; ++r) {
      const __m256i v = block_operand<kKind>(row0 + r * w.row_bytes + b * bs);
      _mm256_store_si256(reinterpret_cast<__m256i*>(interleaved ? block[r] : vals + (b * 8 + r) * 32), v);
    }
    if (interleaved)
      for (int g = 0; g < 8; ++g)
        _mm256_store_si256(reinterpret_cast<__m256i*>(vals + (b * 8 + g) * 32),
                           _mm256_i32gather_epi32(reinterpret_cast<const int*>(&block[0][4 * g]), transpose, 1));
    // The first 4 bytes of each row's block: d, and m where the type has one.
    const __m256i head = _mm256_i32gather_epi32(reinterpret_cast<const int*>(row0 + b * bs), rows, 1);
    _mm256_store_ps(dw + b * 8, fp16_lanes_to_float(_mm256_and_si256(head, low16)));
    if constexpr (kMin) _mm256_store_ps(mw + b * 8, fp16_lanes_to_float(_mm256_srli_epi32(head, 16)));
  }

  if (interleaved) {
    int64_t i = 0;
    for (; i + 4 <= a.rows; i += 4) rows_interleaved<kKind, 4>(t, j0, i, vals, dw, mw);
    switch (a.rows - i) {
      case 3: rows_interleaved<kKind, 3>(t, j0, i, vals, dw, mw); break;
      case 2: rows_interleaved<kKind, 2>(t, j0, i, vals, dw, mw); break;
      case 1: rows_interleaved<kKind, 1>(t, j0, i, vals, dw, mw); break;
      default: break;
    }
    return;
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

// The avx2 build's lane traits for the K-quants' kernel (quant_gemm_simd.h rows_k): 8 rows per vector, half of a
// repacked 16-row tile. vpmaddubsw never saturates there: 2 · 63 · 127 < 32767.
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

}  // namespace

void tile(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) {
  switch (block_layout(t.w->type).kind) {
    case 0: return tile_kind<0>(t, j0, scratch);
    case 1: return tile_kind<1>(t, j0, scratch);
    case 2: return tile_kind<2>(t, j0, scratch);
    case 3: return tile_kind<3>(t, j0, scratch);
    case 4: return tile_kind<4>(t, j0, scratch);
    case 5: return tile_k<V256, 5>(t, j0, scratch);
    case 6: return tile_k<V256, 6>(t, j0, scratch);
    default: return tile_k<V256, 7>(t, j0, scratch);
  }
}

}  // namespace qkv::kernels::quant_detail::avx2
