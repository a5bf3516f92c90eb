// Tests of the autograd tape and of every differentiable op: float32 gradients against central differences of a
// float64 twin (nonlinear ops) or of the op itself (ops affine in each input), plus tape mechanics and errors.
// Attention and the positional encodings: autograd_attention_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "grad_testing.h"
#include "qkv/nn/positional/relative.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/layer_norm.h"
#include "qkv/ops/softmax.h"
#include "qkv/nn/rnn.h"
#include "qkv/ops/functional.h"
#include "qkv/train/loss.h"

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

// --- tape mechanics ---------------------------------------------------------------------------------------------

TEST(Tape, GradientAccumulatesWhenAVarIsUsedTwice) {
  Tape tape;
  const Tensor xv = Tensor::from_vector({3}, {1.0f, -2.0f, 0.5f});
  const Var x = tape.leaf(xv);
  const Var y = ad::add(ad::mul(x, x), x);  // x² + x -> 2x + 1
  tape.backward(y, Tensor::ones({3}));
  EXPECT_TRUE(AllClose(x.grad(), DVec{3.0, -3.0, 2.0}, testing::kExact));
}

TEST(Tape, ConstantsRecordNothing) {
  Tape tape;
  const Var a = Tensor::ones({2, 2});
  const Var b = ad::matmul(a, ad::relu(a));
  EXPECT_FALSE(b.requires_grad());
  EXPECT_EQ(tape.num_nodes(), 0u);
  EXPECT_TRUE(AllClose(b.value, DVec{2, 2, 2, 2}, testing::kExact));
}

TEST(Tape, UpstreamGradientIsNeverWrittenInPlace) {
  // add() hands dy to both operands without a copy; x then receives it twice and must copy before adding.
  Tape tape;
  const Var x = tape.leaf(Tensor::from_vector({2}, {1.0f, 2.0f}));
  const Var y = ad::add(x, x);
  const Tensor dout = Tensor::from_vector({2}, {1.0f, 10.0f});
  tape.backward(y, dout);
  EXPECT_TRUE(AllClose(x.grad(), DVec{2.0, 20.0}, testing::kExact));
  EXPECT_TRUE(AllClose(dout, DVec{1.0, 10.0}, testing::kExact));
}

TEST(Tape, ParameterGradientOverwritesAfterZeroGradAndAccumulatesWithin) {
  Tensor w = Tensor::from_vector({2}, {1.0f, 2.0f});
  ad::ParameterSet params;
  params.add("w", &w);
  for (int step = 0; step < 2; ++step) {
    params.zero_grad();
    EXPECT_FALSE(params[0].has_grad);
    Tape tape;
    const Var p = tape.param(params[0]);
    const Var y = ad::sum(ad::add(ad::scale(p, 3.0f), p));  // d/dw = 4 each
    tape.backward(y);
    EXPECT_TRUE(params[0].has_grad);
    EXPECT_TRUE(AllClose(params[0].grad, DVec{4.0, 4.0}, testing::kExact)) << "step " << step;
  }
}

TEST(Tape, ClearAllowsReuseAndBackwardTwiceThrows) {
  Tape tape;
  Var x = tape.leaf(Tensor::ones({2}));
  Var y = ad::sum(ad::scale(x, 2.0f));
  tape.backward(y);
  EXPECT_TRUE(ThrowsArg([&] { tape.backward(y); }, "[Tape.backward]"));
  tape.clear();
  x = tape.leaf(Tensor::ones({2}));
  y = ad::sum(ad::scale(x, 5.0f));
  tape.backward(y);
  EXPECT_TRUE(AllClose(x.grad(), DVec{5.0, 5.0}, testing::kExact));
}

