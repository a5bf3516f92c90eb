// Tests of the trainable RNN Seq2Seq and of train::TextModel (none / Bahdanau / Luong dot / Luong general, GRU and LSTM): the forward on a
// training Context equals the inference forward, and loss gradients pass finite-difference spot checks on every parameter.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "grad_testing.h"
#include "nn_testing.h"
#include "qkv/data/vocab.h"
#include "qkv/decode/rnn_step.h"
#include "qkv/decode/cached_step.h"
#include "qkv/models/seq2seq.h"
#include "qkv/models/transformer.h"
#include "qkv/train/loss.h"
#include "qkv/train/optim.h"
#include "qkv/train/data_parallel.h"
#include "qkv/train/text_model.h"
#include "recompute_steps.h"
#include "tiny_llama.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::ThrowsArg;
using ad::ParameterSet;
using ad::Tape;
using ad::Var;

constexpr testing::Tol kSameOps{1e-6, 1e-5};
// Central differences of the float32 loss with step 1e-2 against the tape (see train_context_test.cpp).
constexpr testing::Tol kSpotTol{2e-4, 3e-2};

struct Case {
  models::Seq2SeqAttention attention;
  models::RnnCell cell;
  int64_t layers;
};

models::Seq2SeqConfig config_of(const Case& c) {
  models::Seq2SeqConfig cfg;
  cfg.src_vocab = 7;
  cfg.tgt_vocab = 6;
  cfg.embed_dim = 4;
  cfg.hidden_size = 5;
  cfg.num_layers = c.layers;
  cfg.cell = c.cell;
  cfg.attention = c.attention;
  cfg.attention_size = 3;
  return cfg;
}

const Ids kSrc{{1, 2, 3, 4, 5, 6, 1, 0}, {2, 4}};
const std::vector<int64_t> kLengths{4, 3};
const Ids kTgtIn{{1, 2, 3, 1, 4, 5}, {2, 3}};
const std::vector<int64_t> kTargets{2, 3, 5, 4, 5, 0};

std::vector<Case> all_cases() {
  using A = models::Seq2SeqAttention;
  using C = models::RnnCell;
  return {{A::kNone, C::kGRU, 1},     {A::kNone, C::kLSTM, 2},      {A::kBahdanau, C::kGRU, 2},
          {A::kBahdanau, C::kLSTM, 1}, {A::kLuongDot, C::kGRU, 1},  {A::kLuongGeneral, C::kLSTM, 2}};
}

TEST(TrainSeq2Seq, TapeForwardEqualsModelForwardForEveryVariant) {
  for (const Case& c : all_cases()) {
    Rng rng(1);
    models::Seq2Seq m(config_of(c), rng);
    ParameterSet ps(m);
    Tape tape;
    nn::Context g(tape, ps);
    const Var logits = m.forward(g, kSrc, kLengths, kTgtIn).logits;
    EXPECT_TRUE(AllClose(logits.value, m.forward(kSrc, kLengths, kTgtIn).logits, kSameOps))
        << static_cast<int>(c.attention) << " " << static_cast<int>(c.cell);
  }
}

TEST(TrainSeq2Seq, EveryParameterGetsTheFiniteDifferenceGradient) {
  for (const Case& c : all_cases()) {
    Rng rng(2);
    models::Seq2Seq m(config_of(c), rng);
    ParameterSet ps(m);
    auto loss = [&](nn::Context& g) {
      return train::cross_entropy(m.forward(g, kSrc, kLengths, kTgtIn).logits, kTargets,
                                  train::CrossEntropyOptions{0, 0.0f, train::Reduction::kMean});
    };
    ps.zero_grad();
    {
      Tape tape;
      nn::Context g(tape, ps);
      tape.backward(loss(g));
    }
    auto loss_at = [&]() {
      Tape tape;
      nn::Context g(tape, ps);
      return static_cast<double>(loss(g).value.item());
    };
    Rng pick(3);
    for (size_t i = 0; i < ps.size(); ++i) {
      ad::Parameter& p = ps[i];
      ASSERT_TRUE(p.has_grad) << p.name;
      for (int s = 0; s < 2; ++s) {
        const int64_t e = static_cast<int64_t>(pick.below(static_cast<uint64_t>(p.value->numel())));
        float* w = p.value->data() + e;
        const float keep = *w, h = 1e-2f;
        *w = keep + h;
        const double lp = loss_at();
        *w = keep - h;
        const double lm = loss_at();
        *w = keep;
        const double fd = (lp - lm) / (2.0 * h), an = p.grad.data()[e];
        EXPECT_LE(std::fabs(an - fd), kSpotTol.atol + kSpotTol.rtol * std::max(std::fabs(fd), 1e-2))
            << p.name << "[" << e << "] variant " << static_cast<int>(c.attention) << " cell "
            << static_cast<int>(c.cell);
      }
    }
  }
}

