// Positional encodings, the absolute and bias families (sinusoidal, learned, Shaw relative, T5 buckets and bias):
// each against hand-computed values and its defining property, and the error paths. RoPE, ALiBi and the
// permutation test: positional_rope_alibi_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "ops_testing.h"
#include "positional_testing.h"
#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/positional.h"
#include "qkv/ops/attention.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::kExact;
using testing::kFloatVsDouble;
using testing::randn;
using testing::ThrowsArg;
using testing::Tol;
using namespace testing::positional;

// Float64 reference of Shaw's relative attention (no mask), for the clip and offset tests.
struct ShawRef {
  std::vector<double> out, weights, lse;
};
ShawRef shaw_oracle(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& rk, const Tensor& rv,
                    int64_t clip, double scale, int64_t query_offset) {
  const auto Q = testing::to_double(q.contiguous()), K = testing::to_double(k.contiguous());
  const auto V = testing::to_double(v.contiguous()), RK = testing::to_double(rk), RV = testing::to_double(rv);
  const int64_t Tq = q.size(-2), Tk = k.size(-2), D = q.size(-1), Dv = v.size(-1);
  const int64_t nb = q.numel() / (Tq * D);
  ShawRef r;
  r.out.assign(nb * Tq * Dv, 0.0);
  r.weights.assign(nb * Tq * Tk, 0.0);
  r.lse.assign(nb * Tq, 0.0);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t i = 0; i < Tq; ++i) {
      std::vector<double> e(Tk);
      double mx = -INFINITY;
      for (int64_t j = 0; j < Tk; ++j) {
        const int64_t rel = std::clamp<int64_t>(j - (i + query_offset), -clip, clip) + clip;
        double s = 0.0;
        for (int64_t d = 0; d < D; ++d) s += Q[(b * Tq + i) * D + d] * (K[(b * Tk + j) * D + d] + RK[rel * D + d]);
        e[j] = scale * s;
        mx = std::max(mx, e[j]);
      }
      double sum = 0.0;
      for (double& x : e) sum += (x = std::exp(x - mx));
      r.lse[b * Tq + i] = mx + std::log(sum);
      for (int64_t j = 0; j < Tk; ++j) {
        const double a = e[j] / sum;
        r.weights[(b * Tq + i) * Tk + j] = a;
        const int64_t rel = std::clamp<int64_t>(j - (i + query_offset), -clip, clip) + clip;
        for (int64_t d = 0; d < Dv; ++d)
          r.out[(b * Tq + i) * Dv + d] += a * (V[(b * Tk + j) * Dv + d] + RV[rel * Dv + d]);
      }
    }
  return r;
}

// ============================================================================ sinusoidal

TEST(Sinusoidal, TableMatchesFormulaAtSpecificPositions) {
  const Tensor pe = sinusoidal_table(6, 6);
  ASSERT_EQ(pe.shape(), Shape({6, 6}));
  // Position 0: sin(0) = 0 on even columns, cos(0) = 1 on odd ones.
  EXPECT_TRUE(AllClose(pe.select(0, 0), dvec({0, 1, 0, 1, 0, 1}), kExact));
  // E = 6: frequencies 1, 10000^(-2/6), 10000^(-4/6).
  const double f1 = std::pow(10000.0, -2.0 / 6.0), f2 = std::pow(10000.0, -4.0 / 6.0);
  EXPECT_TRUE(AllClose(pe.select(0, 1), dvec({std::sin(1.0), std::cos(1.0), std::sin(f1), std::cos(f1),
                                              std::sin(f2), std::cos(f2)}), kTableTol));
  EXPECT_NEAR(pe.at({2, 3}), std::cos(2 * f1), 1e-7);
  EXPECT_NEAR(pe.at({5, 4}), std::sin(5 * f2), 1e-7);
  EXPECT_NEAR(pe.at({5, 0}), std::sin(5.0), 1e-7);
}

