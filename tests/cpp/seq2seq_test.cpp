// Seq2Seq with and without attention: shapes, parameter names, teacher forcing == step-by-step decoding,
// the no-attention decoder reading only the final encoder state, padding invariance, greedy decoding, errors.
#include "qkv/models/seq2seq.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ops_testing.h"
#include "qkv/decode/rnn_step.h"
#include "qkv/decode/search.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/embedding.h"
#include "qkv/ops/matmul.h"
#include "qkv/ops/shape_ops.h"

namespace qkv::models {
namespace {

using testing::AllClose;
using testing::ThrowsArg;
using testing::Tol;

// Whole-sequence GEMMs vs per-step GEMMs: same math, different BLAS blocking.
constexpr Tol kSameMath{1e-5, 1e-5};

constexpr int64_t kVs = 11, kVt = 13, kE = 6, kH = 8;

Seq2SeqConfig config(Seq2SeqAttention att, RnnCell cell = RnnCell::kGRU, int64_t layers = 1) {
  Seq2SeqConfig c;
  c.src_vocab = kVs;
  c.tgt_vocab = kVt;
  c.embed_dim = kE;
  c.hidden_size = kH;
  c.num_layers = layers;
  c.cell = cell;
  c.attention = att;
  return c;
}

Ids random_ids(int64_t nb, int64_t nt, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  Ids ids{{}, {nb, nt}};
  for (int64_t i = 0; i < nb * nt; ++i) ids.data.push_back(static_cast<int64_t>(rng.below(vocab)));
  return ids;
}

const Seq2SeqAttention kAllAttention[] = {Seq2SeqAttention::kNone, Seq2SeqAttention::kBahdanau,
                                         Seq2SeqAttention::kLuongDot, Seq2SeqAttention::kLuongGeneral};
const RnnCell kAllCells[] = {RnnCell::kGRU, RnnCell::kLSTM};

std::string name(Seq2SeqAttention a, RnnCell c) {
  const char* an[] = {"none", "bahdanau", "luong_dot", "luong_general"};
  return std::string(an[static_cast<int>(a)]) + (c == RnnCell::kGRU ? "/gru" : "/lstm");
}

TEST(Seq2Seq, LogitsAndAlignmentShapes) {
  const Ids src = random_ids(2, 5, kVs, 1), tgt = random_ids(2, 4, kVt, 2);
  for (Seq2SeqAttention a : kAllAttention)
    for (RnnCell c : kAllCells) {
      Rng rng(3);
      Seq2Seq m(config(a, c, 2), rng);
      const Seq2SeqOutput out = m.forward(src, {5, 3}, tgt);
      EXPECT_EQ(out.logits.shape(), (Shape{2, 4, kVt})) << name(a, c);
      if (a == Seq2SeqAttention::kNone) {
        EXPECT_FALSE(out.alignments.defined()) << name(a, c);
      } else {
        EXPECT_EQ(out.alignments.shape(), (Shape{2, 4, 5})) << name(a, c);
      }
    }
}

TEST(Seq2Seq, TeacherForcingEqualsStepByStepDecoding) {
  const Ids src = random_ids(3, 5, kVs, 4), tgt = random_ids(3, 4, kVt, 5);
  const std::vector<int64_t> lengths{5, 2, 4};
  for (Seq2SeqAttention a : kAllAttention)
    for (RnnCell c : kAllCells) {
      Rng rng(6);
      Seq2Seq m(config(a, c, 2), rng);
      const Seq2SeqEncoded enc = m.encode(src, lengths);
      const Seq2SeqOutput full = m.decode(enc, tgt);
      Seq2SeqState s = m.initial_state(enc);
      for (int64_t t = 0; t < 4; ++t) {
        std::vector<int64_t> prev;
        for (int64_t b = 0; b < 3; ++b) prev.push_back(tgt.data[b * 4 + t]);
        const Seq2SeqStep st = m.decode_step(enc, s, prev);
        EXPECT_TRUE(AllClose(full.logits.select(1, t), st.logits.contiguous(), kSameMath)) << name(a, c) << " t=" << t;
        if (st.weights.defined())
          EXPECT_TRUE(AllClose(full.alignments.select(1, t), st.weights.contiguous(), kSameMath)) << name(a, c);
        s = st.state;
      }
    }
}

// The first decoder step rebuilt from public building blocks (cell, scorer, linear) per the documented formulas:
// this pins which state feeds the attention and what is concatenated in which order.
TEST(Seq2Seq, FirstStepRestatesTheDocumentedFormulas) {
  const Ids src = random_ids(2, 5, kVs, 30);
  const std::vector<int64_t> bos{1, 1};
  for (Seq2SeqAttention a : kAllAttention) {
    Rng rng(31);
    Seq2Seq m(config(a), rng);
    const nn::StateDict sd = m.state_dict();
    auto p = [&](const std::string& n) { return sd.at(n); };
    const Seq2SeqEncoded enc = m.encode(src, {5, 3});
    const Tensor h0 = enc.h_n.select(0, 0);
    const Tensor emb = embedding(p("tgt_embed.weight"), Ids{bos, {2}});
    auto cell = [&](const Tensor& x) {
      return nn::gru_cell(x, h0, p("decoder.weight_ih_l0"), p("decoder.weight_hh_l0"), p("decoder.bias_ih_l0"),
                          p("decoder.bias_hh_l0")).h;
    };
    Tensor logits, weights;
    if (a == Seq2SeqAttention::kNone) {
      logits = linear(cell(concat({emb, h0}, -1)), p("out.weight"), p("out.bias"));  // x = [emb; h_T]
    } else if (a == Seq2SeqAttention::kBahdanau) {
      const nn::AlignmentResult al = m.attention()->attend(h0, enc.states, enc.keep_mask);  // α from s_{t-1}
      const Tensor s1 = cell(concat({emb, al.context}, -1));
      logits = linear(concat({s1, al.context}, -1), p("out.weight"), p("out.bias"));
      weights = al.weights;
    } else {
      const Tensor s1 = cell(emb);
      const nn::AlignmentResult al = m.attention()->attend(s1, enc.states, enc.keep_mask);  // α from s_t
      const Tensor ht = tanh(linear(concat({al.context, s1}, -1), p("attn_combine.weight")));
      logits = linear(ht, p("out.weight"), p("out.bias"));
      weights = al.weights;
    }
    const Seq2SeqStep st = m.decode_step(enc, m.initial_state(enc), bos);
    EXPECT_TRUE(AllClose(st.logits, logits, kSameMath)) << name(a, RnnCell::kGRU);
    if (weights.defined()) EXPECT_TRUE(AllClose(st.weights, weights, kSameMath)) << name(a, RnnCell::kGRU);
  }
}

// Overwrite every encoder output except the final one with noise, then decode again.
Tensor scramble_all_but_last(const Tensor& states) {
  Tensor s = states.clone();
  const int64_t ts = s.size(1);
  s.slice(1, 0, ts - 1).copy_from(testing::randn({s.size(0), ts - 1, s.size(2)}, 99, 5.0f));
  return s;
}

TEST(Seq2Seq, NoAttentionDecoderReadsOnlyTheFinalEncoderState) {
  const Ids src = random_ids(2, 6, kVs, 7), tgt = random_ids(2, 5, kVt, 8);
  for (RnnCell c : kAllCells) {
    Rng rng(9);
    Seq2Seq m(config(Seq2SeqAttention::kNone, c, 2), rng);
    Seq2SeqEncoded enc = m.encode(src);
    const Seq2SeqOutput base = m.decode(enc, tgt);
    // Every earlier encoder state replaced: bit-identical logits (it is never read).
    enc.states = scramble_all_but_last(enc.states);
    EXPECT_TRUE(AllClose(m.decode(enc, tgt).logits, base.logits, testing::kExact)) << name(Seq2SeqAttention::kNone, c);
    // Even the last output is not read separately: the decoder's only channel is (h_n, c_n).
    enc.states = Tensor::zeros(enc.states.shape());
    EXPECT_TRUE(AllClose(m.decode(enc, tgt).logits, base.logits, testing::kExact));
    // ... and that channel matters.
    Seq2SeqEncoded moved = m.encode(src);
    moved.h_n = moved.h_n.clone();
    moved.h_n.select(0, 1).fill(0.5f);
    EXPECT_FALSE(AllClose(m.decode(moved, tgt).logits, base.logits, kSameMath));
  }
}

TEST(Seq2Seq, AttentionDecoderReadsEveryEncoderState) {
  const Ids src = random_ids(2, 6, kVs, 10), tgt = random_ids(2, 5, kVt, 11);
  for (Seq2SeqAttention a : {Seq2SeqAttention::kBahdanau, Seq2SeqAttention::kLuongDot,
                             Seq2SeqAttention::kLuongGeneral}) {
    Rng rng(12);
    Seq2Seq m(config(a), rng);
    Seq2SeqEncoded enc = m.encode(src);
    const Seq2SeqOutput base = m.decode(enc, tgt);
    enc.states = scramble_all_but_last(enc.states);
    ASSERT_NE(m.attention(), nullptr);
    enc.prepared = m.attention()->prepare(enc.states);  // the cache follows the states
    EXPECT_FALSE(AllClose(m.decode(enc, tgt).logits, base.logits, kSameMath)) << name(a, RnnCell::kGRU);
  }
}

TEST(Seq2Seq, AlignmentsSumToOneOverRealSourceTokensAndZeroOnPadding) {
  const Ids src = random_ids(3, 6, kVs, 13), tgt = random_ids(3, 4, kVt, 14);
  const std::vector<int64_t> lengths{6, 1, 3};
  for (Seq2SeqAttention a : {Seq2SeqAttention::kBahdanau, Seq2SeqAttention::kLuongDot,
                             Seq2SeqAttention::kLuongGeneral}) {
    Rng rng(15);
    Seq2Seq m(config(a, RnnCell::kLSTM), rng);
    const std::vector<float> w = m.forward(src, lengths, tgt).alignments.to_vector();  // (3, 4, 6)
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t t = 0; t < 4; ++t) {
        double sum = 0;
        for (int64_t i = 0; i < 6; ++i) {
          const float wi = w[(b * 4 + t) * 6 + i];
          if (i >= lengths[b]) EXPECT_EQ(wi, 0.0f);
          sum += wi;
        }
        EXPECT_NEAR(sum, 1.0, 1e-6);
      }
  }
}

TEST(Seq2Seq, PaddedSourceTokensDoNotChangeTheOutput) {
  const Ids tgt = random_ids(2, 3, kVt, 16);
  Ids src = random_ids(2, 5, kVs, 17);
  const std::vector<int64_t> lengths{5, 2};
  for (Seq2SeqAttention a : kAllAttention) {
    Rng rng(18);
    Seq2Seq m(config(a, RnnCell::kGRU, 2), rng);
    const Seq2SeqOutput base = m.forward(src, lengths, tgt);
    Ids other = src;
    for (int64_t t = 2; t < 5; ++t) other.data[5 + t] = (other.data[5 + t] + 1) % kVs;
    const Seq2SeqOutput again = m.forward(other, lengths, tgt);
    EXPECT_TRUE(AllClose(again.logits, base.logits, testing::kExact)) << name(a, RnnCell::kGRU);
  }
}

TEST(Seq2Seq, ParameterNamesPerVariant) {
  auto names = [](Seq2SeqAttention a) {
    Rng rng(19);
    Seq2Seq m(config(a), rng);
    std::vector<std::string> out;
    for (auto& [n, p] : m.named_parameters()) out.push_back(n + str(p->shape()));
    return out;
  };
  const std::vector<std::string> common{
      "src_embed.weight(11, 6)",      "tgt_embed.weight(13, 6)",      "encoder.weight_ih_l0(24, 6)",
      "encoder.weight_hh_l0(24, 8)",  "encoder.bias_ih_l0(24,)",       "encoder.bias_hh_l0(24,)"};
  auto with = [&](std::vector<std::string> tail) {
    std::vector<std::string> v = common;
    v.insert(v.end(), tail.begin(), tail.end());
    return v;
  };
  EXPECT_EQ(names(Seq2SeqAttention::kNone),
            with({"decoder.weight_ih_l0(24, 14)", "decoder.weight_hh_l0(24, 8)", "decoder.bias_ih_l0(24,)",
                  "decoder.bias_hh_l0(24,)", "out.weight(13, 8)", "out.bias(13,)"}));
  EXPECT_EQ(names(Seq2SeqAttention::kBahdanau),
            with({"decoder.weight_ih_l0(24, 14)", "decoder.weight_hh_l0(24, 8)", "decoder.bias_ih_l0(24,)",
                  "decoder.bias_hh_l0(24,)", "attention.W.weight(8, 8)", "attention.U.weight(8, 8)",
                  "attention.v.weight(1, 8)", "out.weight(13, 16)", "out.bias(13,)"}));
  EXPECT_EQ(names(Seq2SeqAttention::kLuongDot),
            with({"decoder.weight_ih_l0(24, 6)", "decoder.weight_hh_l0(24, 8)", "decoder.bias_ih_l0(24,)",
                  "decoder.bias_hh_l0(24,)", "attn_combine.weight(8, 16)", "out.weight(13, 8)", "out.bias(13,)"}));
  EXPECT_EQ(names(Seq2SeqAttention::kLuongGeneral),
            with({"decoder.weight_ih_l0(24, 6)", "decoder.weight_hh_l0(24, 8)", "decoder.bias_ih_l0(24,)",
                  "decoder.bias_hh_l0(24,)", "attention.W.weight(8, 8)", "attn_combine.weight(8, 16)",
                  "out.weight(13, 8)", "out.bias(13,)"}));
}

TEST(Seq2Seq, NoAttentionWithoutFedContextHasPlainDecoderInput) {
  Seq2SeqConfig c = config(Seq2SeqAttention::kNone);
  c.feed_context = false;
  Rng rng(20);
  Seq2Seq m(c, rng);
  EXPECT_EQ(m.state_dict().at("decoder.weight_ih_l0").shape(), (Shape{24, kE}));
  EXPECT_EQ(m.forward(random_ids(1, 3, kVs, 21), {}, random_ids(1, 2, kVt, 22)).logits.shape(),
            (Shape{1, 2, kVt}));
}

// Greedy decoding goes through decode::RnnStep and decode::greedy_search; the alignments of its tokens are
// decode::forced_attention's.
struct Greedy {
  std::vector<std::vector<int64_t>> tokens;  // per source, up to and including eos
  std::vector<Tensor> alignments;            // per source (|tokens|, Ts); undefined for kNone
};

Greedy greedy(const Seq2Seq& m, const Ids& src, const std::vector<int64_t>& lengths, int64_t max_len, int64_t bos,
              int64_t eos) {
  decode::RnnStep step(m, src, lengths);
  Greedy g;
  for (const decode::Hypothesis& h : decode::greedy_search(step, decode::SearchOptions{max_len, bos, eos}))
    g.tokens.push_back(h.tokens);
  g.alignments = decode::forced_attention(step, g.tokens, bos);
  return g;
}

TEST(Seq2Seq, GreedyDecodeIsDeterministicAndAgreesWithTeacherForcing) {
  const Ids src = random_ids(2, 5, kVs, 23);
  const std::vector<int64_t> lengths{5, 3};
  const int64_t bos = 1, eos = 2, max_len = 6;
  for (Seq2SeqAttention a : kAllAttention) {
    Rng r1(24), r2(24);
    Seq2Seq m1(config(a), r1), m2(config(a), r2);
    const Greedy d1 = greedy(m1, src, lengths, max_len, bos, eos);
    const Greedy d2 = greedy(m2, src, lengths, max_len, bos, eos);
    EXPECT_EQ(d1.tokens, d2.tokens) << name(a, RnnCell::kGRU);
    int64_t n = 0;
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t len = static_cast<int64_t>(d1.tokens[b].size());
      ASSERT_GE(len, 1);
      ASSERT_LE(len, max_len);
      n = std::max(n, len);
      if (a != Seq2SeqAttention::kNone) {
        ASSERT_EQ(d1.alignments[b].shape(), (Shape{len, 5}));
        EXPECT_TRUE(AllClose(d1.alignments[b], d2.alignments[b], testing::kExact));
      } else {
        EXPECT_FALSE(d1.alignments[b].defined());
      }
    }
    // Teacher forcing on [bos, y_0 .. y_{n-2}] has argmax y_t at every step up to each row's eos.
    Ids tgt_in{{}, {2, n}};
    for (int64_t b = 0; b < 2; ++b) {
      const std::vector<int64_t>& y = d1.tokens[b];
      tgt_in.data.push_back(bos);
      for (int64_t t = 0; t + 1 < n; ++t) tgt_in.data.push_back(t < static_cast<int64_t>(y.size()) ? y[t] : eos);
    }
    const Tensor logits = m1.forward(src, lengths, tgt_in).logits.contiguous();
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < static_cast<int64_t>(d1.tokens[b].size()); ++t) {
        const float* row = logits.data() + (b * n + t) * kVt;
        EXPECT_EQ(std::max_element(row, row + kVt) - row, d1.tokens[b][t]) << name(a, RnnCell::kGRU);
      }
  }
}

