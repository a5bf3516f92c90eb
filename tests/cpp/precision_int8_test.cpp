// Low precision, int8 (qkv/core/precision.h): the quantization and the int8 products on every path this CPU runs,
// by name, against the exact integer product; the packed builds (vpdpbusd, vpmaddwd-widened, the AMX walk) bit for
// bit; and the int8 linear against the analytic bound of symmetric quantization.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "attention_oracle.h"
#include "ops_testing.h"
#include "qkv/core/precision.h"
#include "qkv/kernels/cpu.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/kernels/lowp.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/multihead_attention.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/lowp.h"
#include "qkv/ops/matmul.h"
#include "precision_testing.h"

namespace qkv {
namespace {

using kernels::Isa;
using namespace precision_testing;
using testing::max_abs_diff;

// Random (rows, cols), quantized per row (weights) or per row and block of 64 columns (activations).
kernels::Int8Rows quantized(int64_t rows, int64_t cols, uint64_t seed, bool per_row,
                            std::vector<float>* values = nullptr) {
  const Tensor t = testing::randn({rows, cols}, seed);
  kernels::Int8Rows q;
  kernels::quantize_rows_int8(t.data(), rows, cols, cols, q, per_row);
  if (values) *values = t.to_vector();
  return q;
}

// The exact sum of entry (i, j) of a (blocked activations) times b (per-row weights), from the integers in double.
double int8_oracle(const kernels::Int8Rows& a, const kernels::Int8Rows& b, int64_t i, int64_t j, double* mag) {
  const int64_t blocks = a.ld / a.group;
  double sum = 0, m = 0;
  for (int64_t g = 0; g < blocks; ++g) {
    int64_t acc = 0;
    for (int64_t t = g * a.group; t < (g + 1) * a.group; ++t) acc += int64_t{a.q[i * a.ld + t]} * b.q[j * b.ld + t];
    sum += static_cast<double>(acc) * a.scale[i * blocks + g];
    m += std::fabs(static_cast<double>(acc) * a.scale[i * blocks + g]);
  }
  *mag = m * b.scale[j];
  return sum * b.scale[j];
}

TEST(Int8Kernels, QuantizationIsSymmetricPerRowOrBlockAndWithinHalfAStep) {
  for (const bool per_row : {true, false}) {
    SCOPED_TRACE(per_row ? "per row" : "per block of 64");
    std::vector<float> x;
    const int64_t cols = 150;
    const kernels::Int8Rows q = quantized(5, cols, 3, per_row, &x);
    ASSERT_EQ(q.ld, 192);
    ASSERT_EQ(q.group, per_row ? 192 : 64);
    const int64_t blocks = q.ld / q.group;
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t g = 0; g < blocks; ++g) {
        const float scale = q.scale[r * blocks + g];
        double amax = 0;
        for (int64_t j = g * q.group; j < std::min(cols, (g + 1) * q.group); ++j)
          amax = std::max(amax, std::fabs(double{x[r * cols + j]}));
        EXPECT_NEAR(scale, amax / 127.0, amax * 1e-6);
        int top = 0;
        for (int64_t j = g * q.group; j < (g + 1) * q.group; ++j) {
          const int v = q.q[r * q.ld + j];
          ASSERT_LE(std::abs(v), 127);
          top = std::max(top, std::abs(v));
          if (j >= cols) ASSERT_EQ(v, 0) << "padding";
          else ASSERT_LE(std::fabs(v * double{scale} - x[r * cols + j]), 0.5 * scale * (1 + 1e-5));
        }
        EXPECT_EQ(top, 127);
      }
  }
  // The AVX2 row quantizer gives the portable one's bits (rows with ties, tails and a non-finite value).
  if (kernels::cpu_supports(Isa::kAvx2)) {
    Rng rng(9);
    for (const int64_t cols : {int64_t{1}, int64_t{15}, int64_t{64}, int64_t{130}, int64_t{385}}) {
      std::vector<float> x(static_cast<size_t>(cols));
      for (float& v : x) v = rng.normal() * 3.0f;
      x[0] = 127.0f * 0.5f;  // a tie at the block's scale when it is the block max
      if (cols > 20) x[17] = 2.5f * (cols > 100 ? 1.0f : -1.0f);
      for (const bool poison : {false, true}) {
        if (poison) x[static_cast<size_t>(cols - 1)] = INFINITY;
        const int64_t ld = kernels::int8_ld(cols), blocks = ld / kernels::kInt8Group;
        std::vector<int16_t> qa(static_cast<size_t>(ld), 0), qb(static_cast<size_t>(ld), 0);
        std::vector<float> sa(static_cast<size_t>(blocks), -1.0f), sb(static_cast<size_t>(blocks), -1.0f);
        kernels::portable::quantize_row_int8(x.data(), cols, kernels::kInt8Group, blocks, qa.data(), sa.data());
        kernels::avx2::quantize_row_int8(x.data(), cols, kernels::kInt8Group, blocks, qb.data(), sb.data());
        EXPECT_EQ(qa, qb) << cols;
        for (int64_t g = 0; g < blocks; ++g) EXPECT_TRUE(same_value(sa[g], sb[g])) << cols << " block " << g;
      }
    }
  }
  // A non-finite value makes every scale of its row NaN; an all-zero block has scale 0 (other blocks unaffected).
  std::vector<float> bad(130, 1.0f), zero(130, 0.0f);
  bad[100] = NAN;
  zero[129] = 3.0f;
  kernels::Int8Rows qb, qz;
  kernels::quantize_rows_int8(bad.data(), 1, 130, 130, qb, false);
  kernels::quantize_rows_int8(zero.data(), 1, 130, 130, qz, false);
  for (float sc : qb.scale) EXPECT_TRUE(std::isnan(sc));
  EXPECT_EQ(qz.scale[0], 0.0f);
  EXPECT_EQ(qz.scale[1], 0.0f);
  EXPECT_FLOAT_EQ(qz.scale[2], 3.0f / 127.0f);
}

TEST(Int8Kernels, EveryPathIsTheExactIntegerProductAndPathsAgreeBitForBit) {
  struct Shp {
    int64_t m, n, k;
  };
  for (const Shp s : {Shp{1, 1, 1}, Shp{3, 5, 17}, Shp{65, 67, 100}, Shp{2, 4, 16}, Shp{7, 9, 385}, Shp{5, 6, 64}}) {
    const kernels::Int8Rows a = quantized(s.m, s.k, 11 + s.m, false), b = quantized(s.n, s.k, 29 + s.n, true);
    const Tensor bias = testing::randn({s.n}, 5);
    std::vector<float> first;
    for (Isa isa : runnable_paths()) {
      SCOPED_TRACE(std::string(kernels::isa_name(isa)) + " m " + std::to_string(s.m) + " n " + std::to_string(s.n) +
                   " k " + std::to_string(s.k));
      std::vector<float> c(static_cast<size_t>(s.m * s.n));
      if (isa == Isa::kAvx2) {  // the avx2 build reads the weight packed (vpdpbusd's quads as vpmaddwd pairs)
        kernels::PackedB pb;
        kernels::pack_int8(b.view(), pb);
        kernels::avx2::gemm_int8_packed_block(a.view(), pb.view(), bias.data(), c.data(), s.n, 0, s.m, 0, s.n);
      } else {
        kernels::portable::gemm_int8_block(a.view(), b.view(), bias.data(), c.data(), s.n, 0, s.m, 0, s.n);
      }
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < s.n; ++j) {
          double mag = 0;
          const double want = int8_oracle(a, b, i, j, &mag) + bias.data()[j];
          mag += std::fabs(bias.data()[j]);
          ASSERT_LE(std::fabs(c[i * s.n + j] - want), 4e-7 * mag * (1 + s.k / 64) + 1e-30) << i << "," << j;
        }
      if (first.empty()) first = c;
      else EXPECT_EQ(c, first) << "differs in bits from the portable path";
    }
    // The threaded dispatcher gives the same bits.
    std::vector<float> c(static_cast<size_t>(s.m * s.n));
    kernels::gemm_int8_nt(a.view(), b.view(), bias.data(), c.data(), s.n);
    EXPECT_EQ(c, first);
  }
}