TEST(Sinusoidal, OddEmbeddingDimEndsOnSineColumn) {
  const Tensor pe = sinusoidal_table(4, 5);
  ASSERT_EQ(pe.shape(), Shape({4, 5}));
  const double f2 = std::pow(10000.0, -4.0 / 5.0);  // column 4 = 2i with i = 2, E = 5
  EXPECT_NEAR(pe.at({3, 4}), std::sin(3 * f2), 1e-7);
  EXPECT_NEAR(pe.at({3, 3}), std::cos(3 * std::pow(10000.0, -2.0 / 5.0)), 1e-7);
}

TEST(Sinusoidal, LargePositionStaysAccurate) {
  // Angles in double: position 100000 at frequency 1 is still sin(100000) to float rounding.
  EXPECT_NEAR(sinusoidal_table(1, 2, 100000).at({0, 0}), std::sin(100000.0), 1e-6);
}

TEST(Sinusoidal, OffsetShiftsRows) {
  const Tensor full = sinusoidal_table(7, 8);
  EXPECT_TRUE(AllClose(sinusoidal_table(4, 8, 3), full.slice(0, 3, 7).contiguous(), kExact));
}

TEST(Sinusoidal, AddBroadcastsOverBatchAndAcceptsStridedInput) {
  const Tensor base = randn({3, 2, 5}, 1);  // (T, B, E); the (B, T, E) view below is strided
  const Tensor x = base.transpose(0, 1);
  ASSERT_FALSE(x.is_contiguous());
  const Tensor y = add_sinusoidal(x, 2);
  ASSERT_EQ(y.shape(), Shape({2, 3, 5}));
  const Tensor pe = sinusoidal_table(3, 5, 2);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t e = 0; e < 5; ++e) EXPECT_FLOAT_EQ(y.at({b, t, e}), x.at({b, t, e}) + pe.at({t, e}));
  nn::SinusoidalPositionalEncoding mod(5);
  EXPECT_EQ(mod.num_parameters(), 0);
  EXPECT_TRUE(AllClose(mod.forward(x, 2), y, kExact));
}

TEST(Sinusoidal, IncrementalDecodingEqualsFullSequence) {
  const Tensor x = randn({1, 5, 4}, 2);
  const Tensor full = add_sinusoidal(x);
  for (int64_t t = 0; t < 5; ++t)
    EXPECT_TRUE(AllClose(add_sinusoidal(x.slice(1, t, t + 1), t), full.slice(1, t, t + 1).contiguous(), kExact));
}

TEST(Sinusoidal, ErrorsNameTheOp) {
  EXPECT_TRUE(ThrowsArg([] { sinusoidal_table(-1, 4); }, "[sinusoidal_table]"));
  EXPECT_TRUE(ThrowsArg([] { sinusoidal_table(3, 0); }, "[sinusoidal_table]"));
  EXPECT_TRUE(ThrowsArg([] { sinusoidal_table(3, 4, -1); }, "[sinusoidal_table]"));
  EXPECT_TRUE(ThrowsArg([] { sinusoidal_table(3, 4, 0, 0.0f); }, "[sinusoidal_table]"));
  EXPECT_TRUE(ThrowsArg([] { sinusoidal_table(3, 4, 0, NAN); }, "[sinusoidal_table]"));
  EXPECT_TRUE(ThrowsArg([] { add_sinusoidal(Tensor::zeros({4})); }, "[add_sinusoidal]"));
  EXPECT_TRUE(ThrowsArg([] { add_sinusoidal(Tensor()); }, "[add_sinusoidal]"));
  EXPECT_TRUE(ThrowsArg([] { add_sinusoidal(Tensor::zeros({2, 0})); }, "[add_sinusoidal]"));
  EXPECT_TRUE(ThrowsArg([] { add_sinusoidal(Tensor::zeros({2, 4}), -2); }, "[add_sinusoidal]"));
  EXPECT_TRUE(ThrowsArg([] { nn::SinusoidalPositionalEncoding m(0); }, "[SinusoidalPositionalEncoding]"));
  EXPECT_TRUE(ThrowsArg([] { nn::SinusoidalPositionalEncoding m(4, -1.0f); }, "[SinusoidalPositionalEncoding]"));
  nn::SinusoidalPositionalEncoding m(4);
  EXPECT_TRUE(ThrowsArg([&] { m.forward(Tensor::zeros({2, 3})); }, "[SinusoidalPositionalEncoding]"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(Tensor::zeros({2, 4}), -1); }, "[SinusoidalPositionalEncoding]"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(Tensor()); }, "[SinusoidalPositionalEncoding]"));
}

