// Private (not installed): the register-blocked microkernel of the packed products, written once over lane traits
// (highway's way): micro<Lanes, Rows, Cols, Dot, Out> with the dot product a policy (fp32 FMA, bf16 pairs, u8·s8
// quads, native or widened to int16 pairs) and the epilogue another. Each ISA's translation unit (sgemm_avx512.cpp,
// lowp_avx512.cpp; the int8 product there, in lowp_avxvnni.cpp and in lowp_avx2.cpp through micro_int8.h)
// instantiates it with its own lanes; everything here has internal linkage, so each unit compiles its own copy with
// its own flags and nothing built for one ISA can stand in for another's (the one-definition rule holds by
// construction). The AMX products keep their tile walk (lowp_amx_impl.h); lowp.cpp's table per ISA picks every
// build. Include only from files compiled with ISA flags.
//
// The packed layout (qkv/kernels/lowp.h, qkv/kernels/sgemm.h): A as [step][a_step] words (row r of a step at
// a[r]), B as panels of 32 columns, [step][32] words, panels b_panel words apart. One k-step is one word: a float
// (fp32), two bf16 (k, k+1) or four int8 (k..k+3). micro computes Rows rows of c by Cols vectors of L::kW lanes:
// vector v is lanes [v·kW, v·kW + kW) of the run of panels, each output the same chain of Dot::step over the steps.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "qkv/kernels/lowp.h"

// GCC 12 flags the _mm512_undefined_*() inside its own intrinsics (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace qkv::kernels::detail {
namespace {

// Lane traits: F (kW floats), I (kW 32-bit integers), Tail (lanes [0, n) of a vector), M (a lane mask), and kRegs
// registers; also attention_flash_simd.h's V (its comment lists the operations); int8_quads(q, out): 4 kW int8
// values held in int16 as kW words of 4 bytes q + 128 (micro_int8.h). dot_pairs (vdpbf16ps) and dot_quads
// (vpdpbusd) exist only in units compiled with their flags.
#if defined(__AVX512F__)
struct Lanes512 {
  using F = __m512;
  using I = __m512i;
  using Tail = __mmask16;
  using M = __mmask16;
  static constexpr int64_t kW = 16;
  static constexpr int kRegs = 32;
  static Tail tail(int64_t n) {
    return n <= 0 ? static_cast<Tail>(0) : n >= 16 ? static_cast<Tail>(0xFFFF) : static_cast<Tail>((1u << n) - 1u);
  }
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static I set1(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static I load(const uint32_t* p) { return _mm512_loadu_si512(p); }
  static I load(const int32_t* p) { return _mm512_loadu_si512(p); }
  static F load_n(const float* p, Tail t) { return _mm512_maskz_loadu_ps(t, p); }
  static I load_n(const uint32_t* p, Tail t) { return _mm512_maskz_loadu_epi32(t, p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store_n(float* p, Tail t, F v) { _mm512_mask_storeu_ps(p, t, v); }
  static void store_i(uint32_t* p, I v) { _mm512_storeu_si512(p, v); }
  static I izero() { return _mm512_setzero_si512(); }
  static I add_i(I a, I b) { return _mm512_add_epi32(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static M eq(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static M ge(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static M unord(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q); }
  static M or_(M a, M b) { return static_cast<M>(a | b); }
  static F select(M m, F a, F b) { return _mm512_mask_blend_ps(m, b, a); }
  static F zero_unless(M m, F a) { return _mm512_maskz_mov_ps(m, a); }
  static F pow2n(F p, F t) {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32(_mm512_castps_si512(t), 23)));
  }
  static float hsum(F v) { return _mm512_reduce_add_ps(v); }
  static F to_float(I a) { return _mm512_cvtepi32_ps(a); }
  static I neg_shl7(I a) { return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(a, 7)); }  // -128 a
  static void prefetch(const float* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
  static void int8_quads(const int16_t* q, uint32_t* out) {  // 64 int8 values held in int16 -> 16 words of q + 128
    const __m512i bytes = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_loadu_si512(q))),
                                             _mm512_cvtepi16_epi8(_mm512_loadu_si512(q + 32)), 1);
    _mm512_storeu_si512(out, _mm512_xor_si512(bytes, _mm512_set1_epi8(static_cast<char>(0x80))));  // v ^ 0x80 = v + 128
  }
#if defined(__AVX512BF16__)
  static F dot_pairs(F s, I a, I b) {
    return _mm512_dpbf16_ps(s, reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b));
  }
#endif
#if defined(__AVX512VNNI__)
  static I dot_quads(I s, I a, I b) { return _mm512_dpbusd_epi32(s, a, b); }
#endif
};

// In place: r[i] lane j -> r[j] lane i (16 x 16 32-bit lanes; exact moves, so any order of shuffles gives the same
// bits).
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int h = 0; h < 16; h += 8) {
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}

