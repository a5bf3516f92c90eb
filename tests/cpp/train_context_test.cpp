// Tests of the modules on a training Context (recorded on the tape) and of the trainable models: tape forwards equal
// the inference forwards, GRU/LSTM through time match a float64 twin's finite differences (batch-first and
// time-major), and model gradients pass spot checks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "grad_testing.h"
#include "nn_testing.h"
#include "qkv/models/transformer.h"
#include "qkv/nn/multihead_attention.h"
#include "qkv/nn/positional/t5_bias.h"
#include "qkv/nn/rnn.h"
#include "qkv/nn/transformer.h"
#include "qkv/ops/functional.h"
#include "qkv/train/loss.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::randn;
using testing::ThrowsArg;
using nn::Context;
using ad::ParameterSet;
using ad::Tape;
using ad::Var;
using DVec = std::vector<double>;
using DIn = std::vector<DVec>;

// Tape forward against the module's forward: the same ops in the same order (bit-identical in practice; the
// tolerance only allows for a different but equivalent BLAS call order).
constexpr testing::Tol kSameOps{1e-6, 1e-5};

Tensor block_mask_row(int64_t B, int64_t T, int64_t pad_from) {
  Tensor m = Tensor::zeros({B, T});
  for (int64_t t = pad_from; t < T; ++t) m.data()[(B - 1) * T + t] = 1.0f;  // last row padded from pad_from
  return m;
}

// A layer of width 8, 2 heads, feed-forward 16.
nn::TransformerLayerConfig small_layer(float dropout) {
  nn::TransformerLayerConfig c;
  c.d_model = 8;
  c.nhead = 2;
  c.dim_feedforward = 16;
  c.dropout = dropout;
  return c;
}

TEST(TrainingContext, MultiheadAttentionMatchesModuleForEveryProjectionLayout) {
  Rng rng(1);
  nn::MultiheadAttention packed(8, 2, rng), separate(8, 2, rng, 0.0f, true, 6, 5);
  testing::randomize_parameters(packed, 2);
  testing::randomize_parameters(separate, 3);
  const Tensor x = randn({2, 4, 8}, 4), mem = randn({2, 5, 8}, 5), k6 = randn({2, 5, 6}, 6), v5 = randn({2, 5, 5}, 7);
  nn::MhaForwardOptions o;
  o.need_weights = false;
  o.key_padding_mask = block_mask_row(2, 4, 3);
  o.is_causal = true;
  ParameterSet pp(packed), ps(separate);
  Tape tape;
  Context g(tape, pp), gs(tape, ps);
  EXPECT_TRUE(AllClose(packed.forward(g, x, x, x, o).out.value, packed.forward(x, x, x, o).out.value, kSameOps));
  nn::MhaForwardOptions cross;
  cross.need_weights = false;
  cross.key_padding_mask = block_mask_row(2, 5, 2);
  EXPECT_TRUE(AllClose(packed.forward(g, x, mem, mem, cross).out.value,
                       packed.forward(x, mem, mem, cross).out.value, kSameOps));
  EXPECT_TRUE(AllClose(packed.forward(g, x, mem, randn({2, 5, 8}, 8), cross).out.value,
                       packed.forward(x, mem, randn({2, 5, 8}, 8), cross).out.value, kSameOps));
  EXPECT_TRUE(AllClose(separate.forward(gs, x, k6, v5, cross).out.value,
                       separate.forward(x, k6, v5, cross).out.value, kSameOps));
  const Tensor u = randn({4, 8}, 9);  // unbatched
  nn::MhaForwardOptions plain;
  plain.need_weights = false;
  EXPECT_TRUE(AllClose(packed.forward(g, u, u, u, plain).out.value, packed.forward(u, u, u, plain).out.value,
                       kSameOps));
}

