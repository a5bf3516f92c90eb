// Float32 weights packed once (kernels::sgemm_pack_b, LinearWeight at kFloat32, Module::set_precision): the same
// bits as sgemm packing op(B) on every call, on random shapes, layouts, column slices and thread counts, within the
// float64 oracle's bound; a module trained after set_precision evaluates its updated weights, never a stale copy.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "nn_testing.h"
#include "ops_testing.h"
#include "qkv/core/rng.h"
#include "qkv/kernels/sgemm.h"
#include "qkv/nn/context.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/multihead_attention.h"
#include "qkv/ops/functional.h"
#include "qkv/ops/lowp.h"
#include "qkv/ops/matmul.h"
#include "qkv/train/optim.h"

namespace qkv {
namespace {

using kernels::SgemmPackedB;

std::vector<float> uniform(int64_t n, Rng& rng) {
  std::vector<float> v(static_cast<size_t>(std::max<int64_t>(n, 1)));
  for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}


// One product C (m, n) = alpha · op(A) · op(B)[:, col0 .. col0 + n) + beta · C, where op(B) has `total` columns.
struct Case {
  bool ta = false, tb = false;
  int64_t m = 1, n = 1, k = 1, total = 1, col0 = 0;
  float alpha = 1.0f, beta = 0.0f;
  std::string str() const {
    return std::string(ta ? "T" : "N") + (tb ? "T" : "N") + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
           " k=" + std::to_string(k) + " of " + std::to_string(total) + " columns from " + std::to_string(col0) +
           " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta);
  }
};

struct Products {
  std::vector<float> packed, per_call;  // C from the pre-packed panels, and from sgemm packing per call
  bool was_packed = false;
};

Products run(const Case& cs, uint64_t seed, int threads) {
  Rng rng(seed);
  const int64_t lda = cs.ta ? cs.m : cs.k, ldb = cs.tb ? cs.k : cs.total, ldc = cs.n;
  const std::vector<float> a = uniform(cs.m * cs.k, rng), b = uniform(cs.k * cs.total, rng),
                           c0 = uniform(cs.m * cs.n, rng);
  // op(B)'s column col0 of the whole matrix: (k, total) row-major starts col0 floats in, (total, k) col0 rows in.
  const float* b_cols = cs.tb ? b.data() + cs.col0 * ldb : b.data() + cs.col0;
  SgemmPackedB pre;
  kernels::sgemm_pack_b(cs.tb, cs.k, cs.total, b.data(), ldb, pre);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  Products r;
  r.was_packed = pre.packed();
  r.packed = r.per_call = c0;
  kernels::sgemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b_cols, ldb, cs.beta, r.packed.data(), ldc,
                 &pre, cs.col0);
  kernels::sgemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b_cols, ldb, cs.beta, r.per_call.data(),
                 ldc);
  omp_set_num_threads(saved);
  // The float64 oracle on the packed result: |error| <= 1e-5 · Σ|terms| + 1e-6.
  for (int64_t i = 0; i < cs.m; ++i)
    for (int64_t j = 0; j < cs.n; ++j) {
      double acc = cs.beta * double(c0[static_cast<size_t>(i * ldc + j)]), mag = std::abs(acc);
      for (int64_t p = 0; p < cs.k; ++p) {
        const double av = cs.ta ? a[static_cast<size_t>(p * lda + i)] : a[static_cast<size_t>(i * lda + p)];
        const double bv = cs.tb ? b_cols[(j * ldb + p)] : b_cols[(p * ldb + j)];
        acc += cs.alpha * av * bv;
        mag += std::abs(cs.alpha * av * bv);
      }
      const double err = std::abs(r.packed[static_cast<size_t>(i * ldc + j)] - acc);
      EXPECT_LE(err, 1e-5 * mag + 1e-6) << cs.str() << " C(" << i << "," << j << ")";
      if (err > 1e-5 * mag + 1e-6) return r;
    }
  return r;
}

TEST(SgemmPacked, SameBitsAsPackingPerCallOnRandomShapesAndSlices) {
  Rng rng(17);
  const std::vector<int64_t> ms = {1, 2, 13, 14, 15, 29, 64, 128, 257};
  const std::vector<int64_t> ns = {1, 5, 31, 32, 33, 96, 130};
  const std::vector<int64_t> ks = {1, 7, 64, 383, 384, 385, 700, 1000};  // one to three K blocks
  const float alphas[] = {1.0f, 0.5f}, betas[] = {0.0f, 1.0f, 0.25f};
  int packed_runs = 0;
  for (int t = 0; t < 60; ++t) {
    Case cs;
    cs.ta = rng.below(2) == 1;
    cs.tb = rng.below(2) == 1;
    cs.m = ms[rng.below(ms.size())];
    cs.n = ns[rng.below(ns.size())];
    cs.k = ks[rng.below(ks.size())];
    cs.col0 = 32 * static_cast<int64_t>(rng.below(3));
    cs.total = cs.col0 + cs.n + static_cast<int64_t>(rng.below(40));
    cs.alpha = alphas[rng.below(2)];
    cs.beta = betas[rng.below(3)];
    const Products r = run(cs, 100 + t, 1 + t % 2);
    ASSERT_TRUE(same_bits(r.packed, r.per_call)) << cs.str();
    packed_runs += r.was_packed;
  }
  // Where sgemm runs its own kernel every operand packs; elsewhere none does, and the product is sgemm's.
  EXPECT_EQ(packed_runs, std::strcmp(kernels::sgemm_backend(), "avx512") == 0 ? 60 : 0);
}

