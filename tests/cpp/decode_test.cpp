// Tests of decoding: greedy and beam search on a toy model whose optimum is known by brute force, the KV cache,
// cached Transformer decoding against full recomputation (exactly the same tokens), and the RNN step model.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>

#include "ops_testing.h"
#include "qkv/nn/kv_cache.h"
#include "qkv/decode/search.h"
#include "qkv/decode/cached_step.h"
#include "recompute_steps.h"

namespace qkv::decode {
using nn::gather_rows;
using nn::is_identity;
using nn::KvCache;
namespace {

using qkv::testing::AllClose;
using qkv::testing::DecoderOnlyRecomputeStep;
using qkv::testing::TransformerRecomputeStep;
using qkv::testing::ThrowsArg;
using qkv::testing::Tol;

// Cached and recomputed logits differ only by float32 rounding in different summation orders.
constexpr Tol kCacheVsRecompute{1e-4, 1e-4};

// A toy model: the logits of the next token are a fixed pseudo-random function of (source, prefix). Its rows
// bookkeeping is what the searches must get right.
class TableModel : public StepModel {
 public:
  TableModel(int64_t sources, int64_t vocab, uint64_t seed) : S_(sources), V_(vocab), seed_(seed) {}
  int64_t num_sources() const override { return S_; }
  int64_t vocab_size() const override { return V_; }
  void start() override {
    prefix_.assign(static_cast<size_t>(S_), {});
    for (int64_t s = 0; s < S_; ++s) prefix_[static_cast<size_t>(s)] = {s};
    ++starts;
  }
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override {
    std::vector<std::vector<int64_t>> next;
    Tensor out = Tensor::empty({static_cast<int64_t>(rows.size()), V_});
    for (size_t i = 0; i < rows.size(); ++i) {
      next.push_back(prefix_.at(static_cast<size_t>(rows[i])));
      next.back().push_back(tokens[i]);
      const auto l = logits(next.back());
      std::copy(l.begin(), l.end(), out.data() + static_cast<int64_t>(i) * V_);
    }
    prefix_ = next;
    max_rows = std::max<int64_t>(max_rows, static_cast<int64_t>(rows.size()));
    return out;
  }
  // prefix = {source, BOS, t1, t2, ...}
  std::vector<float> logits(const std::vector<int64_t>& prefix) const {
    uint64_t h = seed_ * 0x9E3779B97F4A7C15ULL;
    for (int64_t t : prefix) h = (h ^ static_cast<uint64_t>(t + 1)) * 0xBF58476D1CE4E5B9ULL;
    Rng rng(h);
    std::vector<float> l(static_cast<size_t>(V_));
    for (auto& x : l) x = rng.normal(0.0f, 2.0f);
    return l;
  }
  int64_t starts = 0, max_rows = 0;