TEST(TrainingContext, MultiheadAttentionErrorsNameTheModule) {
  Rng rng(1);
  nn::MultiheadAttention m(8, 2, rng);
  ParameterSet ps(m);
  Tape tape;
  Context g(tape, ps);
  const Tensor x = randn({2, 4, 8}, 1);
  EXPECT_TRUE(ThrowsArg([&] { m.forward(g, x, x, randn({2, 4, 7}, 2)); }, "[MultiheadAttention]"));
  nn::MhaForwardOptions o;
  o.key_padding_mask = Tensor::zeros({2, 5});
  EXPECT_TRUE(ThrowsArg([&] { m.forward(g, x, x, x, o); }, "[MultiheadAttention]"));
  Rng rng2(2);
  nn::MultiheadAttention drop(8, 2, rng2, 0.5f);
  ParameterSet pd(drop);
  Context gd(tape, pd);  // no dropout Rng
  EXPECT_TRUE(ThrowsArg([&] { drop.forward(gd, x, x, x); }, "[MultiheadAttention]"));
}

TEST(TrainingContext, MultiheadAttentionTrainsAT5BiasTable) {
  // A T5 table on the tape: the same forward as handing its bias to the module as a constant, and the table's
  // gradient matches central differences of the float32 loss (the bias enters linearly before the softmax).
  Rng rng(21);
  nn::MultiheadAttention m(8, 2, rng);
  testing::randomize_parameters(m, 22);
  nn::T5RelativeBias t5(8, 16, 2, true, rng, 0.5f);
  const Tensor x = randn({2, 5, 8}, 23), r = randn({2, 5, 8}, 24);
  nn::MhaForwardOptions o;
  o.need_weights = false;
  o.is_causal = true;
  nn::MhaForwardOptions with_bias = o;
  with_bias.attn_bias = t5.forward(5, 5);
  ParameterSet ps(m);
  ps.add("relative_attention_bias.weight", &t5.weight);
  auto loss = [&](bool backward) {
    Tape tape;
    Context g(tape, ps);
    const Var bias = ad::t5_bias(g.param(t5.weight), 5, 5, true, 16);
    const Var out = m.forward(g, x, x, x, o, bias).out;
    const Var l = ad::sum(ad::mul(out, Var(r)));
    if (backward) tape.backward(l);
    return std::make_pair(out.value, static_cast<double>(l.value.item()));
  };
  ps.zero_grad();
  EXPECT_TRUE(AllClose(loss(true).first, m.forward(x, x, x, with_bias).out.value, kSameOps));
  const ad::Parameter& table = *ps.find("relative_attention_bias.weight");
  ASSERT_TRUE(table.has_grad);
  const Tensor grad = table.grad.clone();
  for (int64_t e = 0; e < t5.weight.numel(); ++e) {
    float* w = t5.weight.data() + e;
    const float keep = *w, h = 1e-2f;
    *w = keep + h;
    const double lp = loss(false).second;
    *w = keep - h;
    const double lm = loss(false).second;
    *w = keep;
    const double fd = (lp - lm) / (2.0 * h);
    EXPECT_NEAR(grad.data()[e], fd, 1e-3 + 2e-2 * std::fabs(fd)) << e;
  }
}

TEST(TrainingContext, EncoderAndDecoderLayersMatchModulesPreAndPostLN) {
  for (int mode : {0, 1, 2}) {  // post-LN ReLU, post-LN GELU (both fused epilogues), pre-LN GELU
    const bool pre = mode == 2;
    nn::TransformerLayerConfig c = small_layer(0.0f);
    c.norm_first = pre;
    c.activation = mode == 0 ? nn::Activation::kRelu : nn::Activation::kGelu;
    Rng rng(10);
    nn::TransformerEncoderLayer enc(c, rng);
    nn::TransformerDecoderLayer dec(c, rng);
    testing::randomize_parameters(enc, 11);
    testing::randomize_parameters(dec, 12);
    const Tensor src = randn({2, 5, 8}, 13), tgt = randn({2, 3, 8}, 14);
    nn::AttentionMasks sm;
    sm.key_padding_mask = block_mask_row(2, 5, 3);
    nn::AttentionMasks tm;
    tm.is_causal = true;
    ParameterSet pe(enc), pd(dec);
    Tape tape;
    Context ge(tape, pe), gd(tape, pd);
    EXPECT_TRUE(AllClose(enc.forward(ge, src, sm).value, enc.forward(src, sm), kSameOps)) << pre;
    EXPECT_TRUE(AllClose(dec.forward(gd, tgt, src, tm, sm).value, dec.forward(tgt, src, tm, sm), kSameOps))
        << pre;
  }
}

