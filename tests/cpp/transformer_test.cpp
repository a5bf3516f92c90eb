// Transformer layers, stacks and models: PyTorch's parameter names, post-LN / pre-LN against float64 references
// built from the MHA oracle, permutation equivariance, causal no-leak, padding, dropout modes and error paths.
#include "qkv/nn/transformer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "nn_testing.h"
#include "qkv/models/transformer.h"

namespace qkv::nn {
namespace {

using qkv::testing::AllClose;
using qkv::testing::AnyNaN;
using qkv::testing::BitIdentical;
using qkv::testing::kEquivariance;
using qkv::testing::kFloatReorder;
using qkv::testing::kModuleVsDouble;
using qkv::testing::mha_reference;
using qkv::testing::params_of;
using qkv::testing::randn;
using qkv::testing::randomize_parameters;
using qkv::testing::RefMask;
using qkv::testing::ThrowsArg;
using qkv::testing::to_double;

using NameShapes = std::vector<std::pair<std::string, Shape>>;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

NameShapes names_and_shapes(Module& m) {
  NameShapes out;
  for (auto& [name, p] : m.named_parameters()) out.emplace_back(name, p->shape());
  return out;
}

NameShapes prefixed(const std::string& prefix, const NameShapes& ns) {
  NameShapes out;
  for (auto& [n, s] : ns) out.emplace_back(prefix + n, s);
  return out;
}

NameShapes mha_names(int64_t E) {
  return {{"in_proj_weight", {3 * E, E}}, {"in_proj_bias", {3 * E}}, {"out_proj.weight", {E, E}}, {"out_proj.bias", {E}}};
}

// torch.nn.TransformerEncoderLayer(E, H, F).state_dict(), in order.
NameShapes encoder_layer_names(int64_t E, int64_t F) {
  NameShapes n = prefixed("self_attn.", mha_names(E));
  const NameShapes rest = {{"linear1.weight", {F, E}}, {"linear1.bias", {F}}, {"linear2.weight", {E, F}},
                           {"linear2.bias", {E}},      {"norm1.weight", {E}}, {"norm1.bias", {E}},
                           {"norm2.weight", {E}},      {"norm2.bias", {E}}};
  n.insert(n.end(), rest.begin(), rest.end());
  return n;
}

// torch.nn.TransformerDecoderLayer(E, H, F).state_dict(), in order.
NameShapes decoder_layer_names(int64_t E, int64_t F) {
  NameShapes n = prefixed("self_attn.", mha_names(E));
  const NameShapes cross = prefixed("multihead_attn.", mha_names(E));
  n.insert(n.end(), cross.begin(), cross.end());
  const NameShapes rest = {{"linear1.weight", {F, E}}, {"linear1.bias", {F}}, {"linear2.weight", {E, F}},
                           {"linear2.bias", {E}},      {"norm1.weight", {E}}, {"norm1.bias", {E}},
                           {"norm2.weight", {E}},      {"norm2.bias", {E}},   {"norm3.weight", {E}},
                           {"norm3.bias", {E}}};
  n.insert(n.end(), rest.begin(), rest.end());
  return n;
}

TransformerLayerConfig small_config(bool norm_first = false, Activation act = Activation::kRelu, float dropout = 0.0f) {
  TransformerLayerConfig c;
  c.d_model = 12;
  c.nhead = 3;
  c.dim_feedforward = 20;
  c.dropout = dropout;
  c.activation = act;
  c.norm_first = norm_first;
  return c;
}

// --- float64 references built from the MHA oracle -----------------------------------------------------------

using Vec = std::vector<double>;

Vec add(const Vec& a, const Vec& b) {
  Vec o(a.size());
  for (size_t i = 0; i < a.size(); ++i) o[i] = a[i] + b[i];
  return o;
}

Vec layer_norm_ref(const Vec& x, const LayerNorm& ln, int64_t E) {
  const Vec w = to_double(ln.weight), b = to_double(ln.bias);
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / E; ++r) {
    double mean = 0, var = 0;
    for (int64_t e = 0; e < E; ++e) mean += x[r * E + e] / E;
    for (int64_t e = 0; e < E; ++e) var += (x[r * E + e] - mean) * (x[r * E + e] - mean) / E;
    const double rs = 1.0 / std::sqrt(var + ln.eps());
    for (int64_t e = 0; e < E; ++e) y[r * E + e] = (x[r * E + e] - mean) * rs * w[e] + b[e];
  }
  return y;
}

Vec feed_forward_ref(const Vec& x, const FeedForward& ff, int64_t E) {
  const int64_t F = ff.linear1.out_features();
  const Vec w1 = to_double(ff.linear1.weight), b1 = to_double(ff.linear1.bias);
  const Vec w2 = to_double(ff.linear2.weight), b2 = to_double(ff.linear2.bias);
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / E; ++r) {
    Vec h(F);
    for (int64_t f = 0; f < F; ++f) {
      double s = b1[f];
      for (int64_t e = 0; e < E; ++e) s += w1[f * E + e] * x[r * E + e];
      h[f] = ff.activation() == Activation::kRelu ? std::max(s, 0.0) : 0.5 * s * (1 + std::erf(s / std::sqrt(2.0)));
    }
    for (int64_t e = 0; e < E; ++e) {
      double s = b2[e];
      for (int64_t f = 0; f < F; ++f) s += w2[e * F + f] * h[f];
      y[r * E + e] = s;
    }
  }
  return y;
}