// ============================================================================ learned absolute

TEST(LearnedPositional, ParameterIsWeightMaxLenByE) {
  Rng rng(3);
  nn::LearnedPositionalEmbedding pe(10, 4, rng);
  const auto named = pe.named_parameters();
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].first, "weight");
  EXPECT_EQ(named[0].second->shape(), Shape({10, 4}));
  nn::LearnedPositionalEmbedding zero(10, 4);
  EXPECT_EQ(zero.weight.to_vector(), std::vector<float>(40, 0.0f));
  zero.load_state_dict(pe.state_dict());
  EXPECT_TRUE(AllClose(zero.weight, pe.weight, kExact));
}

TEST(LearnedPositional, ForwardAddsRowsFromOffset) {
  Rng rng(4);
  nn::LearnedPositionalEmbedding pe(6, 3, rng);
  const Tensor x = randn({2, 3, 3}, 5);
  const Tensor y = pe.forward(x, 2);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t e = 0; e < 3; ++e) EXPECT_FLOAT_EQ(y.at({b, t, e}), x.at({b, t, e}) + pe.weight.at({t + 2, e}));
  EXPECT_TRUE(pe.rows(3, 2).shares_storage(pe.weight));
  // The whole table fits exactly.
  EXPECT_EQ(pe.forward(Tensor::zeros({6, 3})).to_vector(), pe.weight.to_vector());
}

TEST(LearnedPositional, SequenceLongerThanMaxLenThrows) {
  nn::LearnedPositionalEmbedding pe(4, 2);
  EXPECT_TRUE(ThrowsArg([&] { pe.forward(Tensor::zeros({1, 5, 2})); }, "[LearnedPositionalEmbedding]"));
  EXPECT_TRUE(ThrowsArg([&] { pe.forward(Tensor::zeros({1, 3, 2}), 2); }, "[LearnedPositionalEmbedding]"));
  EXPECT_TRUE(ThrowsArg([&] { pe.forward(Tensor::zeros({1, 3, 2}), -1); }, "[LearnedPositionalEmbedding]"));
  EXPECT_TRUE(ThrowsArg([&] { pe.forward(Tensor::zeros({1, 3, 3})); }, "[LearnedPositionalEmbedding]"));
  EXPECT_TRUE(ThrowsArg([&] { pe.forward(Tensor::zeros({3})); }, "[LearnedPositionalEmbedding]"));
  EXPECT_TRUE(ThrowsArg([&] { pe.forward(Tensor()); }, "[LearnedPositionalEmbedding]"));
  EXPECT_TRUE(ThrowsArg([&] { pe.rows(5); }, "[LearnedPositionalEmbedding]"));
  EXPECT_TRUE(ThrowsArg([] { nn::LearnedPositionalEmbedding m(0, 2); }, "[LearnedPositionalEmbedding]"));
  EXPECT_TRUE(ThrowsArg([] { nn::LearnedPositionalEmbedding m(3, 0); }, "[LearnedPositionalEmbedding]"));
  Rng rng(0);
  EXPECT_TRUE(ThrowsArg([&] { nn::LearnedPositionalEmbedding m(3, 2, rng, -1.0f); }, "[LearnedPositionalEmbedding]"));
}

// ============================================================================ Shaw relative attention

TEST(ShawRelative, IndexClipsDistance) {
  EXPECT_EQ(shaw_relative_index(0, 2), 2);
  EXPECT_EQ(shaw_relative_index(-1, 2), 1);
  EXPECT_EQ(shaw_relative_index(2, 2), 4);
  EXPECT_EQ(shaw_relative_index(7, 2), 4);
  EXPECT_EQ(shaw_relative_index(-9, 2), 0);
  EXPECT_EQ(shaw_relative_index(5, 0), 0);
  EXPECT_TRUE(ThrowsArg([] { shaw_relative_index(0, -1); }, "[shaw_relative_index]"));
}

