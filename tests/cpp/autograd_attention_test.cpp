// Gradients of attention and of the positional encodings: float32 gradients against central differences of the
// float64 attention oracle (every mask kind, causal alignments, Shaw relative) or of the op itself (affine ops).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention_oracle.h"
#include "grad_testing.h"
#include "qkv/nn/positional/relative.h"
#include "qkv/nn/positional/sinusoidal.h"
#include "qkv/nn/positional/t5_bias.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/softmax.h"
#include "qkv/ops/functional.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::GradsMatchAffine;
using testing::GradsMatchTwin;
using testing::randn;
using testing::ThrowsArg;
using ad::Tape;
using ad::Var;
using Vars = std::vector<Var>;
using DVec = std::vector<double>;
using DIn = std::vector<DVec>;

constexpr double kInf = std::numeric_limits<double>::infinity();

// --- attention ---------------------------------------------------------------------------------------------------

// Twin of attention() through the float64 oracle; q, k, v shapes are fixed by the test.
testing::TwinFn attention_twin(const Shape& qs, const Shape& ks, const Shape& vs, const AttentionOptions& o) {
  return [=](const DIn& in) {
    const testing::DTensor mask = o.mask.defined() ? testing::to_dtensor(o.mask) : testing::DTensor{};
    return testing::attention_oracle({qs, in[0]}, {ks, in[1]}, {vs, in[2]}, o.mask.defined() ? &mask : nullptr, o)
        .out;
  };
}

::testing::AssertionResult AttentionGradsMatch(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const AttentionOptions& o, uint64_t seed) {
  return GradsMatchTwin([o](const Vars& x) { return ad::attention(x[0], x[1], x[2], o); },
                        attention_twin(q.shape(), k.shape(), v.shape(), o), {q, k, v}, seed);
}

TEST(GradAttention, NoMask) {
  EXPECT_TRUE(AttentionGradsMatch(randn({2, 2, 4, 3}, 63), randn({2, 2, 5, 3}, 64), randn({2, 2, 5, 2}, 65), {}, 66));
}

TEST(GradAttention, EveryMaskKind) {
  const Tensor q = randn({2, 3, 4}, 67), k = randn({2, 5, 4}, 68), v = randn({2, 5, 3}, 69);
  Tensor bool_mask = Tensor::zeros({2, 1, 5});
  for (int j : {0, 2, 3}) bool_mask.data()[j] = 1.0f;
  for (int j : {1, 4}) bool_mask.data()[5 + j] = 1.0f;
  for (MaskKind kind : {MaskKind::kKeep, MaskKind::kBlock}) {
    AttentionOptions o;
    o.mask = bool_mask;
    o.mask_kind = kind;
    EXPECT_TRUE(AttentionGradsMatch(q, k, v, o, 70)) << static_cast<int>(kind);
  }
  AttentionOptions add;
  add.mask = randn({3, 5}, 71);
  add.mask_kind = MaskKind::kAdditive;
  add.scale = 0.7f;
  EXPECT_TRUE(AttentionGradsMatch(q, k, v, add, 72));
}

TEST(GradAttention, CausalTopLeftAndBottomRightWhenTqLessThanTk) {
  const Tensor q = randn({2, 3, 4}, 73), k = randn({2, 6, 4}, 74), v = randn({2, 6, 3}, 75);
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight}) {
    AttentionOptions o;
    o.causal = c;
    EXPECT_TRUE(AttentionGradsMatch(q, k, v, o, 76)) << static_cast<int>(c);
  }
}

TEST(GradAttention, BroadcastKeyValueAcrossHeads) {
  const Tensor q = randn({2, 3, 4, 4}, 77), k = randn({2, 1, 5, 4}, 78), v = randn({1, 5, 2}, 79);
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  EXPECT_TRUE(AttentionGradsMatch(q, k, v, o, 80));
}

TEST(GradAttention, FullyMaskedRowGivesZeroGradientNotNaN) {
  const Tensor q = randn({1, 3, 4}, 81), k = randn({1, 4, 4}, 82), v = randn({1, 4, 2}, 83);
  AttentionOptions o;
  o.mask = Tensor::ones({3, 4});
  for (int j = 0; j < 4; ++j) o.mask.data()[4 + j] = 0.0f;  // row 1 keeps nothing
  o.mask_kind = MaskKind::kKeep;
  EXPECT_TRUE(AttentionGradsMatch(q, k, v, o, 84));
  Tape tape;
  const Var qv = tape.leaf(q), kv = tape.leaf(k), vv = tape.leaf(v);
  tape.backward(ad::attention(qv, kv, vv, o), randn({1, 3, 2}, 85));
  const std::vector<float> dq = qv.grad().to_vector();
  for (int c = 0; c < 4; ++c) EXPECT_EQ(dq[4 + c], 0.0f);
  for (const Var* x : {&qv, &kv, &vv})
    for (float g : x->grad().to_vector()) EXPECT_FALSE(std::isnan(g));
}