 private:
  int64_t S_, V_;
  uint64_t seed_;
  std::vector<std::vector<int64_t>> prefix_;
};

double log_prob_of(const TableModel& m, int64_t source, int64_t bos, const std::vector<int64_t>& tokens) {
  std::vector<int64_t> prefix = {source, bos};
  double lp = 0.0;
  for (int64_t t : tokens) {
    const auto l = m.logits(prefix);
    double mx = -1e300, s = 0.0;
    for (float x : l) mx = std::max(mx, static_cast<double>(x));
    for (float x : l) s += std::exp(x - mx);
    lp += l[static_cast<size_t>(t)] - mx - std::log(s);
    prefix.push_back(t);
  }
  return lp;
}

// Every sequence that ends with EOS within max_len, or has exactly max_len tokens without EOS.
Hypothesis brute_force_best(const TableModel& m, int64_t source, const SearchOptions& o, LengthPenalty pen,
                            double alpha) {
  Hypothesis best;
  best.score = -1e300;
  std::function<void(std::vector<int64_t>&)> rec = [&](std::vector<int64_t>& seq) {
    const bool ended = !seq.empty() && seq.back() == o.eos;
    if (ended || static_cast<int64_t>(seq.size()) == o.max_len) {
      const double lp = log_prob_of(m, source, o.bos, seq);
      const double score = lp / length_penalty(static_cast<int64_t>(seq.size()), pen, alpha);
      if (score > best.score) best = Hypothesis{seq, lp, score, ended};
      return;
    }
    for (int64_t v = 0; v < m.vocab_size(); ++v) {
      seq.push_back(v);
      rec(seq);
      seq.pop_back();
    }
  };
  std::vector<int64_t> seq;
  rec(seq);
  return best;
}

TEST(LengthPenalty, GnmtAverageAndNone) {
  EXPECT_DOUBLE_EQ(length_penalty(7, LengthPenalty::kNone, 0.6), 1.0);
  EXPECT_DOUBLE_EQ(length_penalty(1, LengthPenalty::kGnmt, 0.6), 1.0);  // ((5 + 1) / 6)^a
  EXPECT_DOUBLE_EQ(length_penalty(7, LengthPenalty::kGnmt, 1.0), 2.0);
  EXPECT_DOUBLE_EQ(length_penalty(9, LengthPenalty::kAverage, 0.5), 3.0);
  EXPECT_DOUBLE_EQ(length_penalty(9, LengthPenalty::kGnmt, 0.0), 1.0);
  EXPECT_TRUE(ThrowsArg([] { length_penalty(0, LengthPenalty::kGnmt, 0.6); }, "[length_penalty] length"));
  EXPECT_TRUE(ThrowsArg([] { length_penalty(3, LengthPenalty::kGnmt, -1.0); }, "[length_penalty] alpha"));
}

TEST(GreedySearch, TakesTheArgmaxAndStopsAtEos) {
  TableModel m(3, 5, 1);
  SearchOptions o{6, 1, 2};
  const auto hyps = greedy_search(m, o);
  ASSERT_EQ(hyps.size(), 3u);
  for (int64_t s = 0; s < 3; ++s) {
    const Hypothesis& h = hyps[static_cast<size_t>(s)];
    std::vector<int64_t> prefix = {s, 1};
    for (size_t i = 0; i < h.tokens.size(); ++i) {
      const auto l = m.logits(prefix);
      EXPECT_EQ(h.tokens[i], std::max_element(l.begin(), l.end()) - l.begin());
      if (i + 1 < h.tokens.size()) EXPECT_NE(h.tokens[i], 2);
      prefix.push_back(h.tokens[i]);
    }
    EXPECT_EQ(h.finished, !h.tokens.empty() && h.tokens.back() == 2);
    if (!h.finished) EXPECT_EQ(h.tokens.size(), 6u);
    EXPECT_NEAR(h.log_prob, log_prob_of(m, s, 1, h.tokens), 1e-9);
  }
}

TEST(BeamSearch, LargeBeamFindsTheBruteForceOptimum) {
  for (LengthPenalty pen : {LengthPenalty::kNone, LengthPenalty::kGnmt, LengthPenalty::kAverage}) {
    for (uint64_t seed : {3u, 4u, 5u}) {
      TableModel m(2, 4, seed);
      const SearchOptions o{4, 1, 2};
      const BeamOptions b{64, pen, 0.8};
      const auto res = beam_search(m, o, b);
      ASSERT_EQ(res.size(), 2u);
      for (int64_t s = 0; s < 2; ++s) {
        const Hypothesis want = brute_force_best(m, s, o, pen, b.alpha);
        ASSERT_FALSE(res[static_cast<size_t>(s)].empty());
        const Hypothesis& got = res[static_cast<size_t>(s)][0];
        EXPECT_EQ(got.tokens, want.tokens) << "penalty " << static_cast<int>(pen) << " seed " << seed;
        EXPECT_NEAR(got.score, want.score, 1e-9);
        EXPECT_EQ(got.finished, want.finished);
        for (size_t i = 1; i < res[static_cast<size_t>(s)].size(); ++i)
          EXPECT_GE(res[static_cast<size_t>(s)][i - 1].score, res[static_cast<size_t>(s)][i].score);
      }
    }
  }
}

TEST(BeamSearch, BeamOfOneWithoutPenaltyIsGreedy) {
  for (uint64_t seed = 0; seed < 5; ++seed) {
    TableModel a(4, 6, seed), b(4, 6, seed);
    const SearchOptions o{8, 1, 2};
    const auto g = greedy_search(a, o);
    const auto r = beam_search(b, o, BeamOptions{1, LengthPenalty::kNone, 0.0});
    for (size_t s = 0; s < 4; ++s) {
      ASSERT_EQ(r[s].size(), 1u);
      EXPECT_EQ(r[s][0].tokens, g[s].tokens);
      EXPECT_NEAR(r[s][0].log_prob, g[s].log_prob, 1e-9);
    }
  }
}

TEST(BeamSearch, WiderBeamNeverScoresWorseThanGreedy) {
  int better = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    TableModel a(1, 5, seed), b(1, 5, seed);
    const SearchOptions o{5, 1, 2};
    const auto g = greedy_search(a, o);
    const auto r = beam_search(b, o, BeamOptions{4, LengthPenalty::kNone, 0.0});
    EXPECT_GE(r[0][0].score, g[0].log_prob - 1e-12);
    better += r[0][0].score > g[0].log_prob + 1e-9;
  }
  EXPECT_GT(better, 0);  // the toy model has greedy traps
}

TEST(BeamSearch, RowsStayBoundedByBeamTimesSources) {
  TableModel m(3, 7, 9);
  beam_search(m, SearchOptions{6, 1, 2}, BeamOptions{3, LengthPenalty::kGnmt, 0.6});
  EXPECT_LE(m.max_rows, 9);
  EXPECT_EQ(m.starts, 1);
}

TEST(Search, BadOptionsAndBadLogitsAreNamed) {
  TableModel m(1, 4, 0);
  EXPECT_TRUE(ThrowsArg([&] { greedy_search(m, SearchOptions{0, 1, 2}); }, "[greedy_search] max_len"));
  EXPECT_TRUE(ThrowsArg([&] { greedy_search(m, SearchOptions{3, 4, 2}); }, "[greedy_search] bos 4"));
  EXPECT_TRUE(ThrowsArg([&] { beam_search(m, SearchOptions{3, 1, 2}, BeamOptions{0}); }, "[beam_search] beam_size"));
  EXPECT_TRUE(ThrowsArg([&] { beam_search(m, SearchOptions{3, 1, 2}, BeamOptions{2, LengthPenalty::kGnmt, -1}); },
                        "[beam_search] alpha"));
  struct Bad : TableModel {
    Bad() : TableModel(1, 4, 0) {}
    Tensor step(const std::vector<int64_t>&, const std::vector<int64_t>&) override { return Tensor::zeros({1, 3}); }
  } bad;
  EXPECT_TRUE(ThrowsArg([&] { greedy_search(bad, SearchOptions{3, 1, 2}); }, "[greedy_search] the model returned"));
}

TEST(BeamSearch, MemoryEstimateOverMaxBytesIsRefusedNamingBoth) {
  struct Heavy : TableModel {
    Heavy() : TableModel(2, 4, 0) {}
    int64_t row_bytes(int64_t steps) const override { return steps * 1024 * 1024; }  // 1 MiB a step
  } m;
  BeamOptions b{3};
  b.max_bytes = int64_t{64} << 20;  // 2 sources x 3 beams x 100 MiB do not fit in 64 MiB
  EXPECT_TRUE(ThrowsArg([&] { beam_search(m, SearchOptions{100, 1, 2}, b); },
                        "[beam_search] 3 beams x 2 source(s) need about 0.59 GiB (KV caches 0.59 GiB"));
  EXPECT_TRUE(ThrowsArg([&] { beam_search(m, SearchOptions{100, 1, 2}, b); }, "more than the limit of 0.06 GiB"));
  EXPECT_EQ(beam_search(m, SearchOptions{5, 1, 2}, b).size(), 2u);  // 30 MiB: fits
}

TEST(Search, EosMinusOneMeansNoEndToken) {
  TableModel m(1, 3, 4);
  for (const Hypothesis& h : greedy_search(m, SearchOptions{12, 1, -1})) {
    EXPECT_EQ(h.tokens.size(), 12u);
    EXPECT_FALSE(h.finished);
  }
  const std::vector<std::vector<Hypothesis>> beams = beam_search(m, SearchOptions{9, 1, -1}, BeamOptions{2});
  for (const Hypothesis& h : beams.at(0)) {
    EXPECT_EQ(h.tokens.size(), 9u);
    EXPECT_FALSE(h.finished);
  }
  EXPECT_TRUE(ThrowsArg([&] { greedy_search(m, SearchOptions{3, 1, -2}); }, "[greedy_search] eos -2"));
  EXPECT_TRUE(ThrowsArg([&] { greedy_search(m, SearchOptions{3, 1, 3}); }, "or -1 (none)"));
}

// --- KV cache -----------------------------------------------------------------------------------------------------

TEST(KvCache, AppendGrowsAndReorderForksRows) {
  KvCache c;
  c.reset(2, 1, 2, 1);
  c.append(Tensor::from_vector({2, 1, 1, 2}, {1, 2, 3, 4}), Tensor::from_vector({2, 1, 1, 2}, {5, 6, 7, 8}));
  c.append(Tensor::from_vector({2, 1, 2, 2}, {9, 10, 11, 12, 13, 14, 15, 16}), Tensor::zeros({2, 1, 2, 2}));
  EXPECT_EQ(c.length(), 3);
  EXPECT_EQ(c.keys().to_vector(), (std::vector<float>{1, 2, 9, 10, 11, 12, 3, 4, 13, 14, 15, 16}));
  c.reorder({1, 1, 0});
  EXPECT_EQ(c.rows(), 3);
  EXPECT_EQ(c.keys().shape(), (Shape{3, 1, 3, 2}));
  EXPECT_EQ(c.keys().to_vector(),
            (std::vector<float>{3, 4, 13, 14, 15, 16, 3, 4, 13, 14, 15, 16, 1, 2, 9, 10, 11, 12}));
  EXPECT_EQ(c.values().select(0, 2).to_vector(), (std::vector<float>{5, 6, 0, 0, 0, 0}));
}

// Paged storage holds what the contiguous one does through appends that cross pages, a reorder that forks and
// drops rows, and the growth of the table and the pool; every table entry names a pool page, rows' pages
// interleave in the pool, and each position sits in the page and slot the table gives it.
TEST(KvCache, PagedHoldsWhatContiguousHolds) {
  for (int64_t page : {1, 2, 3, 8}) {
    SCOPED_TRACE("page " + std::to_string(page));
    KvCache flat, paged;
    flat.reset(2, 2, 3, 2);
    paged.reset(2, 2, 3, 2, page);
    ASSERT_TRUE(paged.paged());
    ASSERT_FALSE(flat.paged());
    uint64_t seed = 40;
    auto append = [&](int64_t rows, int64_t tn) {
      const Tensor k = qkv::testing::randn({rows, 2, tn, 3}, ++seed), v = qkv::testing::randn({rows, 2, tn, 3}, ++seed);
      flat.append(k, v);
      paged.append(k.transpose(2, 3).contiguous().transpose(2, 3), v);  // any strides
    };
    auto same = [&] {
      EXPECT_EQ(paged.length(), flat.length());
      EXPECT_EQ(paged.keys().to_vector(), flat.keys().contiguous().to_vector());
      EXPECT_EQ(paged.values().to_vector(), flat.values().contiguous().to_vector());
      const Tensor pool = paged.key_pages();
      ASSERT_EQ(static_cast<int64_t>(paged.block_table().size()), paged.rows() * paged.max_pages());
      for (int32_t e : paged.block_table()) EXPECT_TRUE(e >= 0 && e < pool.size(0)) << e;
      const int64_t r = paged.rows() - 1, pos = paged.length() - 1;  // the last position of the last row
      const int32_t blk = paged.block_table()[static_cast<size_t>(r * paged.max_pages() + pos / page)];
      EXPECT_EQ(pool.select(0, blk).select(0, pos % page).to_vector(),
                flat.keys().select(0, r).select(1, pos).contiguous().to_vector());
    };
    append(2, 5);
    same();
    append(2, 1);
    same();
    if (page == 1) EXPECT_NE(paged.block_table()[1], paged.block_table()[0] + 1);  // rows take turns
    flat.reorder({1, 1, 0});
    paged.reorder({1, 1, 0});
    same();
    append(3, 7);
    same();
    flat.reorder({2});
    paged.reorder({2});
    append(1, 1);
    same();
  }
}

// A beam fork copies no page: forked rows share their source's pages, an append copies only a shared partly filled
// page (once per row that writes into it), and the pages of dropped rows go back to the pool and are reused.
TEST(KvCache, ForkedRowsSharePagesUntilTheyWrite) {
  KvCache c, flat;
  c.reset(1, 2, 3, 4, 4);  // one row, pages of 4 positions
  flat.reset(1, 2, 3, 4);
  uint64_t seed = 70;
  auto append = [&](int64_t rows, int64_t tn) {
    const Tensor k = qkv::testing::randn({rows, 2, tn, 3}, ++seed), v = qkv::testing::randn({rows, 2, tn, 3}, ++seed);
    c.append(k, v);
    flat.append(k, v);
  };
  append(1, 10);  // pages: 4 + 4 + 2 of 4
  EXPECT_EQ(c.pages_in_use(), 3);
  c.reorder({0, 0, 0});
  flat.reorder({0, 0, 0});
  EXPECT_EQ(c.pages_in_use(), 3);  // shared, not copied
  for (int64_t r = 1; r < 3; ++r)
    for (int64_t p = 0; p < 3; ++p)
      EXPECT_EQ(c.block_table()[static_cast<size_t>(r * c.max_pages() + p)], c.block_table()[static_cast<size_t>(p)]);
  append(3, 1);  // writes into the shared third page: two rows copy it, the last keeps it
  EXPECT_EQ(c.pages_in_use(), 5);
  EXPECT_EQ(c.keys().to_vector(), flat.keys().contiguous().to_vector());
  EXPECT_EQ(c.values().to_vector(), flat.values().contiguous().to_vector());
  append(3, 2);  // the third pages fill up, each row takes a fourth page of its own
  EXPECT_EQ(c.pages_in_use(), 8);
  c.reorder({2});
  flat.reorder({2});
  EXPECT_EQ(c.pages_in_use(), 4);  // the two shared first pages and row 2's own two
  append(1, 3);
  EXPECT_EQ(c.keys().to_vector(), flat.keys().contiguous().to_vector());
  EXPECT_EQ(c.values().to_vector(), flat.values().contiguous().to_vector());
  EXPECT_LE(c.key_pages().size(0), 8);  // freed pages were reused: the pool never outgrew the peak
}

TEST(KvCache, BadShapesAndRowsAreNamed) {
  KvCache c;
  EXPECT_TRUE(ThrowsArg([&] { c.append(Tensor::zeros({1, 1, 1, 1}), Tensor::zeros({1, 1, 1, 1})); },
                        "[KvCache] append before reset"));
  c.reset(2, 2, 4);
  EXPECT_TRUE(ThrowsArg([&] { c.append(Tensor::zeros({2, 2, 1, 3}), Tensor::zeros({2, 2, 1, 3})); },
                        "[KvCache] append k (2, 2, 1, 3)"));
  EXPECT_TRUE(ThrowsArg([&] { c.reorder({0, 2}); }, "[KvCache] reorder row 2"));
  EXPECT_TRUE(ThrowsArg([&] { c.reset(1, 0, 4); }, "[KvCache] reset"));
  EXPECT_TRUE(ThrowsArg([&] { c.reset(1, 2, 4, 16, -1); }, "[KvCache] reset(rows 1, heads 2, head_dim 4, capacity 16, page_size -1)"));
  EXPECT_TRUE(ThrowsArg([] { gather_rows(Tensor::zeros({2, 3}), {2}); }, "[gather_rows] row 2"));
}

// --- Transformers: cache == recomputation ---------------------------------------------------------------------------

models::TransformerSeq2SeqConfig s2s_config(bool norm_first, int64_t d = 32, int64_t layers = 2) {
  models::TransformerSeq2SeqConfig c{};  // aggregate init: see the note in rnn_decode_test.cpp
  c.src_vocab = 17;
  c.tgt_vocab = 19;
  c.transformer.layer.d_model = d;
  c.transformer.layer.nhead = 4;
  c.transformer.layer.dim_feedforward = 2 * d;
  c.transformer.layer.dropout = 0.1f;  // eval mode must switch it off
  c.transformer.layer.norm_first = norm_first;
  c.transformer.num_encoder_layers = layers;
  c.transformer.num_decoder_layers = layers;
  return c;
}

// Three sources of lengths 5, 3 and 1 (padded with 0).
Ids padded_sources() {
  return Ids{{4, 5, 6, 7, 8, 9, 10, 11, 0, 0, 12, 0, 0, 0, 0}, {3, 5}};
}

TEST(TransformerCache, GreedyAndBeamGiveExactlyTheTokensOfRecomputation) {
  for (bool norm_first : {false, true}) {
    Rng rng(norm_first ? 21 : 22);
    models::Seq2SeqTransformer model(s2s_config(norm_first), rng);
    const Ids src = padded_sources();
    CachedStep cached = cached_step(model, src, 0);
    TransformerRecomputeStep full(model, src, 0);
    const SearchOptions o{12, 1, 2};
    const auto gc = greedy_search(cached, o), gf = greedy_search(full, o);
    size_t generated = 0;
    for (size_t s = 0; s < gc.size(); ++s) {
      EXPECT_EQ(gc[s].tokens, gf[s].tokens) << "norm_first " << norm_first << " source " << s;
      EXPECT_NEAR(gc[s].log_prob, gf[s].log_prob, 1e-3);
      generated += gc[s].tokens.size();
    }
    EXPECT_GE(generated, 3 * gc.size()) << "the random model stops too early to exercise the cache";
    const BeamOptions b{3, LengthPenalty::kGnmt, 0.6};
    const auto bc = beam_search(cached, o, b), bf = beam_search(full, o, b);
    for (size_t s = 0; s < bc.size(); ++s) {
      ASSERT_EQ(bc[s].size(), bf[s].size());
      for (size_t k = 0; k < bc[s].size(); ++k) EXPECT_EQ(bc[s][k].tokens, bf[s][k].tokens);
    }
  }
}

TEST(TransformerCache, StepLogitsMatchRecomputationAtEveryPosition) {
  Rng rng(5);
  models::Seq2SeqTransformer model(s2s_config(false), rng);
  const Ids src = padded_sources();
  CachedStep cached = cached_step(model, src, 0);
  TransformerRecomputeStep full(model, src, 0);
  cached.start();
  full.start();
  // forced tokens, with a beam-like reorder at step 3 (rows forked and dropped)
  std::vector<int64_t> rows = {0, 1, 2}, toks = {1, 1, 1};
  for (int t = 0; t < 8; ++t) {
    if (t == 3) {
      rows = {2, 0, 0, 1};
      toks = {5, 6, 7, 8};
    } else if (t > 0) {
      rows.resize(toks.size());
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
    }
    const Tensor a = cached.step(rows, toks), b = full.step(rows, toks);
    ASSERT_TRUE(AllClose(a, b, kCacheVsRecompute)) << "step " << t;
    for (auto& x : toks) x = (x * 7 + t) % 19;
  }
}

TEST(TransformerCache, RecordsCrossAttentionRowsThatSumToOneOverRealTokens) {
  Rng rng(6);
  models::Seq2SeqTransformer model(s2s_config(true), rng);
  const Ids src = padded_sources();
  CachedStep cached = cached_step(model, src, 0);
  const auto att = forced_attention(cached, {{3, 4, 2}, {5, 2}, {2}}, 1);
  ASSERT_EQ(att.size(), 3u);
  EXPECT_EQ(att[0].shape(), (Shape{3, 5}));
  EXPECT_EQ(att[1].shape(), (Shape{2, 5}));
  EXPECT_EQ(att[2].shape(), (Shape{1, 5}));
  const auto a1 = att[1].to_vector();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(a1[r * 5] + a1[r * 5 + 1] + a1[r * 5 + 2], 1.0, 1e-5);
    EXPECT_EQ(a1[r * 5 + 3], 0.0f);  // padding gets no attention
  }
  EXPECT_TRUE(ThrowsArg([&] { forced_attention(cached, {{1}}, 1); }, "[forced_attention] got 1"));
}

