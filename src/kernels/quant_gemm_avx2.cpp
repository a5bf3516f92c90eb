// The quantized product's AVX2 build: tiles of 8 weight rows unpacked once to u8 operands (int8 for Q8_0) and
// float32 scales (the K-quants: half of a repacked 16-row tile); per activation row and block the exact int32 sums
// (up to 4 rows: each row's products reduced; more rows: quant_gemm_simd.h's column-interleaved tile, sums in
// lanes), and quant_gemm_impl.h's float epilogue in 8 lanes.
// vpmaddubsw never saturates here: nibble types 2 · 31 · 127 < 32767 (the offset taken back as offset · Σx), Q8_0
// on |w| and sign(x, w): 2 · 128 · 127 < 32767.
#include "micro.h"
#include "quant_gemm_simd.h"

namespace qkv::kernels::quant_detail::avx2 {
namespace {

// The avx2 build's lane traits for quant_gemm_simd.h's kernels: 8 rows per vector (rows_packed: half of a repacked
// 16-row tile). vpmaddubsw never saturates there: 2 · 63 · 127 < 32767.
struct V256 : detail::Lanes256 {  // micro.h's float lanes (zero, set1, add, sub, mul, to_float) and these
  static constexpr int kLanes = 8;
  static constexpr bool kReadsPacked = false;  // kinds 0..4 in place (Q8_0 tiles hold w + 128)
  static I izero() { return _mm256_setzero_si256(); }
  using Lanes256::load;
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
  // Fused rows (quant_gemm_simd.h rows_fused): row r's block operand in z[r], each row's products reduced.
  template <int kKind>
  static void operands(const uint8_t* blk, int64_t row_bytes, I z[8]) {
    for (int r = 0; r < 8; ++r) z[r] = block_operand<kKind>(blk + r * row_bytes);
  }
  template <int kKind>
  static I block_sums(const I z[8], const int8_t* xq) {
    const I xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
    I p[8];
    for (int r = 0; r < 8; ++r) {
      const I pairs = kKind == 4 ? _mm256_maddubs_epi16(_mm256_abs_epi8(z[r]), _mm256_sign_epi8(xv, z[r]))
                                 : _mm256_maddubs_epi16(z[r], xv);
      p[r] = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    }
    const I h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const I h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                            _mm256_permute2x128_si256(h0123, h4567, 0x31));
  }
  static I offsets(int64_t stride) {  // r · stride in lane r
    return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(static_cast<int>(stride)));
  }
  static I gather(const uint8_t* base, I offsets) {
    return _mm256_i32gather_epi32(reinterpret_cast<const int*>(base), offsets, 1);
  }
  static void store_i(uint8_t* p, I v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
  static F half_lo(I v) { return fp16_lanes_to_float(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF))); }
  static F half_hi(I v) { return fp16_lanes_to_float(_mm256_srli_epi32(v, 16)); }
  static I add_i(I a, I b) { return _mm256_add_epi32(a, b); }
  static I sub_i(I a, int32_t b) { return _mm256_sub_epi32(a, _mm256_set1_epi32(b)); }
  static F scales_u8(const uint8_t* p) {
    return to_float(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static F scales_s8(const uint8_t* p) {
    return to_float(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static F fp16(const uint8_t* p) {
    return fp16_lanes_to_float(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void prefetch(const uint8_t*, int64_t, int64_t, int64_t) {}
};

}  // namespace

void tile(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) { tile_for<V256>(t, j0, scratch); }

}  // namespace qkv::kernels::quant_detail::avx2