Tensor to_tensor(const Vec& v, const Shape& shape) { return Tensor::from_vector(shape, std::vector<float>(v.begin(), v.end())); }

Vec attn_ref(const Vec& q, const Vec& kv, const Shape& qs, const Shape& ks, const MultiheadAttention& m,
             const RefMask& mask = {}, bool causal = false) {
  const Tensor qt = to_tensor(q, qs), kt = to_tensor(kv, ks);
  return mha_reference(qt, kt, kt, params_of(m), mask, causal).out;
}

Vec encoder_layer_ref(const Tensor& src, const TransformerEncoderLayer& l, const RefMask& mask = {}, bool causal = false) {
  const int64_t E = l.config().d_model;
  const Shape s = src.shape();
  Vec x = to_double(src);
  auto sa = [&](const Vec& v) { return attn_ref(v, v, s, s, l.self_attn, mask, causal); };
  if (l.config().norm_first) {
    x = add(x, sa(layer_norm_ref(x, l.norm1, E)));
    x = add(x, feed_forward_ref(layer_norm_ref(x, l.norm2, E), l.ff, E));
  } else {
    x = layer_norm_ref(add(x, sa(x)), l.norm1, E);
    x = layer_norm_ref(add(x, feed_forward_ref(x, l.ff, E)), l.norm2, E);
  }
  return x;
}

Vec decoder_layer_ref(const Tensor& tgt, const Tensor& memory, const TransformerDecoderLayer& l, bool tgt_causal,
                      const RefMask& memory_mask) {
  const int64_t E = l.config().d_model;
  const Shape ts = tgt.shape(), ms = memory.shape();
  const Vec mem = to_double(memory);
  Vec x = to_double(tgt);
  auto sa = [&](const Vec& v) { return attn_ref(v, v, ts, ts, l.self_attn, {}, tgt_causal); };
  auto ca = [&](const Vec& v) { return attn_ref(v, mem, ts, ms, l.multihead_attn, memory_mask); };
  if (l.config().norm_first) {
    x = add(x, sa(layer_norm_ref(x, l.norm1, E)));
    x = add(x, ca(layer_norm_ref(x, l.norm2, E)));
    x = add(x, feed_forward_ref(layer_norm_ref(x, l.norm3, E), l.ff, E));
  } else {
    x = layer_norm_ref(add(x, sa(x)), l.norm1, E);
    x = layer_norm_ref(add(x, ca(x)), l.norm2, E);
    x = layer_norm_ref(add(x, feed_forward_ref(x, l.ff, E)), l.norm3, E);
  }
  return x;
}

