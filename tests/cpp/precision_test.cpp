// Low precision (qkv/core/precision.h): the bf16 rounding and int8 kernels on every path this CPU runs, by name,
// against float64 / integer oracles that share no code with them; the bf16 GEMM accuracy gate; and the fronts that
// carry a precision (linear, matmul, attention, nn::Module::set_precision), fp32 staying bit for bit.
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

namespace qkv {
namespace {

using kernels::Isa;

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// bf16 of x by arithmetic in double: the two neighbouring bf16 values, the nearer one, ties to the even mantissa;
// past the largest bf16 (by half an ulp or more) ±inf.
float bf16_oracle(float x) {
  if (std::isnan(x) || std::isinf(x)) return x;
  const uint32_t u = bits(x);
  const uint32_t lo_bits = u & 0xffff0000u;
  const double lo = from_bits(lo_bits);  // toward zero
  const int e = static_cast<int>((u >> 23) & 0xff);
  const double ulp = std::ldexp(1.0, (e == 0 ? 1 : e) - 127 - 7);
  const double hi = lo + (std::signbit(x) ? -ulp : ulp);
  const double dlo = std::fabs(double{x} - lo), dhi = std::fabs(hi - double{x});
  const bool take_hi = dhi < dlo || (dhi == dlo && ((lo_bits >> 16) & 1u) == 1u);
  if (!take_hi) return static_cast<float>(lo);
  if (std::fabs(hi) >= std::ldexp(1.0, 128)) return std::signbit(x) ? -INFINITY : INFINITY;
  return static_cast<float>(hi);  // exact: a bf16 value
}

std::vector<Isa> runnable_paths() {
  std::vector<Isa> out;
  for (Isa p : {Isa::kPortable, Isa::kAvx2})
    if (kernels::cpu_supports(p)) out.push_back(p);
  std::cout << "[ paths    ] lowp: ran portable" << (out.size() > 1 ? ",avx2" : "; not on this CPU: avx2") << "\n";
  return out;
}

void round_on(Isa isa, const float* x, float* y, int64_t n) {
  (isa == Isa::kAvx2 ? kernels::avx2::bf16_round_range : kernels::portable::bf16_round_range)(x, y, n);
}

// Specials, exact ties (even and odd), the overflow edge, subnormals, and random values over many magnitudes.
std::vector<float> bf16_inputs() {
  std::vector<float> v{0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, std::numeric_limits<float>::max(),
                       -std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                       std::numeric_limits<float>::min(), from_bits(0x7f800001u), from_bits(0xffc00001u),
                       from_bits(0x7fc00000u), from_bits(0x7f7f7fffu), from_bits(0x7f7f8000u), from_bits(0x7f7f8001u),
                       from_bits(0x3f808000u), from_bits(0x3f818000u), from_bits(0xbf808000u), from_bits(0x3f807fffu),
                       from_bits(0x00008000u), from_bits(0x00018000u), from_bits(0x807fffffu)};
  Rng rng(7);
  for (int i = 0; i < 4000; ++i) {
    const uint32_t r = rng.next_u32();
    v.push_back(from_bits(r));  // every bit pattern class, NaNs included
    v.push_back(std::ldexp(static_cast<float>(r) / 4294967296.0f - 0.5f, static_cast<int>(r % 60) - 30));
  }
  return v;
}

bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }

TEST(PrecisionNames, ParseAndNameRoundTripAndBadNameThrows) {
  for (Precision p : {Precision::kFloat32, Precision::kBFloat16, Precision::kInt8})
    EXPECT_EQ(parse_precision(precision_name(p)), p);
  try {
    parse_precision("fp16");
    FAIL() << "fp16 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[precision] 'fp16'", 0), 0u) << e.what();
  }
}