TEST(TrainSeq2Seq, PaddedSourceEmbeddingsGetNoGradient) {
  // Source positions past a row's length never reach the loss, so their embedding rows stay untouched.
  Rng rng(4);
  models::Seq2Seq m(config_of({models::Seq2SeqAttention::kBahdanau, models::RnnCell::kGRU, 1}), rng);
  ParameterSet ps(m);
  ps.zero_grad();
  const Ids src{{1, 2, 3, 6, 4, 5, 6, 6}, {2, 4}};  // id 6 only at padded positions
  Tape tape;
  nn::Context g(tape, ps);
  tape.backward(train::cross_entropy(m.forward(g, src, {3, 2}, kTgtIn).logits, kTargets));
  const Tensor& grad = ps.find("src_embed.weight")->grad;
  for (int64_t e = 0; e < 4; ++e) EXPECT_EQ(grad.data()[6 * 4 + e], 0.0f);
  EXPECT_NE(grad.data()[1 * 4], 0.0f);
}

// The RNN-attention overfit (the Transformer ones are in train_overfit_test.cpp): Bahdanau GRU and Luong LSTM drive a
// small padded batch to near-zero loss with AdamW and clipping.
TEST(TrainSeq2Seq, RnnAttentionOverfitsOneBatch) {
  const Ids src{{3, 4, 5, 6, 6, 5, 4, 0, 5, 3, 0, 0}, {3, 4}};
  const std::vector<int64_t> lengths{4, 3, 2};
  const Ids tgt_in{{1, 6, 5, 4, 3, 1, 4, 5, 6, 0, 1, 3, 5, 0, 0}, {3, 5}};
  const std::vector<int64_t> target{6, 5, 4, 3, 2, 4, 5, 6, 2, 0, 3, 5, 2, 0, 0};
  for (const Case& c : {Case{models::Seq2SeqAttention::kBahdanau, models::RnnCell::kGRU, 1},
                        Case{models::Seq2SeqAttention::kLuongGeneral, models::RnnCell::kLSTM, 1}}) {
    models::Seq2SeqConfig cfg = config_of(c);
    cfg.tgt_vocab = 7;
    cfg.embed_dim = 16;
    cfg.hidden_size = 32;
    cfg.attention_size = 16;
    Rng rng(9);
    models::Seq2Seq m(cfg, rng);
    ParameterSet ps(m);
    train::AdamOptions ao;
    ao.lr = 2e-2;
    ao.weight_decay = 0.0;
    train::AdamW opt(ps, ao);
    Tape tape;
    float loss = 0.0f;
    for (int step = 0; step < 150; ++step) {
      ps.zero_grad();
      tape.clear();
      nn::Context g(tape, ps);
      const Var l = train::cross_entropy(m.forward(g, src, lengths, tgt_in).logits, target,
                                         train::CrossEntropyOptions{0, 0.0f, train::Reduction::kMean});
      tape.backward(l);
      train::clip_grad_norm(ps, 1.0);
      opt.step();
      loss = l.value.item();
    }
    EXPECT_LT(loss, 0.05f) << static_cast<int>(c.attention);
  }
}

TEST(TrainSeq2Seq, BadInputsNameSeq2Seq) {
  Rng rng(5);
  models::Seq2Seq m(config_of(all_cases()[0]), rng);
  ParameterSet ps(m);
  Tape tape;
  nn::Context g(tape, ps);
  EXPECT_TRUE(ThrowsArg([&] { m.forward(g, kSrc, {1, 2, 3}, kTgtIn); }, "[Seq2Seq]"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(g, kSrc, {}, Ids{{1, 2}, {1, 2}}); }, "[Seq2Seq]"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(g, Ids{{}, {0, 3}}, {}, kTgtIn); }, "[Seq2Seq]"));
}

// --- train::TextModel: each kind is its model's forward and step model on the batch it describes ---------------

const data::Example kExA{{3, 4, 5}, {4, 3}}, kExB{{4, 3}, {5, 4, 3}};  // ids < 6: every vocabulary here

std::vector<std::vector<int64_t>> greedy_tokens(decode::StepModel& step) {
  std::vector<std::vector<int64_t>> out;
  for (decode::Hypothesis& h : decode::greedy_search(step, {5, data::Vocabulary::kBos, data::Vocabulary::kEos}))
    out.push_back(h.tokens);
  return out;
}

