// Every SIMD microkernel set of the fused attention (AVX2, AVX-512), named explicitly rather than through kAuto:
// forward against the float64 oracle, gradients against the portable set, on head dims and lengths that leave tails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../../src/kernels/attention_flash_kernels.h"
#include "attention_flash_testing.h"
#include "attention_oracle.h"
#include "ops_testing.h"
#include "qkv/kernels/attention_flash.h"

namespace qkv {
namespace {

using kernels::FlashConfig;
using kernels::FlashIsa;

// max |a - ref| <= kAtol + kRtol · max |ref|, on the finite entries (both infinite with one sign otherwise).
constexpr double kAtol = 1e-5;
constexpr double kRtol = 2e-5;

::testing::AssertionResult Close(const std::vector<double>& a, const std::vector<double>& ref, const char* what) {
  if (a.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << a.size() << " vs " << ref.size();
  double mag = 0.0, err = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(ref[i]) || std::isinf(a[i])) {
      if (a[i] != ref[i]) return ::testing::AssertionFailure() << what << "[" << i << "] " << a[i] << " vs " << ref[i];
      continue;
    }
    if (std::isnan(a[i])) return ::testing::AssertionFailure() << what << "[" << i << "] is NaN";
    mag = std::max(mag, std::abs(ref[i]));
    err = std::max(err, std::abs(a[i] - ref[i]));
  }
  if (err <= kAtol + kRtol * mag) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max error " << err << " > " << kAtol << " + " << kRtol << " * "
                                       << mag;
}

bool isa_available(FlashIsa isa) { return testing::flash::available(isa); }

struct Case {
  Shape q, k;  // (B, H, T, D)
  int64_t dv;
  AttentionOptions o;
};

std::vector<Case> cases() {
  std::vector<Case> cs;
  AttentionOptions causal;
  causal.causal = Causal::kTopLeft;
  AttentionOptions bottom;
  bottom.causal = Causal::kBottomRight;
  cs.push_back({{2, 4, 128, 32}, {2, 4, 128, 32}, 32, causal});  // the training benchmark's shape
  cs.push_back({{1, 2, 77, 24}, {1, 2, 77, 24}, 24, causal});     // 24 = 16 + 8: a masked last vector
  cs.push_back({{1, 3, 33, 40}, {1, 3, 50, 40}, 17, bottom});     // odd Dv, Tq < Tk
  cs.push_back({{2, 1, 300, 64}, {2, 1, 270, 64}, 64, {}});        // long: the wide default tiles
  cs.push_back({{1, 1, 1, 8}, {1, 1, 600, 8}, 8, {}});             // one query: the dot-product path
  cs.push_back({{1, 2, 5, 1}, {1, 2, 9, 1}, 3, causal});           // head dim 1
  cs.push_back({{1, 2, 120, 16}, {1, 2, 32, 16}, 16, {}});         // 2-row score block, 120 = 7.5 vectors wide
  cs.push_back({{1, 1, 150, 16}, {1, 1, 150, 16}, 16, causal});    // 150 queries: 9.5 vectors, many row remainders
  AttentionOptions masked;  // additive mask with a fully masked row
  std::vector<float> m(static_cast<size_t>(20 * 45), 0.0f);
  for (size_t j = 0; j < 45; ++j) m[3 * 45 + j] = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < m.size(); i += 7) m[i] = -1.5f;
  masked.mask = Tensor::from_vector({20, 45}, m);
  masked.mask_kind = MaskKind::kAdditive;
  cs.push_back({{2, 2, 20, 16}, {2, 2, 45, 16}, 16, masked});
  return cs;
}

Tensor out_like(const Case& c, uint64_t seed) { return testing::randn({c.q[0], c.q[1], c.q[2], c.dv}, seed); }