TEST(Bf16Kernels, RoundToNearestEvenOnEveryPathMatchesOracle) {
  const std::vector<float> x = bf16_inputs();
  for (Isa isa : runnable_paths()) {
    SCOPED_TRACE(kernels::isa_name(isa));
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{9}, int64_t{17}, static_cast<int64_t>(x.size())}) {
      std::vector<float> y(static_cast<size_t>(n));
      round_on(isa, x.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float want = bf16_oracle(x[i]);
        ASSERT_TRUE(same_value(y[i], want)) << std::hex << "x bits 0x" << bits(x[i]) << " -> 0x" << bits(y[i])
                                            << ", oracle 0x" << bits(want);
        ASSERT_EQ(bits(y[i]) & 0xffffu, 0u);
        if (std::isnan(x[i])) ASSERT_EQ(bits(y[i]) >> 31, bits(x[i]) >> 31) << "NaN sign kept";
      }
    }
    // Packed bits and back give the rounded values; the one-float helper agrees.
    std::vector<uint16_t> packed(x.size());
    std::vector<float> back(x.size());
    const auto to = isa == Isa::kAvx2 ? kernels::avx2::float_to_bf16_range : kernels::portable::float_to_bf16_range;
    const auto from = isa == Isa::kAvx2 ? kernels::avx2::bf16_to_float_range : kernels::portable::bf16_to_float_range;
    to(x.data(), packed.data(), static_cast<int64_t>(x.size()));
    from(packed.data(), back.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(same_value(back[i], bf16_oracle(x[i]))) << std::hex << "0x" << bits(x[i]);
      ASSERT_TRUE(same_value(kernels::bf16_round(x[i]), bf16_oracle(x[i])));
    }
  }
  // The threaded dispatcher, in place, on a large array.
  std::vector<float> big(300000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = x[i % x.size()];
  std::vector<float> want(big.size());
  for (size_t i = 0; i < big.size(); ++i) want[i] = bf16_oracle(big[i]);
  kernels::bf16_round(big.data(), big.data(), static_cast<int64_t>(big.size()));
  for (size_t i = 0; i < big.size(); ++i) ASSERT_TRUE(same_value(big[i], want[i])) << i;
  const Isa isa = kernels::active_isa();
  const char* path = isa >= Isa::kAmx          ? "amx tdpbf16ps"
                     : isa >= Isa::kAvx512Bf16 ? "avx512bf16 vdpbf16ps"
                                               : "converting";
  EXPECT_EQ(std::string(kernels::lowp_paths().bf16).rfind(path, 0), 0u) << kernels::lowp_paths().bf16;
}

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

using testing::max_abs_diff;

// x (m, k) · w (n, k)ᵀ in float64, and sum |x||w| per row max (the fp32 accumulation slack's scale).
std::vector<double> product64(const std::vector<float>& x, const std::vector<float>& w, int64_t m, int64_t n,
                              int64_t k, double* abs_max = nullptr) {
  std::vector<double> c(static_cast<size_t>(m * n));
  double am = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, sa = 0;
      for (int64_t t = 0; t < k; ++t) {
        s += double{x[i * k + t]} * w[j * k + t];
        sa += std::fabs(double{x[i * k + t]} * w[j * k + t]);
      }
      c[i * n + j] = s;
      am = std::max(am, sa);
    }
  if (abs_max) *abs_max = am;
  return c;
}

