// The portable builds of the low-precision kernels (lowp_impl.h), the per-row int8 quantization and the threaded
// dispatchers; the AVX2 builds are lowp_avx2.cpp.
#include "qkv/kernels/lowp.h"

#include <algorithm>
#include <cmath>

#include <cpuid.h>

#include "lowp_impl.h"
#include "qkv/core/error.h"
#include "qkv/kernels/cpu.h"

namespace qkv::kernels {
namespace {

constexpr int64_t kParallelMin = int64_t{1} << 16;  // elements per OpenMP region for the element-wise passes
constexpr int64_t kBlockM = 64, kBlockN = 64;       // c blocks of the int8 product (one OpenMP work item each)

bool use_avx2() { return active_isa() >= Isa::kAvx2; }

template <class F>
void chunked(int64_t n, F f) {
  const int64_t chunks = n >= kParallelMin ? std::max<int64_t>(1, n / (kParallelMin / 4)) : 1;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    // Multiples of 16 so that every chunk but the last runs whole vectors.
    const int64_t b = (n * ch / chunks) & ~int64_t{15}, e = ch + 1 == chunks ? n : (n * (ch + 1) / chunks) & ~int64_t{15};
    f(b, e);
  }
}

}  // namespace

namespace portable {
void bf16_round_range(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = detail::bf16_round_one(x[i]);
}
void float_to_bf16_range(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<uint16_t>(detail::bf16_round_bits(x[i]) >> 16);
}
void bf16_to_float_range(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t{x[i]} << 16;
    std::memcpy(y + i, &u, sizeof u);
  }
}
void gemm_int8_block(const Int8View& a, const Int8View& b, const float* bias, float* c, int64_t ldc, int64_t m0,
                     int64_t m1, int64_t n0, int64_t n1) {
  for (int64_t i = m0; i < m1; ++i)
    for (int64_t j = n0; j < n1; ++j)
      c[i * ldc + j] = detail::int8_dequant(detail::int8_dot(&a.q[i * a.ld], &b.q[j * b.ld], a.ld), a.scale[i],
                                            b.scale[j], bias, j);
}
}  // namespace portable

float bf16_round(float x) { return detail::bf16_round_one(x); }

void bf16_round(const float* x, float* y, int64_t n) {
  const auto k = use_avx2() ? avx2::bf16_round_range : portable::bf16_round_range;
  chunked(n, [&](int64_t b, int64_t e) { k(x + b, y + b, e - b); });
}

void float_to_bf16(const float* x, uint16_t* y, int64_t n) {
  const auto k = use_avx2() ? avx2::float_to_bf16_range : portable::float_to_bf16_range;
  chunked(n, [&](int64_t b, int64_t e) { k(x + b, y + b, e - b); });
}

void bf16_to_float(const uint16_t* x, float* y, int64_t n) {
  const auto k = use_avx2() ? avx2::bf16_to_float_range : portable::bf16_to_float_range;
  chunked(n, [&](int64_t b, int64_t e) { k(x + b, y + b, e - b); });
}

Int8View Int8Rows::view(int64_t begin, int64_t end) const {
  QKV_CHECK_ARG(0 <= begin && begin <= end && end <= rows, "[int8] rows [", begin, ", ", end, ") outside ", rows);
  return {q.data() + begin * ld, scale.data() + begin, end - begin, cols, ld};
}

int64_t int8_ld(int64_t cols) { return (cols + 15) / 16 * 16; }

void quantize_rows_int8(const float* x, int64_t rows, int64_t cols, int64_t ldx, Int8Rows& out) {
  QKV_CHECK_ARG(rows >= 0 && cols >= 0 && ldx >= cols && (rows == 0 || cols == 0 || x != nullptr),
                "[quantize_int8] rows ", rows, ", cols ", cols, ", ldx ", ldx, " (ldx >= cols, x non-null)");
  QKV_CHECK_ARG(cols <= (int64_t{1} << 17), "[quantize_int8] cols ", cols,
                " exceeds 131072 (the int32 sums of the int8 product must stay exact)");
  out.rows = rows;
  out.cols = cols;
  out.ld = int8_ld(cols);
  out.q.assign(static_cast<size_t>(rows * out.ld), 0);
  out.scale.assign(static_cast<size_t>(rows), 0.0f);
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t j = 0; j < cols; ++j) {
      finite = finite && std::isfinite(xr[j]);
      amax = std::max(amax, std::fabs(xr[j]));
    }
    if (!finite) {
      out.scale[r] = std::nanf("");
      continue;  // q stays 0; the NaN scale makes the row's products NaN
    }
    if (amax == 0.0f) continue;
    const float inv = 127.0f / amax;
    int16_t* qr = &out.q[r * out.ld];
    for (int64_t j = 0; j < cols; ++j)
      qr[j] = static_cast<int16_t>(std::clamp(std::nearbyint(xr[j] * inv), -127.0f, 127.0f));
    out.scale[r] = amax / 127.0f;
  }
}

void gemm_int8_nt(const Int8View& a, const Int8View& b, const float* bias, float* c, int64_t ldc) {
  QKV_CHECK_ARG(a.cols == b.cols && a.ld == b.ld, "[gemm_int8] a (", a.rows, ", ", a.cols, ") and b (", b.rows, ", ",
                b.cols, ") must have the same number of columns");
  QKV_CHECK_ARG(ldc >= b.rows && (a.rows == 0 || b.rows == 0 || c != nullptr), "[gemm_int8] ldc ", ldc,
                " must be >= n = ", b.rows, " and c non-null");
  const auto k = use_avx2() ? avx2::gemm_int8_block : portable::gemm_int8_block;
  const int64_t bm = (a.rows + kBlockM - 1) / kBlockM, bn = (b.rows + kBlockN - 1) / kBlockN;
#pragma omp parallel for schedule(dynamic) if (bm * bn > 1 && a.rows * b.rows * a.ld >= (int64_t{1} << 18))
  for (int64_t t = 0; t < bm * bn; ++t) {
    const int64_t i = t / bn, j = t % bn;
    k(a, b, bias, c, ldc, i * kBlockM, std::min(a.rows, (i + 1) * kBlockM), j * kBlockN,
      std::min(b.rows, (j + 1) * kBlockN));
  }
}

LowpPaths lowp_paths() {
  // The bf16/AMX instruction sets, probed only to say why the converting path runs (no kernel uses them yet).
  static const bool bf16_hw = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) != 0;  // AMX-BF16
    return amx || __builtin_cpu_supports("avx512bf16");
  }();
  const bool v = use_avx2();
  if (bf16_hw)
    return {v ? "converting (AVX512-BF16/AMX kernels not written yet): bf16-rounded operands, float32 avx2 kernels"
              : "converting (AVX512-BF16/AMX kernels not written yet): bf16-rounded operands, float32 portable kernels",
            v ? "avx2 vpmaddwd (int16 pairs, exact int32 accumulation; VNNI/AMX kernels not written yet)"
              : "portable (exact int32 accumulation; VNNI/AMX kernels not written yet)"};
  return {v ? "converting (no AVX512-BF16/AMX on this CPU): bf16-rounded operands, float32 avx2 kernels"
            : "converting (no AVX512-BF16/AMX on this CPU): bf16-rounded operands, float32 portable kernels",
          v ? "avx2 vpmaddwd (int16 pairs, exact int32 accumulation; no VNNI/AMX on this CPU)"
            : "portable (exact int32 accumulation; no VNNI/AMX on this CPU)"};
}

}  // namespace qkv::kernels