// The packed int8 builds this CPU runs, by name (the portable reference runs everywhere and is not listed).
struct PackedInt8Build {
  const char* name;
  Isa isa;
  void (*block)(const kernels::Int8View&, const kernels::PackedBView&, const float*, float*, int64_t, int64_t, int64_t,
                int64_t, int64_t);
};
std::vector<PackedInt8Build> packed_int8_builds() {
  const PackedInt8Build all[] = {{"avx512vnni", Isa::kAvx512Vnni, kernels::avx512vnni::gemm_int8_packed_block},
                                 {"avx2vnni", Isa::kAvx2Vnni, kernels::avxvnni::gemm_int8_packed_block},
                                 {"avx2", Isa::kAvx2, kernels::avx2::gemm_int8_packed_block},
                                 {"amx emulated", Isa::kPortable, kernels::amx_emulated::gemm_int8_packed_block},
                                 {"amx emulated tiles", Isa::kAvx512,
                                  kernels::amx_emulated_tiles::gemm_int8_packed_block},
                                 {"amx", Isa::kAmx, kernels::amx::gemm_int8_packed_block}};
  std::vector<PackedInt8Build> out;
  std::string ran = "portable", not_run;
  for (const PackedInt8Build& b : all) {
    if (kernels::cpu_supports(b.isa)) {
      out.push_back(b);
      ran += std::string(",") + b.name;
    } else {
      not_run += std::string(not_run.empty() ? "" : ",") + b.name;
    }
  }
  std::cout << "[ paths    ] packed int8: ran " << ran << (not_run.empty() ? "" : "; not on this CPU: ") << not_run
            << "\n";
  return out;
}

