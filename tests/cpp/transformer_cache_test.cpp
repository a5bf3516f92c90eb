// The Transformer models' forward with caches (nn::DecoderCache for Seq2SeqTransformer::decode, one nn::KvCache per
// layer for DecoderOnlyTransformer::forward): a target fed in pieces through the caches gives the logits of one
// forward over the whole of it, left-padded rows with their own positions give their unpadded logits, recording
// the attention leaves the logits unchanged, and the caches' error paths.
#include <gtest/gtest.h>

#include <vector>

#include "ops_testing.h"
#include "qkv/models/transformer.h"
#include "qkv/nn/kv_cache.h"
#include "qkv/nn/transformer.h"

namespace qkv::models {
namespace {

using qkv::testing::AllClose;
using qkv::testing::ThrowsArg;
using qkv::testing::Tol;

// Cached and whole-sequence logits differ only by float32 rounding in different summation orders.
constexpr Tol kCacheVsWhole{1e-4, 1e-4};

TransformerSeq2SeqConfig s2s_config(bool norm_first) {
  TransformerSeq2SeqConfig c;
  c.src_vocab = 13;
  c.tgt_vocab = 11;
  c.transformer.layer.d_model = 16;
  c.transformer.layer.nhead = 2;
  c.transformer.layer.dim_feedforward = 24;
  c.transformer.layer.dropout = 0.1f;  // eval mode switches it off
  c.transformer.layer.norm_first = norm_first;
  c.transformer.num_encoder_layers = 2;
  c.transformer.num_decoder_layers = 2;
  return c;
}

DecoderOnlyConfig lm_config() {
  DecoderOnlyConfig c;
  c.vocab = 17;
  c.max_len = 8;
  c.num_layers = 2;
  c.layer.d_model = 16;
  c.layer.nhead = 4;
  c.layer.dim_feedforward = 24;
  return c;
}

const Ids kSrc{{1, 5, 7, 9, 2, 1, 4, 2, 0, 0}, {2, 5}};  // pad id 0
const Ids kTgt{{1, 3, 6, 8, 4, 1, 9, 2, 5, 7}, {2, 5}};

// Columns [from, to) of ids (B, T).
Ids columns(const Ids& ids, int64_t from, int64_t to) {
  const int64_t B = ids.shape[0], T = ids.shape[1];
  Ids out{{}, {B, to - from}};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = from; t < to; ++t) out.data.push_back(ids.data[static_cast<size_t>(b * T + t)]);
  return out;
}

TEST(Seq2SeqTransformerCache, TargetInPiecesGivesTheLogitsOfTheWholeTarget) {
  for (bool norm_first : {false, true}) {
    Rng rng(norm_first ? 41 : 42);
    Seq2SeqTransformer model(s2s_config(norm_first), rng);
    model.eval();
    nn::AttentionMasks src_masks, memory_masks;
    src_masks.key_padding_mask = memory_masks.key_padding_mask = padding_mask(kSrc, 0);
    const nn::Context c;
    const ad::Var memory = model.encode(c, kSrc, src_masks);
    const Tensor whole = model.decode(c, kTgt, memory, Seq2SeqMasks::causal_self_attention(), memory_masks).value;
    nn::DecoderCache cache(2);
    int64_t from = 0;
    for (const int64_t to : {2, 3, 5}) {  // a prefill of 2, then one, then two positions
      // the memory is projected into the cache by the first call only; later calls pass none
      const ad::Var mem = from == 0 ? memory : ad::Var();
      const Tensor piece = model.decode(c, columns(kTgt, from, to), mem, Seq2SeqMasks::causal_self_attention(),
                                        memory_masks, nullptr, &cache)
                               .value;
      EXPECT_TRUE(AllClose(piece, whole.slice(1, from, to), kCacheVsWhole))
          << "norm_first " << norm_first << " at " << from;
      EXPECT_EQ(cache.length, to);
      from = to;
    }
  }
}

TEST(Seq2SeqTransformerCache, RecordingThroughTheCacheLeavesTheLogitsUnchanged) {
  Rng rng(43);
  Seq2SeqTransformer model(s2s_config(true), rng);
  model.eval();
  nn::AttentionMasks memory_masks;
  memory_masks.key_padding_mask = padding_mask(kSrc, 0);
  const nn::Context c;
  const ad::Var memory = model.encode(c, kSrc, memory_masks);
  nn::DecoderCache plain(2), recorded(2);
  nn::StackRecord record;
  record.attention_layers = {false, true};
  for (int64_t t = 0; t < 3; ++t) {
    const ad::Var mem = t == 0 ? memory : ad::Var();
    const Ids tok = columns(kTgt, t, t + 1);
    const auto causal = Seq2SeqMasks::causal_self_attention();
    const Tensor a = model.decode(c, tok, mem, causal, memory_masks, nullptr, &plain).value;
    const Tensor b = model.decode(c, tok, mem, causal, memory_masks, &record, &recorded).value;
    EXPECT_TRUE(AllClose(b, a, qkv::testing::kExact)) << "step " << t;
    EXPECT_FALSE(record.attentions[0].defined());
    ASSERT_EQ(record.attentions[1].shape(), (Shape{2, 2, 1, t + 1}));  // over every cached target position
    ASSERT_EQ(record.cross_attentions[1].shape(), (Shape{2, 2, 1, 5}));
    const std::vector<float> cross = record.cross_attentions[1].contiguous().to_vector();
    for (int64_t h = 0; h < 2; ++h) {  // row 1's source has 3 real tokens: padding gets no attention
      EXPECT_EQ(cross[static_cast<size_t>((2 + h) * 5 + 3)], 0.0f);
      EXPECT_EQ(cross[static_cast<size_t>((2 + h) * 5 + 4)], 0.0f);
    }
  }
}

TEST(Seq2SeqTransformerCache, MisuseIsNamed) {
  Rng rng(44);
  Seq2SeqTransformer model(s2s_config(false), rng);
  model.eval();
  const nn::Context c;
  const ad::Var memory = model.encode(c, kSrc);
  const Ids tok = columns(kTgt, 0, 1);
  const auto causal = Seq2SeqMasks::causal_self_attention();
  nn::DecoderCache one(1);
  EXPECT_TRUE(ThrowsArg([&] { model.decode(c, tok, memory, causal, {}, nullptr, &one); },
                        "[TransformerDecoder] the cache holds 1 self-attention and 1 memory caches for 2 layers"));
  nn::DecoderCache fresh(2);
  EXPECT_TRUE(ThrowsArg([&] { model.decode(c, tok, ad::Var(), causal, {}, nullptr, &fresh); },
                        "[TransformerDecoderLayer] memory is undefined"));
  nn::DecoderCache cache(2);
  model.decode(c, tok, memory, causal, {}, nullptr, &cache);
  cache.length = 3;
  EXPECT_TRUE(ThrowsArg([&] { model.decode(c, tok, ad::Var(), causal, {}, nullptr, &cache); },
                        "[TransformerDecoder] a layer's cache holds 1 positions; the cache's length is 3"));
  // on a tape the memory's keys and values would take no gradient: refused
  nn::DecoderCache taped(2);
  ad::Tape tape;
  ad::ParameterSet params(model);
  const nn::Context training(tape, params);
  const ad::Var x(qkv::testing::randn({2, 1, 16}, 45));
  EXPECT_TRUE(ThrowsArg(
      [&] { model.transformer.decoder.layers[0]->forward(training, x, memory, {}, {}, nullptr, &taped.memory[0]); },
      "[TransformerDecoderLayer] the memory cache is for inference"));
}

TEST(DecoderOnlyTransformerCache, IdsInPiecesGiveTheLogitsOfTheWholeSequence) {
  Rng rng(46);
  DecoderOnlyTransformer model(lm_config(), rng);
  model.eval();
  const Ids ids{{1, 4, 9, 16, 2, 5, 3, 3, 7, 0, 11, 12}, {2, 6}};
  const Tensor whole = model.forward(ids);
  std::vector<nn::KvCache> caches = model.new_caches(2);
  int64_t from = 0;
  for (const int64_t to : {3, 4, 6}) {
    const Tensor piece = model.forward(nn::Context(), columns(ids, from, to), {}, nullptr, &caches).value;
    EXPECT_TRUE(AllClose(piece, whole.slice(1, from, to), kCacheVsWhole)) << "at " << from;
    from = to;
  }
  EXPECT_EQ(caches[0].length(), 6);
  // recording through the caches: (B, H, T, T_keys) over every cached key, the logits unchanged
  ForwardOptions o;
  o.output_attentions = true;
  std::vector<nn::KvCache> a = model.new_caches(2), b = model.new_caches(2);
  model.forward(nn::Context(), columns(ids, 0, 4), {}, nullptr, &a);
  model.forward(columns(ids, 0, 4), o, {}, &b);
  const Tensor plain = model.forward(nn::Context(), columns(ids, 4, 5), {}, nullptr, &a).value;
  const CausalLMOutput out = model.forward(columns(ids, 4, 5), o, {}, &b);
  EXPECT_TRUE(AllClose(out.logits, plain, qkv::testing::kExact));
  ASSERT_EQ(out.attentions.size(), 2u);
  EXPECT_EQ(out.attentions[1].shape(), (Shape{2, 4, 1, 5}));
}

TEST(DecoderOnlyTransformerCache, LeftPaddedRowsAtTheirOwnPositionsGiveTheirUnpaddedLogits) {
  Rng rng(47);
  DecoderOnlyTransformer model(lm_config(), rng);
  model.eval();
  // row 0: four tokens; row 1: two tokens left-padded by two, its positions starting at its first real token
  const Ids prompt{{1, 4, 9, 16, 0, 0, 5, 3}, {2, 4}};
  const std::vector<int64_t> positions = {0, 1, 2, 3, 0, 0, 0, 1};
  std::vector<nn::KvCache> caches = model.new_caches(2);
  const Tensor pad4 = Tensor::from_vector({2, 4}, {0, 0, 0, 0, 1, 1, 0, 0});
  const Tensor first = model.forward(nn::Context(), prompt, pad4, &positions, &caches).value;
  // one more token each: row 0 at position 4, row 1 at 2; the padding mask covers every cached key
  const std::vector<int64_t> next_positions = {4, 2};
  const Tensor pad5 = Tensor::from_vector({2, 5}, {0, 0, 0, 0, 0, 1, 1, 0, 0, 0});
  const Tensor next = model.forward(nn::Context(), Ids{{7, 8}, {2, 1}}, pad5, &next_positions, &caches).value;
  const Tensor row0 = model.forward(Ids{{1, 4, 9, 16, 7}, {1, 5}});
  const Tensor row1 = model.forward(Ids{{5, 3, 8}, {1, 3}});
  EXPECT_TRUE(AllClose(first.select(0, 0), row0.select(0, 0).slice(0, 0, 4), kCacheVsWhole));
  EXPECT_TRUE(AllClose(first.select(0, 1).slice(0, 2, 4), row1.select(0, 0).slice(0, 0, 2), kCacheVsWhole));
  EXPECT_TRUE(AllClose(next.select(0, 0), row0.select(0, 0).slice(0, 4, 5), kCacheVsWhole));
  EXPECT_TRUE(AllClose(next.select(0, 1), row1.select(0, 0).slice(0, 2, 3), kCacheVsWhole));
}

TEST(DecoderOnlyTransformerCache, MisuseIsNamed) {
  Rng rng(48);
  DecoderOnlyTransformer model(lm_config(), rng);
  model.eval();
  const nn::Context c;
  const Ids one{{1, 2}, {2, 1}};
  std::vector<nn::KvCache> short_list(1);
  EXPECT_TRUE(ThrowsArg([&] { model.forward(c, one, {}, nullptr, &short_list); },
                        "[DecoderOnlyTransformer] 1 caches for 2 layers"));
  std::vector<nn::KvCache> caches = model.new_caches(2);
  model.forward(c, Ids{{1, 2, 3, 4, 5, 6}, {2, 3}}, {}, nullptr, &caches);
  EXPECT_TRUE(ThrowsArg([&] { model.forward(c, one, Tensor::zeros({2, 1}), nullptr, &caches); },
                        "[DecoderOnlyTransformer] key_padding_mask (2, 1) must be (B, T_keys) = (2, 4)"));
  const std::vector<int64_t> three = {3, 3, 3};
  EXPECT_TRUE(ThrowsArg([&] { model.forward(c, one, {}, &three, &caches); },
                        "[DecoderOnlyTransformer] 3 positions for ids (2, 1) (T shared by the rows, or B*T)"));
  model.forward(c, Ids{{1, 2, 3, 4, 5, 6}, {2, 3}}, {}, nullptr, &caches);
  EXPECT_TRUE(ThrowsArg([&] { model.forward(c, Ids{{1, 2, 3, 4, 5, 6}, {2, 3}}, {}, nullptr, &caches); },
                        "[DecoderOnlyTransformer] ids (2, 3) after 6 cached positions run past max_len 8"));
}

}  // namespace
}  // namespace qkv::models
