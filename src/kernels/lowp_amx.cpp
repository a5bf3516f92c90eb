// The packed bf16 and int8 products on AMX tiles (qkv/kernels/lowp.h, amx::): lowp_amx_impl.h's walk over the
// hardware's tile unit, and (amx_emulated_tiles::, for tests on any AVX-512 CPU) over the emulated one, both with
// this file's AVX-512 row work; and the fused attention's bf16 products on the same two tile units (flash::, the
// amx and amx-emulated sets of attention_flash_avx512bf16.cpp). The tile instructions are written as inline
// assembly with a memory clobber (the compiler's _tile_loadd declares no memory read, and _tile_loadconfig only the
// first 8 bytes of the configuration); the activation rows are rounded and paired with bf16_round16_hi (the bits of every other path).
// Compiled with the AVX-512 flags; amx:: runs only when active_isa() is amx, which the CPU probe sets only once
// Linux has granted this process the tile data. Each call configures the tiles on its thread and releases them
// before returning.
#include <immintrin.h>

#include <cstring>

#include "attention_flash_kernels.h"
#include "lowp_amx_impl.h"
#include "lowp_avx512_impl.h"
#include "micro.h"
#include "qkv/kernels/lowp.h"

namespace qkv::kernels {
namespace {

// Palette 1: tiles 0-7 each 16 rows of 64 bytes (the layout of the 64-byte LDTILECFG operand).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

struct HardwareTiles {
  static void begin() {
    const TileConfig cfg;
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
  }
  static void end() { __asm__ volatile("tilerelease" ::: "memory"); }
  static void zero_c() {
    __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::: "memory");
  }
  // tmm4, tmm5 = A rows at a0, a1; tmm6, tmm7 = B rows at b0, b1 (16 rows of 64 bytes, strides in bytes).
  static void load_ab(const uint32_t* a0, const uint32_t* a1, int64_t sa, const uint32_t* b0, const uint32_t* b1,
                      int64_t sb) {
    __asm__ volatile(
        "tileloadd (%0,%4,1), %%tmm4\n\t"
        "tileloadd (%1,%4,1), %%tmm5\n\t"
        "tileloadd (%2,%5,1), %%tmm6\n\t"
        "tileloadd (%3,%5,1), %%tmm7"
        :
        : "r"(a0), "r"(a1), "r"(b0), "r"(b1), "r"(sa), "r"(sb)
        : "memory");
  }
  // AT&T operand order: tdp* %tmmB, %tmmA, %tmmC computes C += A · B.
  static void step_bf16(const uint32_t* a0, const uint32_t* a1, int64_t sa, const uint32_t* b0, const uint32_t* b1,
                        int64_t sb) {
    load_ab(a0, a1, sa, b0, b1, sb);
    __asm__ volatile(
        "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\ttdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\ttdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::: "memory");
  }
  static void step_int8(const uint32_t* a0, const uint32_t* a1, int64_t sa, const uint32_t* b0, const uint32_t* b1,
                        int64_t sb) {
    load_ab(a0, a1, sa, b0, b1, sb);
    __asm__ volatile(
        "tdpbusd %%tmm6, %%tmm4, %%tmm0\n\ttdpbusd %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpbusd %%tmm6, %%tmm5, %%tmm2\n\ttdpbusd %%tmm7, %%tmm5, %%tmm3" ::: "memory");
  }
  static void store_c(void* ct) {
    uint32_t* o = static_cast<uint32_t*>(ct);
    const int64_t s = 32 * 4;
    __asm__ volatile(
        "tilestored %%tmm0, (%0,%4,1)\n\t"
        "tilestored %%tmm1, (%1,%4,1)\n\t"
        "tilestored %%tmm2, (%2,%4,1)\n\t"
        "tilestored %%tmm3, (%3,%4,1)"
        :
        : "r"(o), "r"(o + 16), "r"(o + 16 * 32), "r"(o + 16 * 32 + 16), "r"(s)
        : "memory");
  }
};

// The per-call row work with AVX-512 (detail::LaneRows over these lanes): the bits of detail::ScalarRows.
struct Avx512Lanes : detail::Lanes512 {
  static I bf16_pairs(const float* x, int64_t count) { return detail::bf16_pairs32(x, count); }
  // Word i of dst's row q (rows ld_dst apart, q < 16, i < 16) = a[i ld + q] for i < n and q < m, zero elsewhere.
  static void transposed(const uint32_t* a, int64_t ld, int64_t n, int64_t m, uint32_t* dst, int64_t ld_dst) {
    __m512 x[16];
    detail::load_transposed(reinterpret_cast<const float*>(a), ld, n, m, x);
    for (int64_t i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ld_dst, x[i]);
  }
};
using Avx512Rows = detail::LaneRows<Avx512Lanes>;

}  // namespace

namespace amx {
void gemm_bf16_packed_block(const float* x, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                            int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  detail::amx_bf16_block<HardwareTiles, Avx512Rows>(x, ldx, w, bias, c, ldc, m0, m1, n0, n1);
}
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  detail::amx_int8_block<HardwareTiles, Avx512Rows>(a, w, bias, c, ldc, m0, m1, n0, n1);
}
}  // namespace amx

namespace amx_emulated_tiles {
void gemm_bf16_packed_block(const float* x, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                            int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  detail::amx_bf16_block<detail::EmulatedTiles, Avx512Rows>(x, ldx, w, bias, c, ldc, m0, m1, n0, n1);
}
void gemm_int8_packed_block(const Int8View& a, const PackedBView& w, const float* bias, float* c, int64_t ldc,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  detail::amx_int8_block<detail::EmulatedTiles, Avx512Rows>(a, w, bias, c, ldc, m0, m1, n0, n1);
}
}  // namespace amx_emulated_tiles

namespace flash {
void gemm_bf16_amx(const GemmBf16& g) {
  detail::amx_pairs_product<HardwareTiles, Avx512Rows>(g.rows, g.cols, g.depth, g.a, g.a_rs, g.a_ks, g.b, g.b_ks,
                                                       g.c, g.c_rs, g.row_scale, g.accumulate, g.scale);
}
void gemm_bf16_amx_emulated(const GemmBf16& g) {
  detail::amx_pairs_product<detail::EmulatedTiles, Avx512Rows>(g.rows, g.cols, g.depth, g.a, g.a_rs, g.a_ks, g.b,
                                                               g.b_ks, g.c, g.c_rs, g.row_scale, g.accumulate, g.scale);
}
}  // namespace flash

}  // namespace qkv::kernels
