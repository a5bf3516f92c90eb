// Private (not installed): the AMX products' walk over tiles (bf16 tdpbf16ps, int8 tdpbusd), written once over two
// policies and built three times: Tiles, the tile unit (the hardware's: tileloadd, tdp*, tilestored; or
// EmulatedTiles below, in plain loops), and Rows, the per-call vector work (packing the activation rows, the int8
// block epilogue: LaneRows below over lowp_amx.cpp's AVX-512 lanes, or over Lanes1 as ScalarRows). lowp.cpp builds <EmulatedTiles, ScalarRows> (every
// CPU), lowp_amx.cpp <EmulatedTiles, its AVX-512 rows> (AVX-512 CPUs) and <its hardware tiles, AVX-512 rows> (AMX
// CPUs): the three give the same bits where their hardware exists, so the tests reach all but the tile
// instructions themselves on any AVX-512 CPU.
//
// One pass computes 32 rows x 32 columns of c in the four accumulator tiles tmm0-tmm3 (rows 0-15 / 16-31 by panel
// columns 0-15 / 16-31), from two A tiles (tmm4, tmm5: 16 rows x 16 words of the activations) and two B tiles
// (tmm6, tmm7: 16 word rows x 16 columns of a weight panel). pack_bf16's and pack_int8's panels are already the B
// layout ([k-word][32 columns]: a B tile is 16 of those rows, 128 bytes apart, from lane 0 or 16); the activations
// are packed per call as rows of words (bf16 pairs; int8 quads offset to unsigned, q + 128), zero past k and past
// the last row. bf16: the last k-pairs of a panel (fewer than 16) go through a zeroed 16-row buffer, so one tile
// configuration (8 tiles of 16 rows x 64 bytes) serves every shape. int8: a step is one block of kInt8Group = 64
// k, whose exact int32 sums are scaled into float accumulators in block order as on every other int8 path (the
// same bits). No vector code and nothing inline from the standard library here: each unit that includes it
// compiles its own internal copy.
//
// Tiles provides
//   begin() / end(): configure the tiles on this thread / release them;
//   zero_c(): tmm0-tmm3 = 0;
//   step_bf16(a0, a1, sa, b0, b1, sb) / step_int8(...): tmm4 = 16 rows at a0, tmm5 at a1 (row stride sa bytes),
//     tmm6 / tmm7 = 16 rows at b0 / b1 (stride sb), then tmm0 += tmm4·tmm6, tmm1 += tmm4·tmm7, tmm2 += tmm5·tmm6,
//     tmm3 += tmm5·tmm7 (float32 sums of bf16 pair products; int32 sums of unsigned x signed byte quads);
//   store_c(ct): the four tiles into ct, 32 x 32 32-bit values row-major.
// Rows provides
//   pack_bf16(x, ldx, rows, k, ld, dst): rows [0, rows) of x (k floats each, ldx apart) as bf16 pair words (low
//     half even k, rounded to nearest even), row r at dst + r * ld, words [0, ld) (zero from k on);
//   pack_int8(q, ldq, rows, words, dst): rows of int8 values held in int16 (ldq apart) as words of 4 bytes q + 128,
//     row r at dst + r * words;
//   int8_block(ci, colsum, row_scale, scale_stride, rows, f): for r < rows, l < 32,
//     f[r][l] = fma(float(ci[r][l] - 128 colsum[l]), row_scale[r * scale_stride], f[r][l]);
//   pairs_a, pairs_b, pairs_c: amx_pairs_product's copies of its operands and its stores (below).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "lowp_impl.h"
#include "lowp_packed_impl.h"
#include "qkv/kernels/lowp.h"

