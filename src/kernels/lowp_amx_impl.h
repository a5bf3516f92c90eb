// Private (not installed): the AMX bfloat16 product's walk over tiles, written once over a tile unit T and built
// twice: over the hardware's tiles (lowp_amx.cpp: tileloadd, tdpbf16ps, tilestored) and over an emulated tile
// unit in plain loops (lowp.cpp), so that the packing, the K tail, the panel walk and the epilogue run and are
// tested on every CPU, and the hardware build differs from the tested one only in T.
//
// One pass computes 32 rows x 32 columns of c in the four float32 tiles tmm0-tmm3 (rows 0-15 / 16-31 by panel
// columns 0-15 / 16-31), from two A tiles (tmm4, tmm5: 16 rows x 16 pair words of the activations) and two B
// tiles (tmm6, tmm7: 16 k-pairs x 16 columns of a weight panel), 16 k-pairs per step. pack_bf16's panels are
// already the B layout ([k-pair][32 columns] words: a B tile is 16 of those rows, 128 bytes apart, from lane 0 or
// 16); the activations are packed per call as rows of pair words, zero past k and past the last row. The last
// k-pairs of a panel (fewer than 16) are copied into a zeroed 16-row buffer, so every tile is full and one tile
// configuration (8 tiles of 16 rows x 64 bytes) serves the whole product. No vector code and nothing inline from
// the standard library here: each unit that includes it compiles its own internal copy.
//
// T provides
//   begin() / end(): configure the tiles on this thread / release them;
//   zero_c(): tmm0-tmm3 = 0;
//   step(a0, a1, sa, b0, b1, sb): tmm4 = 16 rows at a0, tmm5 at a1 (row stride sa bytes), tmm6 / tmm7 = 16 rows
//     at b0 / b1 (stride sb), then tmm0 += tmm4·tmm6, tmm1 += tmm4·tmm7, tmm2 += tmm5·tmm6, tmm3 += tmm5·tmm7;
//   store_c(ct): the four tiles into ct, 32 x 32 floats row-major;
//   pack_rows(x, ldx, rows, k, ld, dst): rows [0, rows) of x (k floats each, ldx apart) as bf16 pair words (low
//     half even k, rounded to nearest even), row r at dst + r * ld, words [0, ld) (zero from k on).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "lowp_packed_impl.h"
#include "qkv/kernels/lowp.h"

namespace qkv::kernels::detail {
namespace {

constexpr int64_t kAmxRows = 32;    // rows of c per pass: two A tiles
constexpr int64_t kAmxPairs = 16;   // k-pairs per step: an A tile row holds 16 pair words, a B tile has 16 rows

thread_local Scratch amx_scratch;

// Rows [m0, m1) of c over the view's columns [n0, n1) (the contract of gemm_bf16_packed_block for x in rows).
template <class T>
void amx_bf16_block(const float* x, int64_t ldx, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                    int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  if (m0 >= m1 || n0 >= n1) return;
  const int64_t groups = w.groups, ld = (groups + kAmxPairs - 1) / kAmxPairs * kAmxPairs;
  const int64_t full = groups / kAmxPairs * kAmxPairs, tail = groups - full;
  const int64_t tiles = (m1 - m0 + kAmxRows - 1) / kAmxRows;
  uint32_t* pa = amx_scratch.get(tiles * kAmxRows * ld);
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t r0 = m0 + t * kAmxRows, rows = min64(kAmxRows, m1 - r0);
    uint32_t* dst = pa + t * kAmxRows * ld;
    T::pack_rows(x + r0 * ldx, ldx, rows, w.k, ld, dst);
    std::memset(dst + rows * ld, 0, static_cast<size_t>((kAmxRows - rows) * ld) * sizeof(uint32_t));
  }
  alignas(64) float ct[kAmxRows * kPanel];
  alignas(64) uint32_t btail[kAmxPairs * kPanel];
  const int64_t sa = ld * 4, sb = kPanel * 4;
  T::begin();
  // View column j is lane col0 + j of the panels counted from w.data.
  const int64_t l_begin = w.col0 + n0, l_end = w.col0 + n1;
  for (int64_t p = l_begin / kPanel; p * kPanel < l_end; ++p) {
    const int64_t lo = max64(l_begin, p * kPanel) - p * kPanel, hi = min64(l_end, (p + 1) * kPanel) - p * kPanel;
    const int64_t j0 = p * kPanel - w.col0;  // the view column of the panel's lane 0 (< 0 only when lo > 0)
    const uint32_t* b = w.data + p * groups * kPanel;
    if (tail > 0) {
      std::memcpy(btail, b + full * kPanel, static_cast<size_t>(tail * kPanel) * sizeof(uint32_t));
      std::memset(btail + tail * kPanel, 0, static_cast<size_t>((kAmxPairs - tail) * kPanel) * sizeof(uint32_t));
    }
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t r0 = m0 + t * kAmxRows, rows = min64(kAmxRows, m1 - r0);
      const uint32_t* a = pa + t * kAmxRows * ld;
      T::zero_c();
      for (int64_t g0 = 0; g0 < full; g0 += kAmxPairs)
        T::step(a + g0, a + 16 * ld + g0, sa, b + g0 * kPanel, b + g0 * kPanel + 16, sb);
      if (tail > 0) T::step(a + full, a + 16 * ld + full, sa, btail, btail + 16, sb);
      T::store_c(ct);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t l = lo; l < hi; ++l) {
          const float v = ct[r * kPanel + l];
          c[(r0 + r) * ldc + j0 + l] = bias ? v + bias[j0 + l] : v;
        }
    }
  }
  T::end();
}

}  // namespace
}  // namespace qkv::kernels::detail
