// LlamaForCausalLM with HF's attention_mask (B, T_keys): a padded row (left padding, as generation pads, and right
// padding) gives at its tokens the logits, attention probabilities and hidden states it has alone, also through the
// KV cache (contiguous and paged) for the next step, also at per-row positions (transformers' position_ids); a row of
// zeros gives finite outputs; a mask of ones is no mask.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops_testing.h"
#include "qkv/models/llama.h"
#include "qkv/nn/context.h"
#include "qkv/nn/kv_cache.h"
#include "qkv/ops/functional.h"
#include "qkv/train/loss.h"
#include "tiny_llama.h"

namespace qkv::models {
namespace {

using qkv::testing::AllClose;
using qkv::testing::Tol;

// A left-padded row's tokens sit at shifted positions: rotary angles rounded differently, nothing else.
const Tol kPaddedTol{1e-5, 1e-5};
constexpr int64_t kPad = 0;  // any id: padded positions never reach a token's output

ForwardOptions everything() {
  ForwardOptions o;
  o.output_attentions = o.output_hidden_states = true;
  return o;
}

// Two prompts of lengths 9 and 5 in one (2, 9) batch, the short one padded on the left or the right.
struct Padded {
  Ids ids, mask;
  int64_t first = 0;  // where the short row's tokens start
};

const std::vector<int64_t> kLong = {3, 7, 1, 19, 4, 4, 11, 2, 9};
const std::vector<int64_t> kShort = {5, 2, 8, 13, 6};

Padded padded(bool left) {
  Padded p;
  const int64_t t = 9, n = 5, pads = t - n;
  p.first = left ? pads : 0;
  p.ids.shape = p.mask.shape = {2, t};
  p.ids.data = kLong;
  p.mask.data.assign(t, 1);
  for (int64_t j = 0; j < t; ++j) {
    const bool token = j >= p.first && j < p.first + n;
    p.ids.data.push_back(token ? kShort[static_cast<size_t>(j - p.first)] : kPad);
    p.mask.data.push_back(token ? 1 : 0);
  }
  return p;
}

Ids one_row(const std::vector<int64_t>& ids) { return Ids{ids, {1, static_cast<int64_t>(ids.size())}}; }

// x (B, ...) row b, positions [from, from + n) of axis `axis` (1 for (B, T, E), 2 for (B, H, T, T)).
Tensor rows(const Tensor& x, int64_t b, int64_t axis, int64_t from, int64_t n) {
  return x.slice(0, b, b + 1).slice(axis, from, from + n);
}

bool all_finite(const Tensor& x) {
  const Tensor c = x.contiguous();
  for (int64_t i = 0; i < c.numel(); ++i)
    if (!std::isfinite(c.data()[i])) return false;
  return true;
}

// Every entry of `got` (one row of the batch, at its tokens) against the row alone.
void expect_row_alone(const CausalLMOutput& got, int64_t b, int64_t first, const CausalLMOutput& alone,
                      const char* what) {
  const int64_t n = alone.logits.size(1);
  EXPECT_TRUE(AllClose(rows(got.logits, b, 1, first, n), alone.logits, kPaddedTol)) << what;
  ASSERT_EQ(got.hidden_states.size(), alone.hidden_states.size());
  for (size_t l = 0; l < alone.hidden_states.size(); ++l)
    EXPECT_TRUE(AllClose(rows(got.hidden_states[l], b, 1, first, n), alone.hidden_states[l], kPaddedTol))
        << what << " hidden state " << l;
  if (alone.attentions.empty()) return;
  ASSERT_EQ(got.attentions.size(), alone.attentions.size());
  for (size_t l = 0; l < alone.attentions.size(); ++l) {
    const Tensor p = rows(got.attentions[l], b, 2, first, n);  // (1, H, n, T_keys)
    EXPECT_TRUE(AllClose(p.slice(3, first, first + n), alone.attentions[l], kPaddedTol)) << what << " layer " << l;
    // the padded keys get nothing
    const Tensor pc = p.contiguous();
    const int64_t keys = pc.size(3);
    for (int64_t i = 0; i < pc.numel(); ++i) {
      const int64_t j = i % keys;
      if (j < first || j >= first + n) EXPECT_EQ(pc.data()[i], 0.0f) << what << " layer " << l << " key " << j;
    }
  }
}

TEST(LlamaMask, LeftAndRightPaddedRowsGiveWhatEachRowGivesAlone) {
  for (bool gemma : {false, true})  // gemma: a window of 3 on layer 0, soft-caps, GQA 4/2
    for (bool left : {true, false}) {
      Rng rng(7);
      const LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(gemma), rng);
      const Padded p = padded(left);
      const CausalLMOutput out = model.forward(p.ids, everything(), nullptr, p.mask);
      const char* what = left ? "left" : "right";
      expect_row_alone(out, 0, 0, model.forward(one_row(kLong), everything()), what);
      expect_row_alone(out, 1, p.first, model.forward(one_row(kShort), everything()), what);
      EXPECT_TRUE(all_finite(out.logits)) << what;  // the padded queries too
      for (const Tensor& h : out.hidden_states) EXPECT_TRUE(all_finite(h)) << what;
      // the training forward (no recording) takes the same mask: the same logits
      const Tensor logits = model.forward(nn::Context(), p.ids, nullptr, 0, nullptr, p.mask).value;
      EXPECT_TRUE(AllClose(logits, out.logits, Tol{0.0, 0.0})) << what;
      // logits_to_keep 1: the last row only, the same numbers
      const Tensor last = model.forward(nn::Context(), p.ids, nullptr, 1, nullptr, p.mask).value;
      EXPECT_TRUE(AllClose(last, out.logits.slice(1, 8, 9), Tol{1e-6, 1e-6})) << what;
    }
}

TEST(LlamaMask, LeftPaddedPrefillThenStepsThroughTheCacheMatchTheRowAlone) {
  for (bool gemma : {false, true})
    for (int64_t page : {0, 3}) {
      Rng rng(11);
      const LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(gemma), rng);
      const Padded p = padded(true);
      std::vector<nn::KvCache> caches = model.new_caches(2, 4, page);
      model.forward(p.ids, ForwardOptions(), &caches, p.mask);
      std::vector<nn::KvCache> alone = model.new_caches(1, 4, page);
      model.forward(one_row(kShort), ForwardOptions(), &alone);
      Ids mask = p.mask;
      for (int64_t next : {17, 4, 21}) {  // each step's mask covers every cached key and the new one
        std::vector<int64_t> m;
        for (int64_t b = 0; b < 2; ++b) {
          m.insert(m.end(), mask.data.begin() + b * mask.shape[1], mask.data.begin() + (b + 1) * mask.shape[1]);
          m.push_back(1);
        }
        mask = Ids{m, {2, mask.shape[1] + 1}};
        const CausalLMOutput step = model.forward(Ids{{next, next}, {2, 1}}, everything(), &caches, mask);
        const CausalLMOutput one = model.forward(one_row({next}), everything(), &alone);
        expect_row_alone(step, 1, 0, CausalLMOutput{one.logits, {}, one.hidden_states}, "step");
        for (size_t l = 0; l < 2; ++l) {
          const Tensor keys = step.attentions[l].slice(0, 1, 2).slice(3, p.first, mask.shape[1]);
          EXPECT_TRUE(AllClose(keys, one.attentions[l], kPaddedTol)) << "gemma " << gemma << " page " << page;
        }
      }
    }
}