namespace qkv::kernels::detail {
namespace {

constexpr int64_t kAmxRows = 32;   // rows of c per pass: two A tiles
constexpr int64_t kAmxWords = 16;  // words per A tile row and rows per B tile: 16 k-pairs, or one int8 block

thread_local Scratch amx_scratch;

// The walk over passes and panels shared by both products: rows [m0, m1) of c over the view's columns [n0, n1).
//   pack(r0, rows, dst): activation rows [r0, r0 + rows) as rows of ld words at dst (the rest of the pass is zeroed
//     here);
//   pass(a, b, rows, r0, ct): one pass of rows [r0, r0 + rows) over panel b into ct (32 x 32 floats, no bias).
template <class Tiles, class Pack, class Pass>
void amx_walk(const PackedBView& w, const float* bias, float* c, int64_t ldc, int64_t m0, int64_t m1, int64_t n0,
              int64_t n1, int64_t ld, Pack pack, Pass pass) {
  if (m0 >= m1 || n0 >= n1) return;
  const int64_t passes = (m1 - m0 + kAmxRows - 1) / kAmxRows;
  uint32_t* pa = amx_scratch.get(passes * kAmxRows * ld);
  for (int64_t t = 0; t < passes; ++t) {
    const int64_t r0 = m0 + t * kAmxRows, rows = min64(kAmxRows, m1 - r0);
    uint32_t* dst = pa + t * kAmxRows * ld;
    pack(r0, rows, dst);
    std::memset(dst + rows * ld, 0, static_cast<size_t>((kAmxRows - rows) * ld) * sizeof(uint32_t));
  }
  alignas(64) float ct[kAmxRows * kPanel];
  Tiles::begin();
  // View column j is lane col0 + j of the panels counted from w.data.
  const int64_t l_begin = w.col0 + n0, l_end = w.col0 + n1;
  for (int64_t p = l_begin / kPanel; p * kPanel < l_end; ++p) {
    const int64_t lo = max64(l_begin, p * kPanel) - p * kPanel, hi = min64(l_end, (p + 1) * kPanel) - p * kPanel;
    const int64_t j0 = p * kPanel - w.col0;  // the view column of the panel's lane 0 (< 0 only when lo > 0)
    for (int64_t t = 0; t < passes; ++t) {
      const int64_t r0 = m0 + t * kAmxRows, rows = min64(kAmxRows, m1 - r0);
      pass(pa + t * kAmxRows * ld, p, rows, r0, ct);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t l = lo; l < hi; ++l) {
          const float v = ct[r * kPanel + l];
          c[(r0 + r) * ldc + j0 + l] = bias ? v + bias[j0 + l] : v;
        }
    }
  }
  Tiles::end();
}

// The bf16 product (gemm_bf16_packed_block's contract, x in rows).
template <class Tiles, class Rows>
void amx_bf16_block(const float* x, int64_t ldx, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                    int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int64_t groups = w.groups, ld = (groups + kAmxWords - 1) / kAmxWords * kAmxWords;
  const int64_t full = groups / kAmxWords * kAmxWords, tail = groups - full;
  const int64_t sa = ld * 4, sb = kPanel * 4;
  alignas(64) uint32_t btail[kAmxWords * kPanel];
  int64_t tail_panel = -1;  // the panel whose last k-pairs btail holds
  amx_walk<Tiles>(
      w, bias, c, ldc, m0, m1, n0, n1, ld,
      [&](int64_t r0, int64_t rows, uint32_t* dst) { Rows::pack_bf16(x + r0 * ldx, ldx, rows, w.k, ld, dst); },
      [&](const uint32_t* a, int64_t p, int64_t, int64_t, float* ct) {
        const uint32_t* b = w.data + p * groups * kPanel;
        if (tail > 0 && tail_panel != p) {
          std::memcpy(btail, b + full * kPanel, static_cast<size_t>(tail * kPanel) * sizeof(uint32_t));
          std::memset(btail + tail * kPanel, 0, static_cast<size_t>((kAmxWords - tail) * kPanel) * sizeof(uint32_t));
          tail_panel = p;
        }
        Tiles::zero_c();
        for (int64_t g0 = 0; g0 < full; g0 += kAmxWords)
          Tiles::step_bf16(a + g0, a + 16 * ld + g0, sa, b + g0 * kPanel, b + g0 * kPanel + 16, sb);
        if (tail > 0) Tiles::step_bf16(a + full, a + 16 * ld + full, sa, btail, btail + 16, sb);
        Tiles::store_c(ct);
      });
}

// The int8 product (gemm_int8_packed_block's contract): one step per block of kInt8Group k, its int32 sums scaled
// into float accumulators, then acc · the column's scale, to which the walk adds the bias (one float addition, as
// on every int8 path).
template <class Tiles, class Rows>
void amx_int8_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc, int64_t m0,
                    int64_t m1, int64_t n0, int64_t n1) {
  const int64_t words = w.groups, blocks = a.groups();  // a.ld / 4 words per row: kAmxWords per block
  const int64_t sa = words * 4, sb = kPanel * 4;
  alignas(64) int32_t ci[kAmxRows * kPanel];
  alignas(64) float f[kAmxRows * kPanel];
  amx_walk<Tiles>(
      w, bias, c, ldc, m0, m1, n0, n1, words,
      [&](int64_t r0, int64_t rows, uint32_t* dst) { Rows::pack_int8(a.q + r0 * a.ld, a.ld, rows, words, dst); },
      [&](const uint32_t* pa, int64_t p, int64_t rows, int64_t r0, float* ct) {
        const uint32_t* b = w.data + p * words * kPanel;
        const int32_t* colsum = w.colsum + p * blocks * kPanel;
        std::memset(f, 0, sizeof f);
        for (int64_t g = 0; g < blocks; ++g) {
          const int64_t g0 = g * kAmxWords;
          Tiles::zero_c();
          Tiles::step_int8(pa + g0, pa + 16 * words + g0, sa, b + g0 * kPanel, b + g0 * kPanel + 16, sb);
          Tiles::store_c(ci);
          Rows::int8_block(ci, colsum + g * kPanel, a.scale + r0 * blocks + g, blocks, rows, f);
        }
        const float* scale = w.scale + p * kPanel;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t l = 0; l < kPanel; ++l) ct[r * kPanel + l] = f[r * kPanel + l] * scale[l];
      });
}

