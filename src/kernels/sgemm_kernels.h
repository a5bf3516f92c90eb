// Private interface between the sgemm driver (sgemm.cpp: checks, blocking, threading) and its AVX-512 building
// blocks (sgemm_avx512.cpp: panel packing for both layouts of A and B, the 14x32 microkernel over packed panels).
// The packed low-precision products (lowp.cpp) cut their work with the same choose_split.
#pragma once

#include <cstdint>

#include "qkv/kernels/sgemm.h"

namespace qkv::kernels::avx512 {

// Microkernel tile: kMR rows of C (one broadcast of A each) by kNR columns (two zmm registers) = 28 accumulators.
inline constexpr int64_t kMR = 14;
inline constexpr int64_t kNR = kSgemmPanel;

// Packs the (mc, kc) block of op(A) whose top-left element is `a` (A(i, p) = a[i*lda + p], or a[p*lda + i] when
// trans) into ceil(mc/kMR) panels of kMR*kc floats; panel r holds rows r*kMR.. as dst[p*kMR + i]. Rows past mc
// are zero.
void pack_a(bool trans, const float* a, int64_t lda, int64_t mc, int64_t kc, float* dst);

// Packs the (kc, nc) block of op(B) whose top-left element is `b` (B(p, j) = b[p*ldb + j], or b[j*ldb + p] when
// trans) into ceil(nc/kNR) panels of kc*kNR floats; panel s holds columns s*kNR.. as dst[p*kNR + j]. Columns past
// nc are zero.
void pack_b(bool trans, const float* b, int64_t ldb, int64_t kc, int64_t nc, float* dst);

// C (mc, nc) = alpha · packedA · packedB + beta · C (C not read when beta == 0), kMR x kNR tiles.
void macro_kernel(int64_t mc, int64_t nc, int64_t kc, float alpha, const float* pa, const float* pb, float beta,
                  float* c, int64_t ldc);

// One row times op(B), for columns [j0, j1): c[j] = alpha * Σ_p a[p] · op(B)(p, j) + beta * c[j] (c not read when
// beta == 0), a contiguous (k floats). op(B) as for pack_b. Each c[j] is summed in an order fixed by k alone, so
// any split of the columns gives the same bits.
void gemv(bool trans, int64_t k, float alpha, const float* a, const float* b, int64_t ldb, float beta, float* c,
          int64_t j0, int64_t j1);

}  // namespace qkv::kernels::avx512

namespace qkv::kernels {

// Multiply-adds per thread started: smaller products run on fewer threads (never changes the results).
inline constexpr double kWorkPerThread = double(1 << 21);

// How an (m rows, n_panels panels of kNR columns) product is cut into work items for `threads` threads: M blocks
// of mc rows (a multiple of kMR, <= mc_max) times n_splits shares of the panels. Picks the cut whose busiest thread
// has the fewest tiles; on ties, fewer items (less repacking of A). threads <= 1: one share, the fewest M blocks.
struct Split {
  int64_t mc = avx512::kMR;
  int64_t n_splits = 1;
};
Split choose_split(int64_t m, int64_t n_panels, int threads, int64_t mc_max);

}  // namespace qkv::kernels