TEST(TextModel, RnnSeq2SeqReadsReversedSourcesWithEos) {
  train::TextModelConfig tc;
  tc.kind = train::TextModelKind::kRnnSeq2Seq;
  tc.rnn = config_of({models::Seq2SeqAttention::kBahdanau, models::RnnCell::kLSTM, 1});
  tc.reverse_source = true;
  tc.source_eos = true;
  Rng r1(8), r2(8);
  const std::unique_ptr<train::TextModel> tm = train::make_text_model(tc, r1);
  models::Seq2Seq ref(tc.rnn, r2);
  const data::Example ra{{5, 4, 3}, kExA.tgt}, rb{{3, 4}, kExB.tgt};
  const data::Seq2SeqBatch b = data::make_seq2seq_batch({&ra, &rb}, true);
  const train::TeacherForced tf = tm->teacher_forced(nn::Context(), {&kExA, &kExB});
  EXPECT_TRUE(testing::BitIdentical(tf.logits.value, ref.forward(b.src.ids, b.src.lengths, b.tgt_in.ids).logits));
  EXPECT_EQ(tf.targets, b.tgt_out.ids.data);
  EXPECT_EQ(tf.num_target_tokens, b.num_target_tokens);
  EXPECT_TRUE(tm->has_attention());
  decode::RnnStep ref_step(ref, b.src.ids, b.src.lengths);
  EXPECT_EQ(greedy_tokens(*tm->decoder({kExA.src, kExB.src})), greedy_tokens(ref_step));
}

// A decoder-only TextModel of width 8 over ids < 10.
train::TextModelConfig tiny_decoder(int64_t layers) {
  train::TextModelConfig dc;
  dc.kind = train::TextModelKind::kDecoderOnly;
  dc.decoder_only.vocab = 10;
  dc.decoder_only.max_len = 16;
  dc.decoder_only.num_layers = layers;
  dc.decoder_only.layer.d_model = 8;
  dc.decoder_only.layer.nhead = 2;
  dc.decoder_only.layer.dim_feedforward = 12;
  dc.decoder_only.layer.dropout = 0.0f;
  return dc;
}

TEST(TextModel, TransformerKindsForwardToTheirModels) {
  nn::TransformerLayerConfig layer;
  layer.d_model = 8;
  layer.nhead = 2;
  layer.dim_feedforward = 12;
  layer.dropout = 0.0f;
  train::TextModelConfig tc;
  tc.kind = train::TextModelKind::kTransformerSeq2Seq;
  tc.transformer.src_vocab = 10;
  tc.transformer.tgt_vocab = 10;
  tc.transformer.transformer.layer = layer;
  tc.transformer.transformer.num_encoder_layers = 1;
  tc.transformer.transformer.num_decoder_layers = 1;
  tc.mask_target_padding = true;
  Rng r1(9), r2(9);
  const std::unique_ptr<train::TextModel> tm = train::make_text_model(tc, r1);
  models::Seq2SeqTransformer ref(tc.transformer, r2);
  const data::Seq2SeqBatch b = data::make_seq2seq_batch({&kExA, &kExB});
  models::Seq2SeqMasks masks;
  masks.src.key_padding_mask = b.src.padding_mask;
  masks.memory.key_padding_mask = b.src.padding_mask;
  masks.tgt.key_padding_mask = b.tgt_in.padding_mask;
  const train::TeacherForced tf = tm->teacher_forced(nn::Context(), {&kExA, &kExB});
  EXPECT_TRUE(testing::BitIdentical(tf.logits.value, ref.forward(b.src.ids, b.tgt_in.ids, masks)));
  EXPECT_EQ(tf.targets, b.tgt_out.ids.data);
  decode::CachedStep ref_step = decode::cached_step(ref, b.src.ids, data::Vocabulary::kPad);
  EXPECT_EQ(greedy_tokens(*tm->decoder({kExA.src, kExB.src})), greedy_tokens(ref_step));

  train::TextModelConfig dc = tiny_decoder(1);
  Rng r3(10), r4(10);
  const std::unique_ptr<train::TextModel> lm = train::make_text_model(dc, r3);
  models::DecoderOnlyTransformer ref_lm(dc.decoder_only, r4);
  const data::LmBatch lb = data::make_lm_batch({&kExA, &kExB});
  const train::TeacherForced lt = lm->teacher_forced(nn::Context(), {&kExA, &kExB});
  EXPECT_TRUE(testing::BitIdentical(lt.logits.value, ref_lm.forward(lb.input.ids)));
  EXPECT_EQ(lt.targets, lb.targets);
  dc.reverse_source = true;
  Rng r5(11);
  EXPECT_TRUE(ThrowsArg([&] { train::make_text_model(dc, r5); }, "[TextModel]"));
}