// --- names ----------------------------------------------------------------------------------------------------

TEST(TransformerNames, EncoderLayerIsTorchs) {
  Rng rng(1);
  TransformerEncoderLayer layer(small_config(), rng);
  EXPECT_EQ(names_and_shapes(layer), encoder_layer_names(12, 20));
}

TEST(TransformerNames, DecoderLayerIsTorchs) {
  Rng rng(1);
  TransformerDecoderLayer layer(small_config(), rng);
  EXPECT_EQ(names_and_shapes(layer), decoder_layer_names(12, 20));
}

TEST(TransformerNames, StacksAndTransformerAreTorchs) {
  Rng rng(1);
  TransformerEncoder enc(small_config(), 2, /*final_norm=*/true, rng);
  NameShapes want = prefixed("layers.0.", encoder_layer_names(12, 20));
  NameShapes l1 = prefixed("layers.1.", encoder_layer_names(12, 20));
  want.insert(want.end(), l1.begin(), l1.end());
  want.push_back({"norm.weight", {12}});
  want.push_back({"norm.bias", {12}});
  EXPECT_EQ(names_and_shapes(enc), want);
  TransformerDecoder dec_no_norm(small_config(), 1, /*final_norm=*/false, rng);
  EXPECT_EQ(names_and_shapes(dec_no_norm), prefixed("layers.0.", decoder_layer_names(12, 20)));

  // torch.nn.Transformer(12, 3, 1, 2, 20, batch_first=True).state_dict()
  Transformer t({small_config(), 1, 2}, rng);
  NameShapes tw = prefixed("encoder.layers.0.", encoder_layer_names(12, 20));
  tw.push_back({"encoder.norm.weight", {12}});
  tw.push_back({"encoder.norm.bias", {12}});
  for (const char* p : {"decoder.layers.0.", "decoder.layers.1."}) {
    const NameShapes d = prefixed(p, decoder_layer_names(12, 20));
    tw.insert(tw.end(), d.begin(), d.end());
  }
  tw.push_back({"decoder.norm.weight", {12}});
  tw.push_back({"decoder.norm.bias", {12}});
  EXPECT_EQ(names_and_shapes(t), tw);
}

TEST(TransformerNames, BiasFalseDropsEveryBias) {
  Rng rng(1);
  TransformerLayerConfig c = small_config();
  c.bias = false;
  TransformerDecoderLayer layer(c, rng);
  int weights = 0;
  for (auto& [name, shape] : names_and_shapes(layer)) {
    EXPECT_EQ(name.find("bias"), std::string::npos) << name;
    ++weights;
  }
  EXPECT_EQ(weights, 2 + 2 + 2 + 3);  // in_proj/out_proj x2, linear1/2, norm1..3
  const Tensor x = randn({1, 3, 12}, 2);
  EXPECT_FALSE(AnyNaN(layer.forward(x, x)));
}

// --- forward against float64 references ------------------------------------------------------------------------

class EncoderLayerVsReference : public ::testing::TestWithParam<std::tuple<bool, Activation>> {};

TEST_P(EncoderLayerVsReference, MatchesDoubleReference) {
  const auto [norm_first, act] = GetParam();
  Rng rng(1);
  TransformerEncoderLayer layer(small_config(norm_first, act, /*dropout=*/0.3f), rng);
  randomize_parameters(layer, 2);
  layer.eval();
  const Tensor src = randn({2, 5, 12}, 3);
  EXPECT_TRUE(AllClose(layer.forward(src), encoder_layer_ref(src, layer), kModuleVsDouble));
  // With key padding (nonzero = ignore) and a causal mask.
  Tensor kpm = Tensor::zeros({2, 5});
  kpm.at({1, 3}) = 1.0f;
  AttentionMasks m;
  m.key_padding_mask = kpm;
  m.is_causal = true;
  const RefMask ref_mask = [&](int64_t b, int64_t, int64_t, int64_t j) { return kpm.at({b, j}) != 0 ? kNegInf : 0.0; };
  EXPECT_TRUE(AllClose(layer.forward(src, m), encoder_layer_ref(src, layer, ref_mask, true), kModuleVsDouble));
}

