// qkv::kernels::sgemm (AVX-512 kernel or OpenBLAS) against a float64 oracle on random shapes, layouts, alpha/beta;
// the AVX-512 entry point on its own, thread-count and rerun bit-identity, NaN-free beta = 0, argument errors.
#include "qkv/kernels/sgemm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "qkv/core/rng.h"

namespace {

using qkv::Rng;
using namespace qkv::kernels;

using GemmFn = std::function<void(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                                  const float*, int64_t, float, float*, int64_t)>;

// Float32 sgemm against a float64 oracle: error bounded by the magnitude sum_k |alpha a b| + |beta c|.
double gemm_tolerance(double magnitude) { return 1e-5 * magnitude + 1e-6; }
// sgemm against sgemm_reference: both float32, different summation orders, so twice the oracle bound.
double gemm_vs_reference_tolerance(double magnitude) { return 2.0 * gemm_tolerance(magnitude); }

struct Case {
  bool ta = false, tb = false;
  int64_t m = 1, n = 1, k = 1;
  float alpha = 1.0f, beta = 0.0f;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;  // extra leading-dimension slack

  int64_t lda() const { return (ta ? m : k) + pad_a + (ta ? (m == 0) : (k == 0)); }
  int64_t ldb() const { return (tb ? k : n) + pad_b + (tb ? (k == 0) : (n == 0)); }
  int64_t ldc() const { return n + pad_c + (n == 0); }
  std::string str() const {
    return std::string(ta ? "T" : "N") + (tb ? "T" : "N") + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
           " k=" + std::to_string(k) + " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta) +
           " pads=" + std::to_string(pad_a) + "," + std::to_string(pad_b) + "," + std::to_string(pad_c);
  }
};

std::vector<float> random_vec(int64_t n, Rng& rng) {
  std::vector<float> v(static_cast<size_t>(std::max<int64_t>(n, 1)));
  for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
  return v;
}

struct Operands {
  std::vector<float> a, b, c;
};

Operands make_operands(const Case& cs, uint64_t seed, bool nan_c) {
  Rng rng(seed);
  Operands o;
  o.a = random_vec((cs.ta ? cs.k : cs.m) * cs.lda(), rng);
  o.b = random_vec((cs.tb ? cs.n : cs.k) * cs.ldb(), rng);
  o.c = random_vec(cs.m * cs.ldc(), rng);
  if (nan_c) std::fill(o.c.begin(), o.c.end(), std::numeric_limits<float>::quiet_NaN());
  return o;
}

float at_a(const Case& cs, const Operands& o, int64_t i, int64_t p) {
  return cs.ta ? o.a[static_cast<size_t>(p * cs.lda() + i)] : o.a[static_cast<size_t>(i * cs.lda() + p)];
}
float at_b(const Case& cs, const Operands& o, int64_t p, int64_t j) {
  return cs.tb ? o.b[static_cast<size_t>(j * cs.ldb() + p)] : o.b[static_cast<size_t>(p * cs.ldb() + j)];
}

// Runs `fn` on the case and checks every element of C (padding columns untouched) against float64.
::testing::AssertionResult matches_oracle(const GemmFn& fn, const Case& cs, uint64_t seed, bool nan_c = false,
                                          double (*tol)(double) = gemm_tolerance) {
  const Operands in = make_operands(cs, seed, nan_c);
  std::vector<float> c = in.c;
  fn(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, in.a.data(), cs.lda(), in.b.data(), cs.ldb(), cs.beta, c.data(),
     cs.ldc());
  for (int64_t i = 0; i < cs.m; ++i) {
    for (int64_t j = 0; j < cs.ldc(); ++j) {
      const size_t idx = static_cast<size_t>(i * cs.ldc() + j);
      if (j >= cs.n) {
        const bool same = std::memcmp(&c[idx], &in.c[idx], sizeof(float)) == 0;
        if (!same) return ::testing::AssertionFailure() << cs.str() << ": padding C(" << i << "," << j << ") written";
        continue;
      }
      double acc = 0.0, mag = 0.0;
      for (int64_t p = 0; p < cs.k; ++p) {
        const double t = double(cs.alpha) * at_a(cs, in, i, p) * at_b(cs, in, p, j);
        acc += t;
        mag += std::abs(t);
      }
      if (cs.beta != 0.0f) {
        acc += double(cs.beta) * in.c[idx];
        mag += std::abs(double(cs.beta) * in.c[idx]);
      }
      const double err = std::abs(double(c[idx]) - acc);
      if (!(err <= tol(mag)))
        return ::testing::AssertionFailure() << cs.str() << ": C(" << i << "," << j << ") = " << c[idx]
                                             << " vs " << acc << " (err " << err << ", tol " << tol(mag) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

const std::vector<int64_t> kSizes = {1, 2, 3, 5, 13, 14, 15, 16, 17, 28, 31, 32, 33, 64, 100, 257};

Case random_case(Rng& rng) {
  static const float alphas[] = {1.0f, 0.5f, -2.0f};
  static const float betas[] = {0.0f, 1.0f, 0.25f};
  Case cs;
  cs.ta = rng.below(2) == 1;
  cs.tb = rng.below(2) == 1;
  cs.m = kSizes[rng.below(kSizes.size())];
  cs.n = kSizes[rng.below(kSizes.size())];
  cs.k = kSizes[rng.below(kSizes.size())];
  cs.alpha = alphas[rng.below(3)];
  cs.beta = betas[rng.below(3)];
  cs.pad_a = rng.below(2) ? static_cast<int64_t>(rng.below(7)) : 0;
  cs.pad_b = rng.below(2) ? static_cast<int64_t>(rng.below(7)) : 0;
  cs.pad_c = rng.below(2) ? static_cast<int64_t>(rng.below(7)) : 0;
  return cs;
}

const GemmFn kSgemm = [](bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                         const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
};
const GemmFn kReference = sgemm_reference;
const GemmFn kAvx512 = sgemm_avx512;

// Larger shapes: several K blocks (k > 256), several M blocks, an N block past 4096 columns, short-wide C.
std::vector<Case> large_cases() {
  std::vector<Case> out;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    out.push_back({ta, tb, 700, 513, 300, 1.0f, 0.0f, 0, 0, 0});
    out.push_back({ta, tb, 341, 97, 600, -2.0f, 0.25f, 3, 5, 7});
    out.push_back({ta, tb, 14, 4130, 300, 0.5f, 1.0f, 0, 1, 2});
    out.push_back({ta, tb, 1, 4130, 700, -2.0f, 0.25f, 3, 1, 0});  // one row (decoding): the GEMV path
  }
  return out;
}

TEST(Sgemm, RandomConfigsMatchFloat64Oracle) {
  Rng rng(2024);
  for (int i = 0; i < 240; ++i) {
    const Case cs = random_case(rng);
    ASSERT_TRUE(matches_oracle(kSgemm, cs, 100 + i));
    if (sgemm_avx512_supported()) ASSERT_TRUE(matches_oracle(kAvx512, cs, 100 + i));
  }
}

TEST(Sgemm, EveryTransComboOnEveryEdgeSize) {
  // Each size once as m, n and k in all four layouts, through the AVX-512 kernel whatever the size.
  const GemmFn& fn = sgemm_avx512_supported() ? kAvx512 : kSgemm;
  for (int t = 0; t < 4; ++t)
    for (int64_t s : kSizes) {
      ASSERT_TRUE(matches_oracle(fn, {bool(t & 1), bool(t & 2), s, 33, 17, 1.0f, 0.25f, 1, 2, 3}, 7));
      ASSERT_TRUE(matches_oracle(fn, {bool(t & 1), bool(t & 2), 29, s, 17, -2.0f, 1.0f, 0, 0, 0}, 8));
      ASSERT_TRUE(matches_oracle(fn, {bool(t & 1), bool(t & 2), 15, 47, s, 0.5f, 0.0f, 2, 0, 1}, 9));
    }
}

TEST(Sgemm, LargeShapesSeveralBlocksMatchOracle) {
  for (const Case& cs : large_cases()) ASSERT_TRUE(matches_oracle(kSgemm, cs, 31));
}

TEST(Sgemm, BetaZeroDoesNotReadNaNInC) {
  for (int t = 0; t < 4; ++t) {
    const Case small{bool(t & 1), bool(t & 2), 5, 7, 3, 1.0f, 0.0f, 1, 1, 1};
    const Case big{bool(t & 1), bool(t & 2), 100, 257, 64, 0.5f, 0.0f, 0, 0, 2};
    const Case row{bool(t & 1), bool(t & 2), 1, 300, 77, -2.0f, 0.0f, 2, 3, 0};  // one row: the GEMV path
    for (const Case& cs : {small, big, row}) {
      ASSERT_TRUE(matches_oracle(kSgemm, cs, 3, /*nan_c=*/true));
      ASSERT_TRUE(matches_oracle(kReference, cs, 3, /*nan_c=*/true));
      if (sgemm_avx512_supported()) ASSERT_TRUE(matches_oracle(kAvx512, cs, 3, /*nan_c=*/true));
    }
  }
}

TEST(Sgemm, KZeroScalesCByBeta) {
  for (const GemmFn& fn : {kSgemm, kReference}) {
    for (float beta : {0.0f, 1.0f, 0.25f}) {
      ASSERT_TRUE(matches_oracle(fn, {false, false, 4, 6, 0, 1.0f, beta, 0, 0, 2}, 5, beta == 0.0f));
      ASSERT_TRUE(matches_oracle(fn, {true, true, 40, 300, 0, -2.0f, beta, 0, 0, 0}, 6, beta == 0.0f));
    }
  }
  if (sgemm_avx512_supported())
    ASSERT_TRUE(matches_oracle(kAvx512, {false, true, 40, 300, 0, 1.0f, 0.0f, 0, 0, 0}, 6, true));
}

TEST(Sgemm, EmptyMOrNLeavesCUntouched) {
  std::vector<float> c(8, 3.0f);
  const float a[4] = {1, 2, 3, 4};
  sgemm(false, false, 0, 4, 1, 1.0f, a, 1, a, 4, 0.0f, c.data(), 4);
  sgemm(false, false, 2, 0, 1, 1.0f, a, 1, a, 1, 0.0f, c.data(), 4);
  for (float v : c) EXPECT_EQ(v, 3.0f);
}

TEST(Sgemm, AgreesWithReferenceOnRandomConfigs) {
  Rng rng(77);
  for (int i = 0; i < 60; ++i) {
    const Case cs = random_case(rng);
    const Operands in = make_operands(cs, 500 + i, false);
    std::vector<float> c1 = in.c, c2 = in.c;
    sgemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, in.a.data(), cs.lda(), in.b.data(), cs.ldb(), cs.beta,
          c1.data(), cs.ldc());
    sgemm_reference(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, in.a.data(), cs.lda(), in.b.data(), cs.ldb(),
                    cs.beta, c2.data(), cs.ldc());
    for (size_t j = 0; j < c1.size(); ++j) {
      // Magnitude bound: alpha * k (|a|, |b| < 1) plus |beta c|.
      const double mag = std::abs(cs.alpha) * double(cs.k) + std::abs(cs.beta);
      ASSERT_LE(std::abs(double(c1[j]) - c2[j]), gemm_vs_reference_tolerance(mag)) << cs.str() << " at " << j;
    }
  }
}

TEST(Sgemm, BackendMatchesCpuAndEnvironment) {
  const char* env = std::getenv("QKV_SGEMM");
  const bool forced = env != nullptr && std::strcmp(env, "openblas") == 0;
  const std::string backend = sgemm_backend();
  if (sgemm_avx512_supported() && !forced) {
    EXPECT_EQ(backend, "avx512");
  } else {
    EXPECT_EQ(backend, "openblas");
  }
}

TEST(Sgemm, Avx512EntryPointRunsOrReportsUnsupported) {
  const Case cs{false, true, 37, 45, 29, 1.0f, 0.0f, 0, 0, 0};
  if (sgemm_avx512_supported()) {
    ASSERT_TRUE(matches_oracle(kAvx512, cs, 11));
  } else {
    EXPECT_EQ(std::string(sgemm_backend()), "openblas");
    const Operands in = make_operands(cs, 11, false);
    std::vector<float> c = in.c;
    try {
      sgemm_avx512(cs.ta, cs.tb, cs.m, cs.n, cs.k, 1.0f, in.a.data(), cs.lda(), in.b.data(), cs.ldb(), 0.0f,
                   c.data(), cs.ldc());
      FAIL() << "sgemm_avx512 ran on a CPU without AVX-512";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("[sgemm]"), std::string::npos) << e.what();
    }
  }
}

// Runs the case with `threads` OpenMP threads; returns C.
std::vector<float> run_with_threads(const GemmFn& fn, const Case& cs, int threads) {
  const Operands in = make_operands(cs, 99, false);
  std::vector<float> c = in.c;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  fn(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, in.a.data(), cs.lda(), in.b.data(), cs.ldb(), cs.beta, c.data(),
     cs.ldc());
  omp_set_num_threads(saved);
  return c;
}

TEST(Sgemm, OneAndTwoThreadsAndRerunsAreBitIdentical) {
  for (const Case& cs : large_cases()) {
    const std::vector<float> one = run_with_threads(kSgemm, cs, 1);
    const std::vector<float> one_again = run_with_threads(kSgemm, cs, 1);
    const std::vector<float> two = run_with_threads(kSgemm, cs, 2);
    const std::vector<float> two_again = run_with_threads(kSgemm, cs, 2);
    ASSERT_EQ(std::memcmp(one.data(), one_again.data(), one.size() * sizeof(float)), 0) << cs.str();
    ASSERT_EQ(std::memcmp(two.data(), two_again.data(), two.size() * sizeof(float)), 0) << cs.str();
    if (std::strcmp(sgemm_backend(), "avx512") == 0)  // K is never split, so even 1 vs 2 threads agree
      ASSERT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0) << cs.str();
  }
}

