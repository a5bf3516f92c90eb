// The experiments' ablation encoder layer (src/experiments/ablation_layer.h): with its switches at their defaults
// it is nn::TransformerEncoderLayer; its LayerNorm-free / residual-free forms compose the blocks; the Shaw relative
// layer owns its tables and matches the float64 oracle; head gates act per layer (also through the Tagger's
// (layers, heads) head_mask); parameter names and the clip check.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "../../src/experiments/ablation_layer.h"
#include "../../src/experiments/tagger.h"
#include "nn_testing.h"
#include "qkv/nn/transformer.h"
#include "qkv/ops/elementwise.h"

namespace qkv::experiments {
namespace {

using nn::Context;
using nn::MhaForwardOptions;
using qkv::testing::AllClose;
using qkv::testing::kExact;
using qkv::testing::kFloatReorder;
using qkv::testing::kModuleVsDouble;
using qkv::testing::mha_reference;
using qkv::testing::MhaRefExtras;
using qkv::testing::names_and_shapes;
using qkv::testing::params_of;
using qkv::testing::randn;
using qkv::testing::randomize_parameters;
using qkv::testing::ThrowsArg;
using qkv::testing::to_double;

constexpr int64_t kB = 2, kT = 5, kE = 12, kH = 3, kD = kE / kH, kClip = 2;

AblationLayerConfig options_config() {
  AblationLayerConfig c;
  c.layer.d_model = kE;
  c.layer.nhead = kH;
  c.layer.dim_feedforward = 16;
  c.layer.dropout = 0.0f;
  return c;
}

// Default switches: the same parameters (drawn in the same order, under the same names) and the same output as
// torch's layer, post-LN and pre-LN, with a padding mask.
TEST(AblationEncoderLayer, DefaultSwitchesAreTorchsEncoderLayer) {
  for (bool norm_first : {false, true}) {
    AblationLayerConfig c = options_config();
    c.layer.norm_first = norm_first;
    Rng r1(40), r2(40);
    AblationEncoderLayer layer(c, r1);
    nn::TransformerEncoderLayer torch_layer(c.layer, r2);
    const auto a = layer.named_parameters(), b = torch_layer.named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_TRUE(AllClose(*a[i].second, *b[i].second, kExact)) << a[i].first;
    }
    randomize_parameters(layer, 41);
    randomize_parameters(torch_layer, 41);
    const Tensor x = randn({kB, kT, kE}, 42);
    nn::AttentionMasks m;
    m.key_padding_mask = Tensor::zeros({kB, kT});
    m.key_padding_mask.data()[kB * kT - 1] = 1.0f;
    EXPECT_TRUE(AllClose(layer.forward(x, m), torch_layer.forward(x, m), kExact)) << "norm_first " << norm_first;
  }
}

// Without LayerNorm / residuals the layer is the composition of its blocks: ff(sa(x)), x + sa(x) + ff(...), etc.
TEST(AblationEncoderLayer, NormAndResidualSwitchesComposeTheBlocks) {
  for (bool residual : {false, true})
    for (bool norm_first : {false, true}) {
      AblationLayerConfig c = options_config();
      c.layer_norm = false;
      c.residual = residual;
      c.layer.norm_first = norm_first;
      c.layer.rotary = true;
      Rng rng(22);
      AblationEncoderLayer layer(c, rng);
      randomize_parameters(layer, 23);
      const Tensor x = randn({kB, kT, kE}, 24);
      MhaForwardOptions o;
      o.need_weights = false;
      o.rotary = true;
      const Tensor sa = layer.self_attn.forward(x, x, x, o).out.value;
      const Tensor x1 = residual ? add(x, sa) : sa;
      const Tensor f = layer.ff.forward(Context(), ad::Var(x1)).value;
      EXPECT_TRUE(AllClose(layer.forward(x), residual ? add(x1, f) : f, kFloatReorder))
          << "residual " << residual << " norm_first " << norm_first;
      const auto names = names_and_shapes(layer);
      EXPECT_EQ(names.count("norm1.weight") + names.count("norm2.bias"), 0u);
      EXPECT_EQ(names.size(), 8u);  // self_attn (4), linear1 (2), linear2 (2)
    }
}

TEST(AblationEncoderLayer, RelativeLayerOwnsItsTablesAndReturnsWeights) {
  AblationLayerConfig c = options_config();
  c.relative = true;
  c.relative_clip = kClip;
  c.layer.attn_scale = 1.0f;
  Rng rng(25);
  AblationEncoderLayer layer(c, rng);
  const auto names = names_and_shapes(layer);
  EXPECT_EQ(names.at("rel_k"), Shape({2 * kClip + 1, kD}));
  EXPECT_EQ(names.at("rel_v"), Shape({2 * kClip + 1, kD}));
  EXPECT_EQ(names.count("norm1.weight"), 1u);
  randomize_parameters(layer, 26);
  const Tensor x = randn({kB, kT, kE}, 27);
  Tensor weights;
  const Tensor y = layer.forward(Context(), ad::Var(x), {}, {}, &weights).value;
  MhaRefExtras ex;
  ex.rel_k = to_double(layer.rel_k);
  ex.rel_v = to_double(layer.rel_v);
  ex.clip = kClip;
  ex.scale = 1.0;
  const auto ref = mha_reference(x, x, x, params_of(layer.self_attn), {}, false, ex);
  EXPECT_TRUE(AllClose(weights, ref.weights, kModuleVsDouble));
  // post-LN: y = norm2(h + ff(h)), h = norm1(x + sa(x)) with sa the oracle's output.
  const Tensor sa = Tensor::from_vector({kB, kT, kE}, std::vector<float>(ref.out.begin(), ref.out.end()));
  const Tensor h = layer.norm1.forward(Context(), ad::Var(add(x, sa))).value;
  const Tensor want =
      layer.norm2.forward(Context(), ad::Var(add(h, layer.ff.forward(Context(), ad::Var(h)).value))).value;
  EXPECT_TRUE(AllClose(y, want, {1e-4, 1e-3}));
}

// A layer's head gates multiply its self-attention's heads (MhaForwardOptions::head_mask), the weights ungated.
TEST(AblationEncoderLayer, HeadMaskGatesTheSelfAttentionHeads) {
  AblationLayerConfig c = options_config();
  c.layer.norm_first = true;
  Rng rng(28);
  AblationEncoderLayer layer(c, rng);
  randomize_parameters(layer, 29);
  const Tensor x = randn({kB, kT, kE}, 30);
  const Tensor gates = Tensor::from_vector({kH}, {0.0f, 1.0f, 0.5f});
  MhaForwardOptions o;
  o.need_weights = false;
  o.head_mask = gates;
  const Tensor n1 = layer.norm1.forward(x);
  const Tensor x1 = add(x, layer.self_attn.forward(n1, n1, n1, o).out.value);
  const Tensor want = add(x1, layer.ff.forward(Context(), ad::Var(layer.norm2.forward(x1))).value);
  Tensor weights, ungated;
  EXPECT_TRUE(AllClose(layer.forward(Context(), ad::Var(x), {}, gates, &weights).value, want, kFloatReorder));
  EXPECT_FALSE(AllClose(layer.forward(x, {}, gates), layer.forward(x), kFloatReorder));  // the gates change it
  layer.forward(Context(), ad::Var(x), {}, {}, &ungated);
  EXPECT_TRUE(AllClose(weights, ungated, kExact));
  EXPECT_TRUE(ThrowsArg([&] { layer.forward(x, {}, Tensor::ones({kH + 1})); },
                        "[MultiheadAttention] head_mask (4,) must be"));
}

// The Tagger's (layers, heads) head_mask gates only each row's layer: all ones is no mask; a zero in layer 1
// changes the output but not layer 0's attention.
TEST(AblationEncoderLayer, TaggerHeadMaskRowsGateTheirLayer) {
  TaggerConfig c;
  c.vocab_in = c.vocab_out = 9;
  c.d_model = kE;
  c.heads = kH;
  c.ff = 16;
  Rng rng(31);
  Tagger m(c, rng);
  const Ids ids{{1, 2, 3, 4, 5, 6}, {2, 3}};
  std::vector<Tensor> plain, gated;
  TaggerRun run;
  run.attention = &plain;
  const Tensor y = tagger_logits(m, ids, run);
  run.head_mask.assign(static_cast<size_t>(2 * kH), 1.0f);
  EXPECT_TRUE(AllClose(tagger_logits(m, ids, run), y, kExact));
  run.head_mask[kH] = 0.0f;  // layer 1, head 0 off
  run.attention = &gated;
  EXPECT_FALSE(AllClose(tagger_logits(m, ids, run), y, kFloatReorder));
  ASSERT_EQ(gated.size(), 2u);
  EXPECT_TRUE(AllClose(gated[0], plain[0], kExact));
}

TEST(AblationEncoderLayer, ClipIsChecked) {
  AblationLayerConfig c = options_config();
  c.relative = true;
  c.relative_clip = -1;
  Rng rng(32);
  EXPECT_TRUE(ThrowsArg([&] { AblationEncoderLayer l(c, rng); }, "[AblationEncoderLayer] relative_clip must be >= 0"));
  c = options_config();
  c.layer.attn_scale = NAN;
  EXPECT_TRUE(ThrowsArg([&] { AblationEncoderLayer l(c, rng); }, "[AblationEncoderLayer] attn_scale must be finite"));
  const AblationEncoderLayer ok(options_config(), rng);
  EXPECT_TRUE(ThrowsArg([&] { ok.forward(Context(), ad::Var(Tensor::zeros({kT, kE}))); },
                        "[AblationEncoderLayer] src (5, 12) must be (B, T, d_model)"));
}

}  // namespace
}  // namespace qkv::experiments
