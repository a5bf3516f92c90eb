// nn::attend, the attention core under MultiheadAttention and LlamaAttention: the op's bits when called as the
// shells call it, cached steps against one forward, GQA, packed rows, weights, masks, windows, and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "nn_testing.h"
#include "ops_testing.h"
#include "qkv/core/rng.h"
#include "qkv/models/llama.h"
#include "qkv/nn/attention_core.h"
#include "qkv/nn/kv_cache.h"
#include "qkv/nn/multihead_attention.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/functional.h"
#include "tiny_llama.h"

namespace qkv::nn {
namespace {

using qkv::testing::AllClose;
using qkv::testing::BitIdentical;
using qkv::testing::randn;
using qkv::testing::ThrowsArg;
using qkv::testing::Tol;

// Two float32 paths over the same math in another order (a cached step against the full product, a paged read).
constexpr Tol kReorder{1e-5, 1e-4};

// LlamaAttention's output composed by hand from the op: projections, HF's rotary table, one ad::attention call with
// the options the model config asks for, o_proj. The core must give these bits.
Tensor llama_by_hand(const models::LlamaAttention& a, const models::LlamaConfig& k, bool sliding, const Tensor& x) {
  const Context c;
  const int64_t b = x.size(0), t = x.size(1), d = k.head_dim;
  auto heads = [&](const Linear& p, int64_t h) {
    return ad::permute(ad::reshape(p.forward(c, ad::Var(x)), {b, t, h, d}), {0, 2, 1, 3});
  };
  auto table = std::make_shared<const RopeTable>(rope_table(0, t, d, k.rope_theta, k.rope_scaling));
  const ad::Var q = ad::rope(heads(a.q_proj, k.num_attention_heads), table, RopeVariant::kHalfSplit);
  const ad::Var kk = ad::rope(heads(a.k_proj, k.num_key_value_heads), table, RopeVariant::kHalfSplit);
  const ad::Var v = heads(a.v_proj, k.num_key_value_heads);
  AttentionOptions o;
  o.scale = k.attention_scale > 0.0f ? k.attention_scale : 1.0f / std::sqrt(static_cast<float>(d));
  o.causal = Causal::kBottomRight;
  if (sliding) {
    o.window_left = k.sliding_window - 1;
    o.window_right = 0;
  }
  o.softcap = k.attn_logit_softcapping;
  o.enable_gqa = k.num_attention_heads != k.num_key_value_heads;
  const ad::Var out = ad::attention(q, kk, v, o);
  return a.o_proj.forward(c, ad::reshape(ad::permute(out, {0, 2, 1, 3}), {b, t, k.num_attention_heads * d})).value;
}

TEST(AttentionCore, LlamaAttentionGivesTheBitsOfTheOpCalledDirectly) {
  for (bool gemma : {false, true}) {
    const models::LlamaConfig k = qkv::testing::tiny_gqa_llama(gemma);  // layer 0 slides when gemma
    Rng rng(3);
    const models::LlamaAttention a(k, 0, rng);
    const Tensor x = randn({2, 7, k.hidden_size}, 4);
    EXPECT_TRUE(BitIdentical(a.forward(Context(), ad::Var(x), 0, nullptr).value, llama_by_hand(a, k, gemma, x)))
        << "gemma " << gemma;
  }
}

// Prefill 4 rows, then steps of 1 and 2, through a contiguous and a paged cache: the rows of one forward over all 7.
TEST(AttentionCore, LlamaCachedStepsEqualOneForwardContiguousAndPaged) {
  const models::LlamaConfig k = qkv::testing::tiny_gqa_llama(true);
  Rng rng(5);
  const models::LlamaAttention a(k, 0, rng);
  const Tensor x = randn({2, 7, k.hidden_size}, 6);
  const Tensor full = a.forward(Context(), ad::Var(x), 0, nullptr).value;
  for (int64_t page : {0, 2}) {
    KvCache cache;
    cache.reset(2, k.num_key_value_heads, k.head_dim, 4, page);
    int64_t at = 0;
    for (int64_t n : {4, 1, 2}) {
      const Tensor got = a.forward(Context(), ad::Var(x.slice(1, at, at + n)), at, &cache).value;
      EXPECT_TRUE(AllClose(got, full.slice(1, at, at + n), kReorder)) << "page " << page << " at " << at;
      at += n;
    }
  }
}

// A key blocked by the attention mask takes no part: changing its row changes no other row's output, and its
// probability is 0 while each row's still sum to 1.
TEST(AttentionCore, LlamaAttentionMaskBlocksAKey) {
  const models::LlamaConfig k = qkv::testing::tiny_gqa_llama(false);
  Rng rng(7);
  const models::LlamaAttention a(k, 0, rng);
  const Tensor x = randn({1, 5, k.hidden_size}, 8);
  Tensor mask = Tensor::ones({1, 5});
  mask.data()[1] = 0.0f;  // key 1 blocked
  Tensor probs;
  const Tensor out = a.forward(Context(), ad::Var(x), 0, nullptr, nullptr, nullptr, 0, &probs, mask).value;
  Tensor x2 = x.clone();
  for (int64_t e = 0; e < k.hidden_size; ++e) x2.data()[1 * k.hidden_size + e] += 3.0f;
  const Tensor out2 = a.forward(Context(), ad::Var(x2), 0, nullptr, nullptr, nullptr, 0, nullptr, mask).value;
  for (int64_t row : {0, 2, 3, 4})
    EXPECT_TRUE(BitIdentical(out.slice(1, row, row + 1), out2.slice(1, row, row + 1))) << "row " << row;
  ASSERT_EQ(probs.shape(), (Shape{1, k.num_attention_heads, 5, 5}));
  const Tensor p = probs.contiguous();
  for (int64_t h = 0; h < k.num_attention_heads; ++h)
    for (int64_t i = 2; i < 5; ++i) {  // rows 0 and 1: row 0 sees key 0 only; row 1 sees key 0 (1 blocked)
      double sum = 0.0;
      for (int64_t j = 0; j < 5; ++j) sum += p.data()[((h * 5) + i) * 5 + j];
      EXPECT_EQ(p.data()[((h * 5) + i) * 5 + 1], 0.0f);
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
  EXPECT_TRUE(ThrowsArg([&] { a.forward(Context(), ad::Var(x), 0, nullptr, nullptr, nullptr, 0, nullptr,
                                        Tensor::ones({1, 4})); },
                        "[llama] attention_mask (1, 4) must be (B, T_keys) = (1, 5)"));
}

// Grouped-query heads read the kv heads in place: the same as the kv heads repeated per group.
TEST(AttentionCore, GroupedQueryHeadsEqualRepeatedKvHeads) {
  const Tensor q = randn({2, 4, 5, 3}, 1), k = randn({2, 2, 5, 3}, 2), v = randn({2, 2, 5, 3}, 3);
  AttendOptions o;
  o.attention.causal = Causal::kTopLeft;
  o.weights = AttendWeights::kRecomputed;
  const AttendResult g = attend(Context(), ad::Var(q), ad::Var(k), ad::Var(v), o);
  auto repeat = [](const Tensor& t) {  // (B, 2, T, D) -> (B, 4, T, D), head h from h / 2
    return t.unsqueeze(2).expand({2, 2, 2, 5, 3}).reshape({2, 4, 5, 3});
  };
  const AttendResult r = attend(Context(), ad::Var(q), ad::Var(repeat(k)), ad::Var(repeat(v)), o);
  EXPECT_TRUE(AllClose(g.out.value, r.out.value, kReorder));
  EXPECT_TRUE(AllClose(g.weights, r.weights, kReorder));
}

// The op's weights (one pass, the reference) and the probabilities recomputed beside the fused kernel agree, and
// both outputs are the op's.
TEST(AttentionCore, WeightsWithTheOutputEqualTheRecomputedOnes) {
  const Tensor q = randn({1, 2, 4, 8}, 1), k = randn({1, 2, 6, 8}, 2), v = randn({1, 2, 6, 8}, 3);
  AttendOptions o;
  o.attention.causal = Causal::kBottomRight;
  o.attention.softcap = 2.0f;
  o.attention.window_left = 2;
  o.weights = AttendWeights::kWithOutput;
  const AttendResult with = attend(Context(), ad::Var(q), ad::Var(k), ad::Var(v), o);
  o.weights = AttendWeights::kRecomputed;
  const AttendResult beside = attend(Context(), ad::Var(q), ad::Var(k), ad::Var(v), o);
  EXPECT_TRUE(AllClose(with.weights, beside.weights, kReorder));
  AttentionOptions ref = o.attention;
  ref.return_weights = true;
  const AttentionResult op = attention(q, k, v, ref);
  EXPECT_TRUE(BitIdentical(with.out.value, op.out));
  EXPECT_TRUE(BitIdentical(with.weights, op.weights));
  ref.return_weights = false;
  EXPECT_TRUE(BitIdentical(beside.out.value, attention(q, k, v, ref).out));
}

// Packed rows: each sequence alone.
TEST(AttentionCore, PackedRowsEqualEachSequenceAlone) {
  const std::vector<int32_t> cu{0, 3, 4, 8};
  const Tensor q = randn({8, 2, 4}, 1), k = randn({8, 1, 4}, 2), v = randn({8, 1, 4}, 3);
  AttendOptions o;
  o.attention.causal = Causal::kTopLeft;
  o.cu_seqlens = cu;
  const Tensor packed = attend(Context(), ad::Var(q), ad::Var(k), ad::Var(v), o).out.value;
  ASSERT_EQ(packed.shape(), (Shape{8, 2, 4}));
  o.cu_seqlens.clear();
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    auto heads = [&](const Tensor& t) { return ad::Var(t.slice(0, cu[s], cu[s + 1]).transpose(0, 1).unsqueeze(0)); };
    const Tensor alone = attend(Context(), heads(q), heads(k), heads(v), o).out.value;  // (1, 2, T, 4)
    EXPECT_TRUE(AllClose(packed.slice(0, cu[s], cu[s + 1]), alone.squeeze(0).transpose(0, 1), kReorder))
        << "sequence " << s;
  }
}

// MultiheadAttention reaches the op's window and soft-cap through the core: a window of (0, 0) lets query i see
// key i only, so each row is out_proj(v_proj(x_i)); a soft-cap changes the weights as the op's does.
TEST(AttentionCore, MultiheadAttentionGainsWindowAndSoftcap) {
  Rng rng(11);
  MultiheadAttention mha(8, 2, rng);
  qkv::testing::randomize_parameters(mha, 12);
  const Tensor x = randn({2, 5, 8}, 13);
  MhaForwardOptions o;
  o.window_left = o.window_right = 0;
  const Tensor out = mha.forward(x, x, x, o).out.value;
  const Context c;
  const ad::Var vproj = ad::linear(ad::Var(x), ad::Var(mha.in_proj_weight.slice(0, 16, 24)),
                                   ad::Var(mha.in_proj_bias.slice(0, 16, 24)));
  EXPECT_TRUE(AllClose(out, mha.out_proj.forward(c, vproj).value, kReorder));

  MhaForwardOptions s;
  s.softcap = 0.5f;
  s.average_attn_weights = false;
  const Tensor w = mha.forward(x, x, x, s).weights;
  const ad::Var qproj = ad::linear(ad::Var(x), ad::Var(mha.in_proj_weight.slice(0, 0, 8)),
                                   ad::Var(mha.in_proj_bias.slice(0, 0, 8)));
  const auto [kh, vh] = mha.project_kv(x, x);
  AttentionOptions ao;
  ao.softcap = 0.5f;
  ao.return_weights = true;
  const Tensor qh = qproj.value.reshape({2, 5, 2, 4}).transpose(1, 2);
  EXPECT_TRUE(AllClose(w, attention(qh, kh, vh, ao).weights, kReorder));
  s.softcap = 0.0f;
  EXPECT_FALSE(AllClose(w, mha.forward(x, x, x, s).weights, kReorder));
}

// Decoding through the core: steps against a cache equal the causal product over every row, rotary included.
TEST(AttentionCore, CachedStepsWithRotaryEqualOneCall) {
  const Tensor q = randn({1, 2, 6, 4}, 1), k = randn({1, 2, 6, 4}, 2), v = randn({1, 2, 6, 4}, 3);
  AttendOptions o;
  o.attention.causal = Causal::kBottomRight;
  o.rotary.enabled = true;
  const Tensor full = attend(Context(), ad::Var(q), ad::Var(k), ad::Var(v), o).out.value;
  KvCache cache;
  o.cache = &cache;
  int64_t at = 0;
  for (int64_t n : {3, 1, 2}) {
    auto rows = [&](const Tensor& t) { return ad::Var(t.slice(2, at, at + n)); };
    const Tensor got = attend(Context(), rows(q), rows(k), rows(v), o).out.value;
    EXPECT_TRUE(AllClose(got, full.slice(2, at, at + n), kReorder)) << "at " << at;
    at += n;
  }
  EXPECT_EQ(cache.length(), 6);
}

// Per-row rotary positions (B·Tn of them, or a table of B·Tn rows; a left-padded batch): each row rotated at its own
// positions gives the bits of the row alone at them.
TEST(AttentionCore, PerRowPositionsRotateEachRowAtItsOwn) {
  const Tensor q = randn({2, 2, 3, 4}, 1), k = randn({2, 2, 3, 4}, 2), v = randn({2, 2, 3, 4}, 3);
  const std::vector<int64_t> positions = {0, 1, 2, 5, 6, 7};
  AttendOptions o;
  o.attention.causal = Causal::kBottomRight;
  o.rotary.enabled = true;
  o.rotary.positions = &positions;
  const Tensor got = attend(Context(), ad::Var(q), ad::Var(k), ad::Var(v), o).out.value;
  for (int64_t b = 0; b < 2; ++b) {
    const std::vector<int64_t> own(positions.begin() + 3 * b, positions.begin() + 3 * b + 3);
    AttendOptions one = o;
    one.rotary.positions = &own;
    auto row = [&](const Tensor& t) { return ad::Var(t.slice(0, b, b + 1)); };
    const Tensor alone = attend(Context(), row(q), row(k), row(v), one).out.value;
    EXPECT_TRUE(AllClose(got.slice(0, b, b + 1), alone, Tol{0.0, 0.0})) << b;
  }
  AttendOptions table = o;
  table.rotary.positions = nullptr;
  table.rotary.table = std::make_shared<const RopeTable>(rope_table(positions, 4));
  EXPECT_TRUE(AllClose(attend(Context(), ad::Var(q), ad::Var(k), ad::Var(v), table).out.value, got, Tol{0.0, 0.0}));
  // the queries of the last row only (a prefill's last layer): rows 2 and 7
  AttendOptions last = o;
  last.query_first = 2;
  const Tensor tail = attend(Context(), ad::Var(q.slice(2, 2, 3)), ad::Var(k), ad::Var(v), last).out.value;
  EXPECT_TRUE(AllClose(tail, got.slice(2, 2, 3), kReorder));
  const std::vector<int64_t> four = {0, 1, 2, 3};
  o.rotary.positions = &four;
  EXPECT_TRUE(ThrowsArg([&] { attend(Context(), ad::Var(q), ad::Var(k), ad::Var(v), o); },
                        "[attend] 4 rotary positions for the new keys (2, 2, 3, 4) (Tn shared by the rows, or B*Tn"));
}

// Under a sequence shard the attention runs through the shard's attention, and what the ring cannot do is refused.
class LocalShard : public SequenceShard {
 public:
  int64_t padded_length(int64_t t) const override { return t; }
  std::vector<int64_t> positions(int64_t t) const override {
    std::vector<int64_t> p(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) p[static_cast<size_t>(i)] = i;
    return p;
  }
  ad::Var attention(const ad::Var& q, const ad::Var& k, const ad::Var& v,
                    const AttentionOptions& options) const override {
    ++calls;
    return ad::attention(q, k, v, options);
  }
  mutable int calls = 0;
};

TEST(AttentionCore, ShardRunsItsAttentionAndRefusesWhatTheRingHasNot) {
  LocalShard shard;
  Context c;
  c.set_sequence_shard(&shard);
  const Tensor q = randn({1, 2, 4, 4}, 1), k = randn({1, 2, 4, 4}, 2), v = randn({1, 2, 4, 4}, 3);
  AttendOptions o;
  o.op = "test";
  o.attention.causal = Causal::kTopLeft;
  const std::vector<int64_t> positions{0, 1, 2, 3};
  o.rotary.enabled = true;
  o.rotary.positions = &positions;
  const Tensor sharded = attend(c, ad::Var(q), ad::Var(k), ad::Var(v), o).out.value;
  EXPECT_EQ(shard.calls, 1);
  EXPECT_TRUE(BitIdentical(sharded, attend(Context(), ad::Var(q), ad::Var(k), ad::Var(v), o).out.value));
  const std::string ring = "[test] with the sequence split across processes";
  AttendOptions w = o;
  w.attention.window_left = 1;
  EXPECT_TRUE(ThrowsArg([&] { attend(c, ad::Var(q), ad::Var(k), ad::Var(v), w); }, ring));
  AttendOptions local = o;
  local.rotary.positions = nullptr;  // rotary at local offsets
  EXPECT_TRUE(ThrowsArg([&] { attend(c, ad::Var(q), ad::Var(k), ad::Var(v), local); }, ring));
  AttendOptions weights = o;
  weights.weights = AttendWeights::kRecomputed;
  EXPECT_TRUE(ThrowsArg([&] { attend(c, ad::Var(q), ad::Var(k), ad::Var(v), weights); }, ring));
}

TEST(AttentionCore, ErrorsNameTheCallerAndTheShapes) {
  const Tensor q = randn({1, 4, 3, 4}, 1), k = randn({1, 2, 3, 4}, 2), v = randn({1, 2, 3, 4}, 3);
  AttendOptions o;
  o.op = "test";
  EXPECT_TRUE(ThrowsArg([&] { attend(Context(), ad::Var(randn({1, 3, 3, 4}, 1)), ad::Var(k), ad::Var(v), o); },
                        "[test] q (1, 3, 3, 4), k (1, 2, 3, 4) and v (1, 2, 3, 4) must be heads"));
  AttendOptions rel = o;
  rel.rel_k = ad::Var(randn({3, 4}, 4));
  EXPECT_TRUE(ThrowsArg([&] { attend(Context(), ad::Var(q), ad::Var(k), ad::Var(v), rel); },
                        "[test] relative attention has no grouped-query heads"));
  AttendOptions fixed = o;
  fixed.cache_fixed = true;
  EXPECT_TRUE(ThrowsArg([&] { attend(Context(), ad::Var(q), ad::Var(k), ad::Var(v), fixed); },
                        "[test] cache_fixed without a KV cache"));
  KvCache cache;
  AttendOptions at = o;
  at.cache = &cache;
  at.offset = 2;
  EXPECT_TRUE(ThrowsArg([&] { attend(Context(), ad::Var(q), ad::Var(k), ad::Var(v), at); },
                        "[test] the KV cache holds 0 positions; the new rows (1, 2, 3, 4) were given offset 2"));
  AttendOptions packed = o;
  packed.cu_seqlens = {0, 3};
  packed.cache = &cache;
  const Tensor p = randn({3, 2, 4}, 5);
  EXPECT_TRUE(ThrowsArg([&] { attend(Context(), ad::Var(p), ad::Var(p), ad::Var(p), packed); },
                        "[test] packed input (cu_seqlens), q (3, 2, 4), takes no KV cache"));
  AttendOptions gate = o;
  gate.head_mask = Tensor::ones({2});
  EXPECT_TRUE(ThrowsArg([&] { attend(Context(), ad::Var(q), ad::Var(k), ad::Var(v), gate); },
                        "[test] head_mask (2,) must be (num_heads,) = (4,)"));
}

// A ragged cache (rows at different lengths) is read in place only: a mask is refused, naming the caller.
TEST(AttentionCore, RaggedCacheRefusesAMask) {
  KvCache base;
  base.reset(1, 1, 4, 4, 2);
  base.append(randn({1, 1, 3, 4}, 1), randn({1, 1, 3, 4}, 2));
  KvCache cache;
  cache.reset_shared(base, 0);
  const std::vector<int32_t> pages = base.row_pages(0);
  cache.add_row(pages, 3);
  cache.add_row(std::vector<int32_t>(pages.begin(), pages.begin() + 1), 1);
  ASSERT_TRUE(cache.ragged());
  AttendOptions o;
  o.op = "test";
  o.cache = &cache;
  o.attention.causal = Causal::kBottomRight;
  o.attention.mask = Tensor::ones({2, 1, 1, 4});
  o.attention.mask_kind = MaskKind::kKeep;
  const Tensor q = randn({2, 1, 1, 4}, 3), k = randn({2, 1, 1, 4}, 4);
  EXPECT_TRUE(ThrowsArg([&] { attend(Context(), ad::Var(q), ad::Var(k), ad::Var(k), o); },
                        "[test] a ragged KV cache (rows at different lengths) is read in place"));
}

}  // namespace
}  // namespace qkv::nn
