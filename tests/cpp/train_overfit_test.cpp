// Overfit tests: the whole training loop (tape forward, cross-entropy with padding, backward, clipping, AdamW with
// a schedule) drives one small batch to near-zero loss for the encoder-decoder and the decoder-only Transformer.
// The RNN-attention overfit lives in train_seq2seq_test.cpp.
#include <gtest/gtest.h>

#include <vector>

#include "qkv/models/transformer.h"
#include "qkv/nn/context.h"
#include "qkv/train/loss.h"
#include "qkv/train/optim.h"
#include "qkv/train/schedule.h"

namespace qkv {
namespace {

using ad::ParameterSet;
using ad::Tape;

// Near zero for a memorised batch (the start is about log(V) ≈ 2.5).
constexpr float kOverfitLoss = 0.05f;

// Runs `steps` AdamW steps (warmup + cosine, clipping at 1) of loss_fn; returns the last loss.
template <class LossFn>
float train_steps(nn::Module& model, int steps, LossFn&& loss_fn) {
  ParameterSet params(model);
  train::AdamOptions ao;
  ao.weight_decay = 0.0;
  train::AdamW opt(params, ao);
  Tape tape;
  Rng dropout(1);
  float last = 0.0f;
  for (int step = 1; step <= steps; ++step) {
    opt.set_lr(train::warmup_cosine_lr(step, 1e-2, 10, steps, 1e-3));
    params.zero_grad();
    tape.clear();
    nn::Context g(tape, params, &dropout);
    const ad::Var loss = loss_fn(g);
    tape.backward(loss);
    train::clip_grad_norm(params, 1.0);
    opt.step();
    last = loss.value.item();
  }
  return last;
}

TEST(Overfit, EncoderDecoderTransformerMemorisesABatch) {
  models::TransformerSeq2SeqConfig c;
  c.src_vocab = 12;
  c.tgt_vocab = 12;
  c.transformer.layer.d_model = 32;
  c.transformer.layer.nhead = 4;
  c.transformer.layer.dim_feedforward = 64;
  c.transformer.layer.dropout = 0.0f;
  c.transformer.num_encoder_layers = 1;
  c.transformer.num_decoder_layers = 1;
  Rng rng(7);
  models::Seq2SeqTransformer m(c, rng);
  // A fixed batch of 4 rows (pad 0, bos 1, eos 2); targets are tgt_in shifted left plus eos; the last row is
  // shorter (padding in src and tgt, ignored by the loss).
  const Ids src{{3, 4, 5, 6, 7, 8, 9, 10, 11, 3, 5, 7, 4, 6, 8, 10, 9, 11, 0, 0}, {4, 5}};
  const Ids tgt_in{{1, 7, 6, 5, 4, 3, 1, 11, 10, 9, 8, 3, 1, 10, 8, 6, 4, 7, 1, 11, 9, 0, 0, 0}, {4, 6}};
  const std::vector<int64_t> target{7, 6, 5, 4, 3, 2, 11, 10, 9, 8, 3, 2, 10, 8, 6, 4, 7, 2, 11, 9, 2, 0, 0, 0};
  models::Seq2SeqMasks masks;
  masks.src.key_padding_mask = models::padding_mask(src, 0);
  masks.memory.key_padding_mask = masks.src.key_padding_mask;
  train::CrossEntropyOptions ce;
  ce.ignore_index = 0;
  const float loss = train_steps(m, 120, [&](nn::Context& g) {
    return train::cross_entropy(m.forward(g, src, tgt_in, masks), target, ce);
  });
  EXPECT_LT(loss, kOverfitLoss);
}

TEST(Overfit, DecoderOnlyTransformerMemorisesABatch) {
  models::DecoderOnlyConfig c;
  c.vocab = 10;
  c.max_len = 8;
  c.num_layers = 2;
  c.layer.d_model = 32;
  c.layer.nhead = 4;
  c.layer.dim_feedforward = 64;
  c.layer.dropout = 0.0f;
  Rng rng(8);
  models::DecoderOnlyTransformer m(c, rng);
  // Rows start with different tokens, so every next token is a function of its prefix (zero loss is reachable).
  const Ids ids{{1, 3, 5, 7, 9, 2, 4, 6, 8, 9, 8, 7, 6, 5, 4, 3, 2, 2, 3, 3, 4, 4, 5, 5}, {3, 8}};
  std::vector<int64_t> target;
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t t = 0; t < 8; ++t) target.push_back(t + 1 < 8 ? ids.data[b * 8 + t + 1] : -100);
  const float loss =
      train_steps(m, 120, [&](nn::Context& g) { return train::cross_entropy(m.forward(g, ids), target); });
  EXPECT_LT(loss, kOverfitLoss);
}

}  // namespace
}  // namespace qkv