void CheckIsa(FlashIsa isa) {
  if (!isa_available(isa)) {  // nothing to run on this CPU: auto must then never pick it (errors: see below)
    const char* name = isa == FlashIsa::kAvx512 ? "avx512" : isa == FlashIsa::kAvx512Bf16 ? "avx512bf16"
                       : isa == FlashIsa::kAmx ? "amx" : isa == FlashIsa::kAmxEmulated ? "amx-emulated" : "avx2";
    EXPECT_NE(std::string(kernels::flash_isa_name(FlashIsa::kAuto)), name);
    return;
  }
  uint64_t seed = 10;
  for (const Case& c : cases()) {
    const Tensor q = testing::randn(c.q, ++seed), k = testing::randn(c.k, ++seed);
    const Tensor v = testing::randn({c.k[0], c.k[1], c.k[2], c.dv}, ++seed), g = out_like(c, ++seed);
    const Shape batch{c.q[0], c.q[1]};
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.q[3]));
    for (int threads : {1, 2}) {
      SCOPED_TRACE("q " + str(c.q) + " k " + str(c.k) + " threads " + std::to_string(threads));
      FlashConfig cfg{isa, threads, 0};
      FlashConfig port{FlashIsa::kPortable, threads, 0};
      const AttentionResult f = kernels::attention_flash_forward(q, k, v, c.o, batch, scale, cfg);
      const testing::OracleResult r = testing::attention_oracle(q, k, v, c.o);
      EXPECT_TRUE(Close(testing::to_double(f.out), r.out, "out"));
      const AttentionGrads a = kernels::attention_flash_backward(q, k, v, f.out, f.lse, g, c.o, batch, scale, cfg);
      const AttentionGrads p = kernels::attention_flash_backward(q, k, v, f.out, f.lse, g, c.o, batch, scale, port);
      EXPECT_TRUE(Close(testing::to_double(a.dq), testing::to_double(p.dq), "dq"));
      EXPECT_TRUE(Close(testing::to_double(a.dk), testing::to_double(p.dk), "dk"));
      EXPECT_TRUE(Close(testing::to_double(a.dv), testing::to_double(p.dv), "dv"));
    }
  }
}

TEST(AttentionFlashIsa, Avx2MatchesOracleAndPortableOnTailShapes) { CheckIsa(FlashIsa::kAvx2); }

TEST(AttentionFlashIsa, Avx512MatchesOracleAndPortableOnTailShapes) { CheckIsa(FlashIsa::kAvx512); }

// The avx512bf16 set at float32: the avx512 set's products (its bf16 products: precision_test.cpp).
TEST(AttentionFlashIsa, Avx512Bf16MatchesOracleAndPortableOnTailShapes) { CheckIsa(FlashIsa::kAvx512Bf16); }

// The amx sets at float32: the avx512 set's products as well (their bf16 products on tiles: precision_fronts_test.cpp,
// bf16_training_test.cpp).
TEST(AttentionFlashIsa, AmxMatchesOracleAndPortableOnTailShapes) { CheckIsa(FlashIsa::kAmx); }
TEST(AttentionFlashIsa, AmxEmulatedMatchesOracleAndPortableOnTailShapes) { CheckIsa(FlashIsa::kAmxEmulated); }