// The fused attention's bf16 products (attention_flash_kernels.h GemmBf16) on the same tile unit:
//   C(r, c) = accumulate ? row_scale[r] C(r, c) + sum_k A(r, k) B(k, c) : scale sum_k A(r, k) B(k, c),
//   r < rows, c < cols, k < depth words, A(r, k) = a[r a_rs + k a_ks], B(k, c) = b[k b_ks + c] (row_scale null = 1).
// A is copied into passes of 32 rows and B into panels of 32 columns, both zero-padded to whole tiles of 16 words
// along k (so one tile configuration serves every shape, and A may be either layout), then each 32 x 32 block of C
// is one pass of tile steps, added to C in float32. A's copy takes the walk's scratch (amx_scratch), B's its own.
// Rows copies A (pairs_a) and B (pairs_b) and writes each block into C (pairs_c).
thread_local Scratch amx_pairs_b;

template <class Tiles, class Rows>
void amx_pairs_product(int64_t rows, int64_t cols, int64_t depth, const uint32_t* a, int64_t a_rs, int64_t a_ks,
                       const uint32_t* b, int64_t b_ks, float* c, int64_t c_rs, const float* row_scale,
                       bool accumulate, float scale) {
  if (rows <= 0 || cols <= 0) return;
  depth = max64(depth, 0);
  const int64_t kw = (depth + kAmxWords - 1) / kAmxWords * kAmxWords;
  const int64_t passes = (rows + kAmxRows - 1) / kAmxRows, panels = (cols + kPanel - 1) / kPanel;
  uint32_t* pa = amx_scratch.get(max64(1, passes * kAmxRows * kw));  // row r at pa + r kw
  uint32_t* pb = amx_pairs_b.get(max64(1, panels * kw * kPanel));    // panel p, word k at pb + (p kw + k) kPanel
  Rows::pairs_a(a, a_rs, a_ks, rows, depth, passes * kAmxRows, kw, pa);
  Rows::pairs_b(b, b_ks, cols, depth, panels, kw, pb);
  alignas(64) float ct[kAmxRows * kPanel];
  Tiles::begin();
  for (int64_t t = 0; t < passes; ++t)
    for (int64_t p = 0; p < panels; ++p) {
      Tiles::zero_c();
      const uint32_t* a0 = pa + t * kAmxRows * kw;
      const uint32_t* b0 = pb + p * kw * kPanel;
      for (int64_t k0 = 0; k0 < kw; k0 += kAmxWords)
        Tiles::step_bf16(a0 + k0, a0 + 16 * kw + k0, kw * 4, b0 + k0 * kPanel, b0 + k0 * kPanel + 16, kPanel * 4);
      Tiles::store_c(ct);
      const int64_t r0 = t * kAmxRows;
      Rows::pairs_c(ct, min64(kAmxRows, rows - r0), min64(kPanel, cols - p * kPanel), c + r0 * c_rs + p * kPanel, c_rs,
                    row_scale != nullptr ? row_scale + r0 : nullptr, accumulate, scale);
    }
  Tiles::end();
}

