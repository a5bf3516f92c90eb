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

// The per-call row work with AVX-512: the bits of detail::ScalarRows.
struct Avx512Rows {
  static void pack_bf16(const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t ld, uint32_t* dst) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * ldx;
      for (int64_t g0 = 0; g0 < ld; g0 += 16)  // 32 floats (k = 2 g0 ..) -> 16 words; past k zero
        _mm512_storeu_si512(dst + r * ld + g0, detail::bf16_pairs32(xr + 2 * g0, k - 2 * g0));
    }
  }
  static void pack_int8(const int16_t* q, int64_t ldq, int64_t rows, int64_t words, uint32_t* dst) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g0 = 0; g0 < words; g0 += 16)  // 64 values -> 16 words (words is a multiple of 16)
        detail::Lanes512::int8_quads(q + r * ldq + 4 * g0, dst + r * words + g0);
  }
  // amx_pairs_product's copies and block stores (ScalarRows' contract and bits). A in rows (a_ks 1) is copied row
  // by row; A in columns (a_rs 1: P·V's probabilities, paired along keys) is transposed 16 x 16 words at a time.
  static void pairs_a(const uint32_t* a, int64_t a_rs, int64_t a_ks, int64_t rows, int64_t depth, int64_t rows_padded,
                      int64_t kw, uint32_t* dst) {
    if (a_ks != 1 && a_rs != 1) {
      detail::ScalarRows::pairs_a(a, a_rs, a_ks, rows, depth, rows_padded, kw, dst);
      return;
    }
    if (a_ks == 1) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k0 = 0; k0 < kw; k0 += 16)
          _mm512_storeu_si512(dst + r * kw + k0,
                              _mm512_maskz_loadu_epi32(detail::lanes(depth - k0), a + r * a_rs + k0));
    } else {
      for (int64_t r0 = 0; r0 < rows; r0 += 16)
        for (int64_t k0 = 0; k0 < kw; k0 += 16) {
          __m512 x[16];
          detail::load_transposed(reinterpret_cast<const float*>(a + k0 * a_ks + r0), a_ks, depth - k0, rows - r0, x);
          for (int64_t i = 0; i < 16; ++i) _mm512_storeu_ps(dst + (r0 + i) * kw + k0, x[i]);
        }
    }
    const int64_t done = a_ks == 1 ? rows : (rows + 15) / 16 * 16;  // the transposed rows past rows are zeros
    std::memset(dst + done * kw, 0, static_cast<size_t>((rows_padded - done) * kw) * sizeof(uint32_t));
  }
  static void pairs_b(const uint32_t* b, int64_t b_ks, int64_t cols, int64_t depth, int64_t panels, int64_t kw,
                      uint32_t* dst) {
    for (int64_t p = 0; p < panels; ++p) {
      const __mmask16 m0 = detail::lanes(cols - p * 32), m1 = detail::lanes(cols - p * 32 - 16);
      for (int64_t k = 0; k < kw; ++k) {
        uint32_t* o = dst + (p * kw + k) * 32;
        const uint32_t* x = b + k * b_ks + p * 32;
        const bool in = k < depth;
        _mm512_storeu_si512(o, in ? _mm512_maskz_loadu_epi32(m0, x) : _mm512_setzero_si512());
        _mm512_storeu_si512(o + 16, in ? _mm512_maskz_loadu_epi32(m1, x + 16) : _mm512_setzero_si512());
      }
    }
  }
  static void pairs_c(const float* ct, int64_t rows, int64_t cols, float* y, int64_t ys, const float* row_scale,
                      bool accumulate, float scale) {
    const __mmask16 m0 = detail::lanes(cols), m1 = detail::lanes(cols - 16);
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < rows; ++r) {
      float* yr = y + r * ys;
      const __m512 s = _mm512_set1_ps(row_scale != nullptr ? row_scale[r] : 1.0f);
      for (int v = 0; v < 2; ++v) {
        const __mmask16 m = v == 0 ? m0 : m1;
        if (m == 0) continue;
        const __m512 x = _mm512_load_ps(ct + r * 32 + 16 * v);
        const __m512 out = accumulate ? _mm512_add_ps(_mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, yr + 16 * v)), x)
                                      : _mm512_mul_ps(x, sc);
        _mm512_mask_storeu_ps(yr + 16 * v, m, out);
      }
    }
  }
  static void int8_block(const int32_t* ci, const int32_t* colsum, const float* row_scale, int64_t scale_stride,
                         int64_t rows, float* f) {
    const __m512i c0 = _mm512_slli_epi32(_mm512_loadu_si512(colsum), 7);
    const __m512i c1 = _mm512_slli_epi32(_mm512_loadu_si512(colsum + 16), 7);
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 sa = _mm512_set1_ps(row_scale[r * scale_stride]);
      float* fr = f + r * 32;
      const int32_t* cr = ci + r * 32;
      _mm512_storeu_ps(fr, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(cr), c0)), sa,
                                           _mm512_loadu_ps(fr)));
      _mm512_storeu_ps(fr + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(cr + 16), c1)),
                                                sa, _mm512_loadu_ps(fr + 16)));
    }
  }
};

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
