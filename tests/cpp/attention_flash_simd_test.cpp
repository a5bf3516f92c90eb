// The fused-attention microkernel steps written once over the vector width (src/kernels/attention_flash_simd.h):
// the online-softmax step, the backward probabilities and decoding's dot-product scores of every microkernel set
// this CPU runs, and of the
// template instantiated on emulated 8- and 16-lane vectors (GCC vector extensions, any CPU), against a float64
// oracle. The 16-lane emulation runs the block/tail logic the AVX-512 set uses even where AVX-512 is absent.
#include <gtest/gtest.h>

// The emulated 256/512-bit vectors are passed by value between inline helpers of this file only.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../../src/kernels/attention_flash_kernels.h"
#include "../../src/kernels/attention_flash_simd.h"
#include "qkv/kernels/cpu.h"

namespace qkv::kernels::flash {
namespace {

// Lane traits over GCC vector extensions, with the x86 semantics the simd header documents (max/min return the
// second operand when either is NaN; masks are all-ones lanes).
using f32x8 = float __attribute__((vector_size(32)));
using i32x8 = int32_t __attribute__((vector_size(32)));
using f32x16 = float __attribute__((vector_size(64)));
using i32x16 = int32_t __attribute__((vector_size(64)));

template <class FV, class MV, int W>
struct Emulated {
  using F = FV;
  using M = MV;
  using Tail = int64_t;
  static constexpr int64_t kW = W;
  static constexpr int kRegs = W == 16 ? 32 : 16;  // as AVX-512 and AVX2
  static F set1(float v) { return F{} + v; }
  static F zero() { return F{}; }
  static F load(const float* p) { F v; std::memcpy(&v, p, sizeof v); return v; }
  static void store(float* p, F v) { std::memcpy(p, &v, sizeof v); }
  static Tail tail(int64_t n) { return n; }
  static F load_n(const float* p, Tail n) { F v{}; for (int64_t i = 0; i < n; ++i) v[i] = p[i]; return v; }
  static void store_n(float* p, Tail n, F v) { for (int64_t i = 0; i < n; ++i) p[i] = v[i]; }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F fmadd(F a, F b, F c) { return a * b + c; }
  static F max(F a, F b) { return a > b ? a : b; }
  static F min(F a, F b) { return a < b ? a : b; }
  static M eq(F a, F b) { return a == b; }
  static M ge(F a, F b) { return a >= b; }
  static M unord(F a, F b) { return (a != a) | (b != b); }
  static M or_(M a, M b) { return a | b; }
  static F select(M m, F a, F b) { return m ? a : b; }
  static F zero_unless(M m, F a) { return m ? a : F{}; }
  static F pow2n(F p, F t) {
    M pb, tb;
    std::memcpy(&pb, &p, sizeof p);
    std::memcpy(&tb, &t, sizeof t);
    pb += tb << 23;
    F r;
    std::memcpy(&r, &pb, sizeof r);
    return r;
  }
  static void sums4(F a0, F a1, F a2, F a3, float* out) {
    const F a[4] = {a0, a1, a2, a3};
    for (int r = 0; r < 4; ++r) {
      float s = 0.0f;
      for (int i = 0; i < W; ++i) s += a[r][i];
      out[r] = s;
    }
  }
};

using Emulated8 = Emulated<f32x8, i32x8, 8>;
using Emulated16 = Emulated<f32x16, i32x16, 16>;

template <class V>
const Kernels& emulated(const char* name) {
  static const Kernels k{name, portable_kernels().gemm, softmax_cols_impl<V>, dot_scores_impl<V>, bwd_probs_impl<V>};
  return k;
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// Every set to check: the emulations always, the real ones this CPU has (by name; the others are reported).
std::vector<const Kernels*> sets() {
  std::vector<const Kernels*> out{&portable_kernels(), &emulated<Emulated8>("emulated8"),
                                  &emulated<Emulated16>("emulated16")};
  std::string missing;
  if (cpu_supports(Isa::kAvx2)) out.push_back(&avx2_kernels());
  else missing += " avx2";
  if (cpu_supports(Isa::kAvx512)) out.push_back(&avx512_kernels());
  else missing += " avx512";
  std::string ran;
  for (const Kernels* k : out) ran += std::string(" ") + k->name;
  std::cout << "[ sets     ] ran" << ran << (missing.empty() ? "" : "; not on this CPU:" + missing) << "\n";
  return out;
}

// Elementwise |a - ref| <= |ref|·(rtol + ln2·2·2^-24·arg[i]): exp2 is ~2 ulp and a product or a short float sum
// adds a few roundings (rtol); on top, the float argument of 2^x (magnitude arg[i], up to two roundings) is off by
// up to 2^-24·arg each, which scales 2^x by ln2 times that. Infinities and NaN must match exactly.
constexpr double kRtol = 1e-6;     // one exp2 and a few float roundings
constexpr double kSumRtol = 4e-6;  // l: a float sum of up to 33 probabilities
constexpr double kArgRel = 2.0 * 0.6931471805599453 / 16777216.0;
::testing::AssertionResult Close(const std::vector<float>& a, const std::vector<double>& ref, const char* what,
                                 const std::vector<double>& arg, double rtol = kRtol) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(ref[i]) != std::isnan(a[i]))
      return ::testing::AssertionFailure() << what << "[" << i << "] " << a[i] << " vs " << ref[i];
    if (std::isnan(ref[i])) continue;
    if (std::isinf(ref[i]) || std::isinf(a[i])) {
      if (a[i] != ref[i]) return ::testing::AssertionFailure() << what << "[" << i << "] " << a[i] << " vs " << ref[i];
      continue;
    }
    const double err = std::abs(a[i] - ref[i]);
    if (err > std::abs(ref[i]) * (rtol + kArgRel * arg[i]))
      return ::testing::AssertionFailure() << what << "[" << i << "] " << a[i] << " vs " << ref[i] << " (error "
                                           << err << ")";
  }
  return ::testing::AssertionSuccess();
}