TEST(Tape, BadBackwardCallsThrow) {
  Tape tape, other;
  const Var x = tape.leaf(Tensor::ones({2}));
  const Var y = ad::scale(x, 2.0f);
  EXPECT_TRUE(ThrowsArg([&] { tape.backward(y); }, "[Tape.backward]"));  // not a scalar
  EXPECT_TRUE(ThrowsArg([&] { tape.backward(y, Tensor::ones({3})); }, "[Tape.backward]"));
  EXPECT_TRUE(ThrowsArg([&] { tape.backward(Var(Tensor::ones({1}))); }, "[Tape.backward]"));
  const Var z = other.leaf(Tensor::ones({2}));
  EXPECT_TRUE(ThrowsArg([&] { ad::add(x, z); }, "[Tape]"));
}

TEST(ParameterSet, RejectsDuplicatesAndUndefined) {
  Tensor a = Tensor::ones({2}), b;
  ad::ParameterSet ps;
  ps.add("a", &a);
  EXPECT_TRUE(ThrowsArg([&] { ps.add("a", &a); }, "[ParameterSet]"));
  EXPECT_TRUE(ThrowsArg([&] { ps.add("b", &b); }, "[ParameterSet]"));
  EXPECT_EQ(ps.find("a"), &ps[0]);
  EXPECT_EQ(ps.find("zz"), nullptr);
  EXPECT_EQ(ps.numel(), 2);
}

// --- products and elementwise -------------------------------------------------------------------------------------

TEST(Grad, MatmulBroadcastBatch) {
  const Tensor a = randn({2, 3, 4, 5}, 1), b = randn({3, 5, 2}, 2);  // b broadcast over the first dim
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::matmul(v[0], v[1]); }, {a, b}, 3));
}

TEST(Grad, LinearWithBiasOnStridedInput) {
  const Tensor x = randn({5, 3, 4}, 4).transpose(0, 1);  // (3, 5, 4), not contiguous
  const Tensor w = randn({6, 4}, 5), b = randn({6}, 6);
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::linear(v[0], v[1], v[2]); }, {x, w, b}, 7));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::linear(v[0], v[1]); }, {x, w}, 8));
}

TEST(Grad, LinearAccumulatesIntoAParameterUsedTwice) {
  const Tensor x = randn({3, 4}, 9), w = randn({2, 4}, 10);
  EXPECT_TRUE(GradsMatchAffine(
      [](const Vars& v) { return ad::add(ad::linear(v[0], v[1]), ad::linear(ad::scale(v[0], 2.0f), v[1])); },
      {x, w}, 11));
}

TEST(Grad, AddSubMulBroadcast) {
  const Tensor a = randn({2, 3, 4}, 12), b = randn({3, 1}, 13);
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::add(v[0], v[1]); }, {a, b}, 14));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::sub(v[0], v[1]); }, {a, b}, 15));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::mul(v[0], v[1]); }, {a, b}, 16));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::mul(v[1], v[0]); }, {a, b}, 17));
  // Broadcast along leading dims only (the sgemv reduction), with and without leading 1s.
  for (const Shape& s : {Shape{3, 4}, Shape{1, 3, 4}}) {
    const Tensor c = randn(s, 171);
    EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::add(v[0], v[1]); }, {a, c}, 172));
    EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::sub(v[1], v[0]); }, {a, c}, 173));
    EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::expand(v[0], {2, 3, 4}); }, {c}, 174));
  }
}

TEST(Tape, OwnedContributionJoinsASharedGradientWithoutTouchingIt) {
  // add() shares dy with x first; scale()'s fresh 3·dy then takes the shared one into its own buffer.
  Tape tape;
  const Var x = tape.leaf(Tensor::from_vector({2}, {1.0f, 2.0f}));
  const Tensor dout = Tensor::from_vector({2}, {1.0f, -2.0f});
  tape.backward(ad::add(x, ad::scale(x, 3.0f)), dout);
  EXPECT_TRUE(AllClose(x.grad(), DVec{4.0, -8.0}, testing::kExact));
  EXPECT_TRUE(AllClose(dout, DVec{1.0, -2.0}, testing::kExact));
}