TEST(Seq2Seq, GreedyDecodeStopsAtEos) {
  Rng rng(25);
  Seq2Seq m(config(Seq2SeqAttention::kBahdanau, RnnCell::kLSTM), rng);
  nn::StateDict sd = m.state_dict();
  sd.at("out.bias").fill(0.0f);
  sd.at("out.bias").at({3}) = 1e4f;  // eos = 3 wins every step
  m.load_state_dict(sd);
  const Greedy d = greedy(m, random_ids(2, 4, kVs, 26), {}, 10, 0, 3);
  EXPECT_EQ(d.tokens, (std::vector<std::vector<int64_t>>{{3}, {3}}));
  for (const Tensor& al : d.alignments) EXPECT_EQ(al.shape(), (Shape{1, 4}));
}

TEST(Seq2Seq, BadInputsThrowNamingSeq2Seq) {
  Rng rng(27);
  Seq2SeqConfig bad = config(Seq2SeqAttention::kNone);
  bad.hidden_size = 0;
  EXPECT_TRUE(ThrowsArg([&] { Seq2Seq m(bad, rng); }, "[Seq2Seq] config"));
  bad = config(Seq2SeqAttention::kNone);
  bad.num_layers = 0;
  EXPECT_TRUE(ThrowsArg([&] { Seq2Seq m(bad, rng); }, "[Seq2Seq] config"));
  bad = config(Seq2SeqAttention::kBahdanau);
  bad.attention_size = -1;
  EXPECT_TRUE(ThrowsArg([&] { Seq2Seq m(bad, rng); }, "[Seq2Seq] attention_size"));

  Seq2Seq m(config(Seq2SeqAttention::kLuongDot), rng);
  const Ids src = random_ids(2, 4, kVs, 28), tgt = random_ids(2, 3, kVt, 29);
  EXPECT_TRUE(ThrowsArg([&] { m.forward(Ids{{1, 2, 3}, {3}}, {}, tgt); }, "[Seq2Seq] src"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(Ids{{1, 2, 3}, {2, 2}}, {}, tgt); }, "[Seq2Seq] src ids hold 3"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(Ids{{}, {2, 0}}, {}, tgt); }, "[Seq2Seq] src"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(src, {}, random_ids(3, 3, kVt, 1)); }, "[Seq2Seq]"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(src, {4}, tgt); }, "[Seq2Seq] src_lengths"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(src, {4, 5}, tgt); }, "[Seq2Seq] src length 5"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(src, {}, Ids{{}, {2, 0}}); }, "[Seq2Seq] tgt_in"));
  decode::RnnStep step(m, src);
  EXPECT_TRUE(ThrowsArg([&] { decode::greedy_search(step, {0, 1, 2}); }, "[greedy_search] max_len"));
  EXPECT_TRUE(ThrowsArg([&] { decode::greedy_search(step, {5, kVt, 2}); }, "[greedy_search] bos"));
  EXPECT_TRUE(ThrowsArg([&] { decode::greedy_search(step, {5, 1, kVt}); }, "[greedy_search] eos"));
  const Seq2SeqEncoded enc = m.encode(src);
  EXPECT_TRUE(ThrowsArg([&] { m.decode_step(enc, m.initial_state(enc), {1}); }, "[Seq2Seq] decoder state"));
  EXPECT_TRUE(ThrowsArg([&] { m.initial_state(Seq2SeqEncoded{}); }, "[Seq2Seq] encoded h_n"));
}

}  // namespace
}  // namespace qkv::models