// Zero tables: relative attention is exactly scaled dot-product attention, for every mask kind and causal mode.
TEST(ShawRelative, ZeroTablesEqualPlainAttentionForEveryMask) {
  const int64_t B = 2, H = 2, Tq = 3, Tk = 5, D = 4, clip = 2;
  const Tensor q = randn({B, H, Tq, D}, 10), k = randn({B, H, Tk, D}, 11), v = randn({B, H, Tk, D}, 12);
  const Tensor rk = Tensor::zeros({2 * clip + 1, D}), rv = Tensor::zeros({2 * clip + 1, D});
  Tensor keep = Rng(13).bernoulli({1, 1, Tq, Tk}, 0.7f);
  keep.at({0, 0, 1, 0}) = 1.0f;  // keep at least one key in row 1
  std::vector<AttentionOptions> cases(7);
  cases[1].causal = Causal::kTopLeft;
  cases[2].causal = Causal::kBottomRight;
  cases[3].mask = keep;
  cases[3].mask_kind = MaskKind::kKeep;
  cases[4].mask = keep;
  cases[4].mask_kind = MaskKind::kBlock;
  cases[5].mask = randn({B, 1, 1, Tk}, 14);
  cases[5].mask_kind = MaskKind::kAdditive;
  cases[5].causal = Causal::kBottomRight;
  cases[6].scale = 0.3f;
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    AttentionOptions o = cases[c];
    o.return_weights = true;
    o.return_lse = true;
    const AttentionResult ours = relative_attention(q, k, v, rk, rv, clip, o);
    const AttentionResult ref = attention(q, k, v, o);
    EXPECT_TRUE(AllClose(ours.out, ref.out, kPathTol));
    EXPECT_TRUE(AllClose(ours.weights, ref.weights, kPathTol));
    EXPECT_TRUE(AllClose(ours.lse, ref.lse, kPathTol));
  }
}

TEST(ShawRelative, MatchesFormulaWithClippedDistances) {
  // T = 7 and clip = 2: distances up to ±6 fall onto the edge rows.
  const int64_t T = 7, D = 3, clip = 2;
  const Tensor q = randn({2, T, D}, 20), k = randn({2, T, D}, 21), v = randn({2, T, D}, 22);
  const Tensor rk = randn({2 * clip + 1, D}, 23), rv = randn({2 * clip + 1, D}, 24);
  AttentionOptions o;
  o.return_weights = o.return_lse = true;
  const AttentionResult r = relative_attention(q, k, v, rk, rv, clip, o);
  const ShawRef ref = shaw_oracle(q, k, v, rk, rv, clip, 1.0 / std::sqrt(3.0), 0);
  EXPECT_TRUE(AllClose(r.out, ref.out, kFloatVsDouble));
  EXPECT_TRUE(AllClose(r.weights, ref.weights, kFloatVsDouble));
  EXPECT_TRUE(AllClose(r.lse, ref.lse, kFloatVsDouble));
}

TEST(ShawRelative, ClipSharesEdgeRows) {
  // A clip-5 table whose rows beyond ±2 repeat the ±2 rows behaves exactly like the clip-2 table.
  const int64_t T = 7, D = 4;
  const Tensor q = randn({1, T, D}, 30), k = randn({1, T, D}, 31), v = randn({1, T, D}, 32);
  const Tensor rk2 = randn({5, D}, 33), rv2 = randn({5, D}, 34);
  Tensor rk5 = Tensor::empty({11, D}), rv5 = Tensor::empty({11, D});
  for (int64_t d = -5; d <= 5; ++d) {
    const int64_t src = std::clamp<int64_t>(d, -2, 2) + 2;
    rk5.select(0, d + 5).copy_from(rk2.select(0, src));
    rv5.select(0, d + 5).copy_from(rv2.select(0, src));
  }
  const AttentionResult a = relative_attention(q, k, v, rk2, rv2, 2);
  const AttentionResult b = relative_attention(q, k, v, rk5, rv5, 5);
  EXPECT_TRUE(AllClose(a.out, b.out, kPathTol));
  // ... while a clip-5 table with distinct rows does not.
  EXPECT_GT(max_abs_diff(a.out, relative_attention(q, k, v, randn({11, D}, 35), randn({11, D}, 36), 5).out),
            kClearlyDifferent);
}