// out[q] lane i = src[i * ld + q] for i < rows and q < cols <= 16, zero elsewhere: floats, or any 32-bit words read
// as floats (every step is an exact move).
inline void load_transposed(const float* src, int64_t ld, int64_t rows, int64_t cols, __m512 out[16]) {
  const __mmask16 cm = Lanes512::tail(cols);
  for (int64_t i = 0; i < 16; ++i) out[i] = i < rows ? _mm512_maskz_loadu_ps(cm, src + i * ld) : _mm512_setzero_ps();
  transpose16(out);
}
#endif

#if defined(__AVX2__)
struct Lanes256 {
  using F = __m256;
  using I = __m256i;
  using Tail = __m256i;
  using M = __m256;
  static constexpr int64_t kW = 8;
  static constexpr int kRegs = 16;
  static Tail tail(int64_t n) {
    const int c = n < 0 ? 0 : n > 8 ? 8 : static_cast<int>(n);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static I set1(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static I load(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I load(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static F load_n(const float* p, Tail t) { return _mm256_maskload_ps(p, t); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store_n(float* p, Tail t, F v) { _mm256_maskstore_ps(p, t, v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static M eq(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
  static M ge(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  static M unord(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_UNORD_Q); }
  static M or_(M a, M b) { return _mm256_or_ps(a, b); }
  static F select(M m, F a, F b) { return _mm256_blendv_ps(b, a, m); }
  static F zero_unless(M m, F a) { return _mm256_and_ps(a, m); }
  static F pow2n(F p, F t) {  // p · 2^n, n in t's low mantissa bits: t's exponent bits shift out
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(t), 23)));
  }
  static F to_float(I a) { return _mm256_cvtepi32_ps(a); }
  static I neg_shl7(I a) { return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(a, 7)); }
  static void int8_quads(const int16_t* q, uint32_t* out) {  // 32 values -> 8 words, as Lanes512's
    const I lo = load(reinterpret_cast<const int32_t*>(q)), hi = load(reinterpret_cast<const int32_t*>(q + 16));
    // packs works per 128-bit lane: (lo0, hi0, lo1, hi1) -> (lo0, lo1, hi0, hi1); values in [-127, 127] stay.
    const I bytes = _mm256_permute4x64_epi64(_mm256_packs_epi16(lo, hi), 0xd8);
    const I offset = _mm256_set1_epi8(static_cast<char>(0x80));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_xor_si256(bytes, offset));
  }
#if defined(__AVXVNNI__)
  static I dot_quads(I s, I a, I b) { return _mm256_dpbusd_avx_epi32(s, a, b); }
#else
  // vpdpbusd's exact sums without VNNI: a's bytes widened to int16 unsigned, b's signed, the even and the odd bytes
  // of each word multiplied in pairs by vpmaddwd (|2 · 255 · 128| fits in int32; never the saturating vpmaddubsw).
  static I dot_quads(I s, I a, I b) {
    const I a_even = _mm256_and_si256(a, _mm256_set1_epi16(0x00ff)), a_odd = _mm256_srli_epi16(a, 8);
    const I b_even = _mm256_srai_epi16(_mm256_slli_epi16(b, 8), 8), b_odd = _mm256_srai_epi16(b, 8);
    I r = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_madd_epi16(a_even, b_even), _mm256_madd_epi16(a_odd, b_odd)));
    __asm__("" : "+x"(r));  // one chain per sum, in step order: reassociated, GCC 12 computes every product first
    return r;
  }
#endif
};
#endif

// Dot policies: Word (one k-step of A and B), A (a broadcast word), B (a vector of B), Sum (an accumulator),
// step(s, a, b) (the sum plus one k-step's products), kBlock (0: one chain over every step; else the steps of one
// block, whose sums Out starts and folds into float ones).
template <class L>
struct FmaF32 {  // float32: s + a·b
  using Word = float;
  using A = typename L::F;
  using B = typename L::F;
  using Sum = typename L::F;
  static constexpr int64_t kBlock = 0;
  static Sum step(Sum s, A a, B b) { return L::fmadd(a, b, s); }
};
template <class L>
struct PairsBf16 {  // two bf16 products per float lane (vdpbf16ps), float32 sums
  using Word = uint32_t;
  using A = typename L::I;
  using B = typename L::I;
  using Sum = typename L::F;
  static constexpr int64_t kBlock = 0;
  static Sum step(Sum s, A a, B b) { return L::dot_pairs(s, a, b); }
};
template <class L>
struct QuadsU8S8 {  // four u8·s8 products per int32 lane (vpdpbusd), exact int32 sums per block of kInt8Group k
  using Word = uint32_t;
  using A = typename L::I;
  using B = typename L::I;
  using Sum = typename L::I;
  static constexpr int64_t kBlock = kInt8Group / 4;
  static Sum step(Sum s, A a, B b) { return L::dot_quads(s, a, b); }
};

// Epilogues. Each provides store(t, v, c, tail) (vector v of a c row, float sums t, at c, lanes `tail`), at(r0,
// c0) (the epilogue of the register block at row r0, column c0), and kPrefetchTail (prefetch c this many steps
// before the end; 0: never). The int8 one also starts (start(g, v)) and folds (fold(t, s, r, g)) each block's sums.

// c = alpha · sum (+ beta · c; c not read when beta == 0): sgemm.
template <class L>
struct ScaleOut {
  float alpha, beta;
  static constexpr int64_t kPrefetchTail = 32;
  ScaleOut at(int64_t, int64_t) const { return *this; }
  void store(typename L::F t, int, float* c, typename L::Tail m) const {
    const typename L::F y = L::mul(t, L::set1(alpha));
    L::store_n(c, m, beta == 0.0f ? y : L::fmadd(L::load_n(c, m), L::set1(beta), y));
  }
};

// c = sum + bias (bias at c's column 0 of the block, or null): the bf16 product.
template <class L>
struct BiasOut {
  const float* bias;
  static constexpr int64_t kPrefetchTail = 0;
  BiasOut at(int64_t, int64_t c0) const { return {bias ? bias + c0 : nullptr}; }
  void store(typename L::F t, int v, float* c, typename L::Tail m) const {
    if (bias) t = L::add(t, L::load_n(bias + v * L::kW, m));
    L::store_n(c, m, t);
  }
};

// The int8 product: block g's exact sums start at -128 Σ_{k in g} w (the +128 offset of the activations), are
// scaled into the float sums by fused multiply-adds in block order, and c = sum · scale + bias.
template <class L>
struct Int8Out {
  const float* bias;       // at the block's first column, or null
  const int32_t* colsum;   // the panel's [block][32] column sums, from the block's first column
  const float* scale;      // the block's column scales
  const float* row_scale;  // the block's first row's block scales; row r's at + r * blocks
  int64_t blocks;
  static constexpr int64_t kPrefetchTail = 0;
  Int8Out at(int64_t r0, int64_t c0) const {
    return {bias ? bias + c0 : nullptr, colsum + c0, scale + c0, row_scale + r0 * blocks, blocks};
  }
  typename L::I start(int64_t g, int v) const { return L::neg_shl7(L::load(colsum + g * kPanel + v * L::kW)); }
  typename L::F fold(typename L::F t, typename L::I s, int r, int64_t g) const {
    return L::fmadd(L::to_float(s), L::set1(row_scale[r * blocks + g]), t);
  }
  void store(typename L::F t, int v, float* c, typename L::Tail m) const {
    typename L::F y = L::mul(t, L::load(scale + v * L::kW));
    if (bias) y = L::add(y, L::load_n(bias + v * L::kW, m));
    L::store_n(c, m, y);
  }
};

// R rows of c (ldc apart) by C vectors, lanes [0, n) of the run stored: `steps` k-steps of A (a, a_step words per
// step) and B (b, panels b_panel words apart).
template <class L, int R, int C, template <class> class Dot, template <class> class Out>
void micro(int64_t steps, const typename Dot<L>::Word* __restrict a, int64_t a_step,
           const typename Dot<L>::Word* __restrict b, int64_t b_panel, float* c, int64_t ldc, const Out<L>& out,
           int64_t n) {
  using D = Dot<L>;
  using F = typename L::F;
  constexpr int64_t kVecs = kPanel / L::kW;  // vectors per panel
  F t[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < C; ++v) t[r][v] = L::zero();
  // One k-step into the sums s; `count` of them, two at a time.
  const auto step = [&](typename D::Sum(&s)[R][C]) {
    typename D::B bv[C];
#pragma GCC unroll 8
    for (int v = 0; v < C; ++v) bv[v] = L::load(b + (v / kVecs) * b_panel + (v % kVecs) * L::kW);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const typename D::A av = L::set1(a[r]);
#pragma GCC unroll 8
      for (int v = 0; v < C; ++v) s[r][v] = D::step(s[r][v], av, bv[v]);
    }
    a += a_step;
    b += kPanel;
  };
  const auto run = [&](typename D::Sum(&s)[R][C], int64_t count) {
#pragma GCC unroll 2
    for (int64_t k = 0; k < count; ++k) step(s);
  };
  if constexpr (D::kBlock == 0) {
    if constexpr (Out<L>::kPrefetchTail > 0) {
      // Fetch the C tile shortly before the last steps: early enough to hide the miss, late enough that the A and
      // B streams have not pushed it out of L1 again.
      const int64_t tail = steps < Out<L>::kPrefetchTail ? steps : Out<L>::kPrefetchTail;
      run(t, steps - tail);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        L::prefetch(c + r * ldc);
        L::prefetch(c + r * ldc + C * L::kW - 1);
      }
      run(t, tail);
    } else {
      run(t, steps);
    }
  } else {
    for (int64_t g = 0; g * D::kBlock < steps; ++g) {
      typename D::Sum s[R][C];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < C; ++v) s[r][v] = out.start(g, v);
      // Unrolled whole (a block is 16 steps): as a loop, GCC 12 stores the sums to the stack on each step.
#pragma GCC unroll 16
      for (int64_t k = 0; k < D::kBlock; ++k) step(s);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < C; ++v) t[r][v] = out.fold(t[r][v], s[r][v], r, g);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < C; ++v) out.store(t[r][v], v, c + r * ldc + v * L::kW, L::tail(n - v * L::kW));
}

