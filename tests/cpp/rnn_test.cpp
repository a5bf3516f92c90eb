// GRU and LSTM cells and layers against float64 restatements of PyTorch's formulas, one hand-worked example each,
// PyTorch parameter names/shapes/order, padded lengths, layouts, and every error path.
#include "qkv/nn/rnn.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ops_testing.h"

namespace qkv::nn {
namespace {

using testing::AllClose;
using testing::randn;
using testing::ThrowsArg;
using testing::Tol;

// One fused float32 step against float64 math.
constexpr Tol kCellVsDouble{1e-6, 1e-5};
// Whole sequences, several layers: float32 rounding accumulates over steps.
constexpr Tol kSeqVsDouble{1e-5, 1e-4};
// Two float32 paths that should do identical arithmetic (same GEMMs, same order).
constexpr Tol kSameMath{1e-6, 1e-6};
// The cell's polynomial exp/σ (absolute, σ in [0, 1]) and tanh (relative, so tiny arguments count).
constexpr Tol kActivationVsDouble{2e-7, 0.0};
constexpr Tol kTanhRelative{0.0, 4e-7};

using Vec = std::vector<double>;

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// W (rows, cols) · x + b in double; b may be undefined.
Vec affine(const Tensor& w, const Tensor& b, const Vec& x) {
  const int64_t rows = w.size(0), cols = w.size(1);
  const std::vector<float> wv = w.to_vector();
  const std::vector<float> bv = b.defined() ? b.to_vector() : std::vector<float>(rows, 0.0f);
  Vec y(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double s = bv[r];
    for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(wv[r * cols + c]) * x[c];
    y[r] = s;
  }
  return y;
}

// PyTorch's GRU formulas, gates (r, z, n), one row.
Vec gru_ref(const Vec& x, const Vec& h, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
            const Tensor& b_hh) {
  const size_t hs = h.size();
  const Vec gi = affine(w_ih, b_ih, x), gh = affine(w_hh, b_hh, h);
  Vec out(hs);
  for (size_t j = 0; j < hs; ++j) {
    const double r = sig(gi[j] + gh[j]);
    const double z = sig(gi[hs + j] + gh[hs + j]);
    const double n = std::tanh(gi[2 * hs + j] + r * gh[2 * hs + j]);
    out[j] = (1 - z) * n + z * h[j];
  }
  return out;
}

// PyTorch's LSTM formulas, gates (i, f, g, o), one row. Returns (h', c').
std::pair<Vec, Vec> lstm_ref(const Vec& x, const Vec& h, const Vec& c, const Tensor& w_ih, const Tensor& w_hh,
                             const Tensor& b_ih, const Tensor& b_hh) {
  const size_t hs = h.size();
  const Vec gi = affine(w_ih, b_ih, x), gh = affine(w_hh, b_hh, h);
  Vec hn(hs), cn(hs);
  for (size_t j = 0; j < hs; ++j) {
    const double i = sig(gi[j] + gh[j]);
    const double f = sig(gi[hs + j] + gh[hs + j]);
    const double g = std::tanh(gi[2 * hs + j] + gh[2 * hs + j]);
    const double o = sig(gi[3 * hs + j] + gh[3 * hs + j]);
    cn[j] = f * c[j] + i * g;
    hn[j] = o * std::tanh(cn[j]);
  }
  return {hn, cn};
}

// Row b of a (B, N) tensor (any strides) in double.
Vec row(const Tensor& t, int64_t b) {
  const std::vector<float> v = t.select(0, b).to_vector();
  return Vec(v.begin(), v.end());
}

// Whole multi-layer sequence in double: x (B, T, E) batch-first, h0/c0 (L, B, H) or undefined, lengths.
struct SeqRef {
  Vec output;  // (B, T, H) row-major
  Vec h_n;     // (L, B, H)
  Vec c_n;     // (L, B, H), LSTM only
};
SeqRef seq_ref(const RnnBase& m, bool lstm, const Tensor& x, const Tensor& h0, const Tensor& c0,
               const std::vector<int64_t>& lengths) {
  const int64_t nb = x.size(0), nt = x.size(1), hs = m.hidden_size(), nl = m.num_layers();
  SeqRef ref;
  ref.h_n.assign(nl * nb * hs, 0.0);
  ref.c_n.assign(nl * nb * hs, 0.0);
  // in[b][t] = layer input vector
  std::vector<std::vector<Vec>> in(nb, std::vector<Vec>(nt));
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t t = 0; t < nt; ++t) in[b][t] = row(x.select(0, b), t);
  for (int64_t l = 0; l < nl; ++l) {
    for (int64_t b = 0; b < nb; ++b) {
      Vec h = h0.defined() ? row(h0.select(0, l), b) : Vec(hs, 0.0);
      Vec c = c0.defined() ? row(c0.select(0, l), b) : Vec(hs, 0.0);
      const int64_t len = lengths.empty() ? nt : lengths[b];
      for (int64_t t = 0; t < nt; ++t) {
        if (t < len) {
          if (lstm) {
            std::tie(h, c) = lstm_ref(in[b][t], h, c, m.weight_ih(l), m.weight_hh(l), m.bias_ih(l), m.bias_hh(l));
          } else {
            h = gru_ref(in[b][t], h, m.weight_ih(l), m.weight_hh(l), m.bias_ih(l), m.bias_hh(l));
          }
          in[b][t] = h;
        } else {
          in[b][t] = Vec(hs, 0.0);  // padded output
        }
      }
      for (int64_t j = 0; j < hs; ++j) {
        ref.h_n[(l * nb + b) * hs + j] = h[j];
        ref.c_n[(l * nb + b) * hs + j] = c[j];
      }
    }
  }
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t t = 0; t < nt; ++t) ref.output.insert(ref.output.end(), in[b][t].begin(), in[b][t].end());
  return ref;
}