models::DecoderOnlyConfig lm_config(bool norm_first) {
  models::DecoderOnlyConfig c{};
  c.vocab = 23;
  c.max_len = 40;
  c.num_layers = 2;
  c.layer.d_model = 32;
  c.layer.nhead = 4;
  c.layer.dim_feedforward = 64;
  c.layer.dropout = 0.1f;
  c.layer.norm_first = norm_first;
  return c;
}

TEST(DecoderOnlyCache, LeftPaddedPromptsGiveTheTokensOfPerRowRecomputation) {
  for (bool norm_first : {true, false}) {
    Rng rng(norm_first ? 31 : 32);
    models::DecoderOnlyTransformer model(lm_config(norm_first), rng);
    const std::vector<std::vector<int64_t>> prompts = {{5, 6, 7, 8, 9}, {10}, {}, {11, 12, 13}};
    CachedStep cached = cached_step(model, prompts);
    DecoderOnlyRecomputeStep full(model, prompts);
    EXPECT_EQ(cached.capacity(), 35);
    const SearchOptions o{10, 1, 2};
    const auto gc = greedy_search(cached, o), gf = greedy_search(full, o);
    size_t generated = 0;
    for (size_t s = 0; s < gc.size(); ++s) {
      EXPECT_EQ(gc[s].tokens, gf[s].tokens) << "source " << s;
      generated += gc[s].tokens.size();
    }
    EXPECT_GE(generated, 3 * gc.size()) << "the random model stops too early to exercise the cache";
    const auto bc = beam_search(cached, o, BeamOptions{3}), bf = beam_search(full, o, BeamOptions{3});
    for (size_t s = 0; s < bc.size(); ++s) {
      ASSERT_EQ(bc[s].size(), bf[s].size());
      for (size_t k = 0; k < bc[s].size(); ++k) EXPECT_EQ(bc[s][k].tokens, bf[s][k].tokens);
    }
    cached.start();
    full.start();
    std::vector<int64_t> rows = {0, 1, 2, 3}, toks = {1, 1, 1, 1};
    for (int t = 0; t < 5; ++t) {
      ASSERT_TRUE(AllClose(cached.step(rows, toks), full.step(rows, toks), kCacheVsRecompute)) << "step " << t;
      toks = {static_cast<int64_t>(3 + t), 4, 5, 6};
    }
  }
}