// micro over a tile of `rows` rows (at most a packed tile) by lanes [0, n) of one panel: register blocks of up to
// kRows rows by C vectors, rows [r0, ..) reading A at a + r0 and columns [c0, ..) the panel's lanes from c0.
template <class L, int kRows, int C, template <class> class Dot, template <class> class Out>
void micro_tile(int64_t rows, int64_t steps, const typename Dot<L>::Word* a, int64_t a_step,
                const typename Dot<L>::Word* b, float* c, int64_t ldc, const Out<L>& out, int64_t n) {
  using Word = typename Dot<L>::Word;
  using Fn = void (*)(int64_t, const Word*, int64_t, const Word*, int64_t, float*, int64_t, const Out<L>&, int64_t);
  struct Table {
    Fn f[kRows];
  };
  static constexpr Table table = []<int... R>(std::integer_sequence<int, R...>) {
    return Table{{&micro<L, R + 1, C, Dot, Out>...}};
  }(std::make_integer_sequence<int, kRows>());
  constexpr int64_t kCols = C * L::kW;
  for (int64_t c0 = 0; c0 < n; c0 += kCols)
    for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
      const int64_t rb = rows - r0 < kRows ? rows - r0 : kRows;
      table.f[rb - 1](steps, a + r0, a_step, b + c0, 0, c + r0 * ldc + c0, ldc, out.at(r0, c0), n - c0);
    }
}

}  // namespace
}  // namespace qkv::kernels::detail