INSTANTIATE_TEST_SUITE_P(PostAndPreLN, EncoderLayerVsReference,
                         ::testing::Values(std::make_tuple(false, Activation::kRelu),
                                           std::make_tuple(true, Activation::kRelu),
                                           std::make_tuple(false, Activation::kGelu),
                                           std::make_tuple(true, Activation::kGelu)));

class DecoderLayerVsReference : public ::testing::TestWithParam<bool> {};

TEST_P(DecoderLayerVsReference, MatchesDoubleReference) {
  const bool norm_first = GetParam();
  Rng rng(1);
  TransformerDecoderLayer layer(small_config(norm_first), rng);
  randomize_parameters(layer, 4);
  const Tensor tgt = randn({2, 4, 12}, 5), memory = randn({2, 6, 12}, 6);
  Tensor mkpm = Tensor::zeros({2, 6});
  mkpm.at({0, 5}) = 1.0f;
  mkpm.at({1, 0}) = 1.0f;
  AttentionMasks tm, mm;
  tm.is_causal = true;
  mm.key_padding_mask = mkpm;
  const Tensor y = layer.forward(tgt, memory, tm, mm);
  const RefMask ref_mask = [&](int64_t b, int64_t, int64_t, int64_t j) { return mkpm.at({b, j}) != 0 ? kNegInf : 0.0; };
  EXPECT_TRUE(AllClose(y, decoder_layer_ref(tgt, memory, layer, true, ref_mask), kModuleVsDouble));
}

INSTANTIATE_TEST_SUITE_P(PostAndPreLN, DecoderLayerVsReference, ::testing::Values(false, true));

// --- structural properties --------------------------------------------------------------------------------------

TEST(TransformerEncoderLayer, PermutationEquivariantWithoutPositions) {
  for (bool norm_first : {false, true}) {
    Rng rng(1);
    TransformerEncoderLayer layer(small_config(norm_first), rng);
    randomize_parameters(layer, 7);
    const int64_t T = 6;
    const Tensor x = randn({2, T, 12}, 8);
    const std::vector<int64_t> perm = {3, 0, 5, 1, 4, 2};
    Tensor px = Tensor::empty(x.shape());
    for (int64_t t = 0; t < T; ++t) px.slice(1, t, t + 1).copy_from(x.slice(1, perm[t], perm[t] + 1));
    const Tensor fx = layer.forward(x), fpx = layer.forward(px);
    Tensor pfx = Tensor::empty(fx.shape());
    for (int64_t t = 0; t < T; ++t) pfx.slice(1, t, t + 1).copy_from(fx.slice(1, perm[t], perm[t] + 1));
    EXPECT_TRUE(AllClose(fpx, pfx, kEquivariance)) << "norm_first " << norm_first;
  }
}

TEST(TransformerEncoderLayer, EvalDeterministicTrainDropoutDiffers) {
  Rng rng(1);
  TransformerEncoderLayer layer(small_config(false, Activation::kRelu, 0.2f), rng);
  const Tensor x = randn({2, 5, 12}, 9);
  EXPECT_TRUE(layer.training());
  const Tensor t1 = layer.forward(x), t2 = layer.forward(x);
  EXPECT_FALSE(BitIdentical(t1, t2));
  layer.eval();
  EXPECT_FALSE(layer.dropout1.training());
  EXPECT_FALSE(layer.ff.dropout.training());
  EXPECT_FALSE(layer.self_attn.training());
  const Tensor e1 = layer.forward(x);
  EXPECT_TRUE(BitIdentical(e1, layer.forward(x)));
  EXPECT_FALSE(BitIdentical(e1, t1));
  // dropout = 0 in training mode equals eval.
  Rng r2(1);
  TransformerEncoderLayer nodrop(small_config(), r2);
  nodrop.load_state_dict(layer.state_dict());
  EXPECT_TRUE(nodrop.training());
  EXPECT_TRUE(BitIdentical(nodrop.forward(x), e1));
}