// One row (decoding's GEMV): qkv's GEMV takes columns four at a time and gives each column the bits it gets alone.
TEST(Sgemm, OneRowGivesEachColumnItsOwnBitsWhateverTheGrouping) {
  for (bool tb : {true, false})
    for (int64_t k : {1, 15, 64, 100, 770, 4096, 4111}) {  // one row at a time below 4096, four from there
      const Case cs{false, tb, 1, 203, k, 1.0f, 0.0f, 0, 3, 0};
      const Operands in = make_operands(cs, 5, false);
      std::vector<float> all(static_cast<size_t>(cs.n));
      sgemm(false, tb, 1, cs.n, k, 1.0f, in.a.data(), cs.lda(), in.b.data(), cs.ldb(), 0.0f, all.data(), cs.n);
      for (int64_t j = 0; j < cs.n; ++j) {
        float one = 0.0f;
        const float* col = tb ? in.b.data() + j * cs.ldb() : in.b.data() + j;
        sgemm(false, tb, 1, 1, k, 1.0f, in.a.data(), cs.lda(), col, cs.ldb(), 0.0f, &one, 1);
        if (std::strcmp(sgemm_backend(), "avx512") == 0)
          ASSERT_EQ(std::memcmp(&one, &all[static_cast<size_t>(j)], sizeof(float)), 0) << cs.str() << " column " << j;
        else  // OpenBLAS's sgemv blocks differently for one column: within float32 rounding of the same sum
          ASSERT_NEAR(one, all[static_cast<size_t>(j)], gemm_vs_reference_tolerance(double(k))) << cs.str();
      }
    }
}

