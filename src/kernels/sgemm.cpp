// sgemm driver: argument checks, the OpenBLAS reference, the run-time choice of backend, and the GotoBLAS/BLIS
// loop nest (NC, KC, MC cache blocks over packed panels) with OpenMP over independent blocks of C.
#include "qkv/kernels/sgemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/core/storage_pool.h"
#include "qkv/kernels/cpu.h"
#include "qkv/kernels/grad.h"
#include "sgemm_kernels.h"

namespace qkv::kernels {
namespace {

using avx512::kMR;
using avx512::kNR;

// Cache blocks (Zen 4/5: L1d 48 KiB, L2 1 MiB per core, L3 32 MiB). A kc x kNR panel of B (<= 48 KiB) stays in L1
// while the mc x kc block of A (<= 516 KiB) streams from L2; the kc x nc block of B (<= 6 MiB) lives in L3.
// kc = 384 rather than 256 saves a pass over C when K is 384 (MiniLM) and measured 2-10% faster there; 512 was
// no better. K blocks are balanced (k = 600 gives two of 300).
constexpr int64_t kKcMax = 384;
constexpr int64_t kMcMax = 24 * kMR;
constexpr int64_t kNcMax = 128 * kNR;
// Below this many multiply-adds OpenBLAS wins (measured 1 thread: 0.5x at 16^3, 0.85x at 32^3, 1.0x at 48^3,
// 1.45x at 64^3); skinny products (m = 1..14 rows, n = 1024, k = 512) are already 1.2-2x faster here.
constexpr double kSmallWork = 48.0 * 48.0 * 48.0;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_args(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, const float* c, int64_t ldc) {
  QKV_CHECK_ARG(m >= 0 && n >= 0 && k >= 0, "[sgemm] sizes must be >= 0, got m ", m, " n ", n, " k ", k);
  const int64_t a_cols = ta ? m : k, b_cols = tb ? k : n;
  QKV_CHECK_ARG(lda >= std::max<int64_t>(1, a_cols), "[sgemm] lda ", lda, " is less than max(1, ", a_cols,
                ") for ", ta ? "transposed " : "", "A of m ", m, " k ", k);
  QKV_CHECK_ARG(ldb >= std::max<int64_t>(1, b_cols), "[sgemm] ldb ", ldb, " is less than max(1, ", b_cols,
                ") for ", tb ? "transposed " : "", "B of k ", k, " n ", n);
  QKV_CHECK_ARG(ldc >= std::max<int64_t>(1, n), "[sgemm] ldc ", ldc, " is less than max(1, ", n, ") for C of m ",
                m, " n ", n);
  QKV_CHECK_ARG(c != nullptr || m == 0 || n == 0, "[sgemm] C is null for m ", m, " n ", n);
  QKV_CHECK_ARG((a != nullptr && b != nullptr) || m == 0 || n == 0 || k == 0, "[sgemm] A or B is null for m ", m,
                " n ", n, " k ", k);
}

// C = beta * C without reading C when beta == 0 (k == 0 or alpha == 0).
void scale_c(int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (beta == 0.0f) std::fill_n(row, n, 0.0f);
    else if (beta != 1.0f)
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
  }
}

void cblas_call(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t v : {m, n, k, lda, ldb, ldc})
    QKV_CHECK_RUNTIME(v <= INT_MAX, "[sgemm] size ", v, " exceeds the BLAS int range");
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
              beta, c, static_cast<int>(ldc));
}

// A 64-byte aligned float buffer that only grows: each calling thread keeps one for its packed blocks.
struct Buffer {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data;
  int64_t size = 0;
  float* get(int64_t n) {
    if (n > size) {
      const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
      data.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      size = data != nullptr ? n : 0;
      QKV_CHECK_RUNTIME(data != nullptr, "[sgemm] cannot allocate ", bytes, " bytes of packing buffer");
    }
    return data.get();
  }
};