// The packed int8 product (the layout of vpdpbusd) against the exact integer product on its reference and on every
// vpdpbusd build the CPU has (zmm, ymm): the same bits as the unpacked kernels, with and without bias, on odd m, n
// and k, row counts across the register blocks, and views that start or end inside a panel.
TEST(Int8Kernels, PackedProductIsTheUnpackedOneBitForBitOnEveryPath) {
  struct Shp {
    int64_t m, n, k, begin, end;  // the view: weight rows [begin, end)
  };
  const std::vector<PackedInt8Build> builds = packed_int8_builds();
  for (const Shp s : {Shp{1, 1, 1, 0, 1}, Shp{3, 5, 17, 0, 5}, Shp{15, 70, 100, 3, 70}, Shp{29, 97, 385, 33, 96},
                      Shp{14, 64, 64, 0, 64}, Shp{2, 40, 3, 31, 33}, Shp{13, 20, 130, 0, 20}, Shp{7, 45, 64, 5, 44},
                      Shp{20, 9, 200, 0, 9}, Shp{6, 57, 65, 17, 57}, Shp{70, 33, 130, 1, 33}})
    for (const bool with_bias : {true, false}) {
      SCOPED_TRACE("m " + std::to_string(s.m) + " n " + std::to_string(s.n) + " k " + std::to_string(s.k) +
                   " view [" + std::to_string(s.begin) + ", " + std::to_string(s.end) + ")" +
                   (with_bias ? " bias" : " no bias"));
      kernels::Int8Rows a = quantized(s.m, s.k, 41 + s.m, false), b = quantized(s.n, s.k, 43 + s.n, true);
      a.q[0] = -127;  // the extremes of the offset activations (q + 128 = 1 and 255)
      a.q[static_cast<size_t>(a.ld - 1 < s.k ? a.ld - 1 : s.k - 1)] = 127;
      const Tensor bias_t = testing::randn({s.n}, 7);
      const float* bias = with_bias ? bias_t.data() + s.begin : nullptr;
      const int64_t nv = s.end - s.begin;
      std::vector<float> want(static_cast<size_t>(s.m * nv));
      kernels::portable::gemm_int8_block(a.view(), b.view(s.begin, s.end), bias, want.data(), nv, 0, s.m, 0, nv);
      kernels::PackedB packed;
      kernels::pack_int8(b.view(), packed);
      const kernels::PackedBView v = packed.view(s.begin, s.end);
      // c rows padded past the view's columns: the padding must keep its marker (no lane stored past n).
      const int64_t ldc = nv + 5;
      const float marker = -12345.0f;
      std::vector<float> c;
      const auto expect_c = [&](const std::string& what) {
        std::vector<float> got(want.size());
        for (int64_t i = 0; i < s.m; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            if (j < nv) got[static_cast<size_t>(i * nv + j)] = c[static_cast<size_t>(i * ldc + j)];
            else
              EXPECT_EQ(c[static_cast<size_t>(i * ldc + j)], marker) << what << ": stored past n at " << i << "," << j;
          }
        EXPECT_EQ(got, want) << what;
      };
      c.assign(static_cast<size_t>(s.m * ldc), marker);
      kernels::portable::gemm_int8_packed_block(a.view(), v, bias, c.data(), ldc, 0, s.m, 0, nv);
      expect_c("portable packed");
      for (const PackedInt8Build& build : builds) {
        c.assign(static_cast<size_t>(s.m * ldc), marker);
        // Tiles that split rows and columns unevenly, as the threaded driver does.
        const int64_t mh = s.m / 2, nh = nv / 3;
        for (auto [m0, m1] : {std::pair{int64_t{0}, mh}, std::pair{mh, s.m}})
          for (auto [n0, n1] : {std::pair{int64_t{0}, nh}, std::pair{nh, nv}}) {
            // Each tile alone first: it must write its own columns only.
            std::vector<float> before = c;
            build.block(a.view(), v, bias, c.data(), ldc, m0, m1, n0, n1);
            for (int64_t i = 0; i < s.m; ++i)
              for (int64_t j = 0; j < ldc; ++j)
                if (i < m0 || i >= m1 || j < n0 || j >= n1)
                  ASSERT_EQ(c[static_cast<size_t>(i * ldc + j)], before[static_cast<size_t>(i * ldc + j)])
                      << build.name << ": tile [" << m0 << ", " << m1 << ") x [" << n0 << ", " << n1
                      << ") wrote " << i << "," << j;
          }
        expect_c(build.name);
      }
      if (kernels::gemm_int8_packed_runs()) {
        c.assign(static_cast<size_t>(s.m * ldc), marker);
        kernels::gemm_int8_packed(a.view(), v, bias, c.data(), ldc);
        expect_c(std::string("threaded, ") + kernels::isa_name(kernels::active_isa()));
      }
    }
}