// Packed (N, E) input with cu_seqlens against each sequence alone through the padded (1, T, E) path: the same
// rows in inference, and on a tape the same outputs and gradients (input and every parameter), post-LN with GELU
// (the fused epilogues) and pre-LN with ReLU and a final norm, for a two-layer stack.
TEST(TrainingContext, PackedEncoderMatchesEachSequenceAlone) {
  const std::vector<int64_t> lengths{3, 1, 5};
  nn::AttentionMasks pm;
  pm.cu_seqlens = {0, 3, 4, 9};
  for (bool pre : {false, true}) {
    nn::TransformerLayerConfig c = small_layer(0.0f);
    c.norm_first = pre;
    c.activation = pre ? nn::Activation::kRelu : nn::Activation::kGelu;
    Rng rng(80);
    nn::TransformerEncoder enc(c, 2, pre, rng);
    testing::randomize_parameters(enc, 81);
    const Tensor src = randn({9, 8}, 82);
    const Tensor packed = enc.forward(src, pm);
    ASSERT_EQ(packed.shape(), src.shape());
    for (int64_t b = 0, a = 0; b < 3; a += lengths[b], ++b) {
      const Tensor alone = enc.forward(src.slice(0, a, a + lengths[b]).unsqueeze(0)).squeeze(0);
      EXPECT_TRUE(AllClose(packed.slice(0, a, a + lengths[b]), alone, testing::kFloatReorder)) << pre << b;
    }
    ParameterSet p1(enc), p2(enc);
    Tape t1, t2;
    Context g1(t1, p1), g2(t2, p2);
    const Var x1 = t1.leaf(src), x2 = t2.leaf(src);
    const Var o1 = enc.forward(g1, x1, pm);
    std::vector<Var> outs;
    for (int64_t b = 0, a = 0; b < 3; a += lengths[b], ++b)
      outs.push_back(ad::squeeze(enc.forward(g2, ad::unsqueeze(ad::slice(x2, 0, a, a + lengths[b]), 0)), 0));
    const Var o2 = ad::concat(outs, 0);
    EXPECT_TRUE(AllClose(o1.value, o2.value, testing::kFloatReorder)) << pre;
    const Tensor r = randn(o1.shape(), 83);
    t1.backward(o1, r);
    t2.backward(o2, r);
    EXPECT_TRUE(AllClose(x1.grad(), x2.grad(), testing::kFloatReorder)) << pre;
    for (size_t i = 0; i < p1.size(); ++i) {
      ASSERT_TRUE(p1[i].has_grad && p2[i].has_grad) << p1[i].name;
      EXPECT_TRUE(AllClose(p1[i].grad, p2[i].grad, testing::kFloatReorder)) << pre << " " << p1[i].name;
    }
  }
}

TEST(TrainingContext, PackedInputErrorsNameTheModule) {
  nn::TransformerLayerConfig c = small_layer(0.1f);
  Rng rng(90);
  nn::TransformerEncoderLayer enc(c, rng);
  enc.eval();
  nn::AttentionMasks pm;
  pm.cu_seqlens = {0, 2, 5};
  EXPECT_TRUE(ThrowsArg([&] { enc.forward(randn({1, 5, 8}, 1), pm); }, "[TransformerEncoderLayer] packed src"));
  nn::AttentionMasks with_padding = pm;
  with_padding.key_padding_mask = Tensor::zeros({2, 5});
  EXPECT_TRUE(ThrowsArg([&] { enc.forward(randn({5, 8}, 1), with_padding); }, "[MultiheadAttention] packed input"));
  pm.cu_seqlens = {0, 2, 4};
  EXPECT_TRUE(ThrowsArg([&] { enc.forward(randn({5, 8}, 1), pm); }, "[attention_varlen]"));
  enc.train();  // attention-weight dropout cannot run on packed rows
  pm.cu_seqlens = {0, 2, 5};
  EXPECT_TRUE(ThrowsArg([&] { enc.forward(randn({5, 8}, 1), pm); }, "[MultiheadAttention] packed input"));
}

