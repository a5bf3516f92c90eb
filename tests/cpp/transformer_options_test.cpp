// The attention and layer options beyond torch.nn: rotary and Shaw relative positions, the score scale and per-head
// output gates in MultiheadAttention against the float64 oracle (also step by step through a KV cache), gradients
// of a trained bias and of the relative tables against finite differences of the oracle, and the decoder layer's
// refusal of the encoder-only options. The experiments' ablation layer (no LayerNorm, no residual, Shaw tables,
// per-layer head gates) is tested in ablation_layer_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "nn_testing.h"
#include "qkv/nn/multihead_attention.h"
#include "qkv/nn/transformer.h"
#include "qkv/ops/elementwise.h"

namespace qkv::nn {
namespace {

using qkv::testing::AllClose;
using qkv::testing::kFloatReorder;
using qkv::testing::kModuleVsDouble;
using qkv::testing::mha_reference;
using qkv::testing::MhaRefExtras;
using qkv::testing::params_of;
using qkv::testing::randn;
using qkv::testing::randomize_parameters;
using qkv::testing::RefMask;
using qkv::testing::ThrowsArg;
using qkv::testing::to_double;

constexpr int64_t kB = 2, kT = 5, kE = 12, kH = 3, kD = kE / kH, kClip = 2;

struct OptionCase {
  const char* name;
  bool rotary, relative, unscaled, gates, padding;
};

class MhaOptionsVsOracle : public ::testing::TestWithParam<OptionCase> {};

TEST_P(MhaOptionsVsOracle, OutAndWeightsMatchTheDoubleLoop) {
  const OptionCase& p = GetParam();
  Rng rng(3);
  MultiheadAttention mha(kE, kH, rng);
  randomize_parameters(mha, 4);
  const Tensor x = randn({kB, kT, kE}, 5);
  const Tensor rel_k = randn({2 * kClip + 1, kD}, 6, 0.5f), rel_v = randn({2 * kClip + 1, kD}, 7, 0.5f);
  const Tensor gates = Tensor::from_vector({kH}, {1.0f, 0.0f, -0.5f});
  MhaForwardOptions o;
  o.average_attn_weights = false;
  MhaRefExtras ex;
  ex.rotary = o.rotary = p.rotary;
  if (p.relative) {
    o.rel_k = ad::Var(rel_k);
    o.rel_v = ad::Var(rel_v);
    ex.rel_k = to_double(rel_k);
    ex.rel_v = to_double(rel_v);
    ex.clip = kClip;
  }
  if (p.unscaled) {
    o.scale = 1.0f;
    ex.scale = 1.0;
  }
  if (p.gates) {
    o.head_mask = gates;
    ex.head_gate = to_double(gates);
  }
  RefMask mask;
  if (p.padding) {  // the last key of batch row 1 is padding
    o.key_padding_mask = Tensor::zeros({kB, kT});
    o.key_padding_mask.data()[kB * kT - 1] = 1.0f;
    mask = [](int64_t b, int64_t, int64_t, int64_t j) { return b == 1 && j == kT - 1 ? -INFINITY : 0.0; };
  }
  const MhaResult r = mha.forward(x, x, x, o);
  const auto ref = mha_reference(x, x, x, params_of(mha), mask, false, ex);
  EXPECT_TRUE(AllClose(r.out.value, ref.out, kModuleVsDouble)) << p.name;
  EXPECT_TRUE(AllClose(r.weights, ref.weights, kModuleVsDouble)) << p.name;  // weights are never gated
  // The fused path (no weights asked for) gives the same output.
  o.need_weights = false;
  EXPECT_TRUE(AllClose(mha.forward(x, x, x, o).out.value, ref.out, kModuleVsDouble)) << p.name << " (no weights)";
}

INSTANTIATE_TEST_SUITE_P(
    Options, MhaOptionsVsOracle,
    ::testing::Values(OptionCase{"rotary", true, false, false, false, false},
                      OptionCase{"relative", false, true, false, false, false},
                      OptionCase{"unscaled", false, false, true, false, false},
                      OptionCase{"head gates", false, false, false, true, false},
                      OptionCase{"rotary unscaled gated padded", true, false, true, true, true},
                      OptionCase{"relative gated padded", false, true, false, true, true}),
    [](const ::testing::TestParamInfo<OptionCase>& i) {
      std::string s = i.param.name;
      for (char& ch : s)
        if (ch == ' ') ch = '_';
      return s;
    });

// Decoding one position at a time against a KV cache gives the full causal forward: rotary and relative offsets
// follow the cache's length.
TEST(MhaOptions, KvCacheStepsEqualTheFullCausalForward) {
  for (bool relative : {false, true}) {
    Rng rng(8);
    MultiheadAttention mha(kE, kH, rng);
    randomize_parameters(mha, 9);
    const Tensor x = randn({kB, kT, kE}, 10);
    MhaForwardOptions o;
    o.is_causal = true;
    o.rotary = !relative;
    if (relative) {
      o.rel_k = ad::Var(randn({2 * kClip + 1, kD}, 11, 0.5f));
      o.rel_v = ad::Var(randn({2 * kClip + 1, kD}, 12, 0.5f));
    }
    const Tensor full = mha.forward(x, x, x, o).out.value;
    KvCache cache;
    o.kv_cache = &cache;
    for (int64_t t = 0; t < kT; ++t) {
      const Tensor xt = x.slice(1, t, t + 1).contiguous();
      const Tensor step = mha.forward(xt, xt, xt, o).out.value;
      EXPECT_TRUE(AllClose(step, full.slice(1, t, t + 1), kFloatReorder)) << "relative " << relative << " t " << t;
    }
  }
}

// Σ dout · oracle(out) as a function of one scalar of a table, by central differences in float64.
template <class F>
double oracle_fd(std::vector<double>& table, size_t i, const std::vector<double>& dout, F&& out_of) {
  const double h = 1e-5, keep = table[i];
  auto loss = [&] {
    const std::vector<double> o = out_of();
    double s = 0.0;
    for (size_t k = 0; k < o.size(); ++k) s += dout[k] * o[k];
    return s;
  };
  table[i] = keep + h;
  const double up = loss();
  table[i] = keep - h;
  const double down = loss();
  table[i] = keep;
  return (up - down) / (2 * h);
}

TEST(MhaOptions, TrainedBiasAndRelativeTablesGetTheOraclesGradient) {
  Rng rng(13);
  MultiheadAttention mha(kE, kH, rng);
  randomize_parameters(mha, 14);
  const Tensor x = randn({kB, kT, kE}, 15), dout = randn({kB, kT, kE}, 16);
  const std::vector<double> dd = to_double(dout);
  const qkv::testing::MhaParams mp = params_of(mha);
  {  // a learned (1, H, T, T) bias through attn_bias
    ad::Tape tape;
    const Tensor bias = randn({1, kH, kT, kT}, 17);
    const ad::Var bv = tape.leaf(bias);
    MhaForwardOptions o;
    o.need_weights = false;
    tape.backward(mha.forward(Context(), x, x, x, o, bv).out, dout);
    std::vector<double> b = to_double(bias);
    auto out_of = [&] {
      return mha_reference(x, x, x, mp, [&](int64_t, int64_t h, int64_t i, int64_t j) {
               return b[static_cast<size_t>((h * kT + i) * kT + j)];
             }).out;
    };
    std::vector<double> fd;
    for (size_t i = 0; i < b.size(); ++i) fd.push_back(oracle_fd(b, i, dd, out_of));
    EXPECT_TRUE(AllClose(bv.grad(), fd, {1e-4, 1e-3}));
  }
  {  // Shaw's rel_k and rel_v
    ad::Tape tape;
    const Tensor rk = randn({2 * kClip + 1, kD}, 18, 0.5f), rv = randn({2 * kClip + 1, kD}, 19, 0.5f);
    MhaForwardOptions o;
    o.rel_k = tape.leaf(rk);
    o.rel_v = tape.leaf(rv);
    tape.backward(mha.forward(Context(), x, x, x, o).out, dout);
    MhaRefExtras ex;
    ex.rel_k = to_double(rk);
    ex.rel_v = to_double(rv);
    ex.clip = kClip;
    auto out_of = [&] { return mha_reference(x, x, x, mp, {}, false, ex).out; };
    for (auto [table, grad] : {std::pair{&ex.rel_k, o.rel_k.grad()}, std::pair{&ex.rel_v, o.rel_v.grad()}}) {
      std::vector<double> fd;
      for (size_t i = 0; i < table->size(); ++i) fd.push_back(oracle_fd(*table, i, dd, out_of));
      EXPECT_TRUE(AllClose(grad, fd, {1e-4, 1e-3}));
    }
  }
}

TEST(MhaOptions, BadOptionsNameTheModule) {
  Rng rng(20);
  MultiheadAttention mha(kE, kH, rng);
  const Tensor x = randn({1, kT, kE}, 21);
  MhaForwardOptions o;
  o.head_mask = Tensor::ones({kH + 1});
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, o); }, "[MultiheadAttention] head_mask (4,) must be"));
  o = {};
  o.rel_k = ad::Var(Tensor::zeros({4, kD}));
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, o); }, "[MultiheadAttention] rel_k (4, 4) must be"));
  o.rel_k = ad::Var(Tensor::zeros({5, kD}));
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(Context(), x, x, x, o, ad::Var(Tensor::zeros({1, kH, kT, kT}))); },
                        "[MultiheadAttention] relative attention takes no trained attn_bias"));
  o = {};
  o.rotary = true;
  KvCache memory;
  const auto [k, v] = mha.project_kv(x, x);
  memory.reset(1, kH, kD);
  memory.append(k, v);
  o.kv_cache = &memory;
  o.kv_cache_fixed = true;
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, Tensor(), Tensor(), o); }, "not with kv_cache_fixed"));
}

TransformerLayerConfig options_config() {
  TransformerLayerConfig c;
  c.d_model = kE;
  c.nhead = kH;
  c.dim_feedforward = 16;
  c.dropout = 0.0f;
  return c;
}

TEST(TransformerOptions, DecoderRefusesEncoderOnlyOptions) {
  TransformerLayerConfig c = options_config();
  c.rotary = true;
  Rng rng(31);
  EXPECT_TRUE(ThrowsArg([&] { TransformerDecoderLayer d(c, rng); }, "[TransformerDecoderLayer] rotary and attn_scale"));
  c = options_config();
  c.attn_scale = 1.0f;
  EXPECT_TRUE(ThrowsArg([&] { TransformerDecoderLayer d(c, rng); }, "[TransformerDecoderLayer] rotary and attn_scale"));
}

}  // namespace
}  // namespace qkv::nn