std::vector<float> rounded(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf16_oracle(v[i]);
  return r;
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

// The packed bf16 product on its reference and, where the CPU has AVX512-BF16, on vdpbf16ps: within float32
// accumulation slack (k·2^-23·Σ|x||w| per entry) of the float64 product of the bf16-rounded operands, on odd
// shapes, one row, odd k, and views that start inside a panel. NaN and inf in x reach the output.
TEST(Bf16Kernels, PackedProductMatchesTheFloat64ProductOfRoundedOperandsOnEveryPath) {
  struct Shp {
    int64_t m, n, k, begin, end;
  };
  const bool bf16 = kernels::cpu_supports(Isa::kAvx512Bf16), amx = kernels::cpu_supports(Isa::kAmx);
  const bool avx512 = kernels::cpu_supports(Isa::kAvx512);
  std::cout << "[ paths    ] packed bf16: ran portable,amx emulated" << (avx512 ? ",amx emulated tiles" : "")
            << (bf16 ? ",avx512bf16" : "") << (amx ? ",amx" : "") << (bf16 && amx ? "" : "; not on this CPU:")
            << (avx512 ? "" : " amx emulated tiles") << (bf16 ? "" : " avx512bf16") << (amx ? "" : " amx") << "\n";
  // Long k (1100, 1537), also in a view that starts inside a panel; k-pairs a multiple of 16 (k 64) and one past
  // (k 65, 34); rows past one 32-row pass (70).
  for (const Shp s : {Shp{1, 1, 1, 0, 1}, Shp{3, 5, 17, 0, 5}, Shp{15, 70, 101, 3, 70}, Shp{29, 97, 384, 33, 96},
                      Shp{1, 384, 384, 0, 384}, Shp{40, 33, 2, 31, 33}, Shp{17, 45, 1100, 5, 45},
                      Shp{3, 64, 1537, 0, 64}, Shp{70, 40, 64, 0, 40}, Shp{33, 65, 65, 1, 65},
                      Shp{16, 32, 34, 0, 32}}) {
    SCOPED_TRACE("m " + std::to_string(s.m) + " n " + std::to_string(s.n) + " k " + std::to_string(s.k) + " view [" +
                 std::to_string(s.begin) + ", " + std::to_string(s.end) + ")");
    const Tensor x = testing::randn({s.m, s.k}, 60 + s.k), w = testing::randn({s.n, s.k}, 70 + s.k);
    const Tensor bias = testing::randn({s.n}, 8);
    const int64_t nv = s.end - s.begin;
    const std::vector<float> xr = rounded(x.to_vector()), wr = rounded(w.to_vector());
    std::vector<float> wv(wr.begin() + s.begin * s.k, wr.begin() + s.end * s.k);
    double abs_max = 0;
    const std::vector<double> want = product64(xr, wv, s.m, nv, s.k, &abs_max);
    const double slack = static_cast<double>(s.k) * std::ldexp(1.0, -23) * abs_max + 1e-30;
    kernels::PackedB packed;
    kernels::pack_bf16(w.data(), s.n, s.k, s.k, 1, packed);
    // Every packed word from the rounding oracle: panel p, group g, lane l holds column 32p + l's k = 2g (low half)
    // and 2g + 1 (high half); lanes past n and the half past an odd k are zero.
    {
      const int64_t groups = (s.k + 1) / 2;
      ASSERT_EQ(packed.data.size(), static_cast<size_t>((s.n + 31) / 32 * groups * 32));
      const std::vector<float> wf = w.to_vector();
      for (size_t i = 0; i < packed.data.size(); ++i) {
        const int64_t p = static_cast<int64_t>(i) / (groups * 32), g = static_cast<int64_t>(i) / 32 % groups;
        const int64_t j = p * 32 + static_cast<int64_t>(i) % 32;
        const uint32_t lo = j < s.n ? bits(bf16_oracle(wf[j * s.k + 2 * g])) >> 16 : 0u;
        const uint32_t hi = j < s.n && 2 * g + 1 < s.k ? bits(bf16_oracle(wf[j * s.k + 2 * g + 1])) >> 16 : 0u;
        ASSERT_EQ(packed.data[i], lo | (hi << 16)) << "word " << i;
      }
    }
    const kernels::PackedBView v = packed.view(s.begin, s.end);
    auto check = [&](const std::vector<float>& c, const char* path) {
      double err = 0;
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < nv; ++j)
          err = std::max(err, std::fabs(c[i * nv + j] - (want[i * nv + j] + bias.data()[s.begin + j])));
      EXPECT_LE(err, slack + 1e-6 * 4) << path;  // + the rounding of the bias add
    };
    std::vector<float> c(static_cast<size_t>(s.m * nv), NAN);
    kernels::portable::gemm_bf16_packed_block(x.data(), s.k, v, bias.data() + s.begin, c.data(), nv, 0, s.m, 0, nv);
    check(c, "portable");
    // The AMX walk: emulated (plain loops), emulated tiles with the AVX-512 row packing (the same bits), and the
    // hardware's tiles where the CPU has them: whole, and in four blocks that cut rows and columns anywhere (each
    // entry's sum depends on k alone: the same bits).
    std::vector<float> emulated;
    for (const int path : {0, 1, 2}) {
      if ((path == 1 && !avx512) || (path == 2 && !amx)) continue;
      const auto block = path == 0   ? kernels::amx_emulated::gemm_bf16_packed_block
                         : path == 1 ? kernels::amx_emulated_tiles::gemm_bf16_packed_block
                                     : kernels::amx::gemm_bf16_packed_block;
      const char* name = path == 0 ? "amx emulated" : path == 1 ? "amx emulated tiles" : "amx";
      std::vector<float> whole(c.size(), NAN), parts(c.size(), NAN);
      block(x.data(), s.k, v, bias.data() + s.begin, whole.data(), nv, 0, s.m, 0, nv);
      check(whole, name);
      const int64_t mh = s.m / 3, nh = nv / 2 + 1;
      for (auto [m0, m1] : {std::pair{int64_t{0}, mh}, std::pair{mh, s.m}})
        for (auto [n0, n1] : {std::pair{int64_t{0}, std::min(nh, nv)}, std::pair{std::min(nh, nv), nv}})
          block(x.data(), s.k, v, bias.data() + s.begin, parts.data(), nv, m0, m1, n0, n1);
      EXPECT_EQ(parts, whole) << name << ", in blocks";
      if (path == 0) emulated = whole;
      if (path == 1) EXPECT_EQ(whole, emulated) << "the AVX-512 row packing gives the plain one's bits";
    }
    if (bf16) {
      std::fill(c.begin(), c.end(), NAN);
      const int64_t mh = s.m / 2, nh = nv / 3;
      for (auto [m0, m1] : {std::pair{int64_t{0}, mh}, std::pair{mh, s.m}})
        for (auto [n0, n1] : {std::pair{int64_t{0}, nh}, std::pair{nh, nv}})
          kernels::avx512bf16::gemm_bf16_packed_block(x.data(), s.k, v, bias.data() + s.begin, c.data(), nv, m0, m1,
                                                      n0, n1);
      check(c, "avx512bf16");
      // x read transposed (x[i][k] at xt[k * m + i]): the same bits as the rows, on both builds.
      const Tensor xt = x.transpose(0, 1).contiguous();
      std::vector<float> ct(c.size(), NAN), cp(c.size(), NAN), cpt(c.size(), NAN);
      kernels::avx512bf16::gemm_bf16_packed_block(xt.data(), 1, v, bias.data() + s.begin, ct.data(), nv, 0, s.m, 0,
                                                  nv, s.m);
      kernels::avx512bf16::gemm_bf16_packed_block(x.data(), s.k, v, bias.data() + s.begin, cp.data(), nv, 0, s.m, 0,
                                                  nv);
      EXPECT_EQ(ct, cp) << "avx512bf16, x transposed";
      // Each row alone (decoding: a view from a panel's start takes panels four at a time) gives its bits in cp.
      std::vector<float> c1(c.size(), NAN);
      for (int64_t i = 0; i < s.m; ++i)
        kernels::avx512bf16::gemm_bf16_packed_block(x.data(), s.k, v, bias.data() + s.begin, c1.data(), nv, i, i + 1,
                                                    0, nv);
      EXPECT_EQ(c1, cp) << "avx512bf16, one row at a time";
      kernels::portable::gemm_bf16_packed_block(xt.data(), 1, v, bias.data() + s.begin, cpt.data(), nv, 0, s.m, 0, nv,
                                                s.m);
      check(cpt, "portable, x transposed");
      // The transposed-B packing (a (k, n) row-major operand) gives the same packed words.
      kernels::PackedB from_kn;
      const Tensor wt = w.transpose(0, 1).contiguous();
      kernels::pack_bf16(wt.data(), s.n, s.k, 1, s.n, from_kn);
      EXPECT_EQ(from_kn.data, packed.data);
    }
  }
  // Specials: a NaN or an inf in a row of x makes that row's entries NaN or inf; other rows stay finite.
  Tensor x = testing::randn({3, 20}, 1);
  x.data()[5] = NAN;
  x.data()[20 + 7] = INFINITY;
  Tensor w = testing::randn({4, 20}, 2);
  for (int64_t i = 0; i < w.numel(); ++i) w.data()[i] = std::fabs(w.data()[i]) + 0.1f;  // no cancellation to 0
  kernels::PackedB packed;
  kernels::pack_bf16(w.data(), 4, 20, 20, 1, packed);
  std::vector<std::string> paths{"portable", "amx emulated"};
  if (avx512) paths.push_back("amx emulated tiles");
  if (bf16) paths.push_back("avx512bf16");
  if (amx) paths.push_back("amx");
  for (const std::string& p : paths) {
    std::vector<float> c(12, 0.0f);
    if (p == "portable" || p == "avx512bf16")
      (p == "portable" ? kernels::portable::gemm_bf16_packed_block : kernels::avx512bf16::gemm_bf16_packed_block)(
          x.data(), 20, packed.view(), nullptr, c.data(), 4, 0, 3, 0, 4, 1);
    else
      (p == "amx"                  ? kernels::amx::gemm_bf16_packed_block
       : p == "amx emulated tiles" ? kernels::amx_emulated_tiles::gemm_bf16_packed_block
                                   : kernels::amx_emulated::gemm_bf16_packed_block)(
          x.data(), 20, packed.view(), nullptr, c.data(), 4, 0, 3, 0, 4);
    for (int j = 0; j < 4; ++j) {
      EXPECT_TRUE(std::isnan(c[j])) << p;
      EXPECT_TRUE(std::isinf(c[4 + j]) && c[4 + j] > 0) << p;
      EXPECT_TRUE(std::isfinite(c[8 + j])) << p;
    }
  }
}