RnnOptions layers(int64_t n, bool batch_first = true, bool bias = true) {
  RnnOptions o;
  o.num_layers = n;
  o.batch_first = batch_first;
  o.bias = bias;
  return o;
}

// --- cells ------------------------------------------------------------------------------------------

TEST(GruCell, MatchesDoubleFormulaOddSizes) {
  Rng rng(1);
  const int64_t nb = 3, e = 5, hs = 7;
  const Tensor w_ih = rng.uniform({3 * hs, e}, -1, 1), w_hh = rng.uniform({3 * hs, hs}, -1, 1);
  const Tensor b_ih = rng.uniform({3 * hs}, -1, 1), b_hh = rng.uniform({3 * hs}, -1, 1);
  const Tensor x = randn({nb, e}, 2), h = randn({nb, hs}, 3);
  const GruCellResult r = gru_cell(x, h, w_ih, w_hh, b_ih, b_hh);
  ASSERT_EQ(r.h.shape(), (Shape{nb, hs}));
  Vec want;
  for (int64_t b = 0; b < nb; ++b) {
    const Vec o = gru_ref(row(x, b), row(h, b), w_ih, w_hh, b_ih, b_hh);
    want.insert(want.end(), o.begin(), o.end());
  }
  EXPECT_TRUE(AllClose(r.h, want, kCellVsDouble));
  // Saved gates restate the output: h' = (1 - z) n + z h.
  const std::vector<float> z = r.z.to_vector(), n = r.n.to_vector(), hv = h.to_vector();
  Vec again(z.size());
  for (size_t i = 0; i < z.size(); ++i) again[i] = (1.0 - z[i]) * n[i] + z[i] * hv[i];
  EXPECT_TRUE(AllClose(r.h, again, kCellVsDouble));
}

TEST(GruCell, NoBiasEqualsZeroBias) {
  Rng rng(4);
  const int64_t hs = 3;
  const Tensor w_ih = rng.uniform({3 * hs, 2}, -1, 1), w_hh = rng.uniform({3 * hs, hs}, -1, 1);
  const Tensor x = randn({2, 2}, 5), h = randn({2, hs}, 6), zero = Tensor::zeros({3 * hs});
  EXPECT_TRUE(AllClose(gru_cell(x, h, w_ih, w_hh).h, gru_cell(x, h, w_ih, w_hh, zero, zero).h, testing::kExact));
}

// All weights and biases 0.5, x = 1, h = 0.5, E = H = 1:
//   every gate pre-activation from x: 0.5·1 + 0.5 = 1.0; from h: 0.5·0.5 + 0.5 = 0.75
//   r = z = σ(1.75) = 0.8519528020     n = tanh(1.0 + r·0.75) = tanh(1.6389646015) = 0.9273276850
//   h' = (1 − z)·n + z·h = 0.1480471980·0.9273276850 + 0.8519528020·0.5 = 0.5632646664
TEST(GruCell, HandWorkedAllHalfWeights) {
  const Tensor half3x1 = Tensor::full({3, 1}, 0.5f), half3 = Tensor::full({3}, 0.5f);
  const GruCellResult r = gru_cell(Tensor::full({1, 1}, 1.0f), Tensor::full({1, 1}, 0.5f), half3x1, half3x1,
                                   half3, half3);
  EXPECT_NEAR(r.r.item(), 0.8519528020, 1e-6);
  EXPECT_NEAR(r.z.item(), 0.8519528020, 1e-6);
  EXPECT_NEAR(r.hn.item(), 0.75, 1e-7);
  EXPECT_NEAR(r.n.item(), 0.9273276850, 1e-6);
  EXPECT_NEAR(r.h.item(), 0.5632646664, 1e-6);
}