TEST(Grad, ScaleSumMean) {
  const Tensor a = randn({3, 4}, 18);
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::scale(v[0], -1.5f); }, {a}, 19));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::sum(v[0]); }, {a}, 20));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::mean(v[0]); }, {a}, 21));
}

// Unary twins.
DVec unary_twin(const DVec& x, double (*f)(double)) {
  DVec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f(x[i]);
  return y;
}

TEST(Grad, Activations) {
  // Inputs away from relu's kink (|x| >= 0.05) so the step never crosses it.
  Tensor x = randn({4, 5}, 22);
  for (int64_t i = 0; i < x.numel(); ++i)
    if (std::fabs(x.data()[i]) < 0.05f) x.data()[i] = 0.3f;
  auto relu = [](double v) { return v > 0 ? v : 0.0; };
  auto gelu = [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); };
  auto gelu_tanh = [](double v) {
    return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
  };
  auto sigm = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  auto tnh = [](double v) { return std::tanh(v); };
  auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
  EXPECT_TRUE(GradsMatchTwin([](const Vars& v) { return ad::relu(v[0]); },
                             [&](const DIn& in) { return unary_twin(in[0], +relu); }, {x}, 23));
  EXPECT_TRUE(GradsMatchTwin([](const Vars& v) { return ad::gelu(v[0]); },
                             [&](const DIn& in) { return unary_twin(in[0], +gelu); }, {x}, 24));
  EXPECT_TRUE(GradsMatchTwin([](const Vars& v) { return ad::gelu(v[0], GeluApprox::kTanh); },
                             [&](const DIn& in) { return unary_twin(in[0], +gelu_tanh); }, {x}, 25));
  EXPECT_TRUE(GradsMatchTwin([](const Vars& v) { return ad::sigmoid(v[0]); },
                             [&](const DIn& in) { return unary_twin(in[0], +sigm); }, {x}, 26));
  EXPECT_TRUE(GradsMatchTwin([](const Vars& v) { return ad::tanh(v[0]); },
                             [&](const DIn& in) { return unary_twin(in[0], +tnh); }, {x}, 27));
  EXPECT_TRUE(GradsMatchTwin([](const Vars& v) { return ad::silu(v[0]); },
                             [&](const DIn& in) { return unary_twin(in[0], +silu); }, {x}, 28));
}

// --- softmax, layer norm -------------------------------------------------------------------------------------------

// Softmax / log-softmax of a row-major (rows, n) array along its last axis.
DVec softmax_twin(const DVec& x, int64_t n, bool log) {
  DVec y(x.size());
  for (size_t r = 0; r < x.size() / n; ++r) {
    double m = -kInf;
    for (int64_t j = 0; j < n; ++j) m = std::max(m, x[r * n + j]);
    double s = 0.0;
    for (int64_t j = 0; j < n; ++j) s += std::exp(x[r * n + j] - m);
    for (int64_t j = 0; j < n; ++j)
      y[r * n + j] = log ? x[r * n + j] - m - std::log(s) : std::exp(x[r * n + j] - m) / s;
  }
  return y;
}

TEST(Grad, SoftmaxAndLogSoftmaxLastAxis) {
  const Tensor x = randn({3, 5}, 28);
  EXPECT_TRUE(GradsMatchTwin([](const Vars& v) { return ad::softmax(v[0]); },
                             [](const DIn& in) { return softmax_twin(in[0], 5, false); }, {x}, 29));
  EXPECT_TRUE(GradsMatchTwin([](const Vars& v) { return ad::log_softmax(v[0]); },
                             [](const DIn& in) { return softmax_twin(in[0], 5, true); }, {x}, 30));
}

TEST(Grad, SoftmaxAlongAxisZero) {
  const Tensor x = randn({4, 3}, 31);
  EXPECT_TRUE(GradsMatchTwin(
      [](const Vars& v) { return ad::transpose(ad::softmax(v[0], 0), 0, 1); },
      [](const DIn& in) {
        DVec t(12);
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 3; ++j) t[j * 4 + i] = in[0][i * 3 + j];
        return softmax_twin(t, 4, false);
      },
      {x}, 32));
}