TEST(Sgemm, TwoThreadsMatchOracle) {
  for (const Case& cs : large_cases()) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(2);
    const bool ok = matches_oracle(kSgemm, cs, 41);
    omp_set_num_threads(saved);
    ASSERT_TRUE(ok) << cs.str();
  }
}

TEST(Sgemm, InsideParallelRegionEachCallMatchesSerial) {
  const Case cs{false, true, 200, 130, 70, 1.0f, 0.0f, 0, 0, 0};
  const std::vector<float> serial = run_with_threads(kSgemm, cs, 1);
  const Operands in = make_operands(cs, 99, false);
  std::vector<std::vector<float>> outs(4, in.c);
#pragma omp parallel for num_threads(2)
  for (int i = 0; i < 4; ++i)
    sgemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, in.a.data(), cs.lda(), in.b.data(), cs.ldb(), cs.beta,
          outs[static_cast<size_t>(i)].data(), cs.ldc());
  for (const auto& o : outs) ASSERT_EQ(std::memcmp(o.data(), serial.data(), o.size() * sizeof(float)), 0);
}

// Expects std::invalid_argument from `f` whose message contains `needle`.
template <typename F>
void expect_arg_error(F&& f, const std::string& needle) {
  EXPECT_THROW(f(), std::invalid_argument);
  try {
    f();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Sgemm, RejectsNegativeSizesTooSmallLeadingDimsAndNullPointers) {
  std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64, 0.0f);
  for (const GemmFn& fn : {kSgemm, kReference}) {
    auto call = [&](bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                    const float* pa = nullptr, float* pc = nullptr) {
      return [=, &a, &b, &c] {
        fn(ta, tb, m, n, k, 1.0f, pa ? pa : a.data(), lda, b.data(), ldb, 0.0f, pc ? pc : c.data(), ldc);
      };
    };
    expect_arg_error(call(false, false, -1, 2, 2, 2, 2, 2), "[sgemm] sizes must be >= 0");
    expect_arg_error(call(false, false, 2, 2, -3, 2, 2, 2), "[sgemm] sizes must be >= 0");
    expect_arg_error(call(false, false, 2, 3, 4, 3, 3, 3), "[sgemm] lda 3");       // A (2, 4) needs lda >= 4
    expect_arg_error(call(true, false, 5, 3, 2, 4, 3, 3), "[sgemm] lda 4");        // Aᵀ stored (2, 5)
    expect_arg_error(call(false, false, 2, 3, 4, 4, 2, 3), "[sgemm] ldb 2");       // B (4, 3)
    expect_arg_error(call(false, true, 2, 3, 4, 4, 3, 3), "[sgemm] ldb 3");        // Bᵀ stored (3, 4)
    expect_arg_error(call(false, false, 2, 3, 4, 4, 3, 2), "[sgemm] ldc 2");
    expect_arg_error(call(false, false, 2, 3, 0, 0, 3, 3), "[sgemm] lda 0");       // max(1, k) even for k = 0
    expect_arg_error([&] { fn(false, false, 2, 3, 4, 1.0f, nullptr, 4, b.data(), 3, 0.0f, c.data(), 3); },
                     "[sgemm] A or B is null");
    expect_arg_error([&] { fn(false, false, 2, 3, 4, 1.0f, a.data(), 4, b.data(), 3, 0.0f, nullptr, 3); },
                     "[sgemm] C is null");
  }
  if (sgemm_avx512_supported())
    expect_arg_error([&] { sgemm_avx512(false, false, 2, 3, 4, 1.0f, a.data(), 3, b.data(), 3, 0.0f, c.data(), 3); },
                     "[sgemm] lda 3");
}

}  // namespace