TEST(TransformerEncoder, CausalNoLeakAndStackEqualsSequentialLayers) {
  Rng rng(1);
  TransformerEncoder enc(small_config(true), 2, true, rng);
  randomize_parameters(enc, 10);
  const Tensor x = randn({2, 6, 12}, 11);
  Tensor y = x.clone();
  y.slice(1, 4, 6).copy_from(randn({2, 2, 12}, 12));
  AttentionMasks causal;
  causal.is_causal = true;
  const Tensor fx = enc.forward(x, causal), fy = enc.forward(y, causal);
  EXPECT_TRUE(BitIdentical(fx.slice(1, 0, 4), fy.slice(1, 0, 4)));
  EXPECT_FALSE(BitIdentical(fx.slice(1, 4, 6), fy.slice(1, 4, 6)));
  // Without is_causal the past does see the change.
  EXPECT_FALSE(BitIdentical(enc.forward(x).slice(1, 0, 4), enc.forward(y).slice(1, 0, 4)));
  const Tensor seq = enc.norm->forward(enc.layers[1]->forward(enc.layers[0]->forward(x, causal), causal));
  EXPECT_TRUE(BitIdentical(fx, seq));
}

TEST(TransformerEncoder, SubsequentMaskEqualsIsCausal) {
  const Tensor m = generate_square_subsequent_mask(3);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(AllClose(m, std::vector<double>{0, -inf, -inf, 0, 0, -inf, 0, 0, 0}, qkv::testing::kExact));
  EXPECT_EQ(generate_square_subsequent_mask(0).numel(), 0);
  Rng rng(1);
  TransformerEncoder enc(small_config(), 2, false, rng);
  randomize_parameters(enc, 13);
  const Tensor x = randn({2, 5, 12}, 14);
  AttentionMasks a, b;
  a.is_causal = true;
  b.mask = generate_square_subsequent_mask(5);
  b.mask_kind = MaskKind::kAdditive;
  EXPECT_TRUE(AllClose(enc.forward(x, a), enc.forward(x, b), kFloatReorder));
}

TEST(TransformerDecoder, PaddedMemoryPositionsDoNotMatter) {
  Rng rng(1);
  TransformerDecoder dec(small_config(), 2, true, rng);
  randomize_parameters(dec, 15);
  const Tensor tgt = randn({2, 4, 12}, 16), mem = randn({2, 5, 12}, 17);
  Tensor kpm = Tensor::zeros({2, 5});
  kpm.at({0, 3}) = kpm.at({0, 4}) = 1.0f;
  Tensor mem2 = mem.clone();
  mem2.slice(0, 0, 1).slice(1, 3, 5).copy_from(randn({1, 2, 12}, 18));
  AttentionMasks tm, mm;
  tm.is_causal = true;
  mm.key_padding_mask = kpm;
  EXPECT_TRUE(BitIdentical(dec.forward(tgt, mem, tm, mm), dec.forward(tgt, mem2, tm, mm)));
  EXPECT_FALSE(BitIdentical(dec.forward(tgt, mem, tm), dec.forward(tgt, mem2, tm)));
}