// Rows with NaN, +inf or -inf give NaN rows through the packed product on every build (their scales are NaN); the
// other rows keep the portable bits.
TEST(Int8Kernels, PackedProductNonFiniteRowsAreNaNRowsOnEveryPath) {
  const int64_t m = 9, n = 19, k = 70;
  std::vector<float> x = testing::randn({m, k}, 3).to_vector();
  x[2 * k + 5] = NAN;
  x[5 * k + 69] = INFINITY;
  x[7 * k] = -INFINITY;
  kernels::Int8Rows a;
  kernels::quantize_rows_int8(x.data(), m, k, k, a, false);
  const kernels::Int8Rows b = quantized(n, k, 5, true);
  const Tensor bias = testing::randn({n}, 9);
  kernels::PackedB packed;
  kernels::pack_int8(b.view(), packed);
  std::vector<float> want(static_cast<size_t>(m * n));
  kernels::portable::gemm_int8_block(a.view(), b.view(), bias.data(), want.data(), n, 0, m, 0, n);
  std::vector<PackedInt8Build> builds = packed_int8_builds();
  builds.insert(builds.begin(), {"portable", Isa::kPortable, kernels::portable::gemm_int8_packed_block});
  for (const PackedInt8Build& build : builds) {
    std::vector<float> c(want.size(), 0.0f);
    build.block(a.view(), packed.view(), bias.data(), c.data(), n, 0, m, 0, n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const float y = c[i * n + j];
        if (i == 2 || i == 5 || i == 7) EXPECT_TRUE(std::isnan(y)) << build.name << " row " << i << " col " << j;
        else EXPECT_TRUE(same_value(y, want[i * n + j])) << build.name << " row " << i << " col " << j;
      }
  }
}