// The AMX product with more threads than cores (4 threads on this machine's 2, each preempted while it holds tile
// state): every run gives the bits of a run alone. On a CPU with AMX the tiles are the hardware's (the OS must
// save and restore each thread's tiles); elsewhere the emulated walk, whose per-thread scratch is then what is
// tested. Also: gemm_bf16_packed takes the AMX walk from kAmxMinRows rows on exactly where active_isa() is amx.
TEST(Bf16Kernels, AmxProductKeepsItsBitsOversubscribed) {
  const bool amx = kernels::cpu_supports(Isa::kAmx);
  const auto block = amx ? kernels::amx::gemm_bf16_packed_block : kernels::amx_emulated::gemm_bf16_packed_block;
  std::cout << "[ paths    ] amx oversubscribed: " << (amx ? "amx tiles" : "amx emulated (no AMX on this CPU)")
            << "\n";
  const int64_t m = 45, n = 70, k = amx ? 1031 : 131;
  const Tensor x = testing::randn({m, k}, 31), w = testing::randn({n, k}, 32), bias = testing::randn({n}, 33);
  kernels::PackedB packed;
  kernels::pack_bf16(w.data(), n, k, k, 1, packed);
  const auto block8 = amx ? kernels::amx::gemm_int8_packed_block : kernels::amx_emulated::gemm_int8_packed_block;
  kernels::Int8Rows xq, wq;
  kernels::quantize_rows_int8(x.data(), m, k, k, xq, false);
  kernels::quantize_rows_int8(w.data(), n, k, k, wq, true);
  kernels::PackedB packed8;
  kernels::pack_int8(wq.view(), packed8);
  std::vector<float> alone(static_cast<size_t>(m * n), NAN), alone8(alone.size(), NAN);
  block(x.data(), k, packed.view(), bias.data(), alone.data(), n, 0, m, 0, n);
  block8(xq.view(), packed8.view(), bias.data(), alone8.data(), n, 0, m, 0, n);
  constexpr int kThreads = 4, kRuns = 6;
  std::vector<std::vector<float>> out(kThreads * kRuns, std::vector<float>(alone.size(), NAN)), out8 = out;
  {
    std::vector<std::thread> team;
    for (int t = 0; t < kThreads; ++t)
      team.emplace_back([&, t] {
        for (int r = 0; r < kRuns; ++r) {
          const size_t i = static_cast<size_t>(t * kRuns + r);
          block(x.data(), k, packed.view(), bias.data(), out[i].data(), n, 0, m, 0, n);
          std::this_thread::yield();  // give the core away between products (tiles released)
          block8(xq.view(), packed8.view(), bias.data(), out8[i].data(), n, 0, m, 0, n);
        }
      });
    for (std::thread& th : team) th.join();
  }
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i], alone) << "bf16, thread " << i / kRuns << " run " << i % kRuns;
    EXPECT_EQ(out8[i], alone8) << "int8, thread " << i / kRuns << " run " << i % kRuns;
  }
  // The int8 walk gives the unpacked product's bits (as every int8 build).
  std::vector<float> want8(alone.size(), NAN);
  kernels::portable::gemm_int8_block(xq.view(), wq.view(), bias.data(), want8.data(), n, 0, m, 0, n);
  EXPECT_EQ(alone8, want8);
  // The threaded driver of the AMX walk (M blocks of whole 32-row passes, shares of the panels), emulated: the
  // bits of one block, at 1 and 2 threads, on sizes that split rows and panels.
  for (const int64_t rows : {int64_t{17}, int64_t{45}, int64_t{130}}) {
    const int64_t cols = 300, kk = 1500;
    const Tensor xr = testing::randn({rows, kk}, 41), wr = testing::randn({cols, kk}, 42);
    kernels::PackedB pw;
    kernels::pack_bf16(wr.data(), cols, kk, kk, 1, pw);
    std::vector<float> one(static_cast<size_t>(rows * cols), NAN);
    kernels::amx_emulated::gemm_bf16_packed_block(xr.data(), kk, pw.view(), nullptr, one.data(), cols, 0, rows, 0,
                                                  cols);
    const int saved = omp_get_max_threads();
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      std::vector<float> c(one.size(), NAN);
      kernels::amx_emulated::gemm_bf16_packed(xr.data(), rows, kk, pw.view(), nullptr, c.data(), cols);
      EXPECT_EQ(c, one) << rows << " rows, " << threads << " threads";
    }
    omp_set_num_threads(saved);
  }
  if (kernels::gemm_int8_packed_runs()) {  // the int8 dispatcher, AMX or not: the same bits
    std::vector<float> c8(alone.size(), NAN);
    kernels::gemm_int8_packed(xq.view(), packed8.view(), bias.data(), c8.data(), n);
    EXPECT_EQ(c8, want8) << "gemm_int8_packed under " << kernels::isa_name(kernels::active_isa());
  }
  // The dispatcher: the AMX walk from kAmxMinRows rows where active_isa() is amx, vdpbf16ps below.
  if (kernels::active_isa() >= Isa::kAvx512Bf16) {
    std::vector<float> c(alone.size(), NAN), hw(alone.size(), NAN);
    kernels::gemm_bf16_packed(x.data(), m, k, packed.view(), bias.data(), c.data(), n);
    if (kernels::active_isa() >= Isa::kAmx) {
      kernels::amx::gemm_bf16_packed_block(x.data(), k, packed.view(), bias.data(), hw.data(), n, 0, m, 0, n);
      EXPECT_EQ(c, hw) << "gemm_bf16_packed at " << m << " rows runs the AMX walk";
    } else {
      kernels::avx512bf16::gemm_bf16_packed_block(x.data(), k, packed.view(), bias.data(), hw.data(), n, 0, m, 0, n);
      EXPECT_EQ(c, hw) << "gemm_bf16_packed without AMX runs vdpbf16ps";
    }
  }
}