// Gate order by hand: zero weights, distinct biases per gate, E = H = 1, h = 0.5.
//   b_ih = (1, 2, 3) for (r, z, n), b_hh = (0, 0, 0.5):
//   r = σ(1) = 0.7310585786   z = σ(2) = 0.8807970780   n = tanh(3 + r·0.5) = tanh(3.3655292893) = 0.9976163061
//   h' = (1 − z)·n + z·0.5 = 0.5593173177
TEST(GruCell, HandWorkedDistinctGateBiasesFixGateOrder) {
  const Tensor zero = Tensor::zeros({3, 1});
  const GruCellResult r = gru_cell(Tensor::full({1, 1}, 1.0f), Tensor::full({1, 1}, 0.5f), zero, zero,
                                   Tensor::from_vector({3}, {1, 2, 3}), Tensor::from_vector({3}, {0, 0, 0.5f}));
  EXPECT_NEAR(r.r.item(), 0.7310585786, 1e-6);
  EXPECT_NEAR(r.z.item(), 0.8807970780, 1e-6);
  EXPECT_NEAR(r.n.item(), 0.9976163061, 1e-6);
  EXPECT_NEAR(r.h.item(), 0.5593173177, 1e-6);
}

// Zero weights, b_ih = (1, 2, 3, 4) for (i, f, g, o), h = c = 0.5:
//   i = σ(1) = 0.7310585786   f = σ(2) = 0.8807970780   g = tanh(3) = 0.9950547537   o = σ(4) = 0.9820137900
//   c' = f·0.5 + i·g = 1.1678418529   h' = o·tanh(c') = 0.9820137900·0.8235790896 = 0.8087660232
TEST(LstmCell, HandWorkedDistinctGateBiasesFixGateOrder) {
  const Tensor zero = Tensor::zeros({4, 1}), half = Tensor::full({1, 1}, 0.5f);
  const LstmCellResult r = lstm_cell(Tensor::full({1, 1}, 1.0f), half, half, zero, zero,
                                     Tensor::from_vector({4}, {1, 2, 3, 4}), {});
  EXPECT_NEAR(r.i.item(), 0.7310585786, 1e-6);
  EXPECT_NEAR(r.f.item(), 0.8807970780, 1e-6);
  EXPECT_NEAR(r.g.item(), 0.9950547537, 1e-6);
  EXPECT_NEAR(r.o.item(), 0.9820137900, 1e-6);
  EXPECT_NEAR(r.c.item(), 1.1678418529, 1e-6);
  EXPECT_NEAR(r.h.item(), 0.8087660232, 1e-6);
}

TEST(LstmCell, MatchesDoubleFormulaOddSizes) {
  Rng rng(7);
  const int64_t nb = 3, e = 5, hs = 7;
  const Tensor w_ih = rng.uniform({4 * hs, e}, -1, 1), w_hh = rng.uniform({4 * hs, hs}, -1, 1);
  const Tensor b_ih = rng.uniform({4 * hs}, -1, 1), b_hh = rng.uniform({4 * hs}, -1, 1);
  const Tensor x = randn({nb, e}, 8), h = randn({nb, hs}, 9), c = randn({nb, hs}, 10);
  const LstmCellResult r = lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh);
  Vec want_h, want_c;
  for (int64_t b = 0; b < nb; ++b) {
    const auto [hn, cn] = lstm_ref(row(x, b), row(h, b), row(c, b), w_ih, w_hh, b_ih, b_hh);
    want_h.insert(want_h.end(), hn.begin(), hn.end());
    want_c.insert(want_c.end(), cn.begin(), cn.end());
  }
  EXPECT_TRUE(AllClose(r.h, want_h, kCellVsDouble));
  EXPECT_TRUE(AllClose(r.c, want_c, kCellVsDouble));
}