TEST(ShawRelative, ClipZeroAddsOneVectorToKeysAndValues) {
  // clip = 0: every pair uses row 0. q·a is constant along a row (softmax ignores it), and Σα = 1 adds a^V once.
  const Tensor q = randn({1, 2, 4, 3}, 40), k = randn({1, 2, 6, 3}, 41), v = randn({1, 2, 6, 3}, 42);
  const Tensor rk = randn({1, 3}, 43), rv = Tensor::from_vector({1, 3}, {0.5f, -1.0f, 2.0f});
  AttentionOptions o;
  o.return_weights = true;
  const AttentionResult r = relative_attention(q, k, v, rk, rv, 0, o);
  const AttentionResult plain = attention(q, k, v, o);
  EXPECT_TRUE(AllClose(r.weights, plain.weights, kPathTol));
  Tensor shifted = plain.out.clone();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t d = 0; d < 3; ++d) shifted.at({0, h, i, d}) += rv.at({0, d});
  EXPECT_TRUE(AllClose(r.out, shifted, kPathTol));
}

TEST(ShawRelative, ValueTableMayBeAbsent) {
  const Tensor q = randn({1, 3, 2}, 44), k = randn({1, 4, 2}, 45), v = randn({1, 4, 5}, 46);
  const Tensor rk = randn({3, 2}, 47);
  const AttentionResult r = relative_attention(q, k, v, rk, Tensor(), 1);
  const AttentionResult z = relative_attention(q, k, v, rk, Tensor::zeros({3, 5}), 1);
  EXPECT_TRUE(AllClose(r.out, z.out, kExact));
}

TEST(ShawRelative, QueryOffsetMatchesLastRowsOfFullSequence) {
  // Decoding: the last Tq queries with query_offset = Tk - Tq see the same distances as in the full sequence.
  const int64_t T = 6, Tq = 2, D = 4, clip = 3;
  const Tensor q = randn({1, 1, T, D}, 50), k = randn({1, 1, T, D}, 51), v = randn({1, 1, T, D}, 52);
  const Tensor rk = randn({7, D}, 53), rv = randn({7, D}, 54);
  AttentionOptions o;
  o.causal = Causal::kTopLeft;
  const Tensor full = relative_attention(q, k, v, rk, rv, clip, o).out;
  AttentionOptions od;
  od.causal = Causal::kBottomRight;
  const Tensor last = relative_attention(q.slice(2, T - Tq, T), k, v, rk, rv, clip, od, T - Tq).out;
  EXPECT_TRUE(AllClose(last, full.slice(2, T - Tq, T).contiguous(), kPathTol));
  const ShawRef ref = shaw_oracle(q.slice(2, T - Tq, T), k, v, rk, rv, clip, 0.5, T - Tq);
  // Without the causal mask the offset still positions the queries: compare with the oracle.
  EXPECT_TRUE(AllClose(relative_attention(q.slice(2, T - Tq, T), k, v, rk, rv, clip, {}, T - Tq).out, ref.out,
                       kFloatVsDouble));
}

TEST(ShawRelative, FullyMaskedRowIsZeroNotNaN) {
  const Tensor q = randn({1, 3, 2}, 60), k = randn({1, 4, 2}, 61), v = randn({1, 4, 2}, 62);
  Tensor keep = Tensor::ones({3, 4});
  for (int64_t j = 0; j < 4; ++j) keep.at({1, j}) = 0.0f;
  AttentionOptions o;
  o.mask = keep;
  o.mask_kind = MaskKind::kKeep;
  o.return_weights = o.return_lse = true;
  const AttentionResult r = relative_attention(q, k, v, randn({3, 2}, 63), randn({3, 2}, 64), 1, o);
  for (int64_t d = 0; d < 2; ++d) EXPECT_EQ(r.out.at({0, 1, d}), 0.0f);
  for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(r.weights.at({0, 1, j}), 0.0f);
  EXPECT_EQ(r.lse.at({0, 1}), -kInf);
  for (float x : r.out.to_vector()) EXPECT_FALSE(std::isnan(x));
  // Tk = 0: every row is fully masked.
  const AttentionResult e = relative_attention(q, Tensor::zeros({1, 0, 2}), Tensor::zeros({1, 0, 2}),
                                               Tensor::zeros({3, 2}), Tensor(), 1);
  EXPECT_EQ(e.out.to_vector(), std::vector<float>(6, 0.0f));
}

