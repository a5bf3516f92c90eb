// Private (not installed): the packed int8 product (qkv/kernels/lowp.h) written once over micro.h's lane traits: the
// activation rows packed L::kW words at a time (L::int8_quads), then micro.h's microkernel with u8·s8 quads in
// register blocks of kRows rows by 2 vectors. Built by lowp_avx512.cpp (16 lanes, vpdpbusd zmm), lowp_avxvnni.cpp
// (8 lanes, vpdpbusd ymm) and lowp_avx2.cpp (8 lanes, the quads widened to int16 pairs for vpmaddwd), each with its
// own flags and its own internal copy. Include only from those units.
#pragma once

#include "lowp_packed_impl.h"
#include "micro.h"
#include "qkv/kernels/lowp.h"

namespace qkv::kernels::detail {
namespace {

// Rows [0, rows) of int8 rows (int16 values, zero past cols; ld a multiple of 64) as [group][kPackedRows] words of
// 4 bytes q + 128.
template <class L>
void pack_a_int8(const int16_t* q, int64_t ld, int64_t rows, int64_t groups, uint32_t* dst) {
  alignas(64) uint32_t words[L::kW];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g0 = 0; g0 < groups; g0 += L::kW) {  // 4 kW values -> kW words (groups is a multiple of 16)
      L::int8_quads(q + r * ld + 4 * g0, words);
      for (int64_t g = 0; g < min64(L::kW, groups - g0); ++g) dst[(g0 + g) * kPackedRows + r] = words[g];
    }
}

// gemm_int8_packed_block's contract in register blocks of kRows rows by 2 vectors.
template <class L, int kRows>
void int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc, int64_t m0,
                       int64_t m1, int64_t n0, int64_t n1) {
  using Out = Int8Out<L>;
  const int64_t blocks = a.groups();
  run_packed_block(
      w, bias, c, ldc, m0, m1, n0, n1,
      [](int64_t rows, int64_t groups, const uint32_t* pa, const uint32_t* b, float* c, int64_t ldc, const Out& out,
         int64_t n) { micro_tile<L, kRows, 2, QuadsU8S8, Int8Out>(rows, groups, pa, kPackedRows, b, c, ldc, out, n); },
      [&](int64_t r0, int64_t rows, uint32_t* dst) { pack_a_int8<L>(a.q + r0 * a.ld, a.ld, rows, w.groups, dst); },
      [&](int64_t p, int64_t r0, const float* b) {
        return Out{b, w.colsum + p * blocks * kPanel, w.scale + p * kPanel, a.scale + r0 * blocks, blocks};
      });
}

}  // namespace
}  // namespace qkv::kernels::detail