float* workspace(int64_t floats) {
  thread_local Buffer buf;
  return buf.get(floats);
}

// K blocks: as even as possible, at most kKcMax. They depend on k alone (sgemm_pack_b packs in the same blocks).
int64_t kc_of(int64_t k) { return ceil_div(k, ceil_div(k, kKcMax)); }

// Where a K block of a pre-packed op(B) begins: the blocks before it hold pc rows of every panel.
const float* packed_block(const SgemmPackedB& pre, int64_t pc) {
  return pre.data.get() + pc * ceil_div(pre.n, kNR) * kNR;
}

// The loop nest over packed blocks. K blocks depend only on k, so each C element sees the same sequence of
// operations whatever the thread count and the M/N blocking. pre: op(B) pre-packed, its column `pre_col0` (a
// multiple of kNR) being op(B)'s column 0; null: B is packed here, per call.
void run_avx512(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const SgemmPackedB* pre,
                int64_t pre_col0) {
  const int64_t kc_size = kc_of(k);
  const int64_t nc_size = std::min(kNcMax, ceil_div(n, kNR) * kNR);

  const double work = double(m) * double(n) * double(k);
  int threads = 1;
  if (!omp_in_parallel())
    threads = static_cast<int>(std::clamp<double>(work / kWorkPerThread, 1.0, double(omp_get_max_threads())));
  const int64_t n_panels_max = ceil_div(nc_size, kNR);
  const Split split = choose_split(m, n_panels_max, threads, kMcMax);
  const int64_t mc_size = split.mc, m_blocks = ceil_div(m, mc_size), n_splits = split.n_splits;
  threads = static_cast<int>(std::min<int64_t>(threads, m_blocks * n_splits));

  // One allocation, made before the parallel region (nothing may throw inside it): the shared B block, then one
  // A block per thread, each 64-byte aligned (kc·nc and the A stride are multiples of 16 floats).
  const int64_t a_stride = ceil_div(mc_size * kc_size, 16) * 16;
  const int64_t b_floats = pre != nullptr ? 0 : kc_size * nc_size;
  float* const pb = workspace(b_floats + threads * a_stride);

#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    for (int64_t jc = 0; jc < n; jc += nc_size) {
      const int64_t nc = std::min(nc_size, n - jc);
      const int64_t n_panels = ceil_div(nc, kNR);
      const int64_t panels_per_split = ceil_div(n_panels, n_splits);
      for (int64_t pc = 0; pc < k; pc += kc_size) {
        const int64_t kc = std::min(kc_size, k - pc);
        const float beta_here = pc == 0 ? beta : 1.0f;
        // B(pc.., jc..): pre-packed, or packed here cooperatively, one kNR panel per item.
        const float* bblk = pre != nullptr ? packed_block(*pre, pc) + (pre_col0 + jc) * kc : pb;
        if (pre == nullptr) {
#pragma omp for schedule(static)
          for (int64_t s = 0; s < n_panels; ++s) {
            const int64_t j = jc + s * kNR;
            const float* src = tb ? b + j * ldb + pc : b + pc * ldb + j;
            avx512::pack_b(tb, src, ldb, kc, std::min(kNR, n - j), pb + s * kNR * kc);
          }
        }
        // Each item: one M block times one share of the N block's panels.
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < m_blocks * n_splits; ++item) {
          const int64_t ib = item / n_splits, sp = item % n_splits;
          const int64_t i0 = ib * mc_size, mc = std::min(mc_size, m - i0);
          const int64_t s0 = sp * panels_per_split, s1 = std::min(n_panels, s0 + panels_per_split);
          if (s0 >= s1) continue;
          float* const pa = pb + b_floats + omp_get_thread_num() * a_stride;
          const float* src = ta ? a + pc * lda + i0 : a + i0 * lda + pc;
          avx512::pack_a(ta, src, lda, mc, kc, pa);
          const int64_t j0 = s0 * kNR, ncs = std::min(nc, s1 * kNR) - j0;
          avx512::macro_kernel(mc, ncs, kc, alpha, pa, bblk + s0 * kNR * kc, beta_here, c + i0 * ldc + jc + j0,
                               ldc);
        }
      }
    }
  }
}