TEST(Grad, SoftmaxFullyMaskedRowGivesZeroGradientNotNaN) {
  Tape tape;
  Tensor xv = randn({2, 3}, 33);
  for (int j = 0; j < 3; ++j) xv.data()[j] = -std::numeric_limits<float>::infinity();
  const Var x = tape.leaf(xv);
  tape.backward(ad::softmax(x), randn({2, 3}, 34));
  const std::vector<float> g = x.grad().to_vector();
  for (int j = 0; j < 3; ++j) EXPECT_EQ(g[j], 0.0f);
  for (float v : g) EXPECT_FALSE(std::isnan(v));
}

DVec layer_norm_twin(const DVec& x, const DVec* w, const DVec* b, int64_t e, double eps) {
  DVec y(x.size());
  for (size_t r = 0; r < x.size() / e; ++r) {
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < e; ++j) mean += x[r * e + j];
    mean /= e;
    for (int64_t j = 0; j < e; ++j) var += (x[r * e + j] - mean) * (x[r * e + j] - mean);
    var /= e;
    for (int64_t j = 0; j < e; ++j) {
      double v = (x[r * e + j] - mean) / std::sqrt(var + eps);
      if (w) v *= (*w)[j];
      if (b) v += (*b)[j];
      y[r * e + j] = v;
    }
  }
  return y;
}

TEST(Grad, LayerNormWithAndWithoutAffine) {
  const Tensor x = randn({2, 3, 6}, 35), w = randn({6}, 36), b = randn({6}, 37);
  EXPECT_TRUE(GradsMatchTwin([](const Vars& v) { return ad::layer_norm(v[0], v[1], v[2], 1e-5f); },
                             [](const DIn& in) { return layer_norm_twin(in[0], &in[1], &in[2], 6, 1e-5); },
                             {x, w, b}, 38));
  EXPECT_TRUE(GradsMatchTwin([](const Vars& v) { return ad::layer_norm(v[0], Var(), Var(), 1e-5f); },
                             [](const DIn& in) { return layer_norm_twin(in[0], nullptr, nullptr, 6, 1e-5); }, {x},
                             39));
}

// y = x / sqrt(mean(x²) + eps) · g, g = w (+ 1 with unit_offset; w absent: 1).
DVec rms_norm_twin(const DVec& x, const DVec* w, int64_t e, double eps, bool unit_offset) {
  DVec y(x.size());
  for (size_t r = 0; r < x.size() / e; ++r) {
    double ss = 0.0;
    for (int64_t j = 0; j < e; ++j) ss += x[r * e + j] * x[r * e + j];
    const double rstd = 1.0 / std::sqrt(ss / e + eps);
    for (int64_t j = 0; j < e; ++j)
      y[r * e + j] = x[r * e + j] * rstd * ((w ? (*w)[j] : 1.0) + (unit_offset ? 1.0 : 0.0));
  }
  return y;
}

TEST(Grad, RmsNormPlainAndUnitOffset) {
  const Tensor x = randn({2, 3, 6}, 135), w = randn({6}, 136);
  for (bool unit : {false, true}) {
    EXPECT_TRUE(GradsMatchTwin([unit](const Vars& v) { return ad::rms_norm(v[0], v[1], 1e-6f, unit); },
                               [unit](const DIn& in) { return rms_norm_twin(in[0], &in[1], 6, 1e-6, unit); },
                               {x, w}, 137));
    EXPECT_TRUE(GradsMatchTwin([unit](const Vars& v) { return ad::rms_norm(v[0], Var(), 1e-6f, unit); },
                               [unit](const DIn& in) { return rms_norm_twin(in[0], nullptr, 6, 1e-6, unit); }, {x},
                               138));
  }
  // A strided input reads the same rows.
  const Tensor xt = randn({6, 4}, 139).transpose(0, 1);
  EXPECT_TRUE(AllClose(qkv::rms_norm(xt, w).y, qkv::rms_norm(xt.contiguous(), w).y, qkv::testing::Tol{0, 0}));
  EXPECT_THROW(qkv::rms_norm(x, randn({5}, 1)), std::invalid_argument);
}