// The gate: bf16 GEMM error (vs the exact product of the float32 inputs) <= 2x the error of a float64
// product of the same bf16-rounded inputs, plus float32 accumulation slack k·2^-24·max Σ|x||w|.
TEST(Bf16Gemm, ErrorWithinTwiceTheBf16InputErrorPlusFp32Slack) {
  struct Shp {
    int64_t m, n, k;
  };
  for (const Shp s : {Shp{1, 1, 1}, Shp{3, 5, 17}, Shp{33, 65, 257}, Shp{64, 96, 384}}) {
    SCOPED_TRACE("m " + std::to_string(s.m) + " n " + std::to_string(s.n) + " k " + std::to_string(s.k));
    const Tensor x = testing::randn({s.m, s.k}, 100 + s.k), w = testing::randn({s.n, s.k}, 200 + s.k);
    const std::vector<float> xv = x.to_vector(), wv = w.to_vector();
    double abs_max = 0;
    const std::vector<double> exact = product64(xv, wv, s.m, s.n, s.k, &abs_max);
    const double input_err = max_abs_diff(product64(rounded(xv), rounded(wv), s.m, s.n, s.k), exact);
    const double slack = static_cast<double>(s.k) * std::ldexp(1.0, -24) * abs_max;
    const double lin_err = max_abs_diff(testing::to_double(linear(x, LinearWeight(w, Precision::kBFloat16))), exact);
    const double mm_err =
        max_abs_diff(testing::to_double(matmul(x, w.transpose(0, 1), Precision::kBFloat16)), exact);
    std::cout << "[ bf16 gemm] m " << s.m << " n " << s.n << " k " << s.k << ": error " << lin_err
              << " (matmul " << mm_err << "), float64 of bf16 inputs " << input_err << ", fp32 slack " << slack
              << "\n";
    EXPECT_LE(lin_err, 2 * input_err + slack);
    EXPECT_LE(mm_err, 2 * input_err + slack);
    EXPECT_GT(lin_err, 0.0) << "bf16 rounding must show (or the product ran in fp32)";
  }
  EXPECT_THROW(matmul(Tensor::ones({2, 2}), Tensor::ones({2, 2}), Precision::kInt8), std::invalid_argument);
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
