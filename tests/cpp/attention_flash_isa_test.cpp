// Every SIMD microkernel set of the fused attention (AVX2, AVX-512), named explicitly rather than through kAuto:
// forward against the float64 oracle, gradients against the portable set, on head dims and lengths that leave tails.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

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