// forced_attention over the decoder-only model's cached step: each fed token's last-layer attention, heads averaged,
// over the prompt columns equals the full forward of its source alone, left padding at 0 (one prompt empty).
TEST(DecoderOnlyCache, ForcedAttentionIsTheFullForwardsLastLayerOverThePrompt) {
  Rng rng(33);
  models::DecoderOnlyTransformer model(lm_config(true), rng);
  const std::vector<std::vector<int64_t>> prompts = {{5, 6, 7}, {}, {10}};
  const std::vector<std::vector<int64_t>> tokens = {{3, 2}, {4, 4, 9}, {12}};
  CachedStep cached = cached_step(model, prompts);
  models::ForwardOptions o;
  o.output_attentions = true;
  o.attention_layers = {1};
  const auto last_layer = [&](const Ids& ids) { return model.forward(ids, o).attentions.back(); };
  const std::vector<Tensor> want = qkv::testing::prompt_attention_oracle(last_layer, prompts, tokens, 1);
  const std::vector<Tensor> got = forced_attention(cached, tokens, 1);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < got.size(); ++s) {
    ASSERT_EQ(got[s].shape(), (Shape{static_cast<int64_t>(tokens[s].size()), 3})) << s;
    EXPECT_TRUE(AllClose(got[s], want[s], kCacheVsRecompute)) << "source " << s;
  }
}