// --- lookup, dropout ---------------------------------------------------------------------------------------------

TEST(Grad, EmbeddingRepeatedIdsAddUp) {
  const Tensor w = randn({5, 3}, 40);
  const Ids ids{{1, 3, 1, 0, 1, 4}, {2, 3}};
  EXPECT_TRUE(GradsMatchAffine([&](const Vars& v) { return ad::embedding(v[0], ids); }, {w}, 41));
}

TEST(Grad, EmbeddingPaddingIdxRowGetsNoGradient) {
  Tape tape;
  const Var w = tape.leaf(randn({4, 2}, 42));
  const Ids ids{{2, 0, 2, 3}, {4}};
  tape.backward(ad::embedding(w, ids, -2), Tensor::ones({4, 2}));  // -2 == row 2
  EXPECT_TRUE(AllClose(w.grad(), DVec{1, 1, 0, 0, 0, 0, 1, 1}, testing::kExact));
  EXPECT_TRUE(ThrowsArg([&] { ad::embedding(w, ids, 4); }, "[embedding]"));
}

TEST(Grad, DropoutScalesKeptAndZeroesDropped) {
  const Tensor x = randn({4, 8}, 43);
  const float p = 0.25f;
  // Each evaluation re-seeds, so the mask is fixed and the function is linear in x.
  EXPECT_TRUE(GradsMatchAffine(
      [p](const Vars& v) {
        Rng rng(7);
        return ad::dropout(v[0], p, true, rng);
      },
      {x}, 44));
  Rng rng(1);
  const Var same = ad::dropout(Var(x), p, false, rng);
  EXPECT_TRUE(same.value.shares_storage(x));  // eval: identity, no copy
}

// --- shapes ------------------------------------------------------------------------------------------------------

TEST(Grad, ViewsAndTheirInverses) {
  const Tensor x = randn({2, 3, 4}, 45);
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::reshape(v[0], {6, 4}); }, {x}, 46));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::transpose(v[0], 0, 2); }, {x}, 47));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::permute(v[0], {1, 2, 0}); }, {x}, 48));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::select(v[0], 1, 2); }, {x}, 49));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::slice(v[0], 2, 0, 4, 2); }, {x}, 50));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::unsqueeze(v[0], -1); }, {x}, 51));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::squeeze(ad::unsqueeze(v[0], 1), 1); }, {x}, 52));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::contiguous(ad::transpose(v[0], 0, 1)); }, {x},
                               53));
  const Tensor y = randn({3, 1}, 54);
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::expand(v[0], {2, 3, 5}); }, {y}, 55));
}

TEST(Grad, ConcatStackAndSplitWithAnUnusedPiece) {
  const Tensor a = randn({2, 3}, 56), b = randn({2, 2}, 57);
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::concat({v[0], v[1], v[0]}, 1); }, {a, b}, 58));
  EXPECT_TRUE(GradsMatchAffine([](const Vars& v) { return ad::stack({v[0], v[0]}, 0); }, {a}, 59));
  const Tensor x = randn({2, 7}, 60);
  EXPECT_TRUE(GradsMatchAffine(
      [](const Vars& v) {
        std::vector<Var> p = ad::split(v[0], {2, 3, 2}, 1);
        return ad::concat({p[2], p[0]}, 1);  // the middle piece takes no gradient
      },
      {x}, 61));
  EXPECT_TRUE(GradsMatchAffine(
      [](const Vars& v) {
        std::vector<Var> p = ad::split(v[0], {2, 3, 2}, 1);
        return ad::concat({p[2], p[1], p[0]}, 1);
      },
      {x}, 62));
}