TEST(ShawRelative, StridedInputsMatchContiguous) {
  const Tensor base = randn({1, 5, 2, 4}, 70);  // (B, T, H, D) -> (B, H, T, D) view
  const Tensor x = base.transpose(1, 2);
  ASSERT_FALSE(x.is_contiguous());
  const Tensor rk = randn({5, 4}, 71), rv = randn({5, 4}, 72);
  EXPECT_TRUE(AllClose(relative_attention(x, x, x, rk, rv, 2).out,
                       relative_attention(x.contiguous(), x.contiguous(), x.contiguous(), rk, rv, 2).out, kExact));
}

TEST(ShawRelative, ModuleHoldsRelKAndRelV) {
  Rng rng(80);
  nn::ShawRelativePosition m(3, 4, rng);
  const auto named = m.named_parameters();
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[0].first, "rel_k");
  EXPECT_EQ(named[1].first, "rel_v");
  EXPECT_EQ(m.rel_k.shape(), Shape({7, 4}));
  EXPECT_EQ(m.rel_v.shape(), Shape({7, 4}));
  const Tensor q = randn({1, 2, 3, 4}, 81), k = randn({1, 2, 5, 4}, 82), v = randn({1, 2, 5, 4}, 83);
  EXPECT_TRUE(AllClose(m.forward(q, k, v).out, relative_attention(q, k, v, m.rel_k, m.rel_v, 3).out, kExact));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(q.select(0, 0), k, v); }, "[ShawRelativePosition]"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(q, k, Tensor::zeros({1, 2, 5, 3})); }, "[ShawRelativePosition]"));
  EXPECT_TRUE(ThrowsArg([] { nn::ShawRelativePosition s(-1, 4); }, "[ShawRelativePosition]"));
  EXPECT_TRUE(ThrowsArg([] { nn::ShawRelativePosition s(1, 0); }, "[ShawRelativePosition]"));
}

TEST(ShawRelative, ErrorsNameTheOp) {
  const Tensor q = Tensor::zeros({2, 3, 4}), k = Tensor::zeros({2, 5, 4}), v = Tensor::zeros({2, 5, 6});
  const Tensor rk = Tensor::zeros({3, 4}), rv = Tensor::zeros({3, 6});
  const std::string op = "[relative_attention]";
  EXPECT_NO_THROW(relative_attention(q, k, v, rk, rv, 1));
  EXPECT_TRUE(ThrowsArg([&] { relative_attention(Tensor(), k, v, rk, rv, 1); }, op));
  EXPECT_TRUE(ThrowsArg([&] { relative_attention(Tensor::zeros({4}), k, v, rk, rv, 1); }, op));
  EXPECT_TRUE(ThrowsArg([&] { relative_attention(Tensor::zeros({1, 3, 4}), k, v, rk, rv, 1); }, op));  // lead dims
  EXPECT_TRUE(ThrowsArg([&] { relative_attention(q, Tensor::zeros({2, 5, 3}), v, rk, rv, 1); }, op));   // D
  EXPECT_TRUE(ThrowsArg([&] { relative_attention(q, k, Tensor::zeros({2, 4, 6}), rk, rv, 1); }, op));   // Tk
  EXPECT_TRUE(ThrowsArg([&] { relative_attention(q, k, v, rk, rv, -1); }, op));
  EXPECT_TRUE(ThrowsArg([&] { relative_attention(q, k, v, Tensor::zeros({5, 4}), rv, 1); }, op));
  EXPECT_TRUE(ThrowsArg([&] { relative_attention(q, k, v, Tensor(), rv, 1); }, op));
  EXPECT_TRUE(ThrowsArg([&] { relative_attention(q, k, v, rk, Tensor::zeros({3, 4}), 1); }, op));
  AttentionOptions no_kind;
  no_kind.mask = Tensor::zeros({3, 5});
  EXPECT_TRUE(ThrowsArg([&] { relative_attention(q, k, v, rk, rv, 1, no_kind); }, op));
  AttentionOptions no_mask;
  no_mask.mask_kind = MaskKind::kAdditive;
  EXPECT_TRUE(ThrowsArg([&] { relative_attention(q, k, v, rk, rv, 1, no_mask); }, op));
  AttentionOptions bad_mask;
  bad_mask.mask = Tensor::zeros({3, 4});
  bad_mask.mask_kind = MaskKind::kAdditive;
  EXPECT_TRUE(ThrowsArg([&] { relative_attention(q, k, v, rk, rv, 1, bad_mask); }, op));
  AttentionOptions bad_scale;
  bad_scale.scale = INFINITY;
  EXPECT_TRUE(ThrowsArg([&] { relative_attention(q, k, v, rk, rv, 1, bad_scale); }, op));
}