TEST(Transformer, ForwardIsDecoderOfEncoderAndXavierInit) {
  Rng rng(1);
  Transformer t({small_config(), 2, 2}, rng);
  t.eval();
  for (auto& [name, p] : t.named_parameters()) {
    if (p->dim() < 2) continue;
    const float bound = std::sqrt(6.0f / static_cast<float>(p->size(0) + p->size(1)));
    float mx = 0;
    for (float v : p->to_vector()) mx = std::max(mx, std::fabs(v));
    EXPECT_LE(mx, bound) << name;
  }
  const Tensor src = randn({2, 5, 12}, 19), tgt = randn({2, 3, 12}, 20);
  AttentionMasks tm;
  tm.is_causal = true;
  const Tensor y = t.forward(src, tgt, {}, tm);
  EXPECT_EQ(y.shape(), Shape({2, 3, 12}));
  EXPECT_TRUE(BitIdentical(y, t.decoder.forward(tgt, t.encoder.forward(src), tm)));
  // Round trip through a state_dict into a differently seeded model.
  Rng r2(99);
  Transformer u({small_config(), 2, 2}, r2);
  u.eval();
  u.load_state_dict(t.state_dict());
  EXPECT_TRUE(BitIdentical(u.forward(src, tgt, {}, tm), y));
}

// --- errors ----------------------------------------------------------------------------------------------------

TEST(TransformerErrors, ConfigErrorsNameTheModule) {
  Rng rng(1);
  TransformerLayerConfig c = small_config();
  c.nhead = 5;
  EXPECT_TRUE(ThrowsArg([&] { TransformerEncoderLayer l(c, rng); }, "[TransformerEncoderLayer] d_model 12 must be divisible by nhead 5"));
  EXPECT_TRUE(ThrowsArg([&] { TransformerDecoderLayer l(c, rng); }, "[TransformerDecoderLayer]"));
  EXPECT_TRUE(ThrowsArg([&] { TransformerEncoder e(c, 1, true, rng); }, "[TransformerEncoder]"));
  EXPECT_TRUE(ThrowsArg([&] { Transformer t({c, 1, 1}, rng); }, "[Transformer]"));
  c = small_config();
  c.dropout = 1.0f;
  EXPECT_TRUE(ThrowsArg([&] { TransformerEncoderLayer l(c, rng); }, "[TransformerEncoderLayer] dropout"));
  c = small_config();
  c.layer_norm_eps = 0.0f;
  EXPECT_TRUE(ThrowsArg([&] { TransformerDecoderLayer l(c, rng); }, "[TransformerDecoderLayer] layer_norm_eps"));
  EXPECT_TRUE(ThrowsArg([&] { TransformerEncoder e(small_config(), -1, true, rng); }, "[TransformerEncoder] num_layers"));
  EXPECT_TRUE(ThrowsArg([&] { TransformerDecoder d(small_config(), -1, true, rng); }, "[TransformerDecoder] num_layers"));
  EXPECT_TRUE(ThrowsArg([&] { Transformer t({small_config(), -1, 1}, rng); }, "[Transformer]"));
  EXPECT_TRUE(ThrowsArg([] { generate_square_subsequent_mask(-1); }, "[generate_square_subsequent_mask]"));
}

TEST(TransformerErrors, ShapeErrorsNameTheModule) {
  Rng rng(1);
  TransformerEncoderLayer el(small_config(), rng);
  TransformerDecoderLayer dl(small_config(), rng);
  TransformerEncoder enc(small_config(), 1, false, rng);
  TransformerDecoder dec(small_config(), 1, false, rng);
  Transformer t({small_config(), 1, 1}, rng);
  const Tensor x = randn({2, 3, 12}, 1);
  EXPECT_TRUE(ThrowsArg([&] { el.forward(randn({3, 12}, 1)); }, "[TransformerEncoderLayer] src (3, 12)"));
  EXPECT_TRUE(ThrowsArg([&] { el.forward(randn({2, 3, 8}, 1)); }, "d_model = 12"));
  EXPECT_TRUE(ThrowsArg([&] { dl.forward(x, randn({2, 3, 8}, 1)); }, "[TransformerDecoderLayer] memory (2, 3, 8)"));
  EXPECT_TRUE(ThrowsArg([&] { dl.forward(x, randn({1, 3, 12}, 1)); }, "[TransformerDecoderLayer] tgt (2, 3, 12) and memory (1, 3, 12)"));
  EXPECT_TRUE(ThrowsArg([&] { enc.forward(Tensor()); }, "[TransformerEncoder] src is undefined"));
  EXPECT_TRUE(ThrowsArg([&] { dec.forward(x, randn({2, 3}, 1)); }, "[TransformerDecoder] memory"));
  EXPECT_TRUE(ThrowsArg([&] { t.forward(x, randn({1, 3, 12}, 1)); }, "[Transformer] src (2, 3, 12) and tgt (1, 3, 12)"));
  AttentionMasks bad;
  bad.key_padding_mask = Tensor::zeros({2, 4});
  EXPECT_TRUE(ThrowsArg([&] { el.forward(x, bad); }, "[MultiheadAttention] key_padding_mask (2, 4)"));
}

}  // namespace
}  // namespace qkv::nn