TEST(DecoderOnlyCache, CapacityStopsDecodingAtMaxLen) {
  Rng rng(3);
  models::DecoderOnlyConfig c = lm_config(true);
  c.max_len = 8;
  models::DecoderOnlyTransformer model(c, rng);
  CachedStep cached = cached_step(model, {{3, 4, 5}});
  const auto g = greedy_search(cached, SearchOptions{100, 1, 99 % 23});
  EXPECT_LE(g[0].tokens.size(), 5u);
  EXPECT_TRUE(ThrowsArg([&] { cached_step(model, {{1, 2, 3, 4, 5, 6, 7, 8}}); },
                        "[CachedStep] a prompt of 8 tokens"));
  EXPECT_TRUE(ThrowsArg([&] { cached_step(model, {{40}}); }, "[CachedStep] prompt token 40"));
  EXPECT_TRUE(ThrowsArg([&] { cached.start(); cached.step({0}, {23}); }, "[CachedStep] token 23"));
  EXPECT_TRUE(ThrowsArg([&] { cached.start(); cached.step({1}, {3}); }, "[CachedStep] row 1"));
  cached.start();
  for (int t = 0; t < 5; ++t) cached.step({0}, {3});  // positions 3 .. 7
  EXPECT_TRUE(ThrowsArg([&] { cached.step({0}, {3}); }, "[CachedStep] position 8 is past the model's context of 8"));
}

