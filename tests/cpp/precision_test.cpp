// Low precision (qkv/core/precision.h): the bf16 rounding and the packed bf16 products on every path this CPU runs,
// by name, against float64 oracles that share no code with them; the bf16 GEMM accuracy gate; and the fronts that
// carry a precision (linear, matmul, attention, nn::Module::set_precision), fp32 staying bit for bit. The int8
// kernels: precision_int8_test.cpp.
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

std::vector<float> rounded(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf16_oracle(v[i]);
  return r;
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
}  // namespace
}  // namespace qkv