bool force_openblas() {
  static const bool forced = [] {
    const char* v = std::getenv("QKV_SGEMM");
    return v != nullptr && std::strcmp(v, "openblas") == 0;
  }();
  return forced;
}

}  // namespace

Split choose_split(int64_t m, int64_t n_panels, int threads, int64_t mc_max) {
  const int64_t m_panels = ceil_div(m, kMR), mb_min = ceil_div(m, mc_max);
  Split best;
  best.mc = ceil_div(m_panels, mb_min) * kMR;
  if (threads <= 1) return best;
  int64_t best_cost = INT64_MAX, best_items = INT64_MAX;
  for (int64_t mb = mb_min; mb <= std::min(m_panels, mb_min + threads); ++mb) {
    const int64_t mc_panels = ceil_div(m_panels, mb), blocks = ceil_div(m_panels, mc_panels);
    for (int64_t ns = 1; ns <= std::min<int64_t>(threads, n_panels); ++ns) {
      const int64_t items = blocks * ns;
      const int64_t cost = ceil_div(items, threads) * mc_panels * ceil_div(n_panels, ns);
      if (cost < best_cost || (cost == best_cost && items < best_items)) {
        best_cost = cost;
        best_items = items;
        best.mc = mc_panels * kMR;
        best.n_splits = ns;
      }
    }
  }
  return best;
}

bool sgemm_avx512_supported() { return cpu_supports(Isa::kAvx512); }

const char* sgemm_backend() { return active_isa() >= Isa::kAvx512 && !force_openblas() ? "avx512" : "openblas"; }

