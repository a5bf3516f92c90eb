// The bf16 products of the fused attention forward (attention_flash_kernels.h GemmBf16) with AVX512-BF16's
// vdpbf16ps: attention_flash_blocks.h's register blocks of up to 12 rows by 2 vectors or 6 by 4, as the float32
// AVX-512 product, on micro.h's Lanes512 with the PairsBf16 dot (each broadcast word two bfloat16 of A). The rest of the set is avx512_kernels()'s. Compiled with
// -mavx512bf16 on top of the AVX-512 flags; picked at run time only when the CPU has it. The amx sets at the end are
// this one with the bf16 products on AMX tiles, the hardware's or emulated (lowp_amx.cpp).
#include <immintrin.h>

#include "attention_flash_blocks.h"
#include "lowp_avx512_impl.h"  // micro.h: GCC 12's false -Wmaybe-uninitialized silenced
#include "micro.h"

namespace qkv::kernels::flash {
namespace {

using detail::Lanes512;

// Blocks of up to kMaxNV vectors by R rows.
constexpr int max_vectors(int rows) { return rows <= 6 ? 4 : 2; }

// Narrow products (head-dim wide: P·V) take 12 rows at a time, wide ones (score tiles) 6.
void gemm_bf16(const GemmBf16& g) {
  if (g.cols <= 32) product<Lanes512, detail::PairsBf16, 12, max_vectors>(g);
  else product<Lanes512, detail::PairsBf16, 6, max_vectors>(g);
}

void pairs_of_rows(const float* x0, const float* x1, int64_t n, uint32_t* out) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = detail::lanes(n - i);
    const __m512i lo = _mm512_srli_epi32(detail::bf16_round16_hi(_mm512_maskz_loadu_ps(m, x0 + i)), 16);
    const __m512i hi = x1 ? detail::bf16_round16_hi(_mm512_maskz_loadu_ps(m, x1 + i)) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(out + i, m, _mm512_or_si512(lo, hi));
  }
}

void pairs_of_adjacent(const float* x, int64_t n, uint32_t* out) {
  for (int64_t i = 0; i < n; i += 16)  // 16 words from 32 floats
    _mm512_mask_storeu_epi32(out + i, detail::lanes(n - i), detail::bf16_pairs32(x + 2 * i, 2 * (n - i)));
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