// The composed path (forced by a zero bias of `bias_shape` that requires a gradient) against the fused node: the
// same values and gradients.
void ExpectComposedMatchesFused(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                                const Tensor& dout, const Shape& bias_shape) {
  std::vector<Tensor> grads[2];
  Tensor outs[2];
  for (int path = 0; path < 2; ++path) {
    Tape tape;
    const Var qv = tape.leaf(q), kv = tape.leaf(k), vv = tape.leaf(v);
    ad::AttentionExtras ex;
    if (path == 1) ex.bias = tape.leaf(Tensor::zeros(bias_shape));
    const Var out = ad::attention(qv, kv, vv, o, ex);
    tape.backward(out, dout);
    outs[path] = out.value;
    grads[path] = {qv.grad(), kv.grad(), vv.grad()};
  }
  EXPECT_EQ(grads[0][1].shape(), k.shape());
  EXPECT_TRUE(AllClose(outs[1], outs[0], testing::kFloatVsDouble));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(AllClose(grads[1][i], grads[0][i], {1e-5, 1e-4})) << i;
}

TEST(GradAttention, ComposedPathMatchesFusedPath) {
  const Tensor q = randn({2, 2, 5, 4}, 86), k = randn({2, 2, 5, 4}, 87), v = randn({2, 2, 5, 3}, 88);
  AttentionOptions o;
  o.causal = Causal::kTopLeft;
  o.mask = Tensor::zeros({2, 1, 1, 5});
  o.mask.data()[4] = 1.0f;
  o.mask_kind = MaskKind::kBlock;
  ExpectComposedMatchesFused(q, k, v, o, randn({2, 2, 5, 3}, 89), {1, 2, 5, 5});
}

TEST(GradAttention, ComposedPathMatchesFusedPathWithGqaWindowAndSoftcap) {
  // GQA (4 query heads over 2 kv heads), a sliding window, a soft cap and causal; dK and dV summed over each group.
  const Tensor q = randn({2, 4, 5, 4}, 186), k = randn({2, 2, 7, 4}, 187), v = randn({2, 2, 7, 3}, 188);
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  o.enable_gqa = true;
  o.window_left = 2;
  o.window_right = 1;
  o.softcap = 1.5f;
  ExpectComposedMatchesFused(q, k, v, o, randn({2, 4, 5, 3}, 189), {1, 4, 5, 7});
}

TEST(GradAttention, DifferentiableBiasGetsTheScoreGradient) {
  const Tensor q = randn({1, 2, 3, 4}, 90), k = randn({1, 2, 4, 4}, 91), v = randn({1, 2, 4, 2}, 92);
  const Tensor bias = randn({1, 2, 3, 4}, 93);
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  EXPECT_TRUE(GradsMatchTwin(
      [o](const Vars& x) {
        ad::AttentionExtras ex;
        ex.bias = x[3];
        return ad::attention(x[0], x[1], x[2], o, ex);
      },
      [&](const DIn& in) {
        // The bias enters the float64 oracle as a double additive mask (scale 1/sqrt(4)).
        testing::DTensor m{bias.shape(), in[3]};
        AttentionOptions with_bias = o;
        with_bias.mask_kind = MaskKind::kAdditive;
        with_bias.scale = 0.5f;
        return testing::attention_oracle({q.shape(), in[0]}, {k.shape(), in[1]}, {v.shape(), in[2]}, &m, with_bias)
            .out;
      },
      {q, k, v, bias}, 94));
}