TEST(AttentionFlashSimd, SoftmaxColumnsMatchFloat64OracleOnEverySet) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> score(-30.0f, 10.0f), unit(0.0f, 1.0f);
  for (const Kernels* ks : sets())
    for (int64_t ncols : {8, 16, 24, 40})
      for (int64_t nk : {1, 2, 3, 5, 33}) {
        SCOPED_TRACE(std::string(ks->name) + " ncols " + std::to_string(ncols) + " nk " + std::to_string(nk));
        const int64_t ld = ncols + 8;
        std::vector<float> st(static_cast<size_t>(nk * ld)), m(ncols), l(ncols), alpha(ncols, -1.0f);
        for (float& v : st) v = unit(gen) < 0.2f ? kNegInf : score(gen);
        for (int64_t c = 0; c < ncols; ++c) {
          m[c] = c % 3 == 0 ? kNegInf : score(gen);  // a first tile (m = -inf) or a running maximum
          l[c] = m[c] == kNegInf ? 0.0f : 1.0f + unit(gen);
        }
        for (int64_t j = 0; j < nk; ++j) st[j * ld + 1] = kNegInf;  // column 1: still fully masked if m is -inf
        for (int64_t j = 0; j < nk; ++j) st[j * ld + 3] = kNegInf;  // column 3: masked here, m finite
        const std::vector<float> st0 = st, m0 = m, l0 = l;
        std::vector<double> want_st(st.size()), want_m(ncols), want_l(ncols), want_a(ncols);
        std::vector<double> arg_st(st.size(), 0.0), arg_m(ncols, 0.0), arg_a(ncols, 0.0), arg_l(ncols, 0.0);
        for (size_t i = 0; i < st.size(); ++i) want_st[i] = st0[i];
        for (int64_t c = 0; c < ncols; ++c) {
          double mx = m0[c];
          for (int64_t j = 0; j < nk; ++j) mx = std::max<double>(mx, st0[j * ld + c]);
          const double base = mx == -INFINITY ? 0.0 : mx;
          double sum = 0.0;
          for (int64_t j = 0; j < nk; ++j) {
            const double p = std::exp2(st0[j * ld + c] - base);
            want_st[j * ld + c] = p;
            if (std::isfinite(st0[j * ld + c])) arg_st[j * ld + c] = std::abs(st0[j * ld + c] - base);
            arg_l[c] = std::max(arg_l[c], arg_st[j * ld + c]);
            sum += p;
          }
          want_m[c] = mx;
          want_a[c] = std::exp2(m0[c] - base);
          if (std::isfinite(m0[c])) arg_a[c] = std::abs(m0[c] - base);
          arg_l[c] = std::max(arg_l[c], arg_a[c]);
          want_l[c] = want_a[c] * l0[c] + sum;
        }
        ks->softmax_cols(st.data(), ld, nk, ncols, m.data(), l.data(), alpha.data());
        EXPECT_TRUE(Close(st, want_st, "p", arg_st));  // columns >= ncols are left alone (compared with their input)
        EXPECT_TRUE(Close(m, want_m, "m", arg_m));
        EXPECT_TRUE(Close(alpha, want_a, "alpha", arg_a));
        EXPECT_TRUE(Close(l, want_l, "l", arg_l, kSumRtol));
      }
}