// All weights and biases 0.5, x = 1, h = c = 0.5, E = H = 1: every pre-activation is 1.0 + 0.75 = 1.75
//   i = f = o = σ(1.75) = 0.8519528020   g = tanh(1.75) = 0.9413755385
//   c' = f·0.5 + i·g = 0.4259764010 + 0.8020075277 = 1.2279839287
//   h' = o·tanh(c') = 0.8519528020·0.8419935496 = 0.7173387638
TEST(LstmCell, HandWorkedAllHalfWeights) {
  const Tensor half4x1 = Tensor::full({4, 1}, 0.5f), half4 = Tensor::full({4}, 0.5f);
  const Tensor half = Tensor::full({1, 1}, 0.5f);
  const LstmCellResult r =
      lstm_cell(Tensor::full({1, 1}, 1.0f), half, half, half4x1, half4x1, half4, half4);
  EXPECT_NEAR(r.i.item(), 0.8519528020, 1e-6);
  EXPECT_NEAR(r.f.item(), 0.8519528020, 1e-6);
  EXPECT_NEAR(r.g.item(), 0.9413755385, 1e-6);
  EXPECT_NEAR(r.o.item(), 0.8519528020, 1e-6);
  EXPECT_NEAR(r.c.item(), 1.2279839287, 1e-6);
  EXPECT_NEAR(r.h.item(), 0.7173387638, 1e-6);
}

// The fused cell's own exp/σ/tanh across their range, in vector lanes and the scalar tail (H = 4099 = 4·1024 + 3):
// zero weights, h = 0, so r = σ(b_r) and n = tanh(b_n) exactly.
TEST(GruCell, GateActivationsAccurateAcrossRangeAndSaturateWithoutNaN) {
  const int64_t hs = 4099;
  std::vector<float> b(3 * hs, 0.0f);
  for (int64_t j = 0; j < hs; ++j) {
    b[j] = -100.0f + 200.0f * j / (hs - 1);          // r: far into both saturations
    b[2 * hs + j] = -12.0f + 24.0f * j / (hs - 1);   // n
  }
  b[2 * hs + 0] = 1e-20f;  // tiny: tanh must keep relative accuracy
  b[2 * hs + 1] = -3e-6f;
  b[hs - 1] = std::numeric_limits<float>::infinity();
  b[2 * hs + hs - 1] = -std::numeric_limits<float>::infinity();
  const Tensor zw = Tensor::zeros({3 * hs, 1}), zh = Tensor::zeros({3 * hs, hs});
  const GruCellResult r = gru_cell(Tensor::zeros({1, 1}), Tensor::zeros({1, hs}), zw, zh,
                                   Tensor::from_vector({3 * hs}, b), {});
  Vec want_r(hs), want_n(hs);
  for (int64_t j = 0; j < hs; ++j) {
    want_r[j] = sig(b[j]);
    want_n[j] = std::tanh(static_cast<double>(b[2 * hs + j]));
  }
  EXPECT_TRUE(AllClose(r.r, want_r, kActivationVsDouble));
  EXPECT_TRUE(AllClose(r.n, want_n, kTanhRelative));
  EXPECT_EQ(r.r.to_vector()[hs - 1], 1.0f);
  EXPECT_EQ(r.n.to_vector()[hs - 1], -1.0f);
}

TEST(GruCell, StridedGiRowsAreRead) {
  // gi handed in as a strided row view (every other row of a bigger buffer), as the layer does per time step.
  Rng rng(11);
  const int64_t hs = 4;
  const Tensor w_hh = rng.uniform({3 * hs, hs}, -1, 1), b_hh = rng.uniform({3 * hs}, -1, 1);
  const Tensor big = randn({2, 3, 3 * hs}, 12);  // (B, T, 3H); take t = 1
  const Tensor gi = big.select(1, 1), h = randn({2, hs}, 13);
  ASSERT_FALSE(gi.is_contiguous());
  EXPECT_TRUE(AllClose(gru_cell_step(gi, h, w_hh, b_hh).h, gru_cell_step(gi.contiguous(), h, w_hh, b_hh).h,
                       testing::kExact));
}

// --- layers ---------------------------------------------------------------------------------------------

TEST(GRU, MultiLayerSequenceMatchesDoubleRecurrence) {
  Rng rng(20);
  const int64_t nb = 3, nt = 5, e = 7, hs = 4, nl = 3;
  GRU gru(e, hs, rng, layers(nl));
  const Tensor x = randn({nb, nt, e}, 21), h0 = randn({nl, nb, hs}, 22);
  const RnnOutput out = gru.forward(x, h0);
  ASSERT_EQ(out.output.shape(), (Shape{nb, nt, hs}));
  ASSERT_EQ(out.h_n.shape(), (Shape{nl, nb, hs}));
  EXPECT_FALSE(out.c_n.defined());
  const SeqRef ref = seq_ref(gru, false, x, h0, {}, {});
  EXPECT_TRUE(AllClose(out.output, ref.output, kSeqVsDouble));
  EXPECT_TRUE(AllClose(out.h_n, ref.h_n, kSeqVsDouble));
  // The output's last step is the top layer's final state.
  EXPECT_TRUE(AllClose(out.output.select(1, nt - 1), out.h_n.select(0, nl - 1), testing::kExact));
}

