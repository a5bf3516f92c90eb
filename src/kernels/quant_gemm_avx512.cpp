// The quantized product's AVX512-VNNI build: tiles of 16 weight rows as vpdpbusd's u8 operands (nibbles with their
// fifth bit as they are; Q8_0 as w + 128); per activation row and block the exact int32 sums Σ u · x - offset · Σx
// (quant_gemm_simd.h rows_packed, sums in lanes, for every m: on the column-interleaved tiles of a matrix with a
// repacked copy, QuantMatrix::repacked, otherwise on the same vectors read from the stored rows in place), and
// quant_gemm_impl.h's float epilogue in 16 lanes. The K-quants always run on repacked tiles (the matrix's copy, or
// one packed into scratch).
#include <limits>

#include "qkv/core/half.h"
#include "micro.h"  // also silences GCC 12's false -Wmaybe-uninitialized in its AVX-512 intrinsics
#include "quant_gemm_simd.h"

namespace qkv::kernels::quant_detail::avx512 {
namespace {

// fp16 bit patterns in the low halves of 16 int32 lanes to float32 by vcvtph2ps (AVX512F): exact, subnormals
// included and regardless of DAZ; a signaling NaN comes out quiet, as the first product with it would make it.
inline __m512 fp16_lanes_to_float512(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }

// Software prefetch into L2 of the tiles 16 KB ahead: a matrix streamed from DRAM (an output head) then reads at
// the rate of a plain streaming read or above it (the hardware prefetcher alone keeps fewer lines in flight).
inline constexpr int64_t kPrefetchAhead = 16384;

// The avx512vnni build's lane traits for quant_gemm_simd.h's kernels: 16 rows per vector.
struct V512 : detail::Lanes512 {  // micro.h's float lanes (zero, set1, add, sub, mul, to_float) and these
  static constexpr int kLanes = 16;
  static constexpr bool kReadsPacked = true;  // kinds 0..4 on repacked tiles too, or their vectors from the rows
  using Lanes512::load;
  static I load(const uint8_t* p) { return _mm512_load_si512(p); }
  static I low_nibbles(I v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
  static I high_nibbles(I v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
  static I with_fifth_bits(I v, const uint8_t* mask) {
    uint64_t m;
    std::memcpy(&m, mask, 8);
    return _mm512_or_si512(v, _mm512_maskz_mov_epi8(m, _mm512_set1_epi8(0x10)));
  }
  // Q6_K: v | the top 2 bits of group h (bits 2h, 2h + 1 of each byte of top) at bits 4, 5. The 16-bit shifts move
  // bits across bytes only below bit 4 or above bit 5.
  static I with_top_bits(I v, I top, int h) {
    const I s = h == 0 ? _mm512_slli_epi16(top, 4) : h == 1 ? _mm512_slli_epi16(top, 2)
                : h == 2 ? top : _mm512_srli_epi16(top, 2);
    return _mm512_ternarylogic_epi32(v, s, _mm512_set1_epi8(0x30), 0xF8);  // v | (s & 0x30)
  }
  static I dot(I acc, I w, int32_t group) { return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(group)); }
  // The stored rows read in place (quant_gemm_simd.h rows_packed, kStored): Q8_0's w + 128, and v | the fifth bits
  // of elements 4g..4g+3 (bits 4g.. of lane r's qh) at bit 4 of bytes 0..3 of lane r.
  static I flip_sign_bits(I v) { return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80))); }
  // The block's tile vectors from the stored rows (rb apart, p at the first row's bytes): vector g lane r = bytes
  // 4g..4g+3 of row r (g < 4 per 16 bytes), 16-byte loads of rows k, k + 4, k + 8, k + 12 transposed 4 x 4 words in
  // each 128-bit lane.
  template <int kVecs>
  static void stored_vectors(const uint8_t* p, int64_t rb, I (&v)[kVecs]) {
    const auto row = [&](int64_t r, int half) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + r * rb + 16 * half));
    };
    for (int half = 0; half < kVecs / 4; ++half) {
      I x[4];
      for (int k = 0; k < 4; ++k) {
        const __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(row(k, half)), row(k + 4, half), 1);
        const __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(row(k + 8, half)), row(k + 12, half), 1);
        x[k] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      }
      const I t0 = _mm512_unpacklo_epi32(x[0], x[1]), t1 = _mm512_unpackhi_epi32(x[0], x[1]);
      const I t2 = _mm512_unpacklo_epi32(x[2], x[3]), t3 = _mm512_unpackhi_epi32(x[2], x[3]);
      v[4 * half] = _mm512_unpacklo_epi64(t0, t2);
      v[4 * half + 1] = _mm512_unpackhi_epi64(t0, t2);
      v[4 * half + 2] = _mm512_unpacklo_epi64(t1, t3);
      v[4 * half + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
  }
  static I with_fifth_bits_of(I v, I qh, int g) {
    const I byte = _mm512_add_epi8(_mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0),
                                   _mm512_set1_epi8(static_cast<char>(g / 2)));  // byte g / 2 of each lane
    const I bit = _mm512_set1_epi32(g % 2 == 0 ? 0x08040201 : static_cast<int>(0x80402010u));  // of bits 4g..
    const __mmask64 m = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, byte), bit);
    return _mm512_or_si512(v, _mm512_maskz_mov_epi8(m, _mm512_set1_epi8(0x10)));
  }
  static I offsets(int64_t stride) {  // r · stride in lane r
    return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                              _mm512_set1_epi32(static_cast<int>(stride)));
  }
  static I gather(const uint8_t* base, I offsets) { return _mm512_i32gather_epi32(offsets, base, 1); }
  static F half_lo(I v) { return fp16_lanes_to_float512(v); }
  static F half_hi(I v) { return fp16_lanes_to_float512(_mm512_srli_epi32(v, 16)); }
  static I sub_i(I a, int32_t b) { return _mm512_sub_epi32(a, _mm512_set1_epi32(b)); }
  static F scales_u8(const uint8_t* p) {
    return to_float(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static F scales_s8(const uint8_t* p) {
    return to_float(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static F fp16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p))); }
  static void prefetch(const uint8_t* tile, int64_t stride, int64_t b, int64_t nb) {  // this block's share
    const int64_t lines = stride / 64;
    for (int64_t line = b * lines / nb; line < (b + 1) * lines / nb; ++line)
      _mm_prefetch(reinterpret_cast<const char*>(tile + kPrefetchAhead + line * 64), _MM_HINT_T1);
  }
};


}  // namespace