// --- recurrent cells ---------------------------------------------------------------------------------------------

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// GRU step twin: in = {gi (B,3H), h (B,H), w_hh (3H,H), b_hh (3H)}.
DVec gru_twin(const DIn& in, int64_t nb, int64_t hs, const std::vector<uint8_t>& active = {}) {
  const DVec &gi = in[0], &h = in[1], &w = in[2], &bh = in[3];
  DVec out(static_cast<size_t>(nb * hs));
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t j = 0; j < hs; ++j) {
      if (!active.empty() && !active[b]) {
        out[b * hs + j] = h[b * hs + j];
        continue;
      }
      double gh[3];
      for (int g = 0; g < 3; ++g) {
        double s = bh[g * hs + j];
        for (int64_t c = 0; c < hs; ++c) s += w[(g * hs + j) * hs + c] * h[b * hs + c];
        gh[g] = s;
      }
      const double r = sig(gi[b * 3 * hs + j] + gh[0]);
      const double z = sig(gi[b * 3 * hs + hs + j] + gh[1]);
      const double n = std::tanh(gi[b * 3 * hs + 2 * hs + j] + r * gh[2]);
      out[b * hs + j] = (1 - z) * n + z * h[b * hs + j];
    }
  return out;
}

// The cells' float32 activations (exp_fast/tanh_fast) differ from libm by ~1e-7 relative.
constexpr testing::Tol kCellGradTol{2e-5, 2e-4};

TEST(GradRnn, GruCellStepWithAnInactiveRow) {
  const int64_t nb = 3, hs = 4;
  const Tensor gi = randn({nb, 3 * hs}, 115), h = randn({nb, hs}, 116), w = randn({3 * hs, hs}, 117, 0.5f),
               b = randn({3 * hs}, 118);
  const std::vector<uint8_t> active{1, 0, 1};
  EXPECT_TRUE(GradsMatchTwin([&](const Vars& x) { return ad::gru_cell_step(x[0], x[1], x[2], x[3], active); },
                             [&](const DIn& in) { return gru_twin(in, nb, hs, active); }, {gi, h, w, b}, 119,
                             kCellGradTol));
  EXPECT_TRUE(GradsMatchTwin([&](const Vars& x) { return ad::gru_cell_step(x[0], x[1], x[2], x[3]); },
                             [&](const DIn& in) { return gru_twin(in, nb, hs); }, {gi, h, w, b}, 120, kCellGradTol));
}

// LSTM step twin: in = {gi (B,4H), h, c (B,H), w_hh (4H,H), b_hh (4H)} -> [h' ; c'] concatenated.
DVec lstm_twin(const DIn& in, int64_t nb, int64_t hs, const std::vector<uint8_t>& active = {}) {
  const DVec &gi = in[0], &h = in[1], &c = in[2], &w = in[3], &bh = in[4];
  DVec out(static_cast<size_t>(2 * nb * hs));
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t j = 0; j < hs; ++j) {
      if (!active.empty() && !active[b]) {
        out[b * hs + j] = h[b * hs + j];
        out[nb * hs + b * hs + j] = c[b * hs + j];
        continue;
      }
      double pre[4];
      for (int g = 0; g < 4; ++g) {
        double s = bh[g * hs + j] + gi[b * 4 * hs + g * hs + j];
        for (int64_t k = 0; k < hs; ++k) s += w[(g * hs + j) * hs + k] * h[b * hs + k];
        pre[g] = s;
      }
      const double cn = sig(pre[1]) * c[b * hs + j] + sig(pre[0]) * std::tanh(pre[2]);
      out[b * hs + j] = sig(pre[3]) * std::tanh(cn);
      out[nb * hs + b * hs + j] = cn;
    }
  return out;
}