// row_bytes counts float32 K and V of every layer (d_model values each): the Seq2Seq decoder's self-attention over
// the steps and its cross-attention over the source, the decoder-only model's over the longest prompt and the steps.
// A beam search's max_bytes then refuses a limit that holds the candidate scores but only half the caches.
TEST(TransformerCache, RowBytesCountTheCachesAndBoundBeamSearch) {
  const auto fits = [](StepModel& m, int64_t sources, int64_t beams, int64_t max_len, int64_t cache_bytes) {
    BeamOptions b{beams, LengthPenalty::kNone, 0.0};
    b.max_bytes = sources * beams * (cache_bytes + m.vocab_size() * 64);  // 64 bytes a candidate: more than used
    return beam_search(m, SearchOptions{max_len, 1, 2}, b);
  };
  const auto check = [&](StepModel& m, int64_t sources, int64_t max_len) {
    const int64_t full = m.row_bytes(max_len);
    EXPECT_EQ(fits(m, sources, 2, max_len, full).size(), static_cast<size_t>(sources));
    EXPECT_TRUE(ThrowsArg([&] { fits(m, sources, 2, max_len, full / 2); }, "[beam_search] 2 beams x"));
    EXPECT_TRUE(ThrowsArg([&] { fits(m, sources, 2, max_len, full / 2); }, "(KV caches"));
  };
  Rng rng(8);
  models::Seq2SeqTransformer s2s(s2s_config(false), rng);  // 2 decoder layers, d_model 32
  CachedStep cached = cached_step(s2s, padded_sources(), 0);  // Ts = 5
  EXPECT_EQ(cached.row_bytes(10), 2 * 2 * 32 * (10 + 5) * 4);
  check(cached, 3, 12);
  models::DecoderOnlyTransformer lm(lm_config(true), rng);  // 2 layers, d_model 32
  CachedStep prompted = cached_step(lm, {{5, 6, 7}, {8}});     // longest prompt 3
  EXPECT_EQ(prompted.row_bytes(10), 2 * 2 * 32 * (3 + 10) * 4);
  check(prompted, 2, 10);
  EXPECT_EQ(kv_row_bytes(2, 32, 0), 0);
  EXPECT_EQ(kv_row_bytes(int64_t{1} << 20, int64_t{1} << 20, int64_t{1} << 30), std::numeric_limits<int64_t>::max());
}