// The amx sets' bf16 products (kernels::flash::GemmBf16 on tiles) against their reference (the emulated tile unit
// with plain-loop copies and stores): the emulated unit with the AVX-512 copies bit for bit, the hardware's within
// float32 rounding of the float64 product; both A layouts (rows: the scores' K, columns: P·V's probabilities), with
// and without accumulation and row scales, on sizes that leave partial tiles, and nothing written outside C's block.
TEST(AttentionFlashIsa, AmxProductsMatchTheirReference) {
  const bool emulated = isa_available(FlashIsa::kAmxEmulated), amx = isa_available(FlashIsa::kAmx);
  std::cout << "[ paths    ] amx products: reference" << (emulated ? ",amx-emulated" : "") << (amx ? ",amx" : "")
            << (emulated && amx ? "" : "; not on this CPU:") << (emulated ? "" : " amx-emulated")
            << (amx ? "" : " amx") << "\n";
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  auto word = [&] {  // two bfloat16, both from normal draws
    float x0 = normal(gen), x1 = normal(gen);
    uint32_t b0, b1;
    std::memcpy(&b0, &x0, 4);
    std::memcpy(&b1, &x1, 4);
    return (b0 >> 16) | (b1 & 0xffff0000u);
  };
  auto half = [](uint32_t w, int h) {
    const uint32_t u = h ? (w & 0xffff0000u) : (w << 16);
    float f;
    std::memcpy(&f, &u, 4);
    return static_cast<double>(f);
  };
  const float poison = -12345.0f;
  for (const int64_t rows : {1, 5, 33, 70, 96})
    for (const int64_t cols : {1, 17, 32, 45, 100})
      for (const int64_t depth : {1, 7, 16, 17, 40})
        for (int mode = 0; mode < 6; ++mode) {
          const bool a_in_rows = mode % 2 == 0, accumulate = mode / 2 != 2, scaled_rows = mode / 2 == 1;
          const int64_t a_rs = a_in_rows ? depth + 3 : 1, a_ks = a_in_rows ? 1 : rows + 5;
          const int64_t b_ks = cols + 2, c_rs = cols + 4;
          std::vector<uint32_t> a(static_cast<size_t>(a_in_rows ? rows * a_rs : depth * a_ks));
          std::vector<uint32_t> b(static_cast<size_t>(depth * b_ks));
          for (uint32_t& x : a) x = word();
          for (uint32_t& x : b) x = word();
          std::vector<float> c0(static_cast<size_t>(rows * c_rs) + 8, poison), row_scale(static_cast<size_t>(rows));
          for (int64_t r = 0; r < rows; ++r) {
            row_scale[static_cast<size_t>(r)] = 0.5f + 0.25f * static_cast<float>(r % 5);
            for (int64_t j = 0; j < cols; ++j) c0[static_cast<size_t>(r * c_rs + j)] = normal(gen);
          }
          kernels::flash::GemmBf16 g;
          g.rows = rows, g.cols = cols, g.depth = depth;
          g.a = a.data(), g.a_rs = a_rs, g.a_ks = a_ks;
          g.b = b.data(), g.b_ks = b_ks;
          g.c_rs = c_rs;
          g.row_scale = scaled_rows ? row_scale.data() : nullptr;
          g.accumulate = accumulate;
          g.scale = accumulate ? 1.0f : 0.125f;
          std::vector<double> want(c0.size());  // float64 of the same operands
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < cols; ++j) {
              double sum = 0.0;
              for (int64_t k = 0; k < depth; ++k) {
                const uint32_t x = a[static_cast<size_t>(r * a_rs + k * a_ks)];
                const uint32_t y = b[static_cast<size_t>(k * b_ks + j)];
                sum += half(x, 0) * half(y, 0) + half(x, 1) * half(y, 1);
              }
              const size_t i = static_cast<size_t>(r * c_rs + j);
              const double s = scaled_rows ? row_scale[static_cast<size_t>(r)] : 1.0;
              want[i] = accumulate ? s * c0[i] + sum : sum * g.scale;
            }
          std::vector<float> ref = c0;
          g.c = ref.data();
          kernels::flash::gemm_bf16_amx_reference(g);
          const std::string at = "rows " + std::to_string(rows) + " cols " + std::to_string(cols) + " depth " +
                                 std::to_string(depth) + " mode " + std::to_string(mode);
          for (size_t i = 0; i < ref.size(); ++i) {
            const bool inside = static_cast<int64_t>(i) < rows * c_rs && static_cast<int64_t>(i) % c_rs < cols;
            if (!inside) {
              ASSERT_EQ(ref[i], poison) << at << " wrote outside C at " << i;
              continue;
            }
            ASSERT_NEAR(ref[i], want[i], 1e-5 * (1.0 + std::abs(want[i])) * static_cast<double>(depth)) << at;
          }
          if (emulated) {
            std::vector<float> got = c0;
            g.c = got.data();
            kernels::flash::gemm_bf16_amx_emulated(g);
            for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(std::memcmp(&got[i], &ref[i], 4), 0) << at << " at " << i;
          }
          if (amx) {
            std::vector<float> got = c0;
            g.c = got.data();
            kernels::flash::gemm_bf16_amx(g);
            for (size_t i = 0; i < got.size(); ++i) {
              if (ref[i] == poison) {
                ASSERT_EQ(got[i], poison) << at << " wrote outside C at " << i;
                continue;
              }
              ASSERT_NEAR(got[i], want[i], 1e-5 * (1.0 + std::abs(want[i])) * static_cast<double>(depth)) << at;
            }
          }
        }
}

TEST(AttentionFlashIsa, AutoPicksTheWidestAvailableSet) {
  const std::string name = kernels::flash_isa_name(FlashIsa::kAuto);
  if (isa_available(FlashIsa::kAmx))
    EXPECT_EQ(name, "amx");
  else if (isa_available(FlashIsa::kAvx512Bf16))
    EXPECT_EQ(name, "avx512bf16");
  else if (isa_available(FlashIsa::kAvx512))
    EXPECT_EQ(name, "avx512");
  else if (isa_available(FlashIsa::kAvx2))
    EXPECT_EQ(name, "avx2");
  else
    EXPECT_EQ(name, "portable");
}

TEST(AttentionFlashIsaErrors, MissingInstructionSetThrowsNamingAttention) {
  for (FlashIsa isa : {FlashIsa::kAvx2, FlashIsa::kAvx512, FlashIsa::kAvx512Bf16, FlashIsa::kAmx,
                       FlashIsa::kAmxEmulated}) {
    if (isa_available(isa)) continue;
    FlashConfig cfg;
    cfg.isa = isa;
    const Tensor q = testing::randn({1, 8}, 2);
    EXPECT_THROW(
        {
          try {
            kernels::attention_flash_forward(q, q, q, {}, Shape{}, 1.0f, cfg);
          } catch (const std::runtime_error& e) {
            EXPECT_NE(std::string(e.what()).find("[attention]"), std::string::npos);
            throw;
          }
        },
        std::runtime_error);
  }
}

}  // namespace
}  // namespace qkv
