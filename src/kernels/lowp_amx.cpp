// The packed bfloat16 product on AMX tiles (qkv/kernels/lowp.h, amx::gemm_bf16_packed_block): lowp_amx_impl.h's
// walk over the hardware's tile unit. The tile instructions are written as inline assembly with a memory clobber
// (the compiler's _tile_loadd declares no memory read, and _tile_loadconfig only the first 8 bytes of the
// configuration), and the activation rows are rounded and paired with AVX-512 (bf16_round16_hi: the bits of every
// other path). Compiled with the AVX-512 flags; runs only when active_isa() is amx, which the CPU probe sets only
// once Linux has granted this process the tile data. Each call configures the tiles on its thread and releases
// them before returning.
#include <immintrin.h>

#include "lowp_amx_impl.h"
#include "lowp_avx512_impl.h"
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

inline __mmask16 lanes(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF)
                     : static_cast<__mmask16>((1u << detail::max64(count, 0)) - 1u);
}

struct HardwareTiles {
  static void begin() {
    const TileConfig cfg;
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
  }
  static void end() { __asm__ volatile("tilerelease" ::: "memory"); }
  static void zero_c() { __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::: "memory"); }
  static void step(const uint32_t* a0, const uint32_t* a1, int64_t sa, const uint32_t* b0, const uint32_t* b1,
                   int64_t sb) {
    // tdpbf16ps %tmmB, %tmmA, %tmmC: C += A · B (AT&T order: the B tile first).
    __asm__ volatile(
        "tileloadd (%0,%4,1), %%tmm4\n\t"
        "tileloadd (%1,%4,1), %%tmm5\n\t"
        "tileloadd (%2,%5,1), %%tmm6\n\t"
        "tileloadd (%3,%5,1), %%tmm7\n\t"
        "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"
        "tdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"
        "tdpbf16ps %%tmm7, %%tmm5, %%tmm3"
        :
        : "r"(a0), "r"(a1), "r"(b0), "r"(b1), "r"(sa), "r"(sb)
        : "memory");
  }
  static void store_c(float* ct) {
    const int64_t s = 32 * 4;
    __asm__ volatile(
        "tilestored %%tmm0, (%0,%4,1)\n\t"
        "tilestored %%tmm1, (%1,%4,1)\n\t"
        "tilestored %%tmm2, (%2,%4,1)\n\t"
        "tilestored %%tmm3, (%3,%4,1)"
        :
        : "r"(ct), "r"(ct + 16), "r"(ct + 16 * 32), "r"(ct + 16 * 32 + 16), "r"(s)
        : "memory");
  }
  static void pack_rows(const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t ld, uint32_t* dst) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * ldx;
      for (int64_t g0 = 0; g0 < ld; g0 += 16) {  // 32 floats (k = 2 g0 ..) -> 16 words; past k zero
        const int64_t k0 = 2 * g0;
        const __m512i lo = detail::bf16_round16_hi(_mm512_maskz_loadu_ps(lanes(k - k0), xr + k0));
        const __m512i hi = detail::bf16_round16_hi(_mm512_maskz_loadu_ps(lanes(k - k0 - 16), xr + k0 + 16));
        _mm512_storeu_si512(dst + r * ld + g0, detail::bf16_adjacent_pairs(lo, hi));
      }
    }
  }
};

}  // namespace

namespace amx {
void gemm_bf16_packed_block(const float* x, int64_t ldx, const PackedBView& w, const float* bias, float* c,
                            int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  detail::amx_bf16_block<HardwareTiles>(x, ldx, w, bias, c, ldc, m0, m1, n0, n1);
}
}  // namespace amx

}  // namespace qkv::kernels