TEST(TrainingContext, TransformerModelsMatchTheirForwards) {
  models::TransformerSeq2SeqConfig sc;
  sc.src_vocab = 7;
  sc.tgt_vocab = 6;
  sc.transformer.layer.d_model = 8;
  sc.transformer.layer.nhead = 2;
  sc.transformer.layer.dim_feedforward = 16;
  sc.transformer.layer.dropout = 0.0f;
  sc.transformer.num_encoder_layers = 2;
  sc.transformer.num_decoder_layers = 1;
  Rng rng(20);
  models::Seq2SeqTransformer s2s(sc, rng);
  const Ids src{{1, 2, 3, 4, 5, 6, 1, 0, 0, 0}, {2, 5}}, tgt{{1, 2, 3, 4, 5, 0}, {2, 3}};
  models::Seq2SeqMasks masks;
  masks.src.key_padding_mask = models::padding_mask(src, 0);
  masks.memory.key_padding_mask = masks.src.key_padding_mask;
  ParameterSet ps(s2s);
  Tape tape;
  Context g(tape, ps);
  EXPECT_TRUE(AllClose(s2s.forward(g, src, tgt, masks).value, s2s.forward(src, tgt, masks),
                       kSameOps));

  models::DecoderOnlyConfig dc;
  dc.vocab = 9;
  dc.max_len = 8;
  dc.num_layers = 2;
  dc.layer.d_model = 8;
  dc.layer.nhead = 2;
  dc.layer.dim_feedforward = 16;
  dc.layer.dropout = 0.0f;
  models::DecoderOnlyTransformer lm(dc, rng);
  const Ids ids{{1, 2, 3, 4, 5, 8, 7, 6, 5, 0}, {2, 5}};
  ParameterSet pl(lm);
  Context gl(tape, pl);
  EXPECT_TRUE(AllClose(lm.forward(gl, ids, block_mask_row(2, 5, 4)).value,
                       lm.forward(ids, block_mask_row(2, 5, 4)), kSameOps));
  EXPECT_TRUE(ThrowsArg([&] { lm.forward(gl, Ids{std::vector<int64_t>(9, 1), {1, 9}}); },
                        "[DecoderOnlyTransformer]"));
}

TEST(TrainingContext, DropoutFollowsModuleModeAndTheContextRng) {
  models::DecoderOnlyConfig dc;
  dc.vocab = 5;
  dc.max_len = 6;
  dc.num_layers = 1;
  dc.layer.d_model = 8;
  dc.layer.nhead = 2;
  dc.layer.dim_feedforward = 16;
  dc.layer.dropout = 0.2f;
  Rng rng(30);
  models::DecoderOnlyTransformer lm(dc, rng);
  const Ids ids{{1, 2, 3, 4, 0, 1}, {2, 3}};
  ParameterSet ps(lm);
  auto run = [&](uint64_t seed) {
    Tape tape;
    Rng drop(seed);
    Context g(tape, ps, &drop);
    return lm.forward(g, ids).value;
  };
  lm.eval();
  EXPECT_TRUE(AllClose(run(1), lm.forward(ids), kSameOps));
  lm.train();
  const Tensor a = run(5), b = run(5), c = run(6);
  EXPECT_TRUE(testing::BitIdentical(a, b));
  EXPECT_FALSE(AllClose(a, c, kSameOps));
  Tape tape;
  Context no_rng(tape, ps);
  EXPECT_TRUE(ThrowsArg([&] { lm.forward(no_rng, ids); }, "dropout"));
}