// Full-scale operands: every activation +127 (byte 255 after the +128 offset) or -127 (byte 1) against weights of
// -127 / +127, so each quad's pair sums reach 2 · 255 · 127 = 64770, past int16 (where vpmaddubsw would saturate).
// Every packed build, the vpmaddwd-widened avx2 one included, gives the exact product's bits.
TEST(Int8Kernels, PackedProductExactAtFullScaleOnEveryPath) {
  const int64_t m = 17, n = 35, k = 192;
  std::vector<float> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < m * k; ++i) x[static_cast<size_t>(i)] = (i / 3) % 5 == 0 ? -2.0f : 2.0f;
  for (int64_t i = 0; i < n * k; ++i) w[static_cast<size_t>(i)] = (i / 7) % 3 == 0 ? 0.5f : -0.5f;
  kernels::Int8Rows a, b;
  kernels::quantize_rows_int8(x.data(), m, k, k, a, false);
  kernels::quantize_rows_int8(w.data(), n, k, k, b, true);
  kernels::PackedB packed;
  kernels::pack_int8(b.view(), packed);
  std::vector<float> want(static_cast<size_t>(m * n));
  kernels::portable::gemm_int8_block(a.view(), b.view(), nullptr, want.data(), n, 0, m, 0, n);
  for (const PackedInt8Build& build : packed_int8_builds()) {
    std::vector<float> c(want.size(), NAN);
    build.block(a.view(), packed.view(), nullptr, c.data(), n, 0, m, 0, n);
    EXPECT_EQ(c, want) << build.name;
  }
}

// Int8 linear against the analytic bound of symmetric quantization: each operand is within half a step of its
// value, so |error| <= Σ_k (|x_k|·sw/2 + |w_k|·sx/2 + sx·sw/4) plus fp32 slack.
TEST(Int8Linear, ErrorWithinTheQuantizationBound) {
  const int64_t m = 9, n = 21, k = 130;
  const Tensor x = testing::randn({m, k}, 1), w = testing::randn({n, k}, 2), b = testing::randn({n}, 3);
  const Tensor y = linear(x, LinearWeight(w, Precision::kInt8), b);
  const std::vector<float> xv = x.to_vector(), wv = w.to_vector();
  const std::vector<double> exact = product64(xv, wv, m, n, k);
  const std::vector<float> yv = y.to_vector();
  for (int64_t i = 0; i < m; ++i) {
    double xmax = 0;
    for (int64_t t = 0; t < k; ++t) xmax = std::max(xmax, std::fabs(double{xv[i * k + t]}));
    for (int64_t j = 0; j < n; ++j) {
      double wmax = 0, bound = 0;
      for (int64_t t = 0; t < k; ++t) wmax = std::max(wmax, std::fabs(double{wv[j * k + t]}));
      const double sx = xmax / 127, sw = wmax / 127;
      for (int64_t t = 0; t < k; ++t)
        bound += std::fabs(double{xv[i * k + t]}) * sw / 2 + std::fabs(double{wv[j * k + t]}) * sx / 2 + sx * sw / 4;
      ASSERT_LE(std::fabs(yv[i * n + j] - (exact[i * n + j] + b.data()[j])), bound * (1 + 1e-5)) << i << "," << j;
    }
  }
  // Output channels [4, 11) of the weight, without copying it, equal the same channels of the whole product.
  const Tensor part = linear(x, LinearWeight(w, Precision::kInt8).rows(4, 11), b.slice(0, 4, 11));
  const Tensor full = linear(x, LinearWeight(w, Precision::kInt8), b);
  EXPECT_TRUE(testing::AllClose(part, full.slice(1, 4, 11).contiguous(), testing::kExact));
}

}  // namespace
}  // namespace qkv