// ============================================================================ T5 buckets

// The first relative distance of each log bucket, from the formula: bucket max_exact + m starts at
// ceil(max_exact · (max_distance / max_exact)^(m / (n - max_exact))) with n the buckets per direction.
//   bidirectional, 32 buckets, 128: n = 16, max_exact = 8, 16^(m/8) = 2^(m/2): 8, 11.3, 16, 22.6, 32, 45.3, 64, 90.5
//   unidirectional, 32 buckets, 128: n = 32, max_exact = 16, 8^(m/16): 16, 18.2, 20.7, 23.5, ... 99.5, 113.1
struct BucketStart {
  int64_t distance;
  int64_t bucket;
};

int64_t expected_bucket(const std::vector<BucketStart>& starts, int64_t distance) {
  int64_t b = 0;
  for (const BucketStart& s : starts)
    if (distance >= s.distance) b = s.bucket;
  return b;
}

TEST(T5Bucket, BidirectionalDefaultTableByHand) {
  std::vector<BucketStart> past;  // keys at or before the query (j - i <= 0): buckets 0..15
  for (int64_t d = 0; d < 8; ++d) past.push_back({d, d});
  for (auto [d, b] : std::vector<std::pair<int64_t, int64_t>>{
           {8, 8}, {12, 9}, {16, 10}, {23, 11}, {32, 12}, {46, 13}, {64, 14}, {91, 15}})
    past.push_back({d, b});
  for (int64_t rp = -300; rp <= 300; ++rp) {
    const int64_t dist = rp < 0 ? -rp : rp;
    const int64_t want = rp > 0 ? 16 + expected_bucket(past, dist) : expected_bucket(past, dist);
    ASSERT_EQ(t5_relative_bucket(rp, true), want) << "relative_position " << rp;
  }
  // Spot values: the exact-power boundaries (16 = 8·2, 64 = 8·8) land on their bucket, not one below.
  EXPECT_EQ(t5_relative_bucket(-16, true), 10);
  EXPECT_EQ(t5_relative_bucket(64, true), 30);
  EXPECT_EQ(t5_relative_bucket(0, true), 0);
  EXPECT_EQ(t5_relative_bucket(1, true), 17);
  EXPECT_EQ(t5_relative_bucket(-100000, true), 15);
  EXPECT_EQ(t5_relative_bucket(100000, true), 31);
}

TEST(T5Bucket, UnidirectionalDefaultTableByHand) {
  std::vector<BucketStart> past;
  for (int64_t d = 0; d < 16; ++d) past.push_back({d, d});
  const int64_t starts[] = {16, 19, 21, 24, 27, 31, 35, 40, 46, 52, 59, 67, 77, 87, 99, 113};
  for (int64_t m = 0; m < 16; ++m) past.push_back({starts[m], 16 + m});
  for (int64_t rp = -300; rp <= 300; ++rp) {
    const int64_t want = rp > 0 ? 0 : expected_bucket(past, -rp);  // future keys collapse to bucket 0
    ASSERT_EQ(t5_relative_bucket(rp, false), want) << "relative_position " << rp;
  }
}

TEST(T5Bucket, SmallConfigurations) {
  // 8 buckets, bidirectional, max_distance 20: n = 4, max_exact = 2, log bucket m starts at 2·10^(m/2): 2, 6.3
  const int64_t want[] = {0, 1, 2, 2, 2, 2, 2, 3, 3, 3};  // distances 0..9 before the query
  for (int64_t d = 0; d < 10; ++d) {
    EXPECT_EQ(t5_relative_bucket(-d, true, 8, 20), want[d]) << d;
    if (d > 0) EXPECT_EQ(t5_relative_bucket(d, true, 8, 20), 4 + want[d]) << d;
  }
}