TEST(TrainingContext, LayerErrorsNameTheModule) {
  nn::TransformerLayerConfig c = small_layer(0.0f);
  Rng rng(70);
  nn::TransformerEncoderLayer enc(c, rng);
  nn::TransformerDecoderLayer dec(c, rng);
  nn::LayerNorm ln(8);
  nn::GRU gru(3, 4, rng);
  ParameterSet pe(enc), pd(dec), pg(gru);
  Tape tape;
  Context ge(tape, pe), gd(tape, pd), gg(tape, pg);
  EXPECT_TRUE(ThrowsArg([&] { enc.forward(ge, randn({2, 3, 6}, 1)); }, "[TransformerEncoderLayer]"));
  EXPECT_TRUE(ThrowsArg([&] { dec.forward(gd, randn({2, 3, 8}, 1), randn({3, 4, 8}, 2)); },
                        "[TransformerDecoderLayer]"));
  EXPECT_TRUE(ThrowsArg([&] { ln.forward(ge, randn({2, 7}, 1)); }, "[LayerNorm]"));
  EXPECT_TRUE(ThrowsArg([&] { gru.forward(gg, randn({2, 5, 4}, 1)); }, "[GRU]"));
  EXPECT_TRUE(ThrowsArg([&] { gru.forward(gg, randn({2, 5, 3}, 1), randn({1, 3, 4}, 2)); }, "[GRU]"));
  EXPECT_TRUE(ThrowsArg([&] { gru.forward_any(gg, randn({2, 5, 3}, 1), {}, randn({1, 2, 4}, 2)); }, "[GRU]"));
  EXPECT_TRUE(ThrowsArg([&] { nn::rnn_layers(5, {}, randn({2, 5, 3}, 1), Var(), Var(), {}); }, "[rnn_layers]"));
  EXPECT_TRUE(ThrowsArg([&] { gg.dropout(randn({2, 2}, 1), 0.5f, true); }, "[Dropout]"));
}

// --- GRU / LSTM through time ---------------------------------------------------------------------------------

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Multi-layer GRU/LSTM twin. in = {x (B,T,E), h0 (L,B,H), [c0], then per layer w_ih, w_hh, b_ih, b_hh}.
// Returns [output (B,T,H) ; h_n (L,B,H) (; c_n)].
DVec rnn_twin(const DIn& in, int gates, int64_t B, int64_t T, int64_t E, int64_t H, int64_t L,
              const std::vector<int64_t>& lengths) {
  const bool lstm = gates == 4;
  const size_t w0 = lstm ? 3 : 2;
  DVec x = in[0];
  int64_t ein = E;
  DVec hn, cn;
  for (int64_t l = 0; l < L; ++l) {
    const DVec &wih = in[w0 + 4 * l], &whh = in[w0 + 4 * l + 1], &bih = in[w0 + 4 * l + 2], &bhh = in[w0 + 4 * l + 3];
    DVec h(in[1].begin() + l * B * H, in[1].begin() + (l + 1) * B * H);
    DVec c = lstm ? DVec(in[2].begin() + l * B * H, in[2].begin() + (l + 1) * B * H) : DVec();
    DVec out(static_cast<size_t>(B * T * H), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      DVec nh = h, nc = c;
      for (int64_t b = 0; b < B; ++b) {
        if (!lengths.empty() && t >= lengths[b]) continue;
        for (int64_t j = 0; j < H; ++j) {
          double gi[4], gh[4];
          for (int g = 0; g < gates; ++g) {
            double si = bih[g * H + j], sh = bhh[g * H + j];
            for (int64_t k = 0; k < ein; ++k) si += wih[(g * H + j) * ein + k] * x[(b * T + t) * ein + k];
            for (int64_t k = 0; k < H; ++k) sh += whh[(g * H + j) * H + k] * h[b * H + k];
            gi[g] = si;
            gh[g] = sh;
          }
          if (!lstm) {
            const double r = sig(gi[0] + gh[0]), z = sig(gi[1] + gh[1]), n = std::tanh(gi[2] + r * gh[2]);
            nh[b * H + j] = (1 - z) * n + z * h[b * H + j];
          } else {
            const double ig = sig(gi[0] + gh[0]), fg = sig(gi[1] + gh[1]), gg = std::tanh(gi[2] + gh[2]),
                         og = sig(gi[3] + gh[3]);
            nc[b * H + j] = fg * c[b * H + j] + ig * gg;
            nh[b * H + j] = og * std::tanh(nc[b * H + j]);
          }
          out[(b * T + t) * H + j] = nh[b * H + j];
        }
      }
      h = nh;
      c = nc;
    }
    hn.insert(hn.end(), h.begin(), h.end());
    cn.insert(cn.end(), c.begin(), c.end());
    x = out;
    ein = H;
  }
  DVec res = x;
  res.insert(res.end(), hn.begin(), hn.end());
  if (lstm) res.insert(res.end(), cn.begin(), cn.end());
  return res;
}

