// output_attentions / output_hidden_states of the encoder and encoder-decoder models (HF's BaseModelOutput and
// Seq2SeqLMOutput) and of the GPT-style decoder: shapes, rows that are distributions, 0 at masked keys, the last
// hidden state the output itself, outputs unchanged by recording, attention_layers and the error paths.
// The experiments' Tagger reads its per-layer maps from the same encoder records (TaggerRun::attention).
// Llama's are in llama_outputs_test.cpp; transformers parity of BERT's in tests/python/test_model_outputs.py.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../../src/experiments/tagger.h"
#include "ops_testing.h"
#include "qkv/models/bert.h"
#include "qkv/models/outputs.h"
#include "qkv/models/transformer.h"

namespace qkv::models {
namespace {

using qkv::testing::AllClose;
using qkv::testing::Tol;

// Recording the weights recomputes them beside the fused kernel, which still gives the output: the outputs are the
// same bits with or without recording.
const Tol kSame = qkv::testing::kExact;

ForwardOptions everything() {
  ForwardOptions o;
  o.output_attentions = o.output_hidden_states = true;
  return o;
}

template <typename F>
void expect_throw_with(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an exception containing: " << needle;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// p: (B, H, Tq, Tk). Every row sums to 1 and is >= 0; blocked(b, i, j) entries are exactly 0.
template <typename Blocked>
void expect_distributions(const Tensor& p_in, Blocked blocked, const char* what) {
  const Tensor p = p_in.contiguous();
  ASSERT_EQ(p.dim(), 4) << what;
  const int64_t nb = p.size(0), nh = p.size(1), tq = p.size(2), tk = p.size(3);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < tq; ++i) {
        double sum = 0.0;
        for (int64_t j = 0; j < tk; ++j) {
          const float w = p.data()[((b * nh + h) * tq + i) * tk + j];
          EXPECT_GE(w, 0.0f) << what;
          if (blocked(b, i, j)) EXPECT_EQ(w, 0.0f) << what << " b " << b << " head " << h << " q " << i << " k " << j;
          sum += w;
        }
        EXPECT_NEAR(sum, 1.0, 1e-5) << what << " b " << b << " head " << h << " row " << i;
      }
}

// --- BERT --------------------------------------------------------------------------------------------------------

BertConfig tiny_bert() {
  BertConfig c;
  c.vocab_size = 28;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 24;
  c.max_position_embeddings = 12;
  return c;
}

// Two rows, the second right-padded by 2.
const Ids kBertIds{{2, 8, 9, 11, 3, 2, 14, 3, 0, 0}, {2, 5}};
const Ids kBertMask{{1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 5}};

TEST(BertOutputs, AttentionsAreDistributionsWithZeroAtPaddedKeys) {
  Rng rng(1);
  const BertModel m(tiny_bert(), rng);
  const BaseModelOutput out = m.forward(kBertIds, kBertMask, everything());
  ASSERT_EQ(out.attentions.size(), 2u);
  for (const Tensor& a : out.attentions) {
    ASSERT_EQ(a.shape(), (Shape{2, 4, 5, 5}));
    // padded query rows too: they attend to the tokens, as transformers' BertModel
    expect_distributions(a, [](int64_t b, int64_t, int64_t j) { return b == 1 && j >= 3; }, "bert");
  }
}

TEST(BertOutputs, HiddenStatesAreTheEmbeddingsThenEachLayersOutput) {
  Rng rng(2);
  const BertModel m(tiny_bert(), rng);
  const BaseModelOutput out = m.forward(kBertIds, kBertMask, everything());
  ASSERT_EQ(out.hidden_states.size(), 3u);
  for (const Tensor& h : out.hidden_states) EXPECT_EQ(h.shape(), (Shape{2, 5, 16}));
  EXPECT_TRUE(AllClose(out.hidden_states[2], out.last_hidden_state, kSame));
  const std::vector<int64_t> positions = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4};
  const Tensor emb = m.embeddings.forward(kBertIds.data, positions).view({2, 5, 16});
  EXPECT_TRUE(AllClose(out.hidden_states[0], emb, kSame));
  nn::AttentionMasks masks;
  masks.key_padding_mask = Tensor::from_vector({2, 5}, {0, 0, 0, 0, 0, 0, 0, 0, 1, 1});
  const Tensor layer0 = m.encoder.layers[0]->forward(nn::Context(), ad::Var(emb), masks).value;
  EXPECT_TRUE(AllClose(out.hidden_states[1], layer0, kSame));
}

TEST(BertOutputs, RecordingLeavesTheOutputUnchanged) {
  Rng rng(3);
  const BertModel m(tiny_bert(), rng);
  const BaseModelOutput plain = m.forward(kBertIds, kBertMask, ForwardOptions());
  EXPECT_TRUE(plain.attentions.empty() && plain.hidden_states.empty());
  EXPECT_TRUE(AllClose(plain.last_hidden_state, m.forward(kBertIds, kBertMask), kSame));
  const BaseModelOutput out = m.forward(kBertIds, kBertMask, everything());
  EXPECT_TRUE(AllClose(out.last_hidden_state, plain.last_hidden_state, kSame));
  ForwardOptions hidden_only;
  hidden_only.output_hidden_states = true;
  const BaseModelOutput h = m.forward(kBertIds, kBertMask, hidden_only);
  EXPECT_TRUE(h.attentions.empty());
  EXPECT_TRUE(AllClose(h.last_hidden_state, plain.last_hidden_state, kSame));  // no weights: the same kernels
  EXPECT_TRUE(AllClose(h.hidden_states.back(), plain.last_hidden_state, kSame));
}

TEST(BertOutputs, NoMaskMeansEveryPositionIsAToken) {
  Rng rng(4);
  const BertModel m(tiny_bert(), rng);
  const Ids ones{std::vector<int64_t>(10, 1), {2, 5}};
  const BaseModelOutput a = m.forward(kBertIds, Ids(), everything());
  const BaseModelOutput b = m.forward(kBertIds, ones, everything());
  for (size_t l = 0; l < 2; ++l) EXPECT_TRUE(AllClose(a.attentions[l], b.attentions[l], kSame));
  EXPECT_TRUE(AllClose(a.last_hidden_state, b.last_hidden_state, kSame));
}

TEST(BertOutputs, AttentionLayersPickTheRecordedOnes) {
  Rng rng(5);
  const BertModel m(tiny_bert(), rng);
  ForwardOptions o;
  o.output_attentions = true;
  o.attention_layers = {1};
  const BaseModelOutput some = m.forward(kBertIds, kBertMask, o);
  const BaseModelOutput all = m.forward(kBertIds, kBertMask, everything());
  ASSERT_EQ(some.attentions.size(), 2u);
  EXPECT_FALSE(some.attentions[0].defined());
  EXPECT_TRUE(AllClose(some.attentions[1], all.attentions[1], kSame));
  o.attention_layers = {2};
  expect_throw_with([&] { m.forward(kBertIds, kBertMask, o); }, "[bert] attention layer 2 is outside [0, 2)");
}

TEST(BertOutputs, MisshapenArgumentsAreRefused) {
  Rng rng(6);
  const BertModel m(tiny_bert(), rng);
  const Ids short_mask{{1, 1, 1}, {1, 3}};
  expect_throw_with([&] { m.forward(kBertIds, short_mask, everything()); }, "[bert] attention_mask (1, 3) must be empty or have the shape of ids (2, 5)");
  expect_throw_with([&] { m.forward(kBertIds, Ids(), everything(), short_mask); }, "[bert] token_type_ids (1, 3)");
  const Ids too_long{std::vector<int64_t>(13, 2), {1, 13}};
  expect_throw_with([&] { m.forward(too_long, Ids(), everything()); }, "[bert] sequence length 13");
  const Ids flat{{2, 3}, {2}};
  expect_throw_with([&] { m.forward(flat, Ids(), everything()); }, "[bert] ids (2,) must be (B, T)");
}

// --- Seq2SeqTransformer ------------------------------------------------------------------------------------------

TransformerSeq2SeqConfig tiny_seq2seq(int64_t encoder_layers, int64_t decoder_layers) {
  TransformerSeq2SeqConfig c;
  c.src_vocab = 13;
  c.tgt_vocab = 11;
  c.transformer.layer.d_model = 16;
  c.transformer.layer.nhead = 2;
  c.transformer.layer.dim_feedforward = 24;
  c.transformer.num_encoder_layers = encoder_layers;
  c.transformer.num_decoder_layers = decoder_layers;
  return c;
}

const Ids kSrc{{1, 5, 7, 9, 2, 1, 4, 2, 0, 0}, {2, 5}};  // pad id 0
const Ids kTgt{{1, 3, 6, 8, 1, 9, 2, 5}, {2, 4}};

Seq2SeqMasks padded_source() {
  Seq2SeqMasks m;
  m.src.key_padding_mask = padding_mask(kSrc, 0);
  m.memory.key_padding_mask = padding_mask(kSrc, 0);
  return m;
}

TEST(Seq2SeqTransformerOutputs, EncoderDecoderAndCrossAttentionsUnderTheirMasks) {
  Rng rng(7);
  Seq2SeqTransformer model(tiny_seq2seq(3, 2), rng);
  model.eval();
  const Seq2SeqLMOutput out = model.forward(kSrc, kTgt, padded_source(), everything());
  auto pad = [](int64_t b, int64_t, int64_t j) { return b == 1 && j >= 3; };
  ASSERT_EQ(out.encoder_attentions.size(), 3u);
  ASSERT_EQ(out.decoder_attentions.size(), 2u);
  ASSERT_EQ(out.cross_attentions.size(), 2u);
  for (const Tensor& a : out.encoder_attentions) {
    ASSERT_EQ(a.shape(), (Shape{2, 2, 5, 5}));
    expect_distributions(a, pad, "encoder");
  }
  for (const Tensor& a : out.decoder_attentions) {
    ASSERT_EQ(a.shape(), (Shape{2, 2, 4, 4}));
    expect_distributions(a, [](int64_t, int64_t i, int64_t j) { return j > i; }, "decoder");
  }
  for (const Tensor& a : out.cross_attentions) {
    ASSERT_EQ(a.shape(), (Shape{2, 2, 4, 5}));
    expect_distributions(a, pad, "cross");
  }
}

TEST(Seq2SeqTransformerOutputs, HiddenStatesEndInTheMemoryAndTheLogits) {
  Rng rng(8);
  Seq2SeqTransformer model(tiny_seq2seq(3, 2), rng);
  model.eval();
  const Seq2SeqMasks masks = padded_source();
  const Seq2SeqLMOutput out = model.forward(kSrc, kTgt, masks, everything());
  ASSERT_EQ(out.encoder_hidden_states.size(), 4u);
  ASSERT_EQ(out.decoder_hidden_states.size(), 3u);
  for (const Tensor& h : out.encoder_hidden_states) EXPECT_EQ(h.shape(), (Shape{2, 5, 16}));
  for (const Tensor& h : out.decoder_hidden_states) EXPECT_EQ(h.shape(), (Shape{2, 4, 16}));
  // the last entries are after the stacks' final norms: the memory, and what the generator reads
  EXPECT_TRUE(AllClose(out.encoder_hidden_states.back(), out.encoder_last_hidden_state, kSame));
  EXPECT_TRUE(AllClose(model.generator.forward(out.decoder_hidden_states.back()), out.logits, kSame));
  // the first entries are the embeddings with their positions
  const nn::Context c;
  const ad::Var memory = model.encode(c, kSrc, masks.src);
  EXPECT_TRUE(AllClose(out.encoder_last_hidden_state, memory.value, kSame));
  const Tensor first_layer =
      model.transformer.encoder.layers[0]->forward(c, ad::Var(out.encoder_hidden_states[0]), masks.src).value;
  EXPECT_TRUE(AllClose(out.encoder_hidden_states[1], first_layer, kSame));
}

TEST(Seq2SeqTransformerOutputs, RecordingLeavesTheLogitsUnchanged) {
  Rng rng(9);
  Seq2SeqTransformer model(tiny_seq2seq(2, 2), rng);
  model.eval();
  const Seq2SeqMasks masks = padded_source();
  const Tensor logits = model.forward(kSrc, kTgt, masks);
  const Seq2SeqLMOutput plain = model.forward(kSrc, kTgt, masks, ForwardOptions());
  EXPECT_TRUE(plain.encoder_attentions.empty() && plain.decoder_attentions.empty() && plain.cross_attentions.empty());
  EXPECT_TRUE(plain.encoder_hidden_states.empty() && plain.decoder_hidden_states.empty());
  EXPECT_TRUE(AllClose(plain.logits, logits, kSame));
  ForwardOptions hidden_only;
  hidden_only.output_hidden_states = true;
  EXPECT_TRUE(AllClose(model.forward(kSrc, kTgt, masks, hidden_only).logits, logits, kSame));
  EXPECT_TRUE(AllClose(model.forward(kSrc, kTgt, masks, everything()).logits, logits, kSame));
}

TEST(Seq2SeqTransformerOutputs, AttentionLayersCountOverTheDeeperStack) {
  Rng rng(10);
  Seq2SeqTransformer model(tiny_seq2seq(3, 2), rng);
  model.eval();
  ForwardOptions o;
  o.output_attentions = true;
  o.attention_layers = {2};  // the encoder's third layer; the decoder has none
  const Seq2SeqLMOutput out = model.forward(kSrc, kTgt, padded_source(), o);
  ASSERT_EQ(out.encoder_attentions.size(), 3u);
  EXPECT_FALSE(out.encoder_attentions[0].defined());
  EXPECT_TRUE(out.encoder_attentions[2].defined());
  ASSERT_EQ(out.decoder_attentions.size(), 2u);
  EXPECT_FALSE(out.decoder_attentions[0].defined() || out.decoder_attentions[1].defined());
  EXPECT_FALSE(out.cross_attentions[0].defined() || out.cross_attentions[1].defined());
  o.attention_layers = {3};
  expect_throw_with([&] { model.forward(kSrc, kTgt, padded_source(), o); },
                    "[Seq2SeqTransformer] attention layer 3 is outside [0, 3)");
  const Ids other_batch{{1, 2, 3}, {1, 3}};
  expect_throw_with([&] { model.forward(kSrc, other_batch, padded_source(), everything()); },
                    "must have the same batch size");
}

// --- DecoderOnlyTransformer --------------------------------------------------------------------------------------

TEST(DecoderOnlyOutputs, CausalAttentionsAndHiddenStatesEndingAfterTheFinalNorm) {
  DecoderOnlyConfig c;
  c.vocab = 17;
  c.max_len = 8;
  c.num_layers = 2;
  c.layer.d_model = 16;
  c.layer.nhead = 4;
  c.layer.dim_feedforward = 24;
  Rng rng(11);
  DecoderOnlyTransformer model(c, rng);
  model.eval();
  const Ids ids{{1, 4, 9, 16, 2, 5, 3, 3, 7, 0, 11, 12}, {2, 6}};
  const Tensor logits = model.forward(ids);
  const CausalLMOutput out = model.forward(ids, everything());
  EXPECT_TRUE(AllClose(out.logits, logits, kSame));
  ASSERT_EQ(out.attentions.size(), 2u);
  for (const Tensor& a : out.attentions) {
    ASSERT_EQ(a.shape(), (Shape{2, 4, 6, 6}));
    expect_distributions(a, [](int64_t, int64_t i, int64_t j) { return j > i; }, "decoder-only");
  }
  ASSERT_EQ(out.hidden_states.size(), 3u);
  EXPECT_TRUE(AllClose(model.lm_head.forward(out.hidden_states.back()), out.logits, kSame));
  ForwardOptions hidden_only;
  hidden_only.output_hidden_states = true;
  EXPECT_TRUE(AllClose(model.forward(ids, hidden_only).logits, logits, kSame));
  ForwardOptions o;
  o.output_attentions = true;
  o.attention_layers = {-1};
  expect_throw_with([&] { model.forward(ids, o); }, "[DecoderOnlyTransformer] attention layer -1 is outside [0, 2)");
}

// --- the experiments' Tagger: its head maps are the encoder stack's records ---------------------------------------

TEST(TaggerOutputs, HeadMapsAreEachLayersDistributionsWithZeroAtPaddedKeys) {
  experiments::TaggerConfig c;
  c.vocab_in = c.vocab_out = 12;
  Rng rng(12);
  const experiments::Tagger m(c, rng);
  const Ids ids{{4, 5, 6, 7, 8, 3, 2, 9, 0, 0}, {2, 5}};
  std::vector<Tensor> maps;
  experiments::TaggerRun run;
  run.key_padding = Tensor::from_vector({2, 5}, {0, 0, 0, 0, 0, 0, 0, 0, 1, 1});
  const Tensor plain = experiments::tagger_logits(m, ids, run);
  run.attention = &maps;
  const Tensor logits = experiments::tagger_logits(m, ids, run);
  EXPECT_TRUE(AllClose(logits, plain, kSame));
  ASSERT_EQ(maps.size(), 2u);
  for (const Tensor& a : maps) {
    ASSERT_EQ(a.shape(), (Shape{2, 4, 5, 5}));
    expect_distributions(a, [](int64_t b, int64_t, int64_t j) { return b == 1 && j >= 3; }, "tagger");
  }
}

}  // namespace
}  // namespace qkv::models