// transformers' generate: position_ids = cumsum(mask) - 1 per row, the padding at 1 (its positions are never seen).
std::vector<int64_t> positions_of(const Ids& mask) {
  std::vector<int64_t> p;
  const int64_t t = mask.shape[1];
  for (int64_t b = 0; b < mask.shape[0]; ++b) {
    int64_t n = 0;
    for (int64_t j = 0; j < t; ++j) {
      n += mask.data[static_cast<size_t>(b * t + j)] != 0 ? 1 : 0;
      p.push_back(mask.data[static_cast<size_t>(b * t + j)] != 0 ? n - 1 : 1);
    }
  }
  return p;
}

TEST(LlamaMask, LeftPaddedRowsAtTheirOwnPositionsGiveTheRowAloneThroughTheCache) {
  for (bool gemma : {false, true})
    for (int64_t page : {0, 3}) {
      Rng rng(13);
      const LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(gemma), rng);
      const Padded p = padded(true);
      std::vector<int64_t> positions = positions_of(p.mask);  // (2, 9): 0 .. 8 and 1 1 1 1 0 .. 4
      std::vector<nn::KvCache> caches = model.new_caches(2, 4, page);
      const CausalLMOutput prefill = model.forward(p.ids, everything(), &caches, p.mask, &positions);
      std::vector<nn::KvCache> alone_long = model.new_caches(1, 4, page), alone_short = model.new_caches(1, 4, page);
      expect_row_alone(prefill, 0, 0, model.forward(one_row(kLong), everything(), &alone_long), "prefill long");
      expect_row_alone(prefill, 1, p.first, model.forward(one_row(kShort), everything(), &alone_short), "prefill");
      // the training forward takes the same positions: the same logits
      std::vector<nn::KvCache> again = model.new_caches(2, 4, page);
      EXPECT_TRUE(AllClose(model.forward(nn::Context(), p.ids, &again, 0, &positions, p.mask).value, prefill.logits,
                           Tol{0.0, 0.0}));
      Ids mask = p.mask;
      std::vector<int64_t> next = {9, 5};  // each row's next position: its count of tokens
      for (int64_t token : {17, 4, 21}) {
        std::vector<int64_t> m;
        for (int64_t b = 0; b < 2; ++b) {
          m.insert(m.end(), mask.data.begin() + b * mask.shape[1], mask.data.begin() + (b + 1) * mask.shape[1]);
          m.push_back(1);
        }
        mask = Ids{m, {2, mask.shape[1] + 1}};
        positions = next;
        const CausalLMOutput step = model.forward(Ids{{token, token}, {2, 1}}, everything(), &caches, mask, &positions);
        const CausalLMOutput one = model.forward(one_row({token}), everything(), &alone_short);
        const CausalLMOutput one_long = model.forward(one_row({token}), everything(), &alone_long);
        const std::string what = "gemma " + std::to_string(gemma) + " page " + std::to_string(page);
        expect_row_alone(step, 0, 0, CausalLMOutput{one_long.logits, {}, one_long.hidden_states}, what.c_str());
        for (size_t l = 0; l < 2; ++l)
          EXPECT_TRUE(AllClose(step.attentions[l].slice(0, 0, 1), one_long.attentions[l], kPaddedTol)) << what;
        expect_row_alone(step, 1, 0, CausalLMOutput{one.logits, {}, one.hidden_states}, what.c_str());
        for (size_t l = 0; l < 2; ++l) {
          const Tensor keys = step.attentions[l].slice(0, 1, 2).slice(3, p.first, mask.shape[1]);
          EXPECT_TRUE(AllClose(keys, one.attentions[l], kPaddedTol)) << what << " layer " << l;
        }
        for (int64_t& n : next) ++n;
      }
    }
}