TEST(GradRnn, LstmCellStepBothOutputsAndAnInactiveRow) {
  const int64_t nb = 2, hs = 3;
  const Tensor gi = randn({nb, 4 * hs}, 121), h = randn({nb, hs}, 122), c = randn({nb, hs}, 123),
               w = randn({4 * hs, hs}, 124, 0.5f), b = randn({4 * hs}, 125);
  for (const std::vector<uint8_t>& active : {std::vector<uint8_t>{}, std::vector<uint8_t>{0, 1}}) {
    EXPECT_TRUE(GradsMatchTwin(
        [&](const Vars& x) {
          ad::LstmVars s = ad::lstm_cell_step(x[0], x[1], x[2], x[3], x[4], active);
          return ad::concat({ad::reshape(s.h, {nb * hs}), ad::reshape(s.c, {nb * hs})}, 0);
        },
        [&](const DIn& in) { return lstm_twin(in, nb, hs, active); }, {gi, h, c, w, b}, 126, kCellGradTol));
  }
}

TEST(GradRnn, LstmCellOnlyHiddenUsed) {
  const int64_t nb = 2, hs = 3;
  const Tensor gi = randn({nb, 4 * hs}, 127), h = randn({nb, hs}, 128), c = randn({nb, hs}, 129),
               w = randn({4 * hs, hs}, 130, 0.5f), b = randn({4 * hs}, 131);
  EXPECT_TRUE(GradsMatchTwin(
      [&](const Vars& x) { return ad::lstm_cell_step(x[0], x[1], x[2], x[3], x[4]).h; },
      [&](const DIn& in) {
        DVec both = lstm_twin(in, nb, hs);
        return DVec(both.begin(), both.begin() + nb * hs);
      },
      {gi, h, c, w, b}, 132, kCellGradTol));
}

TEST(GradRnn, CellErrorsNameTheOp) {
  const Tensor gi = randn({2, 6}, 133), h = randn({2, 2}, 134), w = randn({6, 2}, 135);
  EXPECT_TRUE(ThrowsArg([&] { ad::gru_cell_step(gi, h, w, Var(), {1, 1, 1}); }, "[gru_cell]"));
  EXPECT_TRUE(ThrowsArg([&] { ad::gru_cell_step(Var(), h, w, Var()); }, "[gru_cell]"));
  EXPECT_TRUE(ThrowsArg([&] { ad::lstm_cell_step(randn({2, 8}, 1), h, Var(), randn({8, 2}, 2), Var()); },
                        "[lstm_cell]"));
}

// --- cross-entropy -----------------------------------------------------------------------------------------------

DVec ce_twin(const DVec& x, const std::vector<int64_t>& t, int64_t V, double eps, int64_t ignore, bool mean) {
  double loss = 0.0;
  int64_t count = 0;
  for (size_t n = 0; n < t.size(); ++n) {
    if (t[n] == ignore) continue;
    ++count;
    DVec row(x.begin() + n * V, x.begin() + (n + 1) * V);
    const DVec lp = softmax_twin(row, V, true);
    double smooth = 0.0;
    for (double v : lp) smooth -= v;
    loss += (1 - eps) * -lp[t[n]] + eps / V * smooth;
  }
  return {mean ? (count ? loss / count : 0.0) : loss};
}

TEST(GradLoss, CrossEntropyPlainIgnoreIndexAndLabelSmoothing) {
  const int64_t V = 5;
  const Tensor logits = randn({2, 3, V}, 136);
  const std::vector<int64_t> t{1, 0, -100, 4, 2, -100};
  for (float eps : {0.0f, 0.1f}) {
    for (train::Reduction red : {train::Reduction::kMean, train::Reduction::kSum}) {
      train::CrossEntropyOptions o;
      o.label_smoothing = eps;
      o.reduction = red;
      EXPECT_TRUE(GradsMatchTwin([&](const Vars& x) { return train::cross_entropy(x[0], t, o); },
                                 [&](const DIn& in) {
                                   return ce_twin(in[0], t, V, eps, -100, red == train::Reduction::kMean);
                                 },
                                 {logits}, 137))
          << eps;
    }
  }
  train::CrossEntropyOptions pad;
  pad.ignore_index = 0;
  const std::vector<int64_t> t0{0, 3, 0, 2, 1, 0};
  EXPECT_TRUE(GradsMatchTwin([&](const Vars& x) { return train::cross_entropy(x[0], t0, pad); },
                             [&](const DIn& in) { return ce_twin(in[0], t0, V, 0.0, 0, true); }, {logits}, 138));
}