// Measures the speed-up of the cache (printed; asserted loosely since the machine is shared).
TEST(TransformerCache, CachedDecodingIsFasterThanRecomputation) {
  Rng rng(8);
  models::TransformerSeq2SeqConfig c = s2s_config(true, 128, 2);
  models::Seq2SeqTransformer model(c, rng);
  Ids src{std::vector<int64_t>(4 * 16), {4, 16}};
  for (size_t i = 0; i < src.data.size(); ++i) src.data[i] = 3 + static_cast<int64_t>(i % 13);
  const int64_t steps = 64;  // forced full length (a search could stop early at a random EOS)
  auto time_it = [&](StepModel& m) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<int64_t> rows(4), toks(4, 1);
    for (int64_t i = 0; i < 4; ++i) rows[static_cast<size_t>(i)] = i;
    m.start();
    for (int64_t t = 0; t < steps; ++t) m.step(rows, toks);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  CachedStep cached = cached_step(model, src, 0);
  TransformerRecomputeStep full(model, src, 0);
  // One thread: the work ratio, not OpenMP barrier waits on a shared machine.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  time_it(cached);  // warm-up
  const double tc = time_it(cached), tf = time_it(full);
  omp_set_num_threads(threads);
  std::printf("[ speed    ] 1 thread, 4 rows x 64 tokens, d_model 128, 2 layers: cached %.1f ms, recompute %.1f ms, ratio %.1fx\n",
              tc * 1e3, tf * 1e3, tf / tc);
  RecordProperty("cache_speedup", std::to_string(tf / tc));
  EXPECT_GT(tf / tc, 1.5);
}

}  // namespace
}  // namespace qkv::decode