TEST(LSTM, MultiLayerSequenceMatchesDoubleRecurrence) {
  Rng rng(30);
  const int64_t nb = 2, nt = 6, e = 3, hs = 5, nl = 2;
  LSTM lstm(e, hs, rng, layers(nl));
  const Tensor x = randn({nb, nt, e}, 31), h0 = randn({nl, nb, hs}, 32), c0 = randn({nl, nb, hs}, 33);
  const RnnOutput out = lstm.forward(x, h0, c0);
  ASSERT_EQ(out.output.shape(), (Shape{nb, nt, hs}));
  ASSERT_EQ(out.h_n.shape(), (Shape{nl, nb, hs}));
  ASSERT_EQ(out.c_n.shape(), (Shape{nl, nb, hs}));
  const SeqRef ref = seq_ref(lstm, true, x, h0, c0, {});
  EXPECT_TRUE(AllClose(out.output, ref.output, kSeqVsDouble));
  EXPECT_TRUE(AllClose(out.h_n, ref.h_n, kSeqVsDouble));
  EXPECT_TRUE(AllClose(out.c_n, ref.c_n, kSeqVsDouble));
}

TEST(GRU, MissingInitialStateIsZeros) {
  Rng rng(40);
  GRU gru(3, 4, rng, layers(2));
  const Tensor x = randn({2, 3, 3}, 41);
  const RnnOutput a = gru.forward(x), b = gru.forward(x, Tensor::zeros({2, 2, 4}));
  EXPECT_TRUE(AllClose(a.output, b.output, testing::kExact));
  EXPECT_TRUE(AllClose(a.h_n, b.h_n, testing::kExact));
}

TEST(GRU, SeqLenOneEqualsOneCell) {
  Rng rng(42);
  GRU gru(3, 4, rng);
  const Tensor x = randn({2, 1, 3}, 43), h0 = randn({1, 2, 4}, 44);
  const GruCellResult c = gru_cell(x.select(1, 0), h0.select(0, 0), gru.weight_ih(0), gru.weight_hh(0),
                                   gru.bias_ih(0), gru.bias_hh(0));
  EXPECT_TRUE(AllClose(gru.forward(x, h0).h_n.select(0, 0), c.h, kSameMath));
}

TEST(GRU, TimeMajorLayoutEqualsBatchFirst) {
  Rng a(50), b(50);
  GRU bf(3, 4, a, layers(2, true)), tm(3, 4, b, layers(2, false));
  const Tensor x = randn({2, 5, 3}, 51);
  const RnnOutput o1 = bf.forward(x), o2 = tm.forward(x.transpose(0, 1));  // strided (T, B, E) view
  ASSERT_EQ(o2.output.shape(), (Shape{5, 2, 4}));
  EXPECT_TRUE(AllClose(o2.output.transpose(0, 1), o1.output, kSameMath));
  EXPECT_TRUE(AllClose(o2.h_n, o1.h_n, kSameMath));
}

TEST(LSTM, TimeMajorLayoutEqualsBatchFirst) {
  Rng a(52), b(52);
  LSTM bf(3, 4, a, layers(2, true)), tm(3, 4, b, layers(2, false));
  const Tensor x = randn({2, 5, 3}, 53);
  const RnnOutput o1 = bf.forward(x), o2 = tm.forward(x.transpose(0, 1).contiguous());
  EXPECT_TRUE(AllClose(o2.output.transpose(0, 1), o1.output, kSameMath));
  EXPECT_TRUE(AllClose(o2.c_n, o1.c_n, kSameMath));
}

TEST(GRU, StepEqualsForwardOneStepAtATime) {
  Rng rng(55);
  const int64_t nl = 2, nb = 2, nt = 4;
  GRU gru(3, 5, rng, layers(nl));
  const Tensor x = randn({nb, nt, 3}, 56);
  const RnnOutput full = gru.forward(x);
  Tensor h = Tensor::zeros({nl, nb, 5});
  for (int64_t t = 0; t < nt; ++t) {
    h = gru.step(x.select(1, t), h);
    EXPECT_TRUE(AllClose(h.select(0, nl - 1), full.output.select(1, t), kSameMath)) << "t=" << t;
  }
  EXPECT_TRUE(AllClose(h, full.h_n, kSameMath));
}

TEST(LSTM, StepEqualsForwardOneStepAtATime) {
  Rng rng(57);
  const int64_t nl = 2, nb = 2, nt = 4;
  LSTM lstm(3, 5, rng, layers(nl));
  const Tensor x = randn({nb, nt, 3}, 58);
  const RnnOutput full = lstm.forward(x);
  LSTM::State s{Tensor::zeros({nl, nb, 5}), Tensor::zeros({nl, nb, 5})};
  for (int64_t t = 0; t < nt; ++t) s = lstm.step(x.select(1, t), s.h, s.c);
  EXPECT_TRUE(AllClose(s.h, full.h_n, kSameMath));
  EXPECT_TRUE(AllClose(s.c, full.c_n, kSameMath));
}