void sgemm_reference(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  check_args(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
  if (m == 0 || n == 0) return;
  cblas_call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void sgemm_avx512(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  check_args(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
  QKV_CHECK_RUNTIME(sgemm_avx512_supported(), "[sgemm] this CPU lacks AVX-512 F/BW/DQ/VL");
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    scale_c(m, n, beta, c, ldc);
    return;
  }
  run_avx512(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, nullptr, 0);
}

void sgemm_pack_b(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb, SgemmPackedB& out) {
  QKV_CHECK_ARG(n >= 0 && k >= 0 && ldb >= std::max<int64_t>(1, trans_b ? k : n) && (b != nullptr || n * k == 0),
                "[sgemm_pack_b] op(B) (", k, ", ", n, ")", trans_b ? " transposed" : "", " with ldb ", ldb,
                b == nullptr ? " and a null pointer" : "", " is not a valid operand");
  out = SgemmPackedB();
  if (std::strcmp(sgemm_backend(), "avx512") != 0 || n == 0 || k == 0) return;
  const int64_t kc_size = kc_of(k), panels = ceil_div(n, kNR);
  const size_t bytes = static_cast<size_t>(panels * kNR * k) * sizeof(float);
  float* data = static_cast<float*>(storage_pool::system_alloc(bytes));
  QKV_CHECK_RUNTIME(data != nullptr, "[sgemm_pack_b] cannot allocate ", bytes, " bytes for op(B) (", k, ", ", n, ")");
  out.data = std::shared_ptr<const float>(data, [](const float* p) { std::free(const_cast<float*>(p)); });
  out.k = k;
  out.n = n;
  for (int64_t pc = 0; pc < k; pc += kc_size) {
    const int64_t kc = std::min(kc_size, k - pc);
    float* blk = data + pc * panels * kNR;
#pragma omp parallel for schedule(static) if (panels * kc * kNR >= (int64_t{1} << 16))
    for (int64_t s = 0; s < panels; ++s) {
      const int64_t j = s * kNR;
      const float* src = trans_b ? b + j * ldb + pc : b + pc * ldb + j;
      avx512::pack_b(trans_b, src, ldb, kc, std::min(kNR, n - j), blk + s * kNR * kc);
    }
  }
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const SgemmPackedB* packed,
           int64_t packed_col0) {
  check_args(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
  if (packed != nullptr && packed->packed())
    QKV_CHECK_ARG(packed->k == k && packed_col0 >= 0 && packed_col0 % kNR == 0 && packed_col0 + n <= packed->n,
                  "[sgemm] pre-packed op(B) (", packed->k, ", ", packed->n, ") does not hold columns [", packed_col0,
                  ", ", packed_col0 + n, ") of a k ", k, " product (column 0 must be a multiple of ", kNR, ")");
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    scale_c(m, n, beta, c, ldc);
    return;
  }
  if (m == 1) {  // one row (decoding): a GEMV reads op(B) once, where a GEMM would first pack all of it
    if (std::strcmp(sgemm_backend(), "avx512") == 0) {
      // qkv's own GEMV, threaded over blocks of columns: each output is summed by one thread in an order fixed by
      // k, so the bits are the same for any thread count and block size (OpenBLAS's threaded GEMV sums an output
      // differently depending on where its split falls). Blocks of 64 columns keep two threads even on 768-wide
      // projections (256-column blocks split them 2 + 1), taken as the threads come: a thread still busy with the
      // serial work between products (norms, RoPE, attention) finds the others already reading (a decode step ran
      // 5-15 % faster than with equal static shares), in shrinking runs (guided): long contiguous reads first, and
      // single blocks at the end, where the threads wait for each other (1.00-1.04x decode against runs of two
      // blocks, five in-process A/B runs of 12-16 pairs; Zen 4).
      std::vector<float> a_row;
      const float* av = a;
      if (trans_a && lda != 1) {  // op(A) is column 0 of the (k, 1) A: strided
        a_row.resize(static_cast<size_t>(k));
        for (int64_t p = 0; p < k; ++p) a_row[static_cast<size_t>(p)] = a[p * lda];
        av = a_row.data();
      }
      constexpr int64_t kGemvBlock = 64;
      const int64_t blocks = ceil_div(n, kGemvBlock);
      const bool par = !omp_in_parallel() && blocks > 1 && double(n) * double(k) >= double(1 << 17);
#pragma omp parallel for schedule(guided) if (par)
      for (int64_t blk = 0; blk < blocks; ++blk)
        avx512::gemv(trans_b, k, alpha, av, b, ldb, beta, c, blk * kGemvBlock, std::min(n, (blk + 1) * kGemvBlock));
      return;
    }
    for (int64_t v : {n, k, lda, ldb})
      QKV_CHECK_RUNTIME(v <= INT_MAX, "[sgemm] size ", v, " exceeds the BLAS int range");
    const SmallBlasGuard guard(blas_work(m, n, k));  // the thread count of this shape, whoever calls
    const int incx = trans_a ? static_cast<int>(lda) : 1;  // op(A) is the 1 x k row
    if (beta == 0.0f) std::fill_n(c, n, 0.0f);            // beta = 0 never reads C (it may hold NaN)
    if (trans_b) {  // B is (n, k): c = B a
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), alpha, b,
                  static_cast<int>(ldb), a, incx, beta, c, 1);
    } else {  // B is (k, n): c = B^T a
      cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(k), static_cast<int>(n), alpha, b,
                  static_cast<int>(ldb), a, incx, beta, c, 1);
    }
    return;
  }
  if (std::strcmp(sgemm_backend(), "avx512") == 0 && double(m) * double(n) * double(k) >= kSmallWork) {
    const bool pre = packed != nullptr && packed->packed();
    run_avx512(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, pre ? packed : nullptr, packed_col0);
    return;
  }
  const SmallBlasGuard guard(blas_work(m, n, k));  // the thread count of this shape, whoever calls
  cblas_call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace qkv::kernels
