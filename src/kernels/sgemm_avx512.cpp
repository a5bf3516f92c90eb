// AVX-512 building blocks of qkv's sgemm: panel packing for both layouts of A and B (16x16 register transposes
// for the strided ones), the GEMV, and the 14x32 tiles of micro.h's microkernel (fp32 FMA on 16 lanes, masked
// edges). Driver: sgemm.cpp.
#include <immintrin.h>

#include <algorithm>

#include "micro.h"
#include "sgemm_kernels.h"

namespace qkv::kernels::avx512 {
namespace {

using L = detail::Lanes512;
inline __mmask16 lanes(int64_t count) { return L::tail(count); }

static_assert(kMR == 14 && kNR == kPanel, "sgemm's tiles are 14 rows by one 32-column panel");

}  // namespace

void pack_a(bool trans, const float* a, int64_t lda, int64_t mc, int64_t kc, float* dst) {
  const __mmask16 tile = lanes(kMR);
  for (int64_t i0 = 0; i0 < mc; i0 += kMR, dst += kMR * kc) {
    const int64_t rows = std::min(kMR, mc - i0);
    if (trans) {
      // A(i, p) = a[p*lda + i]: each k step is a contiguous run of rows.
      const __mmask16 rm = lanes(rows);
      for (int64_t p = 0; p < kc; ++p)
        _mm512_mask_storeu_ps(dst + p * kMR, tile, _mm512_maskz_loadu_ps(rm, a + p * lda + i0));
    } else {
      // A(i, p) = a[i*lda + p]: 16x16 transposes of (rows, 16 k steps).
      for (int64_t p0 = 0; p0 < kc; p0 += 16) {
        const int64_t w = std::min<int64_t>(16, kc - p0);
        __m512 t[16];
        detail::load_transposed(a + i0 * lda + p0, lda, rows, w, t);
        for (int64_t q = 0; q < w; ++q) _mm512_mask_storeu_ps(dst + (p0 + q) * kMR, tile, t[q]);
      }
    }
  }
}

void pack_b(bool trans, const float* b, int64_t ldb, int64_t kc, int64_t nc, float* dst) {
  for (int64_t j0 = 0; j0 < nc; j0 += kNR, dst += kNR * kc) {
    const int64_t w = std::min(kNR, nc - j0);
    if (!trans) {
      // B(p, j) = b[p*ldb + j]: each k step is a contiguous run of columns.
      const __mmask16 m0 = lanes(w), m1 = lanes(w - 16);
      for (int64_t p = 0; p < kc; ++p) {
        _mm512_store_ps(dst + p * kNR, _mm512_maskz_loadu_ps(m0, b + p * ldb + j0));
        _mm512_store_ps(dst + p * kNR + 16, _mm512_maskz_loadu_ps(m1, b + p * ldb + j0 + 16));
      }
    } else {
      // B(p, j) = b[j*ldb + p]: 16x16 transposes of (16 columns, 16 k steps), two halves per panel.
      for (int64_t h = 0; h < 2; ++h) {
        const int64_t cols = std::clamp<int64_t>(w - 16 * h, 0, 16);
        for (int64_t p0 = 0; p0 < kc; p0 += 16) {
          const int64_t pw = std::min<int64_t>(16, kc - p0);
          __m512 t[16];
          detail::load_transposed(b + (j0 + 16 * h) * ldb + p0, ldb, cols, pw, t);
          for (int64_t q = 0; q < pw; ++q) _mm512_store_ps(dst + (p0 + q) * kNR + 16 * h, t[q]);
        }
      }
    }
  }
}

void macro_kernel(int64_t mc, int64_t nc, int64_t kc, float alpha, const float* pa, const float* pb, float beta,
                  float* c, int64_t ldc) {
  const detail::ScaleOut<L> out{alpha, beta};
  for (int64_t j0 = 0; j0 < nc; j0 += kNR)
    for (int64_t i0 = 0; i0 < mc; i0 += kMR)
      detail::micro_tile<detail::Lanes512, kMR, 2, detail::FmaF32, detail::ScaleOut>(
          std::min(kMR, mc - i0), kc, pa + i0 * kc, kMR, pb + j0 * kc, c + i0 * ldc + j0, ldc, out,
          std::min(kNR, nc - j0));
}

void gemv(bool trans, int64_t k, float alpha, const float* a, const float* b, int64_t ldb, float beta, float* c,
          int64_t j0, int64_t j1) {
  if (trans) {  // B(p, j) = b[j*ldb + p]: one dot product per column, four partial sums over k
    // R columns at once: each x load serves R rows of B, and R rows stream from memory side by side. Every column's
    // partial sums, tail and final reduction are those of one column alone, so R does not change the bits.
    // Rows shorter than 16 KiB go one at a time: the hardware prefetcher follows one long stream through adjacent
    // rows, and four interleaved 3-8 KiB streams read DRAM 20-35 % slower (Zen 4: 768-float rows 33 against
    // 21 GB/s, 2048 even); from 4096 floats on, four rows side by side read 10-20 % faster.
    constexpr int64_t kLongRow = 4096;
    const auto columns = [&]<int R>(int64_t j) {
      const float* row[R];
      __m512 s[R][4];
      for (int r = 0; r < R; ++r) {
        row[r] = b + (j + r) * ldb;
        for (int q = 0; q < 4; ++q) s[r][q] = _mm512_setzero_ps();
      }
      int64_t p = 0;
      for (; p + 64 <= k; p += 64)
        for (int q = 0; q < 4; ++q) {
          const __m512 x = _mm512_loadu_ps(a + p + 16 * q);
          for (int r = 0; r < R; ++r) s[r][q] = _mm512_fmadd_ps(x, _mm512_loadu_ps(row[r] + p + 16 * q), s[r][q]);
        }
      for (; p < k; p += 16) {
        const __mmask16 m = lanes(k - p);
        const __m512 x = _mm512_maskz_loadu_ps(m, a + p);
        for (int r = 0; r < R; ++r) s[r][0] = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(m, row[r] + p), s[r][0]);
      }
      for (int r = 0; r < R; ++r) {
        const float dot = L::hsum(_mm512_add_ps(_mm512_add_ps(s[r][0], s[r][1]), _mm512_add_ps(s[r][2], s[r][3])));
        c[j + r] = beta == 0.0f ? alpha * dot : alpha * dot + beta * c[j + r];
      }
    };
    int64_t j = j0;
    if (k >= kLongRow)
      for (; j + 4 <= j1; j += 4) columns.template operator()<4>(j);
    for (; j < j1; ++j) columns.template operator()<1>(j);
    return;
  }
  // B(p, j) = b[p*ldb + j]: 64 columns at a time, rows of B streamed in k order; micro.h's sgemm epilogue.
  const detail::ScaleOut<L> out{alpha, beta};
  for (int64_t jb = j0; jb < j1; jb += 64) {
    const int64_t w = std::min<int64_t>(64, j1 - jb);
    const __mmask16 m0 = lanes(w), m1 = lanes(w - 16), m2 = lanes(w - 32), m3 = lanes(w - 48);
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    const float* col = b + jb;
    for (int64_t p = 0; p < k; ++p, col += ldb) {
      const __m512 av = _mm512_set1_ps(a[p]);
      s0 = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m0, col), s0);
      s1 = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m1, col + 16), s1);
      s2 = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m2, col + 32), s2);
      s3 = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m3, col + 48), s3);
    }
    out.store(s0, 0, c + jb, m0);
    if (w > 16) out.store(s1, 1, c + jb + 16, m1);
    if (w > 32) out.store(s2, 2, c + jb + 32, m2);
    if (w > 48) out.store(s3, 3, c + jb + 48, m3);
  }
}

}  // namespace qkv::kernels::avx512