// --- padded lengths ------------------------------------------------------------------------------------

TEST(GRU, PaddedStepsLeaveStateUnchangedAndOutputZero) {
  Rng rng(60);
  const int64_t nb = 3, nt = 5, e = 3, hs = 4, nl = 2;
  GRU gru(e, hs, rng, layers(nl));
  const std::vector<int64_t> lengths{5, 2, 0};
  Tensor x = randn({nb, nt, e}, 61);
  const Tensor h0 = randn({nl, nb, hs}, 62);
  const RnnOutput out = gru.forward(x, h0, lengths);
  const SeqRef ref = seq_ref(gru, false, x, h0, {}, lengths);
  EXPECT_TRUE(AllClose(out.output, ref.output, kSeqVsDouble));
  EXPECT_TRUE(AllClose(out.h_n, ref.h_n, kSeqVsDouble));
  // Row 1 equals running only its 2 real steps; row 2 (length 0) keeps h0; padded outputs are exactly 0.
  const RnnOutput alone = gru.forward(x.slice(0, 1, 2).slice(1, 0, 2), h0.slice(1, 1, 2).contiguous());
  EXPECT_TRUE(AllClose(out.h_n.select(1, 1), alone.h_n.select(1, 0), kSameMath));
  EXPECT_TRUE(AllClose(out.h_n.select(1, 2), h0.select(1, 2), testing::kExact));
  EXPECT_TRUE(AllClose(out.output.select(0, 1).slice(0, 2, nt), Vec(3 * hs, 0.0), testing::kExact));
  // Garbage in the padded positions changes nothing.
  x.select(0, 1).slice(0, 2, nt).fill(1e6f);
  const RnnOutput again = gru.forward(x, h0, lengths);
  EXPECT_TRUE(AllClose(again.h_n, out.h_n, testing::kExact));
  EXPECT_TRUE(AllClose(again.output, out.output, testing::kExact));
}

TEST(LSTM, PaddedStepsLeaveStateUnchanged) {
  Rng rng(63);
  const int64_t nb = 2, nt = 4, e = 2, hs = 3, nl = 2;
  LSTM lstm(e, hs, rng, layers(nl, false));  // time-major, to cover that layout's output rows
  const std::vector<int64_t> lengths{1, 4};
  const Tensor x = randn({nt, nb, e}, 64);
  const RnnOutput out = lstm.forward(x, {}, {}, lengths);
  const SeqRef ref = seq_ref(lstm, true, x.transpose(0, 1), {}, {}, lengths);
  EXPECT_TRUE(AllClose(out.output.transpose(0, 1), ref.output, kSeqVsDouble));
  EXPECT_TRUE(AllClose(out.h_n, ref.h_n, kSeqVsDouble));
  EXPECT_TRUE(AllClose(out.c_n, ref.c_n, kSeqVsDouble));
}

// --- parameters -----------------------------------------------------------------------------------------

std::vector<std::pair<std::string, Shape>> names_and_shapes(Module& m) {
  std::vector<std::pair<std::string, Shape>> out;
  for (auto& [name, p] : m.named_parameters()) out.emplace_back(name, p->shape());
  return out;
}

TEST(GRU, ParameterNamesShapesAndOrderAsPyTorch) {
  Rng rng(70);
  GRU gru(10, 20, rng, layers(2));
  // torch.nn.GRU(10, 20, num_layers=2).named_parameters()
  const std::vector<std::pair<std::string, Shape>> want{
      {"weight_ih_l0", {60, 10}}, {"weight_hh_l0", {60, 20}}, {"bias_ih_l0", {60}}, {"bias_hh_l0", {60}},
      {"weight_ih_l1", {60, 20}}, {"weight_hh_l1", {60, 20}}, {"bias_ih_l1", {60}}, {"bias_hh_l1", {60}}};
  EXPECT_EQ(names_and_shapes(gru), want);
  EXPECT_EQ(gru.num_parameters(), 2 * 60 * 20 + 60 * 10 + 4 * 60 + 60 * 20);
}

