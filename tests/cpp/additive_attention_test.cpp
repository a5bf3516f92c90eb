// Bahdanau and Luong scorers against float64 restatements of their scores; masked softmax and context rules
// (sum to 1 over real positions, 0 on padding, fully masked -> 0), parameter names, and error paths.
#include "qkv/nn/additive_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ops_testing.h"

namespace qkv::nn {
namespace {

using testing::AllClose;
using testing::randn;
using testing::ThrowsArg;
using testing::Tol;

constexpr Tol kScoreVsDouble{1e-5, 1e-5};
constexpr Tol kSameMath{1e-6, 1e-6};
using Vec = std::vector<double>;

Vec vec(const Tensor& t) { return testing::to_double(t); }

// W (rows, cols) · x, double.
Vec matvec(const Tensor& w, const Vec& x) {
  const Vec wv = vec(w);
  const int64_t rows = w.size(0), cols = w.size(1);
  Vec y(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[r] += wv[r * cols + c] * x[c];
  return y;
}
double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
Vec row(const Tensor& t) { return vec(t); }

// Scores (B, Ts) for query (B, Hq), keys (B, Ts, Hk), in double.
Vec bahdanau_ref(const BahdanauAttention& a, const Tensor& q, const Tensor& k) {
  Vec out;
  for (int64_t b = 0; b < k.size(0); ++b) {
    const Vec ws = matvec(a.W.weight, row(q.select(0, b)));
    for (int64_t i = 0; i < k.size(1); ++i) {
      Vec e = matvec(a.U.weight, row(k.select(0, b).select(0, i)));
      for (size_t j = 0; j < e.size(); ++j) e[j] = std::tanh(e[j] + ws[j]);
      out.push_back(dot(vec(a.v.weight), e));
    }
  }
  return out;
}
Vec luong_ref(const Tensor& w /* undefined for dot */, const Tensor& q, const Tensor& k) {
  Vec out;
  for (int64_t b = 0; b < k.size(0); ++b)
    for (int64_t i = 0; i < k.size(1); ++i) {
      const Vec h = row(k.select(0, b).select(0, i));
      out.push_back(dot(row(q.select(0, b)), w.defined() ? matvec(w, h) : h));
    }
  return out;
}

// Masked softmax + context in double, from scores (B, Ts).
struct AlignRef {
  Vec weights, context;
};
AlignRef align_ref(const Vec& scores, const Tensor& keys, const std::vector<int64_t>& lengths) {
  const int64_t nb = keys.size(0), ts = keys.size(1), hk = keys.size(2);
  const Vec kv = vec(keys);
  AlignRef r{Vec(nb * ts, 0.0), Vec(nb * hk, 0.0)};
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t len = lengths.empty() ? ts : lengths[b];
    if (len == 0) continue;
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < len; ++i) mx = std::max(mx, scores[b * ts + i]);
    for (int64_t i = 0; i < len; ++i) sum += std::exp(scores[b * ts + i] - mx);
    for (int64_t i = 0; i < len; ++i) {
      const double w = std::exp(scores[b * ts + i] - mx) / sum;
      r.weights[b * ts + i] = w;
      for (int64_t j = 0; j < hk; ++j) r.context[b * hk + j] += w * kv[(b * ts + i) * hk + j];
    }
  }
  return r;
}

std::vector<std::unique_ptr<AttentionScorer>> all_scorers(int64_t h, Rng& rng) {
  std::vector<std::unique_ptr<AttentionScorer>> v;
  v.push_back(std::make_unique<BahdanauAttention>(h, h, 5, rng));
  v.push_back(std::make_unique<LuongAttention>(LuongScore::kDot, h, h, rng));
  v.push_back(std::make_unique<LuongAttention>(LuongScore::kGeneral, h, h, rng));
  return v;
}

TEST(BahdanauAttention, ScoresWeightsAndContextMatchDouble) {
  Rng rng(1);
  const int64_t nb = 2, ts = 5, hq = 3, hk = 4, a = 6;
  BahdanauAttention att(hq, hk, a, rng);
  const Tensor q = randn({nb, hq}, 2), k = randn({nb, ts, hk}, 3);
  const Tensor prepared = att.prepare(k);
  ASSERT_EQ(prepared.shape(), (Shape{nb, ts, a}));
  const Vec want = bahdanau_ref(att, q, k);
  EXPECT_TRUE(AllClose(att.score(q, prepared), want, kScoreVsDouble));
  const std::vector<int64_t> lengths{5, 3};
  const AlignmentResult r = att.forward(q, k, prepared, lengths_to_keep_mask(lengths, ts));
  const AlignRef ref = align_ref(want, k, lengths);
  ASSERT_EQ(r.weights.shape(), (Shape{nb, ts}));
  ASSERT_EQ(r.context.shape(), (Shape{nb, hk}));
  EXPECT_TRUE(AllClose(r.weights, ref.weights, kScoreVsDouble));
  EXPECT_TRUE(AllClose(r.context, ref.context, kScoreVsDouble));
}

TEST(LuongAttention, DotAndGeneralScoresMatchDouble) {
  Rng rng(4);
  const int64_t nb = 3, ts = 4, h = 5;
  const Tensor q = randn({nb, h}, 5), k = randn({nb, ts, h}, 6);
  LuongAttention dot_att(LuongScore::kDot, h, h, rng);
  EXPECT_TRUE(AllClose(dot_att.score(q, dot_att.prepare(k)), luong_ref({}, q, k), kScoreVsDouble));
  LuongAttention gen(LuongScore::kGeneral, 2, h, rng);  // Hq != Hk is allowed for general
  const Tensor q2 = randn({nb, 2}, 7);
  const Tensor w = gen.state_dict().at("W.weight");
  ASSERT_EQ(w.shape(), (Shape{2, h}));
  const Vec want = luong_ref(w, q2, k);
  EXPECT_TRUE(AllClose(gen.score(q2, gen.prepare(k)), want, kScoreVsDouble));
  const AlignRef ref = align_ref(want, k, {});
  const AlignmentResult r = gen.attend(q2, k);
  EXPECT_TRUE(AllClose(r.weights, ref.weights, kScoreVsDouble));
  EXPECT_TRUE(AllClose(r.context, ref.context, kScoreVsDouble));
}

TEST(AttentionScorer, WeightsSumToOneOverRealPositionsAndZeroOnPadding) {
  Rng rng(8);
  const int64_t nb = 4, ts = 6, h = 4;
  const std::vector<int64_t> lengths{6, 3, 1, 5};
  const Tensor mask = lengths_to_keep_mask(lengths, ts);
  const Tensor q = randn({nb, h}, 9), k = randn({nb, ts, h}, 10, 3.0f);
  for (auto& att : all_scorers(h, rng)) {
    const std::vector<float> w = att->attend(q, k, mask).weights.to_vector();
    for (int64_t b = 0; b < nb; ++b) {
      double sum = 0;
      for (int64_t i = 0; i < ts; ++i) {
        const float wi = w[b * ts + i];
        if (i >= lengths[b]) {
          EXPECT_EQ(wi, 0.0f) << "b=" << b << " i=" << i;
        } else {
          EXPECT_GT(wi, 0.0f);
        }
        sum += wi;
      }
      EXPECT_NEAR(sum, 1.0, 1e-6) << "b=" << b;
    }
  }
}

TEST(AttentionScorer, FullyMaskedRowIsZeroNotNaN) {
  Rng rng(11);
  const Tensor q = randn({2, 4}, 12), k = randn({2, 3, 4}, 13);
  const Tensor mask = lengths_to_keep_mask({0, 3}, 3);
  for (auto& att : all_scorers(4, rng)) {
    const AlignmentResult r = att->attend(q, k, mask);
    EXPECT_TRUE(AllClose(r.weights.select(0, 0), Vec(3, 0.0), testing::kExact));
    EXPECT_TRUE(AllClose(r.context.select(0, 0), Vec(4, 0.0), testing::kExact));
  }
}

TEST(AttentionScorer, ContextIsTheWeightedSumOfKeys) {
  Rng rng(14);
  const int64_t nb = 2, ts = 5, h = 3;
  const Tensor q = randn({nb, h}, 15), k = randn({nb, ts, h}, 16);
  for (auto& att : all_scorers(h, rng)) {
    const AlignmentResult r = att->attend(q, k, lengths_to_keep_mask({4, 5}, ts));
    const Vec w = vec(r.weights), kv = vec(k);
    Vec want(nb * h, 0.0);
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t i = 0; i < ts; ++i)
        for (int64_t j = 0; j < h; ++j) want[b * h + j] += w[b * ts + i] * kv[(b * ts + i) * h + j];
    EXPECT_TRUE(AllClose(r.context, want, kScoreVsDouble));
  }
}

