// The bf16 products of the fused attention forward (attention_flash_kernels.h GemmBf16) with AVX512-BF16's
// vdpbf16ps: register blocks of up to 12 rows by 2 vectors or 6 by 4, as the float32 AVX-512 product, each
// broadcast word carrying two bfloat16 of A. The rest of the set is avx512_kernels()'s. Compiled with
// -mavx512bf16 on top of the AVX-512 flags; picked at run time only when the CPU has it. The amx sets at the end are
// this one with the bf16 products on AMX tiles, the hardware's or emulated (lowp_amx.cpp).
#include <immintrin.h>

#include <algorithm>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "attention_flash_blocks.h"
#include "attention_flash_kernels.h"
#include "lowp_avx512_impl.h"

namespace qkv::kernels::flash {
namespace {

inline __mmask16 tail_mask(int64_t n) {  // lanes [0, n), 0 <= n <= 16
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

inline __m512 dot(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b));
}

template <int R, int NV, bool kTail>
inline void micro(const GemmBf16& g, const uint32_t* a, const uint32_t* b, float* c, __mmask16 last) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r) {
    const __m512 s = g.accumulate && g.row_scale ? _mm512_set1_ps(g.row_scale[r]) : _mm512_set1_ps(1.0f);
    for (int v = 0; v < NV; ++v) {
      if (!g.accumulate) {
        acc[r][v] = _mm512_setzero_ps();
        continue;
      }
      const __m512 x = kTail && v == NV - 1 ? _mm512_maskz_loadu_ps(last, c + r * g.c_rs + 16 * v)
                                            : _mm512_loadu_ps(c + r * g.c_rs + 16 * v);
      acc[r][v] = _mm512_mul_ps(x, s);
    }
  }
  const int64_t a_rs = g.a_rs, a_ks = g.a_ks, b_ks = g.b_ks;
  for (int64_t k = 0; k < g.depth; ++k) {
    __m512i bv[NV];
    for (int v = 0; v < NV; ++v)
      bv[v] = kTail && v == NV - 1 ? _mm512_maskz_loadu_epi32(last, b + 16 * v) : _mm512_loadu_si512(b + 16 * v);
    for (int r = 0; r < R; ++r) {
      const __m512i av = _mm512_set1_epi32(static_cast<int>(a[r * a_rs]));
      for (int v = 0; v < NV; ++v) acc[r][v] = dot(acc[r][v], av, bv[v]);
    }
    a += a_ks;
    b += b_ks;
  }
  if (!g.accumulate && g.scale != 1.0f) {
    const __m512 s = _mm512_set1_ps(g.scale);
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_mul_ps(acc[r][v], s);
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      if (kTail && v == NV - 1) _mm512_mask_storeu_ps(c + r * g.c_rs + 16 * v, last, acc[r][v]);
      else _mm512_storeu_ps(c + r * g.c_rs + 16 * v, acc[r][v]);
    }
}

template <int R, int NV>
inline void tail(const GemmBf16& g, const uint32_t* a, const uint32_t* b, float* c, __mmask16 last) {
  if (last == 0xFFFF) micro<R, NV, false>(g, a, b, c, last);
  else micro<R, NV, true>(g, a, b, c, last);
}

template <int R>
inline void row_block(const GemmBf16& g, int64_t r0) {
  constexpr int kMaxNV = R <= 6 ? 4 : 2;
  const uint32_t* a = g.a + r0 * g.a_rs;
  float* c = g.c + r0 * g.c_rs;
  GemmBf16 shifted = g;
  if (g.row_scale) shifted.row_scale = g.row_scale + r0;
  int64_t j = 0;
  for (; j + 16 * kMaxNV <= g.cols; j += 16 * kMaxNV) micro<R, kMaxNV, false>(shifted, a, g.b + j, c + j, 0xFFFF);
  const int64_t rest = g.cols - j;
  if (rest <= 0) return;
  const int64_t nv = (rest + 15) / 16;
  const __mmask16 last = tail_mask(rest - 16 * (nv - 1));
  switch (nv) {
    case 1: tail<R, 1>(shifted, a, g.b + j, c + j, last); break;
    case 2: tail<R, 2>(shifted, a, g.b + j, c + j, last); break;
    case 3: if constexpr (kMaxNV >= 3) tail<R, 3>(shifted, a, g.b + j, c + j, last); break;
    case 4: if constexpr (kMaxNV >= 4) tail<R, 4>(shifted, a, g.b + j, c + j, last); break;
    default: break;
  }
}

template <int R>
inline void row_blocks(const GemmBf16& g) {
  for_row_blocks<R>(g.rows, [&]<int RR>(int64_t r) { row_block<RR>(g, r); });
}

// Narrow products (head-dim wide: P·V) take 12 rows at a time, wide ones (score tiles) 6.
void gemm_bf16(const GemmBf16& g) {
  if (g.cols <= 32) row_blocks<12>(g);
  else row_blocks<6>(g);
}

void pairs_of_rows(const float* x0, const float* x1, int64_t n, uint32_t* out) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(n - i);
    const __m512i lo = _mm512_srli_epi32(detail::bf16_round16_hi(_mm512_maskz_loadu_ps(m, x0 + i)), 16);
    const __m512i hi = x1 ? detail::bf16_round16_hi(_mm512_maskz_loadu_ps(m, x1 + i)) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(out + i, m, _mm512_or_si512(lo, hi));
  }
}

void pairs_of_adjacent(const float* x, int64_t n, uint32_t* out) {
  // 16 words from 32 floats: the even ones' high halves shifted down, or'ed with the odd ones' high halves.
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t w = std::min<int64_t>(16, n - i);
    const __mmask16 m0 = tail_mask(std::min<int64_t>(16, 2 * w)), m1 = 2 * w > 16 ? tail_mask(2 * w - 16) : 0;
    const __m512i a = detail::bf16_round16_hi(_mm512_maskz_loadu_ps(m0, x + 2 * i));       // floats 0..15 of this block
    const __m512i b = detail::bf16_round16_hi(_mm512_maskz_loadu_ps(m1, x + 2 * i + 16));  // floats 16..31
    _mm512_mask_storeu_epi32(out + i, tail_mask(w), detail::bf16_adjacent_pairs(a, b));
  }
}

}  // namespace

const Kernels& avx512bf16_kernels() {
  static const Kernels k = [] {
    Kernels s = avx512_kernels();
    s.name = "avx512bf16";
    s.gemm_bf16 = gemm_bf16;
    s.pairs_of_rows = pairs_of_rows;
    s.pairs_of_adjacent = pairs_of_adjacent;
    return s;
  }();
  return k;
}

// avx512bf16's set with its bf16 products on tiles (lowp_amx.cpp), the hardware's or emulated.
namespace {
Kernels on_tiles(const char* name, void (*gemm)(const GemmBf16&)) {
  Kernels s = avx512bf16_kernels();
  s.name = name;
  s.gemm_bf16 = gemm;
  return s;
}
}  // namespace

const Kernels& amx_kernels() {
  static const Kernels k = on_tiles("amx", gemm_bf16_amx);
  return k;
}

const Kernels& amx_emulated_kernels() {
  static const Kernels k = on_tiles("amx-emulated", gemm_bf16_amx_emulated);
  return k;
}

}  // namespace qkv::kernels::flash