// The Llama kind forwards to its model and reports attention: forced_attention through its decoder (sources of two
// lengths, left-padded in one KV cache) is the full forward's last layer, heads averaged, over each source.
TEST(TextModel, LlamaForwardsToItsModelAndReportsItsLastLayersAttention) {
  train::TextModelConfig tc;
  tc.kind = train::TextModelKind::kLlama;
  tc.llama = testing::tiny_gqa_llama(false);
  Rng r1(13), r2(13);
  const std::unique_ptr<train::TextModel> tm = train::make_text_model(tc, r1);
  const models::LlamaForCausalLM ref(tc.llama, r2);
  const data::LmBatch lb = data::make_lm_batch({&kExA, &kExB});
  const train::TeacherForced tf = tm->teacher_forced(nn::Context(), {&kExA, &kExB});
  EXPECT_TRUE(testing::BitIdentical(tf.logits.value, ref.logits(lb.input.ids)));
  EXPECT_EQ(tf.targets, lb.targets);
  ASSERT_TRUE(tm->has_attention());
  const std::vector<std::vector<int64_t>> sources = {{3, 5, 9, 2}, {4, 7}}, tokens = {{6, 11, 2}, {9, 13, 5, 2}};
  models::ForwardOptions o;
  o.output_attentions = true;
  o.attention_layers = {1};
  const auto last_layer = [&](const Ids& ids) { return ref.forward(ids, o).attentions.back(); };
  const std::vector<Tensor> want =
      testing::prompt_attention_oracle(last_layer, sources, tokens, data::Vocabulary::kBos);
  const std::vector<Tensor> got = decode::forced_attention(*tm->decoder(sources), tokens, data::Vocabulary::kBos);
  ASSERT_EQ(got.size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    ASSERT_EQ(got[s].shape(), (Shape{static_cast<int64_t>(tokens[s].size()), 4})) << s;
    EXPECT_TRUE(AllClose(got[s], want[s], testing::Tol{1e-5, 1e-4})) << "source " << s;
  }
}

// Context parallelism in a group of one (what every rank's forward does, with the ring reduced to one block): the
// batch is right-padded to the shard's even length and the model runs on global positions through the ring; the
// real positions' logits, the loss and every gradient equal the plain forward's, and the padding's targets are PAD.
TEST(TextModel, DecoderOnlyUnderASequenceShardEqualsThePlainForward) {
  const train::TextModelConfig dc = tiny_decoder(2);
  Rng rng(12);
  const std::unique_ptr<train::TextModel> lm = train::make_text_model(dc, rng);
  const train::ContextParallel cp(parallel::Communicator::world());
  ASSERT_EQ(parallel::Communicator::world().size(), 1);
  const data::Example ea{{3, 4, 5}, {4, 3, 5}}, eb{{4, 3}, {5, 4}};  // 7 and 5 tokens: odd, so the shard pads
  const data::LmBatch lb = data::make_lm_batch({&ea, &eb});
  const int64_t B = lb.input.ids.shape[0], T = lb.input.ids.shape[1], P = cp.padded_length(T);
  ASSERT_EQ(T, 7);
  ASSERT_EQ(P, 8);
  ParameterSet params(lm->module());
  std::vector<Tensor> grads[2];
  double loss[2];
  for (int sharded = 0; sharded < 2; ++sharded) {
    params.zero_grad();
    Tape tape;
    nn::Context c(tape, params);
    if (sharded == 1) c.set_sequence_shard(&cp);
    const train::TeacherForced tf = lm->teacher_forced(c, {&ea, &eb});
    const int64_t L = sharded == 1 ? P : T;
    ASSERT_EQ(tf.logits.shape(), (Shape{B, L, 10}));
    ASSERT_EQ(static_cast<int64_t>(tf.targets.size()), B * L);
    for (int64_t r = 0; r < B; ++r)
      for (int64_t j = 0; j < L; ++j)
        EXPECT_EQ(tf.targets[static_cast<size_t>(r * L + j)],
                  j < T ? lb.targets[static_cast<size_t>(r * T + j)] : data::Vocabulary::kPad);
    EXPECT_EQ(tf.num_target_tokens, lb.num_target_tokens);
    train::CrossEntropyOptions ce;
    ce.ignore_index = data::Vocabulary::kPad;
    const Var l = train::cross_entropy(tf.logits, tf.targets, ce);
    loss[sharded] = l.value.item();
    tape.backward(l);
    for (size_t i = 0; i < params.size(); ++i) grads[sharded].push_back(params[i].grad.clone());
    if (sharded == 1) {  // the real positions' logits
      const Tensor real = tf.logits.value.slice(1, 0, T).contiguous();
      EXPECT_TRUE(AllClose(real, lm->teacher_forced(nn::Context(), {&ea, &eb}).logits.value, kSameOps));
    }
  }
  EXPECT_NEAR(loss[1], loss[0], 1e-6 * std::fabs(loss[0]));
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(AllClose(grads[1][i], grads[0][i], kSameOps)) << i;
}

}  // namespace
}  // namespace qkv