// The AMX tile unit in plain loops, as the instruction set reference writes TDPBF16PS (for each row m and word g,
// c[m][n] += a_even·b_even, then += a_odd·b_odd: float32 adds of exact products) and TDPBUSD (int32 sums of
// unsigned x signed bytes). What it tests is the walk above, not the hardware's rounding.
struct EmulatedTiles {
  struct State {
    uint32_t c[4][16][16];  // float32 or int32 bits, by the last step
    uint32_t a[2][16][16], b[2][16][16];
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  static float bf16_half(uint32_t word, bool high) {
    const uint32_t u = high ? (word & 0xffff0000u) : (word << 16);
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  static void load(uint32_t (&t)[16][16], const uint32_t* p, int64_t stride_bytes) {
    for (int r = 0; r < 16; ++r) std::memcpy(t[r], p + r * (stride_bytes / 4), sizeof t[r]);
  }
  static void dp_bf16(uint32_t (&c)[16][16], const uint32_t (&a)[16][16], const uint32_t (&b)[16][16]) {
    for (int m = 0; m < 16; ++m)
      for (int g = 0; g < 16; ++g)
        for (int n = 0; n < 16; ++n) {
          float v;
          std::memcpy(&v, &c[m][n], sizeof v);
          v += bf16_half(a[m][g], false) * bf16_half(b[g][n], false);
          v += bf16_half(a[m][g], true) * bf16_half(b[g][n], true);
          std::memcpy(&c[m][n], &v, sizeof v);
        }
  }
  static void dp_int8(uint32_t (&c)[16][16], const uint32_t (&a)[16][16], const uint32_t (&b)[16][16]) {
    for (int m = 0; m < 16; ++m)
      for (int g = 0; g < 16; ++g)
        for (int n = 0; n < 16; ++n) {
          int32_t s = 0;
          for (int i = 0; i < 4; ++i)
            s += static_cast<int32_t>((a[m][g] >> (8 * i)) & 0xffu) *
                 static_cast<int32_t>(static_cast<int8_t>((b[g][n] >> (8 * i)) & 0xffu));
          c[m][n] = static_cast<uint32_t>(static_cast<int32_t>(c[m][n]) + s);
        }
  }
  template <class Dp>
  static void step(const uint32_t* a0, const uint32_t* a1, int64_t sa, const uint32_t* b0, const uint32_t* b1,
                   int64_t sb, Dp dp) {
    State& s = state();
    load(s.a[0], a0, sa);
    load(s.a[1], a1, sa);
    load(s.b[0], b0, sb);
    load(s.b[1], b1, sb);
    dp(s.c[0], s.a[0], s.b[0]);
    dp(s.c[1], s.a[0], s.b[1]);
    dp(s.c[2], s.a[1], s.b[0]);
    dp(s.c[3], s.a[1], s.b[1]);
  }
  static void begin() { std::memset(&state(), 0, sizeof(State)); }  // LDTILECFG zeroes every tile
  static void end() {}
  static void zero_c() { std::memset(state().c, 0, sizeof state().c); }
  static void step_bf16(const uint32_t* a0, const uint32_t* a1, int64_t sa, const uint32_t* b0, const uint32_t* b1,
                        int64_t sb) {
    step(a0, a1, sa, b0, b1, sb, dp_bf16);
  }
  static void step_int8(const uint32_t* a0, const uint32_t* a1, int64_t sa, const uint32_t* b0, const uint32_t* b1,
                        int64_t sb) {
    step(a0, a1, sa, b0, b1, sb, dp_int8);
  }
  static void store_c(void* ct) {
    const State& s = state();
    uint32_t* out = static_cast<uint32_t*>(ct);
    for (int t = 0; t < 4; ++t)
      for (int r = 0; r < 16; ++r)
        std::memcpy(out + (16 * (t / 2) + r) * kPanel + 16 * (t % 2), s.c[t][r], sizeof s.c[t][r]);
  }
};

// One-lane traits (micro.h's lane traits' operations that LaneRows uses, on plain values): LaneRows<Lanes1> is the
// per-call row work in plain loops, the bits of the vector builds (bf16_round_bits, exact int32, fma).
struct Lanes1 {
  using F = float;
  using I = uint32_t;
  using Tail = bool;
  static constexpr int64_t kW = 1;
  static Tail tail(int64_t n) { return n > 0; }
  static I izero() { return 0u; }
  static F set1(float x) { return x; }
  static F load(const float* p) { return *p; }
  static I load(const int32_t* p) { return static_cast<uint32_t>(*p); }
  static F load_n(const float* p, Tail t) { return t ? *p : 0.0f; }
  static I load_n(const uint32_t* p, Tail t) { return t ? *p : 0u; }
  static void store(float* p, F v) { *p = v; }
  static void store_n(float* p, Tail t, F v) { *p = t ? v : *p; }
  static void store_i(uint32_t* p, I v) { *p = v; }
  static F add(F a, F b) { return a + b; }
  static F mul(F a, F b) { return a * b; }
  static F fmadd(F a, F b, F c) { return __builtin_fmaf(a, b, c); }
  static I add_i(I a, I b) { return a + b; }
  static I neg_shl7(I a) { return 0u - (a << 7); }  // -128 a
  static F to_float(I a) { return static_cast<float>(static_cast<int32_t>(a)); }
  static I bf16_pairs(const float* x, int64_t count) {  // x[0] rounded in the low half, x[1] in the high one
    return (count > 0 ? bf16_round_bits(x[0]) >> 16 : 0u) | (count > 1 ? bf16_round_bits(x[1]) : 0u);
  }
  static void int8_quads(const int16_t* q, uint32_t* out) {  // 4 values -> 1 word of q + 128
    uint32_t word = 0;
    for (int i = 0; i < 4; ++i) word |= static_cast<uint32_t>(static_cast<uint8_t>(q[i] + 128)) << (8 * i);
    *out = word;
  }
};

// The per-call row work (the Rows policy above) written once over lane traits L: Lanes1 here, or lowp_amx.cpp's
// AVX-512 lanes, which also copy A by rows or by 16 x 16 transposes (L::load_transposed) where one of its strides
// is 1. Every step is a move, an exact integer step, or the same float operation per lane: the same bits.
template <class L>
struct LaneRows {
  static void pack_bf16(const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t ld, uint32_t* dst) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g0 = 0; g0 < ld; g0 += L::kW)  // 2 kW floats (k = 2 g0 ..) -> kW words; past k zero
        L::store_i(dst + r * ld + g0, L::bf16_pairs(x + r * ldx + 2 * g0, k - 2 * g0));
  }
  static void pack_int8(const int16_t* q, int64_t ldq, int64_t rows, int64_t words, uint32_t* dst) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g0 = 0; g0 < words; g0 += L::kW)  // 4 kW values -> kW words (words is a multiple of 16)
        L::int8_quads(q + r * ldq + 4 * g0, dst + r * words + g0);
  }
  // amx_pairs_product's copies: A(r, k) = a[r a_rs + k a_ks] as rows of kw words at dst, r < rows_padded (zero
  // from depth on and from rows on); B(k, col) = b[k b_ks + col] as panels of 32 columns, word k of panel p's lane l
  // at dst[(p kw + k) kPanel + l] (zero from depth on and from cols on).
  static void pairs_a(const uint32_t* a, int64_t a_rs, int64_t a_ks, int64_t rows, int64_t depth, int64_t rows_padded,
                      int64_t kw, uint32_t* dst) {
    if constexpr (L::kW > 1) {
      if (a_ks == 1 || a_rs == 1) {  // A in rows: copied row by row; in columns (P·V's probabilities): transposed
        for (int64_t r0 = 0; r0 < rows; r0 += a_ks == 1 ? 1 : L::kW)
          for (int64_t k0 = 0; k0 < kw; k0 += L::kW)
            if (a_ks == 1)
              L::store_i(dst + r0 * kw + k0, L::load_n(a + r0 * a_rs + k0, L::tail(depth - k0)));
            else
              L::transposed(a + k0 * a_ks + r0, a_ks, depth - k0, rows - r0, dst + r0 * kw + k0, kw);
        const int64_t done = a_ks == 1 ? rows : (rows + L::kW - 1) / L::kW * L::kW;  // transposed rows: zeros
        std::memset(dst + done * kw, 0, static_cast<size_t>((rows_padded - done) * kw) * sizeof(uint32_t));
        return;
      }
    }
    for (int64_t r = 0; r < rows_padded; ++r)
      for (int64_t k = 0; k < kw; ++k) dst[r * kw + k] = r < rows && k < depth ? a[r * a_rs + k * a_ks] : 0u;
  }
  static void pairs_b(const uint32_t* b, int64_t b_ks, int64_t cols, int64_t depth, int64_t panels, int64_t kw,
                      uint32_t* dst) {
    for (int64_t p = 0; p < panels; ++p)
      for (int64_t k = 0; k < kw; ++k)
        for (int64_t l = 0; l < kPanel; l += L::kW) {
          const typename L::Tail t = L::tail(cols - p * kPanel - l);
          const typename L::I x = k < depth ? L::load_n(b + k * b_ks + p * kPanel + l, t) : L::izero();
          L::store_i(dst + (p * kw + k) * kPanel + l, x);
        }
  }
  // One block of C from ct (32 x 32): y[r ys + l] for r < rows, l < lanes becomes s_r y + ct (accumulate; s_r =
  // row_scale[r], or 1 where row_scale is null) or ct · scale.
  static void pairs_c(const float* ct, int64_t rows, int64_t lanes, float* y, int64_t ys, const float* row_scale,
                      bool accumulate, float scale) {
    for (int64_t r = 0; r < rows; ++r) {
      const typename L::F s = L::set1(row_scale != nullptr ? row_scale[r] : 1.0f);
      for (int64_t l = 0; l < lanes; l += L::kW) {
        const typename L::Tail t = L::tail(lanes - l);
        const typename L::F x = L::load(ct + r * kPanel + l);
        L::store_n(y + r * ys + l, t, accumulate ? L::add(L::mul(s, L::load_n(y + r * ys + l, t)), x)
                                                 : L::mul(x, L::set1(scale)));
      }
    }
  }
  static void int8_block(const int32_t* ci, const int32_t* colsum, const float* row_scale, int64_t scale_stride,
                         int64_t rows, float* f) {
    typename L::I c[kPanel / L::kW];  // -128 colsum
    for (int64_t v = 0; v < kPanel / L::kW; ++v) c[v] = L::neg_shl7(L::load(colsum + v * L::kW));
    for (int64_t r = 0; r < rows; ++r) {
      const typename L::F sa = L::set1(row_scale[r * scale_stride]);
      for (int64_t v = 0; v < kPanel / L::kW; ++v) {
        float* fr = f + r * kPanel + v * L::kW;
        L::store(fr, L::fmadd(L::to_float(L::add_i(L::load(ci + r * kPanel + v * L::kW), c[v])), sa, L::load(fr)));
      }
    }
  }
};
using ScalarRows = LaneRows<Lanes1>;

}  // namespace
}  // namespace qkv::kernels::detail