// --- models ---------------------------------------------------------------------------------------------------

namespace qkv::models {
namespace {

using qkv::testing::BitIdentical;
using qkv::testing::ThrowsArg;

TransformerSeq2SeqConfig seq2seq_config() {
  TransformerSeq2SeqConfig c;
  c.src_vocab = 11;
  c.tgt_vocab = 13;
  c.transformer.layer.d_model = 12;
  c.transformer.layer.nhead = 3;
  c.transformer.layer.dim_feedforward = 16;
  c.transformer.layer.dropout = 0.1f;
  c.transformer.num_encoder_layers = 1;
  c.transformer.num_decoder_layers = 2;
  return c;
}

TEST(Seq2SeqTransformer, NamesShapesAndLogits) {
  Rng rng(1);
  Seq2SeqTransformer m(seq2seq_config(), rng);
  m.eval();
  std::map<std::string, Shape> got;
  for (auto& [name, p] : m.named_parameters()) got[name] = p->shape();
  EXPECT_EQ(got.at("src_tok_emb.weight"), Shape({11, 12}));
  EXPECT_EQ(got.at("tgt_tok_emb.weight"), Shape({13, 12}));
  EXPECT_EQ(got.at("transformer.encoder.layers.0.self_attn.in_proj_weight"), Shape({36, 12}));
  EXPECT_EQ(got.at("transformer.decoder.layers.1.multihead_attn.out_proj.weight"), Shape({12, 12}));
  EXPECT_EQ(got.at("transformer.decoder.norm.bias"), Shape({12}));
  EXPECT_EQ(got.at("generator.weight"), Shape({13, 12}));
  EXPECT_EQ(got.at("generator.bias"), Shape({13}));
  EXPECT_EQ(got.size(), 4u + m.transformer.named_parameters().size());
  const Ids src{{1, 2, 3, 4, 5, 6, 7, 0}, {2, 4}}, tgt{{1, 2, 3, 4, 5, 6}, {2, 3}};
  const Tensor logits = m.forward(src, tgt);
  EXPECT_EQ(logits.shape(), Shape({2, 3, 13}));
  EXPECT_TRUE(BitIdentical(logits, m.decode(tgt, m.encode(src))));
}

TEST(Seq2SeqTransformer, TargetIsCausalAndSourcePaddingIsIgnored) {
  Rng rng(1);
  Seq2SeqTransformer m(seq2seq_config(), rng);
  m.eval();
  const int64_t pad = 0;
  const Ids src{{1, 2, 3, pad, 4, 5, 6, 7}, {2, 4}};
  Ids src2 = src;
  src2.data[3] = 9;  // a padded slot changes value
  const Ids tgt{{1, 2, 3, 4, 5, 6}, {2, 3}};
  Ids tgt2 = tgt;
  tgt2.data[2] = 12;  // the last target position of batch 0 changes
  Seq2SeqMasks masks;
  masks.src.key_padding_mask = padding_mask(src, pad);
  masks.memory.key_padding_mask = padding_mask(src, pad);
  EXPECT_EQ(masks.src.key_padding_mask.to_vector(), (std::vector<float>{0, 0, 0, 1, 0, 0, 0, 0}));
  const Tensor a = m.forward(src, tgt, masks);
  EXPECT_TRUE(BitIdentical(a, m.forward(src2, tgt, masks)));
  const Tensor b = m.forward(src, tgt2, masks);
  EXPECT_TRUE(BitIdentical(a.slice(1, 0, 2), b.slice(1, 0, 2)));
  EXPECT_FALSE(BitIdentical(a.slice(1, 2, 3), b.slice(1, 2, 3)));
  // Training mode: dropout makes two calls differ.
  m.train();
  EXPECT_FALSE(BitIdentical(m.forward(src, tgt, masks), m.forward(src, tgt, masks)));
}

TEST(Seq2SeqTransformer, ErrorsNameTheModel) {
  Rng rng(1);
  TransformerSeq2SeqConfig c = seq2seq_config();
  c.tgt_vocab = 0;
  EXPECT_TRUE(ThrowsArg([&] { Seq2SeqTransformer m(c, rng); }, "[Seq2SeqTransformer]"));
  Seq2SeqTransformer m(seq2seq_config(), rng);
  EXPECT_TRUE(ThrowsArg([&] { m.forward(Ids{{1, 2}, {2}}, Ids{{1}, {1, 1}}); }, "[Seq2SeqTransformer] src ids (2,)"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(Ids{{1, 2}, {2, 1}}, Ids{{1}, {1, 1}}); }, "same batch size"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(Ids{{1, 2}, {1, 2}}, Ids{{1, 2}, {1, 1}}); }, "[Seq2SeqTransformer] tgt ids (1, 1) hold 2"));
  EXPECT_TRUE(ThrowsArg([&] { padding_mask(Ids{{1}, {1}}, 0); }, "[padding_mask]"));
}

