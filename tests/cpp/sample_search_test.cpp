// decode::sample_search over any StepModel: greedy_search at temperature 0 (and with top_k 1), each source drawing
// from its own stream (its tokens the same alone or beside others, seeded runs repeating), the first tokens'
// frequencies following softmax(logits / T) after top-k and top-p, and its argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ops_testing.h"
#include "qkv/decode/search.h"

namespace qkv::decode {
namespace {

using qkv::testing::ThrowsArg;

constexpr int64_t kV = 6;

// Next-token logits that depend only on the row's last token (a Markov chain): a row's logits are the same in any
// batch, so a source's draws can be compared alone and beside others.
float logit(int64_t prev, int64_t v) {
  return 2.0f * std::sin(1.3f * static_cast<float>(prev) + 0.7f * static_cast<float>(v));
}

class MarkovModel : public StepModel {
 public:
  explicit MarkovModel(int64_t sources) : sources_(sources) {}
  int64_t num_sources() const override { return sources_; }
  int64_t vocab_size() const override { return kV; }
  void start() override {}
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override {
    const auto n = static_cast<int64_t>(rows.size());
    Tensor out = Tensor::empty({n, kV});
    for (int64_t i = 0; i < n; ++i)
      for (int64_t v = 0; v < kV; ++v) out.data()[i * kV + v] = logit(tokens[static_cast<size_t>(i)], v);
    return out;
  }

 private:
  int64_t sources_;
};

TEST(SampleSearch, TemperatureZeroAndTopKOneAreGreedySearch) {
  MarkovModel m(3);
  SearchOptions o;
  o.max_len = 12;
  o.bos = 1;
  o.eos = 2;
  const std::vector<Hypothesis> greedy = greedy_search(m, o);
  SamplingOptions top1;
  top1.temperature = 1.0f;
  top1.top_k = 1;
  top1.seed = 5;
  for (const SamplingOptions& s : {SamplingOptions{}, top1}) {
    const std::vector<Hypothesis> sampled = sample_search(m, o, s);
    ASSERT_EQ(sampled.size(), greedy.size());
    for (size_t i = 0; i < greedy.size(); ++i) {
      EXPECT_EQ(sampled[i].tokens, greedy[i].tokens) << "source " << i;
      EXPECT_EQ(sampled[i].log_prob, greedy[i].log_prob);
      EXPECT_EQ(sampled[i].finished, greedy[i].finished);
    }
  }
}

TEST(SampleSearch, EachSourceDrawsFromItsOwnSeededStream) {
  SearchOptions o;
  o.max_len = 24;
  o.bos = 0;
  o.eos = -1;
  SamplingOptions s;
  s.temperature = 1.0f;
  s.seed = 42;
  MarkovModel three(3), one(1);
  const std::vector<Hypothesis> a = sample_search(three, o, s);
  EXPECT_EQ(sample_search(one, o, s)[0].tokens, a[0].tokens);  // source 0 alone: the same draws
  EXPECT_TRUE(a[0].tokens != a[1].tokens || a[1].tokens != a[2].tokens) << "the sources share one stream";
  const std::vector<Hypothesis> again = sample_search(three, o, s);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(again[i].tokens, a[i].tokens) << "source " << i;
  s.seed = 43;
  const std::vector<Hypothesis> other = sample_search(three, o, s);
  EXPECT_TRUE(other[0].tokens != a[0].tokens || other[1].tokens != a[1].tokens || other[2].tokens != a[2].tokens);
  for (const Hypothesis& h : a) EXPECT_EQ(h.tokens.size(), 24u);
}

// The probabilities sample_token draws from: softmax(logits / T) over the top_k largest (lower id first on ties),
// cut to the shortest prefix whose mass reaches top_p, renormalised.
std::vector<double> filtered(int64_t prev, const SamplingOptions& s) {
  std::vector<int64_t> order(kV);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logit(prev, a) > logit(prev, b); });
  if (s.top_k > 0 && s.top_k < kV) order.resize(static_cast<size_t>(s.top_k));
  std::vector<double> p(order.size());
  double total = 0.0;
  for (size_t i = 0; i < order.size(); ++i) total += p[i] = std::exp(double{logit(prev, order[i])} / s.temperature);
  size_t keep = p.size();
  double mass = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    mass += p[i] / total;
    if (mass >= s.top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  std::vector<double> out(kV, 0.0);
  for (size_t i = 0; i < keep; ++i) out[static_cast<size_t>(order[i])] = p[i] / kept;
  return out;
}

TEST(SampleSearch, FirstTokensFollowTheFilteredSoftmax) {
  constexpr int64_t kSources = 6000;
  SearchOptions o;
  o.max_len = 1;
  o.bos = 3;
  o.eos = -1;
  struct Case {
    float temperature;
    int64_t top_k;
    float top_p;
  };
  for (const Case c : {Case{1.0f, 0, 1.0f}, Case{0.7f, 3, 1.0f}, Case{1.5f, 0, 0.8f}, Case{2.0f, 4, 0.9f}}) {
    SamplingOptions s;
    s.temperature = c.temperature;
    s.top_k = c.top_k;
    s.top_p = c.top_p;
    s.seed = 7;
    MarkovModel m(kSources);
    std::vector<double> count(kV, 0.0);
    for (const Hypothesis& h : sample_search(m, o, s)) count[static_cast<size_t>(h.tokens.at(0))] += 1.0;
    const std::vector<double> p = filtered(o.bos, s);
    for (int64_t v = 0; v < kV; ++v) {
      const double want = p[static_cast<size_t>(v)], got = count[static_cast<size_t>(v)] / kSources;
      if (want == 0.0) {
        EXPECT_EQ(got, 0.0) << "token " << v << " is outside top_k / top_p but was drawn";
        continue;
      }
      const double sigma = std::sqrt(want * (1.0 - want) / kSources);
      EXPECT_NEAR(got, want, 5.0 * sigma + 1e-9) << "T " << c.temperature << " top_k " << c.top_k << " top_p "
                                                 << c.top_p << " token " << v;
    }
  }
}

TEST(SampleSearch, RefusesBadOptions) {
  MarkovModel m(2);
  SearchOptions o;
  SamplingOptions s;
  s.temperature = -1.0f;
  EXPECT_TRUE(ThrowsArg([&] { sample_search(m, o, s); }, "[sampling] temperature must be finite and >= 0"));
  s = SamplingOptions{};
  s.top_p = 0.0f;
  EXPECT_TRUE(ThrowsArg([&] { sample_search(m, o, s); }, "[sampling] top_p must be in (0, 1]"));
  o.max_len = 0;
  EXPECT_TRUE(ThrowsArg([&] { sample_search(m, o, SamplingOptions{}); }, "[sample_search] max_len must be >= 1"));
  o.max_len = 4;
  o.bos = kV;
  EXPECT_TRUE(ThrowsArg([&] { sample_search(m, o, SamplingOptions{}); }, "[sample_search] bos 6 must be in [0, 6)"));
}

}  // namespace
}  // namespace qkv::decode