TEST(LSTM, ParameterNamesShapesAndOrderAsPyTorch) {
  Rng rng(71);
  LSTM lstm(10, 20, rng, layers(2));
  // torch.nn.LSTM(10, 20, num_layers=2).named_parameters()
  const std::vector<std::pair<std::string, Shape>> want{
      {"weight_ih_l0", {80, 10}}, {"weight_hh_l0", {80, 20}}, {"bias_ih_l0", {80}}, {"bias_hh_l0", {80}},
      {"weight_ih_l1", {80, 20}}, {"weight_hh_l1", {80, 20}}, {"bias_ih_l1", {80}}, {"bias_hh_l1", {80}}};
  EXPECT_EQ(names_and_shapes(lstm), want);
}

TEST(GRU, NoBiasHasOnlyWeights) {
  Rng rng(72);
  GRU gru(3, 4, rng, layers(2, true, false));
  const std::vector<std::pair<std::string, Shape>> want{
      {"weight_ih_l0", {12, 3}}, {"weight_hh_l0", {12, 4}}, {"weight_ih_l1", {12, 4}}, {"weight_hh_l1", {12, 4}}};
  EXPECT_EQ(names_and_shapes(gru), want);
  EXPECT_FALSE(gru.bias_ih(0).defined());
  const Tensor x = randn({1, 2, 3}, 73);
  EXPECT_TRUE(AllClose(gru.forward(x).output, seq_ref(gru, false, x, {}, {}, {}).output, kSeqVsDouble));
}

TEST(GRU, InitIsUniformWithinOneOverSqrtHAndSeeded) {
  Rng a(74), b(74);
  GRU g1(6, 16, a, layers(2)), g2(6, 16, b, layers(2));
  const float bound = 1.0f / std::sqrt(16.0f);
  float lo = 1, hi = -1;
  for (auto& [name, p] : g1.named_parameters())
    for (float v : p->to_vector()) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  EXPECT_GE(lo, -bound);
  EXPECT_LT(hi, bound);
  EXPECT_LT(lo, -0.9f * bound);  // actually spans the range
  EXPECT_GT(hi, 0.9f * bound);
  for (auto& [name, p] : g2.named_parameters())
    EXPECT_TRUE(AllClose(*p, g1.state_dict().at(name), testing::kExact)) << name;
}

TEST(LSTM, LoadsAPyTorchNamedStateDict) {
  Rng rng(75);
  LSTM src(3, 2, rng), dst(3, 2, rng);
  dst.load_state_dict(src.state_dict());
  const Tensor x = randn({1, 3, 3}, 76);
  EXPECT_TRUE(AllClose(dst.forward(x).h_n, src.forward(x).h_n, testing::kExact));
}

// --- errors ---------------------------------------------------------------------------------------------

TEST(GRU, BadConstructionThrowsNamingGRU) {
  Rng rng(80);
  EXPECT_TRUE(ThrowsArg([&] { GRU g(0, 4, rng); }, "[GRU]"));
  EXPECT_TRUE(ThrowsArg([&] { GRU g(3, 0, rng); }, "[GRU]"));
  EXPECT_TRUE(ThrowsArg([&] { GRU g(3, 4, rng, layers(0)); }, "[GRU]"));
  EXPECT_TRUE(ThrowsArg([&] { LSTM l(3, -1, rng); }, "[LSTM]"));
}

TEST(GRU, BadInputsThrowNamingGRU) {
  Rng rng(81);
  GRU gru(3, 4, rng, layers(2));
  const Tensor x = randn({2, 5, 3}, 82);
  EXPECT_TRUE(ThrowsArg([&] { gru.forward(Tensor()); }, "[GRU]"));
  EXPECT_TRUE(ThrowsArg([&] { gru.forward(randn({5, 3}, 1)); }, "[GRU]"));            // rank 2
  EXPECT_TRUE(ThrowsArg([&] { gru.forward(randn({2, 5, 4}, 1)); }, "[GRU]"));         // wrong E
  EXPECT_TRUE(ThrowsArg([&] { gru.forward(Tensor::zeros({2, 0, 3})); }, "[GRU]"));    // empty T
  EXPECT_TRUE(ThrowsArg([&] { gru.forward(Tensor::zeros({0, 5, 3})); }, "[GRU]"));    // empty B
  EXPECT_TRUE(ThrowsArg([&] { gru.forward(x, randn({1, 2, 4}, 1)); }, "[GRU] h0"));   // L mismatch
  EXPECT_TRUE(ThrowsArg([&] { gru.forward(x, randn({2, 3, 4}, 1)); }, "[GRU] h0"));   // B mismatch
  EXPECT_TRUE(ThrowsArg([&] { gru.forward(x, {}, {5}); }, "[GRU] lengths"));          // B mismatch
  EXPECT_TRUE(ThrowsArg([&] { gru.forward(x, {}, {5, 6}); }, "[GRU] length 6"));      // > T
  EXPECT_TRUE(ThrowsArg([&] { gru.forward(x, {}, {-1, 2}); }, "[GRU] length -1"));
  EXPECT_TRUE(ThrowsArg([&] { gru.step(randn({2, 4}, 1), Tensor::zeros({2, 2, 4})); }, "[GRU] step"));
  EXPECT_TRUE(ThrowsArg([&] { gru.step(randn({2, 3}, 1), Tensor()); }, "[GRU] step"));
  EXPECT_TRUE(ThrowsArg([&] { gru.step(randn({2, 3}, 1), Tensor::zeros({2, 1, 4})); }, "[GRU] h"));
  EXPECT_TRUE(ThrowsArg([&] { gru.weight_ih(2); }, "[GRU] layer 2"));
}