// batch_first false: the same sequences time-major, (T, B, E) in and (T, B, H) out.
void rnn_through_time(int gates, bool batch_first) {
  const int64_t B = 3, T = 4, E = 3, H = 2, L = 2;
  const std::vector<int64_t> lengths{4, 2, 3};
  std::vector<Tensor> xs{randn({B, T, E}, 40), randn({L, B, H}, 41)};
  if (gates == 4) xs.push_back(randn({L, B, H}, 42));
  for (int64_t l = 0; l < L; ++l) {
    const int64_t in = l == 0 ? E : H;
    xs.push_back(randn({gates * H, in}, 43 + 4 * l, 0.6f));
    xs.push_back(randn({gates * H, H}, 44 + 4 * l, 0.6f));
    xs.push_back(randn({gates * H}, 45 + 4 * l, 0.3f));
    xs.push_back(randn({gates * H}, 46 + 4 * l, 0.3f));
  }
  const size_t w0 = gates == 4 ? 3 : 2;
  auto f = [&](const std::vector<Var>& v) {
    std::vector<nn::RnnLayerVars> layers;
    for (int64_t l = 0; l < L; ++l) layers.push_back({v[w0 + 4 * l], v[w0 + 4 * l + 1], v[w0 + 4 * l + 2], v[w0 + 4 * l + 3]});
    const Var x = batch_first ? v[0] : ad::transpose(v[0], 0, 1);
    nn::RnnVars r = nn::rnn_layers(gates, layers, x, v[1], gates == 4 ? v[2] : Var(), lengths, batch_first);
    const Var out = batch_first ? r.output : ad::transpose(r.output, 0, 1);
    std::vector<Var> parts{ad::reshape(out, {-1}), ad::reshape(r.h_n, {-1})};
    if (gates == 4) parts.push_back(ad::reshape(r.c_n, {-1}));
    return ad::concat(parts, 0);
  };
  EXPECT_TRUE(testing::GradsMatchTwin(f, [&](const DIn& in) { return rnn_twin(in, gates, B, T, E, H, L, lengths); },
                                      xs, 47, testing::kChainGradTol));
}

TEST(TrainingContextRnn, GruThroughTimeWithLengthsMatchesFiniteDifferences) {
  rnn_through_time(3, true);
  rnn_through_time(3, false);
}
TEST(TrainingContextRnn, LstmThroughTimeWithLengthsMatchesFiniteDifferences) {
  rnn_through_time(4, true);
  rnn_through_time(4, false);
}

TEST(TrainingContextRnn, LayersMatchModuleForwardsBatchFirstAndNot) {
  for (bool bf : {true, false}) {
    Rng rng(50);
    nn::RnnOptions o;
    o.num_layers = 2;
    o.batch_first = bf;
    nn::GRU gru(3, 4, rng, o);
    nn::LSTM lstm(3, 4, rng, o);
    const Tensor x = bf ? randn({2, 5, 3}, 51) : randn({5, 2, 3}, 51);
    const Tensor h0 = randn({2, 2, 4}, 52), c0 = randn({2, 2, 4}, 53);
    const std::vector<int64_t> lengths{5, 3};
    ParameterSet pg(gru), pl(lstm);
    Tape tape;
    Context gg(tape, pg), gl(tape, pl);
    const nn::RnnOutput rg = gru.forward(x, h0, lengths), rl = lstm.forward(x, h0, c0, lengths);
    const nn::RnnVars vg = gru.forward(gg, x, h0, lengths), vl = lstm.forward(gl, x, h0, c0, lengths);
    // Same values (the tape zeroes padded outputs by a multiply, so -0 may stand for 0).
    EXPECT_TRUE(AllClose(vg.output.value, rg.output, testing::kExact)) << bf;
    EXPECT_TRUE(AllClose(vg.h_n.value, rg.h_n, testing::kExact)) << bf;
    EXPECT_TRUE(AllClose(vl.output.value, rl.output, testing::kExact)) << bf;
    EXPECT_TRUE(AllClose(vl.c_n.value, rl.c_n, testing::kExact)) << bf;
    EXPECT_TRUE(ThrowsArg([&] { lstm.forward(gl, x, h0, Var(), lengths); }, "[LSTM]"));
    EXPECT_TRUE(ThrowsArg([&] { gru.forward(gg, x, h0, {1, 2, 3}); }, "[GRU]"));
  }
}