TEST(DecoderOnlyTransformer, NamesCausalNoLeakAndLengthLimit) {
  DecoderOnlyConfig c;
  c.vocab = 17;
  c.max_len = 8;
  c.num_layers = 2;
  c.layer.d_model = 12;
  c.layer.nhead = 3;
  c.layer.dim_feedforward = 24;
  Rng rng(1);
  DecoderOnlyTransformer m(c, rng);
  m.eval();
  std::map<std::string, Shape> got;
  for (auto& [name, p] : m.named_parameters()) got[name] = p->shape();
  EXPECT_EQ(got.at("tok_emb.weight"), Shape({17, 12}));
  EXPECT_EQ(got.at("pos_emb.weight"), Shape({8, 12}));
  EXPECT_EQ(got.at("layers.1.linear2.weight"), Shape({12, 24}));
  EXPECT_EQ(got.at("norm.weight"), Shape({12}));
  EXPECT_EQ(got.at("lm_head.weight"), Shape({17, 12}));
  EXPECT_EQ(got.count("lm_head.bias"), 0u);
  const Ids ids{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {2, 5}};
  Ids ids2 = ids;
  ids2.data[4] = 16;  // last position of batch 0
  const Tensor a = m.forward(ids), b = m.forward(ids2);
  EXPECT_EQ(a.shape(), Shape({2, 5, 17}));
  EXPECT_TRUE(BitIdentical(a.slice(1, 0, 4), b.slice(1, 0, 4)));
  EXPECT_FALSE(BitIdentical(a.slice(1, 4, 5), b.slice(1, 4, 5)));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(Ids{std::vector<int64_t>(9, 1), {1, 9}}); }, "[DecoderOnlyTransformer] ids (1, 9) are longer than max_len 8"));
  EXPECT_TRUE(ThrowsArg([&] { m.forward(ids, Tensor::zeros({2, 4})); }, "[DecoderOnlyTransformer] key_padding_mask"));
  c.max_len = 0;
  EXPECT_TRUE(ThrowsArg([&] { DecoderOnlyTransformer bad(c, rng); }, "[DecoderOnlyTransformer]"));
}

}  // namespace
}  // namespace qkv::models