TEST(LSTM, BadInputsThrowNamingLSTM) {
  Rng rng(83);
  LSTM lstm(3, 4, rng);
  const Tensor x = randn({2, 5, 3}, 84), s = Tensor::zeros({1, 2, 4});
  EXPECT_TRUE(ThrowsArg([&] { lstm.forward(x, s, {}); }, "[LSTM] h0 and c0"));
  EXPECT_TRUE(ThrowsArg([&] { lstm.forward(x, s, Tensor::zeros({1, 2, 5})); }, "[LSTM] c0"));
  EXPECT_TRUE(ThrowsArg([&] { lstm.forward(randn({2, 5, 2}, 1)); }, "[LSTM]"));
  EXPECT_TRUE(ThrowsArg([&] { lstm.step(randn({2, 3}, 1), s, Tensor()); }, "[LSTM] step"));
  EXPECT_TRUE(ThrowsArg([&] { lstm.bias_hh(-1); }, "[LSTM] layer"));
}

TEST(GruCell, BadShapesThrowNamingTheCell) {
  const Tensor h = Tensor::zeros({2, 4}), w_hh = Tensor::zeros({12, 4}), gi = Tensor::zeros({2, 12});
  EXPECT_TRUE(ThrowsArg([&] { gru_cell_step(Tensor::zeros({2, 8}), h, w_hh, {}); }, "[gru_cell] gi"));
  EXPECT_TRUE(ThrowsArg([&] { gru_cell_step(Tensor::zeros({3, 12}), h, w_hh, {}); }, "[gru_cell] gi"));
  EXPECT_TRUE(ThrowsArg([&] { gru_cell_step(gi, h, Tensor::zeros({12, 3}), {}); }, "[gru_cell] w_hh"));
  EXPECT_TRUE(ThrowsArg([&] { gru_cell_step(gi, h, w_hh, Tensor::zeros({8})); }, "[gru_cell] b_hh"));
  EXPECT_TRUE(ThrowsArg([&] { gru_cell_step(gi, Tensor::zeros({2, 0}), w_hh, {}); }, "[gru_cell] h"));
  EXPECT_TRUE(ThrowsArg([&] { gru_cell_step(gi, Tensor(), w_hh, {}); }, "[gru_cell]"));
  EXPECT_TRUE(
      ThrowsArg([&] { gru_cell(Tensor::zeros({2, 3}), h, Tensor::zeros({12, 2}), w_hh); }, "[gru_cell] w_ih"));
  EXPECT_TRUE(
      ThrowsArg([&] { gru_cell(Tensor::zeros({3, 3}), h, Tensor::zeros({12, 3}), w_hh); }, "[gru_cell] x"));
  EXPECT_TRUE(ThrowsArg(
      [&] { gru_cell(Tensor::zeros({2, 3}), h, Tensor::zeros({12, 3}), w_hh, Tensor::zeros({4})); },
      "[gru_cell] b_ih"));
}

TEST(LstmCell, BadShapesThrowNamingTheCell) {
  const Tensor h = Tensor::zeros({2, 4}), w_hh = Tensor::zeros({16, 4}), gi = Tensor::zeros({2, 16});
  EXPECT_TRUE(ThrowsArg([&] { lstm_cell_step(gi, h, Tensor::zeros({2, 3}), w_hh, {}); }, "[lstm_cell] c"));
  EXPECT_TRUE(ThrowsArg([&] { lstm_cell_step(gi, h, Tensor(), w_hh, {}); }, "[lstm_cell] c"));
  EXPECT_TRUE(ThrowsArg([&] { lstm_cell_step(Tensor::zeros({2, 12}), h, h, w_hh, {}); }, "[lstm_cell] gi"));
  EXPECT_TRUE(ThrowsArg([&] { lstm_cell(Tensor::zeros({2, 3}), h, h, Tensor::zeros({12, 3}), w_hh); },
                        "[lstm_cell] w_ih"));
}

}  // namespace
}  // namespace qkv::nn