TEST(AttentionFlashSimd, BackwardProbabilitiesMatchFloat64OracleOnEverySet) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> score(-20.0f, 5.0f), unit(0.0f, 1.0f);
  for (const Kernels* ks : sets())
    for (int64_t cols : {1, 7, 8, 9, 16, 17, 33})
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(std::string(ks->name) + " cols " + std::to_string(cols) + " bias " + std::to_string(with_bias));
        const int64_t rows = 4, ld = cols + 5;
        std::vector<float> s(rows * ld), bias(rows * ld), dp(rows * ld), lse2(rows), delta(rows);
        for (float& v : s) v = unit(gen) < 0.15f ? kNegInf : score(gen);
        for (float& v : bias) v = unit(gen) < 0.15f ? kNegInf : score(gen) * 0.1f;
        for (float& v : dp) v = score(gen) * 0.1f;
        for (int64_t r = 0; r < rows; ++r) lse2[r] = 3.0f + unit(gen), delta[r] = unit(gen);
        lse2[2] = kPosInf;                                       // a fully masked row: p = 0, dS = 0
        lse2[3] = std::numeric_limits<float>::quiet_NaN();       // blocked pairs stay 0 even with a NaN lse
        const float scale = 0.37f;
        const std::vector<float> s0 = s, dp0 = dp;
        std::vector<double> want_p(s.size()), want_ds(s.size()), arg(s.size(), 0.0);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < ld; ++j) {
            const size_t x = static_cast<size_t>(r * ld + j);
            if (j >= cols) {  // outside the tile: untouched
              want_p[x] = s0[x];
              want_ds[x] = dp0[x];
              continue;
            }
            const bool blocked = s0[x] == kNegInf || (with_bias && bias[x] == kNegInf);
            const double p = blocked ? 0.0 : std::exp2(double(s0[x]) + (with_bias ? bias[x] : 0.0) - lse2[r]);
            want_p[x] = p;
            if (!blocked) arg[x] = std::abs(s0[x]) + (with_bias ? std::abs(bias[x]) : 0.0) + std::abs(lse2[r]);
            want_ds[x] = p == 0.0 ? 0.0 : scale * p * (double(dp0[x]) - delta[r]);
          }
        ks->bwd_probs(s.data(), with_bias ? bias.data() : nullptr, dp.data(), ld, rows, cols, lse2.data(),
                      delta.data(), scale);
        EXPECT_TRUE(Close(s, want_p, "p", arg));
        EXPECT_TRUE(Close(dp, want_ds, "dS", arg));
      }
}