void quantize_blocks(const float* x, int64_t nb, int8_t* q, float* d, float* s, int32_t* sum, int32_t* sum_lo) {
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQK;
    const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
    const __m512 a0 = _mm512_abs_ps(x0), a1 = _mm512_abs_ps(x1);
    // |x| < inf is false for inf and NaN: a block with any of them is marked as quantize_block marks it.
    if ((_mm512_cmp_ps_mask(a0, inf, _CMP_LT_OQ) & _mm512_cmp_ps_mask(a1, inf, _CMP_LT_OQ)) != 0xFFFF) {
      std::memset(q + b * kQK, 0, kQK);
      d[b] = s[b] = std::numeric_limits<float>::quiet_NaN();
      sum[b] = sum_lo[b] = 0;
      continue;
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
    const float dv = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(dv != 0.0f ? 1.0f / dv : 0.0f);
    // roundf (halves away from zero), exactly: the truncation plus one unit in the sign's direction where the
    // dropped fraction (exact: |v| < 2^23) is at least one half.
    const auto round_away = [](__m512 v) {
      const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
      const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
      const __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));
      return _mm512_cvtps_epi32(_mm512_mask_add_ps(t, up, t, one));
    };
    const __m512i q0 = round_away(_mm512_mul_ps(x0, id)), q1 = round_away(_mm512_mul_ps(x1, id));
    const __m128i n0 = _mm512_cvtepi32_epi8(q0), n1 = _mm512_cvtepi32_epi8(q1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQK), n0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQK + 16), n1);
    // The sums of the stored int8 values, as quantize_block sums q[j] (a value past int8, from a block whose 1 / d
    // overflows, is stored truncated as the plain loop's cast stores it, and summed so: no int32 overflow).
    const __m512i w0 = _mm512_cvtepi8_epi32(n0), w1 = _mm512_cvtepi8_epi32(n1);
    const int32_t total = _mm512_reduce_add_epi32(_mm512_add_epi32(w0, w1));
    sum_lo[b] = _mm512_reduce_add_epi32(w0);
    d[b] = fp16_to_float(fp16_from_float(dv));
    s[b] = fp16_to_float(fp16_from_float(static_cast<float>(total) * dv));
    sum[b] = total;
  }
}

void tile(const TileArgs& t, int64_t j0, std::vector<uint8_t>& scratch) { tile_for<V512>(t, j0, scratch); }

}  // namespace qkv::kernels::quant_detail::avx512