TEST(LlamaMask, PerRowPositionsOnATapeGiveTheInferenceLogitsAndGradients) {
  Rng rng(8);
  LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(true), rng);
  const Padded p = padded(true);
  const std::vector<int64_t> positions = positions_of(p.mask);
  const Tensor want = model.forward(nn::Context(), p.ids, nullptr, 0, &positions, p.mask).value;
  ad::ParameterSet params(model);
  ad::Tape tape;
  const nn::Context ctx(tape, params);
  const ad::Var logits = model.forward(ctx, p.ids, nullptr, 0, &positions, p.mask);
  EXPECT_TRUE(AllClose(logits.value, want, Tol{1e-6, 1e-6}));
  tape.backward(train::cross_entropy(ad::reshape(logits, {18, logits.size(2)}), std::vector<int64_t>(18, 3)));
  const ad::Parameter* k = params.find("model.layers.0.self_attn.k_proj.weight");
  ASSERT_TRUE(k != nullptr && k->has_grad);
  EXPECT_TRUE(all_finite(k->grad));
  double norm = 0.0;
  for (int64_t i = 0; i < k->grad.numel(); ++i) norm += std::fabs(k->grad.data()[i]);
  EXPECT_GT(norm, 0.0);
}

TEST(LlamaMask, SharedPositionsThroughTheCacheAreTheDefaultAndOtherCountsThrow) {
  using qkv::testing::ThrowsArg;
  Rng rng(5);
  const LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(false), rng);
  const Padded p = padded(false);
  std::vector<nn::KvCache> a = model.new_caches(2), b = model.new_caches(2);
  std::vector<int64_t> shared = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_TRUE(AllClose(model.forward(p.ids, ForwardOptions(), &a, {}, &shared).logits,
                       model.forward(p.ids, ForwardOptions(), &b).logits, Tol{0.0, 0.0}));
  shared = {9};
  EXPECT_TRUE(AllClose(model.forward(Ids{{3, 4}, {2, 1}}, ForwardOptions(), &a, {}, &shared).logits,
                       model.forward(Ids{{3, 4}, {2, 1}}, ForwardOptions(), &b).logits, Tol{0.0, 0.0}));
  const std::vector<int64_t> three = {0, 1, 2};
  EXPECT_TRUE(ThrowsArg([&] { model.forward(p.ids, ForwardOptions(), nullptr, {}, &three); },
                        "[llama] 3 positions for ids (2, 9) (T shared by the rows, or B*T: one set per row)"));
  const std::vector<int64_t> negative(18, -1);
  EXPECT_THROW(model.forward(p.ids, ForwardOptions(), nullptr, {}, &negative), std::invalid_argument);
}