// --- gradient spot checks through whole models ----------------------------------------------------------------

// Central differences of the float32 loss (step h on single parameter entries) against the tape's gradient.
// Loose by necessity (float32 loss); any wiring mistake shows up as an O(1) relative error.
constexpr testing::Tol kSpotTol{2e-4, 3e-2};

::testing::AssertionResult SpotCheck(nn::Module& model, const std::function<Var(Context&)>& loss_fn, uint64_t seed,
                                     int samples_per_param = 2, float h = 1e-2f) {
  ParameterSet ps(model);
  ps.zero_grad();
  {
    Tape tape;
    Context g(tape, ps);
    tape.backward(loss_fn(g));
  }
  auto loss_at = [&]() {
    Tape tape;
    Context g(tape, ps);
    return static_cast<double>(loss_fn(g).value.item());
  };
  Rng pick(seed);
  for (size_t i = 0; i < ps.size(); ++i) {
    ad::Parameter& p = ps[i];
    if (!p.has_grad) return ::testing::AssertionFailure() << p.name << " got no gradient";
    for (int s = 0; s < samples_per_param; ++s) {
      const int64_t e = static_cast<int64_t>(pick.below(static_cast<uint64_t>(p.value->numel())));
      float* w = p.value->data() + e;
      const float keep = *w;
      *w = keep + h;
      const double lp = loss_at();
      *w = keep - h;
      const double lm = loss_at();
      *w = keep;
      const double fd = (lp - lm) / (2.0 * h);
      const double an = p.grad.data()[e];
      if (std::fabs(an - fd) > kSpotTol.atol + kSpotTol.rtol * std::max(std::fabs(fd), 1e-2))
        return ::testing::AssertionFailure() << p.name << "[" << e << "]: tape " << an << " vs difference " << fd;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(TrainingContextModels, Seq2SeqTransformerGradientSpotCheck) {
  models::TransformerSeq2SeqConfig sc;
  sc.src_vocab = 6;
  sc.tgt_vocab = 5;
  sc.transformer.layer.d_model = 8;
  sc.transformer.layer.nhead = 2;
  sc.transformer.layer.dim_feedforward = 12;
  sc.transformer.layer.dropout = 0.0f;
  sc.transformer.layer.activation = nn::Activation::kGelu;  // smooth: a step of h never crosses a relu kink
  sc.transformer.num_encoder_layers = 1;
  sc.transformer.num_decoder_layers = 1;
  Rng rng(60);
  models::Seq2SeqTransformer m(sc, rng);
  const Ids src{{1, 2, 3, 4, 5, 0}, {2, 3}}, tgt{{1, 2, 3, 4}, {2, 2}};
  const std::vector<int64_t> target{2, 3, 4, 0};
  models::Seq2SeqMasks masks;
  masks.src.key_padding_mask = models::padding_mask(src, 0);
  train::CrossEntropyOptions ce;
  ce.ignore_index = 0;
  ce.label_smoothing = 0.1f;
  EXPECT_TRUE(SpotCheck(
      m, [&](Context& g) { return train::cross_entropy(m.forward(g, src, tgt, masks), target, ce); },
      61));
}

TEST(TrainingContextModels, DecoderOnlyGradientSpotCheck) {
  models::DecoderOnlyConfig dc;
  dc.vocab = 7;
  dc.max_len = 5;
  dc.num_layers = 2;
  dc.layer.d_model = 8;
  dc.layer.nhead = 2;
  dc.layer.dim_feedforward = 12;
  dc.layer.dropout = 0.0f;
  Rng rng(62);
  models::DecoderOnlyTransformer m(dc, rng);
  const Ids ids{{1, 2, 3, 4, 5, 6, 1, 2}, {2, 4}};
  const std::vector<int64_t> target{2, 3, 4, 5, 6, 1, 2, 3};
  EXPECT_TRUE(SpotCheck(m, [&](Context& g) { return train::cross_entropy(m.forward(g, ids), target); },
                        63));
}

}  // namespace
}  // namespace qkv