// st[j·ld + i] = q_i · k_j for every query count a decoding tile holds (1-8), head sizes around and past the vector
// widths and the register budget (up to 8 vectors of d at a time), keys past the 16-key blocks; columns past nq and
// the rows' padding untouched.
// Rows held in registers across the keys (dk of whole vectors: as many rows as the registers take, group after group)
// give each score the bits of dot_key's, the rows reloaded per key: the same two chains.
template <class V>
void held_rows_keep_the_bits() {
  std::mt19937 gen(8);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  for (int64_t nq : {1, 2, 3, 4, 5, 8})
    for (int64_t dk : {V::kW, 4 * V::kW, 5 * V::kW, 8 * V::kW})
      for (int64_t nk : {1, 7, 40}) {
        const int64_t k_rs = dk + 5, ld = 8;
        std::vector<float> q(static_cast<size_t>(nq * dk)), k(static_cast<size_t>(nk * k_rs));
        for (float& v : q) v = value(gen);
        for (float& v : k) v = value(gen);
        std::vector<float> st(static_cast<size_t>(nk * ld), 0.0f);
        dot_scores_impl<V>(q.data(), nq, dk, k.data(), k_rs, nk, st.data(), ld);
        for (int64_t j = 0; j < nk; ++j)
          for (int64_t i = 0; i < nq; ++i) {
            float want = 0.0f;
            dot_key<V, 1>(q.data() + i * dk, dk, k.data() + j * k_rs, &want);
            ASSERT_EQ(st[static_cast<size_t>(j * ld + i)], want)
                << V::kW << " lanes, nq " << nq << " dk " << dk << " key " << j << " query " << i;
          }
      }
}

TEST(AttentionFlashSimd, DotScoresOfRowsHeldInRegistersKeepTheBits) {
  held_rows_keep_the_bits<Emulated8>();
  held_rows_keep_the_bits<Emulated16>();
}

TEST(AttentionFlashSimd, DotScoresMatchFloat64OracleOnEverySet) {
  std::mt19937 gen(6);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  for (const Kernels* ks : sets())
    for (int64_t nq : {1, 2, 3, 4, 5, 8})
      for (int64_t dk : {1, 7, 8, 9, 16, 17, 64, 80, 128, 129, 200})
        for (int64_t nk : {1, 5, 16, 33}) {
          SCOPED_TRACE(std::string(ks->name) + " nq " + std::to_string(nq) + " dk " + std::to_string(dk) + " nk " +
                       std::to_string(nk));
          const int64_t k_rs = dk + 3, ld = 8;
          std::vector<float> q(static_cast<size_t>(nq * dk)), k(static_cast<size_t>(nk * k_rs));
          for (float& v : q) v = value(gen);
          for (float& v : k) v = value(gen);
          std::vector<float> st(static_cast<size_t>(nk * ld), 12345.0f);
          ks->dot_scores(q.data(), nq, dk, k.data(), k_rs, nk, st.data(), ld);
          for (int64_t j = 0; j < nk; ++j)
            for (int64_t i = 0; i < ld; ++i) {
              const float got = st[static_cast<size_t>(j * ld + i)];
              if (i >= nq) {
                ASSERT_EQ(got, 12345.0f) << "column " << i << " written";
                continue;
              }
              double want = 0.0, mag = 0.0;
              for (int64_t d = 0; d < dk; ++d) {
                const double x = double(q[static_cast<size_t>(i * dk + d)]) * k[static_cast<size_t>(j * k_rs + d)];
                want += x;
                mag += std::abs(x);
              }
              // A float sum of dk rounded multiply-adds, any order: |error| <= (dk + 4)·2^-24·Σ|q_d·k_d|.
              ASSERT_NEAR(got, want, double(dk + 4) * 0x1p-24 * mag) << "key " << j << " query " << i;
            }
        }
}

}  // namespace
}  // namespace qkv::kernels::flash