TEST(LlamaMask, RowOfZerosIsFiniteAndLeavesTheOtherRowAlone) {
  Rng rng(2);
  const LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(true), rng);
  Padded p = padded(true);
  std::fill(p.mask.data.begin() + 9, p.mask.data.end(), 0);  // row 1: every key masked
  const CausalLMOutput out = model.forward(p.ids, everything(), nullptr, p.mask);
  EXPECT_TRUE(all_finite(out.logits));
  for (const Tensor& h : out.hidden_states) EXPECT_TRUE(all_finite(h));
  for (const Tensor& a : out.attentions) {  // qkv::attention's fully masked rule: probabilities 0
    const Tensor r = a.slice(0, 1, 2).contiguous();
    for (int64_t i = 0; i < r.numel(); ++i) ASSERT_EQ(r.data()[i], 0.0f) << i;
  }
  expect_row_alone(out, 0, 0, model.forward(one_row(kLong), everything()), "zeros");
}

TEST(LlamaMask, MaskOfOnesIsNoMask) {
  Rng rng(4);
  const LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(false), rng);
  const Padded p = padded(true);
  Ids ones = p.mask;
  std::fill(ones.data.begin(), ones.data.end(), 3);  // any nonzero value counts as 1
  const CausalLMOutput a = model.forward(p.ids, everything(), nullptr, ones);
  const CausalLMOutput b = model.forward(p.ids, everything());
  EXPECT_TRUE(AllClose(a.logits, b.logits, Tol{0.0, 0.0}));
  EXPECT_TRUE(AllClose(a.attentions[1], b.attentions[1], Tol{0.0, 0.0}));
}

TEST(LlamaMask, MaskOfTheWrongShapeThrows) {
  using qkv::testing::ThrowsArg;
  Rng rng(4);
  const LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(false), rng);
  const Padded p = padded(true);
  const char* needle = "[llama] attention_mask";
  EXPECT_TRUE(ThrowsArg([&] { model.forward(p.ids, everything(), nullptr, Ids{{1, 1, 1}, {1, 3}}); }, needle));
  EXPECT_TRUE(ThrowsArg([&] { model.forward(p.ids, everything(), nullptr, Ids{{1, 1}, {2, 9}}); }, needle));
  EXPECT_TRUE(ThrowsArg([&] { model.forward(nn::Context(), p.ids, nullptr, 0, nullptr, Ids{p.mask.data, {9, 2}}); },
                        needle));
  // with a cache the mask covers the cached positions too: (2, 9 + 1)
  std::vector<nn::KvCache> caches = model.new_caches(2);
  model.forward(p.ids, ForwardOptions(), &caches, p.mask);
  EXPECT_TRUE(ThrowsArg([&] { model.forward(Ids{{1, 2}, {2, 1}}, ForwardOptions(), &caches, Ids{{1, 0}, {2, 1}}); },
                        "[llama] attention_mask (2, 1) holding 2 values must be empty or (B, T_keys) = (2, 10)"));
}

// One process holding every position: enough for the model's refusal, which comes before any attention runs.
class WholeSequence : public nn::SequenceShard {
 public:
  int64_t padded_length(int64_t t) const override { return t; }
  std::vector<int64_t> positions(int64_t t) const override {
    std::vector<int64_t> p(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) p[static_cast<size_t>(i)] = i;
    return p;
  }
  ad::Var attention(const ad::Var& q, const ad::Var& k, const ad::Var& v, const AttentionOptions& o) const override {
    return ad::attention(q, k, v, o);
  }
};

TEST(LlamaMask, MaskUnderASequenceShardThrows) {
  Rng rng(4);
  const LlamaForCausalLM model(qkv::testing::tiny_gqa_llama(false), rng);
  const Padded p = padded(true);
  const WholeSequence shard;
  nn::Context c;
  c.set_sequence_shard(&shard);
  const std::vector<int64_t> positions = shard.positions(9);
  EXPECT_NO_THROW(model.forward(c, p.ids, nullptr, 0, &positions));
  EXPECT_TRUE(qkv::testing::ThrowsArg([&] { model.forward(c, p.ids, nullptr, 0, &positions, p.mask); },
                                      "[llama] attention_mask (2, 9) with the ids (2, 9) under context parallelism"));
  const std::vector<int64_t> per_row = positions_of(p.mask);  // B·T positions: not around the ring
  EXPECT_TRUE(qkv::testing::ThrowsArg([&] { model.forward(c, p.ids, nullptr, 0, &per_row); },
                                      "[llama] ids (2, 9): context parallelism needs the ids' global positions"));
}

}  // namespace
}  // namespace qkv::models