TEST(GradLoss, CrossEntropyAllIgnoredIsZeroWithZeroGradient) {
  Tape tape;
  const Var x = tape.leaf(randn({3, 4}, 139));
  const Var loss = train::cross_entropy(x, {-100, -100, -100});
  EXPECT_EQ(loss.value.item(), 0.0f);
  tape.backward(loss);
  EXPECT_TRUE(testing::AllZero(x.grad()));
}

TEST(GradLoss, CrossEntropyErrorsNameTheOp) {
  const Var x = randn({3, 4}, 140);
  EXPECT_TRUE(ThrowsArg([&] { train::cross_entropy(x, {0, 1}); }, "[cross_entropy]"));
  EXPECT_TRUE(ThrowsArg([&] { train::cross_entropy(x, {0, 1, 4}); }, "[cross_entropy]"));
  EXPECT_TRUE(ThrowsArg([&] { train::cross_entropy(x, {0, 1, -1}); }, "[cross_entropy]"));
  EXPECT_TRUE(ThrowsArg([&] { train::cross_entropy(Var(randn({4}, 1)), {0}); }, "[cross_entropy]"));
  train::CrossEntropyOptions o;
  o.label_smoothing = 1.5f;
  EXPECT_TRUE(ThrowsArg([&] { train::cross_entropy(x, {0, 1, 2}, o); }, "[cross_entropy]"));
}

// --- other errors ------------------------------------------------------------------------------------------------

TEST(GradErrors, OpsNameThemselves) {
  const Var a = randn({2, 3}, 141);
  EXPECT_TRUE(ThrowsArg([&] { ad::matmul(a, a); }, "[matmul]"));
  EXPECT_TRUE(ThrowsArg([&] { ad::linear(a, Var()); }, "[linear]"));
  EXPECT_TRUE(ThrowsArg([&] { ad::add(a, Var(randn({4}, 1))); }, "[add]"));
  EXPECT_TRUE(ThrowsArg([&] { ad::mean(Var(Tensor::zeros({0}))); }, "[mean]"));
  EXPECT_TRUE(ThrowsArg([&] { ad::concat({}, 0); }, "[concat]"));
  EXPECT_TRUE(ThrowsArg([&] { ad::stack({a, Var(randn({3, 2}, 1))}, 0); }, "[stack]"));
  const Var q = randn({2, 3, 4}, 142);
  AttentionOptions dropped;
  dropped.dropout_p = 0.5f;  // without a dropout_rng
  EXPECT_TRUE(ThrowsArg([&] { ad::attention(q, q, q, dropped); }, "[attention]"));
  ad::AttentionExtras ex;
  ex.bias = randn({5, 3, 3}, 1);
  EXPECT_TRUE(ThrowsArg([&] { ad::attention(q, q, q, {}, ex); }, "[attention]"));
  EXPECT_TRUE(ThrowsArg([&] { ad::relative_attention(q, q, q, Var(randn({4, 4}, 1)), Var(), 2); },
                        "[relative_attention]"));
  EXPECT_TRUE(ThrowsArg([&] { ad::t5_bias(Var(randn({8}, 1)), 2, 2, true); }, "[t5_relative_bias]"));
  EXPECT_TRUE(ThrowsArg([&] { ad::rope(Var(randn({2, 3}, 1))); }, "[rope_apply]"));
}

}  // namespace
}  // namespace qkv