TEST(AttentionScorer, PaddedKeysDoNotInfluenceTheResult) {
  Rng rng(17);
  const Tensor q = randn({2, 4}, 18), mask = lengths_to_keep_mask({2, 4}, 4);
  Tensor k = randn({2, 4, 4}, 19);
  for (auto& att : all_scorers(4, rng)) {
    const AlignmentResult a = att->attend(q, k, mask);
    Tensor k2 = k.clone();
    k2.select(0, 0).slice(0, 2, 4).fill(1e3f);
    const AlignmentResult b = att->attend(q, k2, mask);
    EXPECT_TRUE(AllClose(b.weights, a.weights, testing::kExact));
    EXPECT_TRUE(AllClose(b.context, a.context, testing::kExact));
  }
}

TEST(AttentionScorer, BatchedQueriesEqualOneQueryAtATime) {
  Rng rng(20);
  const int64_t nb = 2, tq = 3, ts = 4, h = 4;
  const Tensor q = randn({nb, tq, h}, 21), k = randn({nb, ts, h}, 22), mask = lengths_to_keep_mask({4, 2}, ts);
  for (auto& att : all_scorers(h, rng)) {
    const Tensor prepared = att->prepare(k);
    const AlignmentResult all = att->forward(q, k, prepared, mask);
    ASSERT_EQ(all.weights.shape(), (Shape{nb, tq, ts}));
    ASSERT_EQ(all.context.shape(), (Shape{nb, tq, h}));
    for (int64_t t = 0; t < tq; ++t) {
      const AlignmentResult one = att->forward(q.select(1, t), k, prepared, mask);
      EXPECT_TRUE(AllClose(all.weights.select(1, t), one.weights, kSameMath));
      EXPECT_TRUE(AllClose(all.context.select(1, t), one.context, kSameMath));
    }
  }
}