TEST(T5Bucket, ErrorsNameTheOp) {
  EXPECT_TRUE(ThrowsArg([] { t5_relative_bucket(0, true, 3, 128); }, "[t5_relative_bucket]"));
  EXPECT_TRUE(ThrowsArg([] { t5_relative_bucket(0, false, 1, 128); }, "[t5_relative_bucket]"));
  EXPECT_TRUE(ThrowsArg([] { t5_relative_bucket(0, true, 32, 8); }, "[t5_relative_bucket]"));
  EXPECT_NO_THROW(t5_relative_bucket(0, true, 4, 2));
  EXPECT_NO_THROW(t5_relative_bucket(0, false, 2, 2));
}

TEST(T5Bias, ModuleNamesAndShapes) {
  Rng rng(90);
  nn::T5RelativeBias m(32, 128, 3, true, rng);
  const auto named = m.named_parameters();
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].first, "relative_attention_bias.weight");
  EXPECT_EQ(named[0].second->shape(), Shape({32, 3}));
  const Tensor bias = m.forward(4, 7);
  ASSERT_EQ(bias.shape(), Shape({1, 3, 4, 7}));
  for (int64_t h = 0; h < 3; ++h)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 7; ++j)
        EXPECT_EQ(bias.at({0, h, i, j}), m.weight.at({t5_relative_bucket(j - i, true), h}));
}

TEST(T5Bias, QueryOffsetEqualsLastRowsOfFullBias) {
  Rng rng(91);
  nn::T5RelativeBias m(16, 40, 2, false, rng);
  const Tensor full = m.forward(9, 9);
  EXPECT_TRUE(AllClose(m.forward(2, 9, 7), full.slice(2, 7, 9).contiguous(), kExact));
  // Bias depends on j - i only: shifting both by one gives the same values.
  for (int64_t i = 0; i + 1 < 9; ++i)
    for (int64_t j = 0; j + 1 < 9; ++j) EXPECT_EQ(full.at({0, 1, i, j}), full.at({0, 1, i + 1, j + 1}));
  EXPECT_EQ(m.forward(0, 3).shape(), Shape({1, 2, 0, 3}));
}

TEST(T5Bias, ErrorsNameTheOp) {
  EXPECT_TRUE(ThrowsArg([] { nn::T5RelativeBias m(32, 128, 0, true); }, "[T5RelativeBias]"));
  EXPECT_TRUE(ThrowsArg([] { nn::T5RelativeBias m(2, 128, 1, true); }, "[T5RelativeBias]"));
  EXPECT_TRUE(ThrowsArg([] { nn::T5RelativeBias m(32, 4, 1, false); }, "[T5RelativeBias]"));
  nn::T5RelativeBias m(32, 128, 2, true);
  EXPECT_TRUE(ThrowsArg([&] { m.forward(-1, 3); }, "[T5RelativeBias]"));
  m.weight = Tensor::zeros({31, 2});
  EXPECT_TRUE(ThrowsArg([&] { m.forward(2, 3); }, "[T5RelativeBias]"));
  EXPECT_TRUE(ThrowsArg([] { t5_relative_bias(Tensor::zeros({32}), 2, 2, true); }, "[t5_relative_bias]"));
  EXPECT_TRUE(ThrowsArg([] { t5_relative_bias(Tensor(), 2, 2, true); }, "[t5_relative_bias]"));
  EXPECT_TRUE(ThrowsArg([] { t5_relative_bias(Tensor::zeros({32, 0}), 2, 2, true); }, "[t5_relative_bias]"));
  EXPECT_TRUE(ThrowsArg([] { t5_relative_bias(Tensor::zeros({32, 2}), 2, -2, true); }, "[t5_relative_bias]"));
  EXPECT_TRUE(ThrowsArg([] { t5_relative_bias(Tensor::zeros({3, 2}), 2, 2, true); }, "[t5_relative_bias]"));
}

}  // namespace
}  // namespace qkv