TEST(GradAttention, WeightDropoutMatchesManualComposition) {
  // With the same seed, attention's weight dropout equals softmax -> dropout -> matmul written out by hand.
  const Tensor q = randn({1, 2, 3, 4}, 95), k = randn({1, 2, 5, 4}, 96), v = randn({1, 2, 5, 3}, 97);
  const Tensor dout = randn({1, 2, 3, 3}, 98);
  std::vector<Tensor> grads[2];
  for (int path = 0; path < 2; ++path) {
    Tape tape;
    const Var qv = tape.leaf(q), kv = tape.leaf(k), vv = tape.leaf(v);
    Rng rng(5);
    Var out;
    if (path == 0) {
      AttentionOptions o;
      o.dropout_p = 0.3f;
      o.dropout_rng = &rng;
      out = ad::attention(qv, kv, vv, o);
    } else {
      const Var s = ad::scale(ad::matmul(qv, ad::transpose(kv, -1, -2)), 0.5f);
      out = ad::matmul(ad::dropout(ad::softmax(s), 0.3f, true, rng), vv);
    }
    tape.backward(out, dout);
    grads[path] = {qv.grad(), kv.grad(), vv.grad()};
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(AllClose(grads[0][i], grads[1][i], testing::kExact)) << i;
}

// Shaw relative attention twin (float64 loops).
DVec relative_twin(const DIn& in, int64_t nb, int64_t tq, int64_t tk, int64_t d, int64_t dv, int64_t clip,
                   Causal causal, bool with_rel_v) {
  const DVec &q = in[0], &k = in[1], &v = in[2], &rk = in[3];
  DVec out(static_cast<size_t>(nb * tq * dv), 0.0);
  const double sc = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t i = 0; i < tq; ++i) {
      DVec s(static_cast<size_t>(tk));
      double m = -kInf;
      for (int64_t j = 0; j < tk; ++j) {
        const int64_t r = std::clamp<int64_t>(j - i, -clip, clip) + clip;
        double dot = 0.0;
        for (int64_t c = 0; c < d; ++c) dot += q[(b * tq + i) * d + c] * (k[(b * tk + j) * d + c] + rk[r * d + c]);
        s[j] = testing::oracle_causal_allows(causal, i, j, tq, tk) ? sc * dot : -kInf;
        m = std::max(m, s[j]);
      }
      double z = 0.0;
      for (int64_t j = 0; j < tk; ++j) z += std::exp(s[j] - m);
      for (int64_t j = 0; j < tk; ++j) {
        const double a = std::exp(s[j] - m) / z;
        const int64_t r = std::clamp<int64_t>(j - i, -clip, clip) + clip;
        for (int64_t c = 0; c < dv; ++c)
          out[(b * tq + i) * dv + c] += a * (v[(b * tk + j) * dv + c] + (with_rel_v ? in[4][r * dv + c] : 0.0));
      }
    }
  return out;
}

TEST(GradAttention, ShawRelativeWithBothTablesAndCausal) {
  const int64_t clip = 2;
  const Tensor q = randn({2, 4, 3}, 99), k = randn({2, 4, 3}, 100), v = randn({2, 4, 2}, 101);
  const Tensor rk = randn({5, 3}, 102), rv = randn({5, 2}, 103);
  AttentionOptions o;
  o.causal = Causal::kTopLeft;
  EXPECT_TRUE(GradsMatchTwin(
      [o](const Vars& x) { return ad::relative_attention(x[0], x[1], x[2], x[3], x[4], clip, o); },
      [](const DIn& in) { return relative_twin(in, 2, 4, 4, 3, 2, clip, Causal::kTopLeft, true); },
      {q, k, v, rk, rv}, 104));
  // Values agree with the forward-only op.
  const Tensor ref = relative_attention(q, k, v, rk, rv, clip, o).out;
  EXPECT_TRUE(AllClose(ad::relative_attention(q, k, v, rk, rv, clip, o).value, testing::to_double(ref),
                       {1e-6, 1e-5}));
  EXPECT_TRUE(GradsMatchTwin(
      [](const Vars& x) { return ad::relative_attention(x[0], x[1], x[2], x[3], Var(), clip); },
      [](const DIn& in) { return relative_twin(in, 2, 4, 4, 3, 2, clip, Causal::kNone, false); }, {q, k, v, rk},
      105));
}

// --- positional encodings ----------------------------------------------------------------------------------------

TEST(GradPositional, RopeBackwardIsTheInverseRotation) {
  const Tensor x = randn({2, 5, 6}, 106);
  for (RopeVariant variant : {RopeVariant::kHalfSplit, RopeVariant::kInterleaved}) {
    EXPECT_TRUE(GradsMatchAffine([variant](const Vars& v) { return ad::rope(v[0], 3, 10000.0f, variant); }, {x},
                                 107))
        << static_cast<int>(variant);
    // A shared table (what a model hands its layers), kept alive by the tape after the caller drops it.
    EXPECT_TRUE(GradsMatchAffine(
        [variant](const Vars& v) {
          return ad::rope(v[0], std::make_shared<const RopeTable>(rope_table({7, 2, 0, 9, 4}, 6, 500.0f)), variant);
        },
        {x}, 108))
        << static_cast<int>(variant);
  }
}

TEST(GradPositional, T5BiasScatterAddsIntoItsTable) {
  const Tensor table = randn({8, 2}, 108);
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::t5_bias(v[0], 4, 6, true, 16, 2); }, {table}, 109));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::t5_bias(v[0], 5, 5, false, 16); }, {table}, 110));
}

TEST(GradPositional, LearnedTableAndSinusoidal) {
  const Tensor x = randn({2, 3, 4}, 111), table = randn({6, 4}, 112);
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::add_learned_positions(v[0], v[1], 2); }, {x, table},
                               113));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::add_sinusoidal(v[0], 1); }, {x}, 114));
  EXPECT_TRUE(AllClose(ad::add_sinusoidal(Var(x), 1).value, testing::to_double(add_sinusoidal(x, 1)),
                       testing::kExact));
  EXPECT_TRUE(ThrowsArg([&] { ad::add_learned_positions(Var(x), Var(table), 4); }, "[add_learned_positions]"));
}

}  // namespace
}  // namespace qkv