TEST(AttentionScorer, ParameterNames) {
  Rng rng(23);
  BahdanauAttention b(3, 4, 5, rng);
  std::vector<std::pair<std::string, Shape>> got;
  for (auto& [n, p] : b.named_parameters()) got.emplace_back(n, p->shape());
  EXPECT_EQ(got, (std::vector<std::pair<std::string, Shape>>{
                     {"W.weight", {5, 3}}, {"U.weight", {5, 4}}, {"v.weight", {1, 5}}}));
  LuongAttention g(LuongScore::kGeneral, 3, 4, rng), d(LuongScore::kDot, 4, 4, rng);
  ASSERT_EQ(g.named_parameters().size(), 1u);
  EXPECT_EQ(g.named_parameters()[0].first, "W.weight");
  EXPECT_EQ(g.named_parameters()[0].second->shape(), (Shape{3, 4}));
  EXPECT_TRUE(d.named_parameters().empty());
}

TEST(AttentionScorer, BadInputsThrowNamingTheScorer) {
  Rng rng(24);
  BahdanauAttention b(3, 4, 5, rng);
  LuongAttention g(LuongScore::kGeneral, 3, 4, rng);
  const Tensor q = randn({2, 3}, 1), k = randn({2, 5, 4}, 2);
  EXPECT_TRUE(ThrowsArg([&] { BahdanauAttention x(3, 4, 0, rng); }, "[BahdanauAttention]"));
  EXPECT_TRUE(ThrowsArg([&] { BahdanauAttention x(0, 4, 5, rng); }, "[BahdanauAttention]"));
  EXPECT_TRUE(ThrowsArg([&] { LuongAttention x(LuongScore::kDot, 3, 4, rng); }, "[LuongAttention] the dot"));
  EXPECT_TRUE(ThrowsArg([&] { b.attend(randn({2, 4}, 1), k); }, "[BahdanauAttention] query"));
  EXPECT_TRUE(ThrowsArg([&] { b.attend(randn({2}, 1), k); }, "[BahdanauAttention] query"));
  EXPECT_TRUE(ThrowsArg([&] { b.attend(q, randn({2, 5, 3}, 1)); }, "[BahdanauAttention] keys"));
  EXPECT_TRUE(ThrowsArg([&] { b.attend(q, randn({2, 0, 4}, 1)); }, "[BahdanauAttention] keys"));
  EXPECT_TRUE(ThrowsArg([&] { b.attend(randn({3, 3}, 1), k); }, "[BahdanauAttention] query"));
  EXPECT_TRUE(ThrowsArg([&] { b.attend(q, k, Tensor::ones({2, 4})); }, "[BahdanauAttention] keep_mask"));
  EXPECT_TRUE(ThrowsArg([&] { b.forward(q, k, randn({2, 4, 5}, 1), Tensor()); }, "[BahdanauAttention] prepared"));
  EXPECT_TRUE(ThrowsArg([&] { b.score(q, randn({2, 5, 4}, 1)); }, "[BahdanauAttention] prepared"));
  EXPECT_TRUE(ThrowsArg([&] { g.score(q, k); }, "[LuongAttention] prepared"));
  EXPECT_TRUE(ThrowsArg([&] { g.prepare(randn({2, 5, 3}, 1)); }, "[LuongAttention] keys"));
}

TEST(Align, BadInputsThrowNamingAlign) {
  const Tensor k = randn({2, 5, 4}, 1);
  EXPECT_TRUE(ThrowsArg([&] { align(randn({2, 4}, 1), k); }, "[align] scores"));
  EXPECT_TRUE(ThrowsArg([&] { align(randn({3, 5}, 1), k); }, "[align] scores"));
  EXPECT_TRUE(ThrowsArg([&] { align(randn({2, 5}, 1), randn({2, 5}, 1)); }, "[align] keys"));
  EXPECT_TRUE(ThrowsArg([&] { align(randn({2, 5}, 1), k, Tensor::ones({2, 6})); }, "[align] keep_mask"));
  EXPECT_TRUE(ThrowsArg([&] { align(Tensor(), k); }, "[align]"));
  EXPECT_TRUE(ThrowsArg([&] { lengths_to_keep_mask({1, 6}, 5); }, "[lengths_to_keep_mask] length 6"));
  EXPECT_TRUE(ThrowsArg([&] { lengths_to_keep_mask({}, 5); }, "[lengths_to_keep_mask]"));
  EXPECT_TRUE(ThrowsArg([&] { lengths_to_keep_mask({1}, 0); }, "[lengths_to_keep_mask]"));
}

}  // namespace
}  // namespace qkv::nn