TEST(SgemmPacked, SeveralNBlocksAndThreadCountsGiveOneResult) {
  for (bool tb : {false, true}) {
    const Case cs{false, tb, 45, 4130, 400, 4200, 64, 1.0f, 0.0f};  // two N blocks of 4096, two K blocks
    const Products one = run(cs, 7, 1), two = run(cs, 7, 2);
    EXPECT_TRUE(same_bits(one.packed, one.per_call)) << cs.str();
    if (std::strcmp(kernels::sgemm_backend(), "avx512") == 0)  // OpenBLAS may sum differently on 2 threads
      EXPECT_TRUE(same_bits(one.packed, two.packed)) << cs.str();
    EXPECT_TRUE(same_bits(two.packed, two.per_call)) << cs.str();
  }
}

TEST(SgemmPacked, RejectsASliceThePackDoesNotHold) {
  Rng rng(3);
  const std::vector<float> b = uniform(64 * 100, rng), a = uniform(20 * 64, rng);
  std::vector<float> c(20 * 100);
  SgemmPackedB pre;
  kernels::sgemm_pack_b(true, 64, 100, b.data(), 64, pre);
  const auto call = [&](int64_t n, int64_t k, int64_t col0) {
    kernels::sgemm(false, true, 20, n, k, 1.0f, a.data(), k, b.data() + col0 * 64, 64, 0.0f, c.data(), 100, &pre,
                   col0);
  };
  if (!pre.packed()) {  // sgemm runs OpenBLAS here (no AVX-512, or QKV_ISA below it): an empty pack is never read
    EXPECT_STRNE(kernels::sgemm_backend(), "avx512");
    EXPECT_NO_THROW(call(50, 64, 5));
    return;
  }
  for (auto [n, k, col0] : {std::tuple<int64_t, int64_t, int64_t>{50, 64, 5}, {50, 64, 64}, {50, 32, 0}}) {
    try {
      call(n, k, col0);
      ADD_FAILURE() << "no error for n " << n << " k " << k << " col0 " << col0;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("[sgemm] pre-packed op(B) (64, 100)"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(kernels::sgemm_pack_b(true, 64, 100, b.data(), 10, pre), std::invalid_argument);
}

TEST(SgemmPacked, Fp32LinearWeightGivesLinearsBitsWholeAndInRowSlices) {
  for (auto [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 96}, {7, 5, 3}, {128, 700, 130},
                               {33, 384, 1152}}) {
    const Tensor x = testing::randn({rows, in}, 1), w = testing::randn({out, in}, 2), b = testing::randn({out}, 3);
    const LinearWeight lw(w, Precision::kFloat32);
    EXPECT_TRUE(testing::BitIdentical(linear(x, lw, b), linear(x, w, b))) << rows << "x" << in << "x" << out;
    EXPECT_TRUE(testing::BitIdentical(linear(x, lw), linear(x, w))) << rows << "x" << in << "x" << out;
    for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, out / 2}, {out / 3, out}, {32, out}, {64, out - 1}}) {
      if (r0 >= r1 || r1 > out) continue;
      const Tensor part = linear(x, lw.rows(r0, r1), b.slice(0, r0, r1));
      EXPECT_TRUE(testing::BitIdentical(part, linear(x, w.slice(0, r0, r1), b.slice(0, r0, r1))))
          << "rows " << r0 << ".." << r1;
    }
  }
}

// After set_precision(fp32) the module reads the packed copy; a training step's tape forward switches it to the live
// weights, so evaluating between steps sees the optimizer's update; set_precision / load_state_dict pack again.
TEST(SgemmPacked, ModulePackedAtFp32EvaluatesTheTrainedWeightsNotAStaleCopy) {
  Rng rng(5);
  nn::Linear lin(96, 64, true, rng);
  const Tensor x = testing::randn({40, 96}, 6);
  const Tensor live = lin.forward(nn::Context(), ad::Var(x)).value.clone();
  lin.set_precision(Precision::kFloat32);
  EXPECT_TRUE(testing::BitIdentical(lin.forward(nn::Context(), ad::Var(x)).value, live));
  testing::sgd_steps(lin, x, 2);
  const Tensor want = linear(x, lin.weight, lin.bias);
  EXPECT_FALSE(testing::BitIdentical(want, live));
  EXPECT_TRUE(testing::BitIdentical(lin.forward(nn::Context(), ad::Var(x)).value, want));
  lin.set_precision(Precision::kFloat32);
  EXPECT_TRUE(testing::BitIdentical(lin.forward(nn::Context(), ad::Var(x)).value, want));
  nn::StateDict sd = lin.state_dict();
  sd["weight"] = testing::randn({64, 96}, 8);
  lin.load_state_dict(sd);
  EXPECT_TRUE(
      testing::BitIdentical(lin.forward(nn::Context(), ad::Var(x)).value, linear(x, sd["weight"], lin.bias)));
}

// MultiheadAttention's packed in_proj read as row slices of one packed weight (E = 64: slices on panel bounds; E =
// 40: not, so those slices pack per call): the same bits as before set_precision.
TEST(SgemmPacked, MultiheadAttentionPackedAtFp32KeepsItsBits) {
  for (int64_t E : {64, 40}) {
    Rng rng(9);
    nn::MultiheadAttention mha(E, 4, rng);
    mha.eval();
    const Tensor q = testing::randn({2, 37, E}, 10), kv = testing::randn({2, 21, E}, 11);
    const Tensor self_before = mha.forward(q, q, q).out.value.clone();
    const Tensor cross_before = mha.forward(q, kv, kv).out.value.clone();
    mha.set_precision(Precision::kFloat32);
    EXPECT_TRUE(testing::BitIdentical(mha.forward(q, q, q).out.value, self_before)) << "E " << E;
    EXPECT_TRUE(testing::BitIdentical(mha.forward(q, kv, kv).out.value, cross_before)) << "E " << E;
  }
}

}  // namespace
}  // namespace qkv
