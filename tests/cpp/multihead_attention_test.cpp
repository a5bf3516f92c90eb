// nn::MultiheadAttention: head split/merge against a float64 per-head loop, masks and their polarity, causal no-leak,
// kdim/vdim and bias=false parameter sets with PyTorch's names, dropout modes, state_dict round trips, error paths.
#include "qkv/nn/multihead_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "nn_testing.h"
#include "qkv/core/rng.h"

namespace qkv::nn {
namespace {

using qkv::testing::AllClose;
using qkv::testing::AnyNaN;
using qkv::testing::BitIdentical;
using qkv::testing::kFloatReorder;
using qkv::testing::kModuleVsDouble;
using qkv::testing::mean_heads;
using qkv::testing::mha_reference;
using qkv::testing::names_and_shapes;
using qkv::testing::params_of;
using qkv::testing::randn;
using qkv::testing::randomize_parameters;
using qkv::testing::ThrowsArg;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct MhaCase {
  int64_t B = 2, Tq = 5, Tk = 7, E = 12, H = 3;
};

TEST(MultiheadAttention, SplitMergeEqualsPerHeadLoopCrossAttention) {
  const MhaCase c;
  Rng rng(1);
  MultiheadAttention mha(c.E, c.H, rng);
  randomize_parameters(mha, 2);
  const Tensor q = randn({c.B, c.Tq, c.E}, 3), k = randn({c.B, c.Tk, c.E}, 4), v = randn({c.B, c.Tk, c.E}, 5);
  MhaForwardOptions o;
  o.average_attn_weights = false;
  const MhaResult r = mha.forward(q, k, v, o);
  const auto ref = mha_reference(q, k, v, params_of(mha));
  ASSERT_EQ(r.out.value.shape(), Shape({c.B, c.Tq, c.E}));
  ASSERT_EQ(r.weights.shape(), Shape({c.B, c.H, c.Tq, c.Tk}));
  EXPECT_TRUE(AllClose(r.out.value, ref.out, kModuleVsDouble));
  EXPECT_TRUE(AllClose(r.weights, ref.weights, kModuleVsDouble));
}

TEST(MultiheadAttention, PackedSelfAttentionEqualsPerHeadLoopAndSlicedPath) {
  const MhaCase c;
  Rng rng(1);
  MultiheadAttention mha(c.E, c.H, rng);
  randomize_parameters(mha, 7);
  const Tensor x = randn({c.B, c.Tq, c.E}, 8);
  MhaForwardOptions o;
  o.need_weights = false;  // fused attention path
  const MhaResult packed = mha.forward(x, x, x, o);  // same tensor: one (3E, E) projection
  EXPECT_FALSE(packed.weights.defined());
  const auto ref = mha_reference(x, x, x, params_of(mha));
  EXPECT_TRUE(AllClose(packed.out.value, ref.out, kModuleVsDouble));
  // Equal values in distinct storage take the three-projection path: same result up to float reordering.
  const MhaResult sliced = mha.forward(x, x.clone(), x.clone(), o);
  EXPECT_TRUE(AllClose(sliced.out.value, packed.out.value, kFloatReorder));
  // key is value but not query (cross-attention on memory): the (2E, E) projection.
  const Tensor mem = x.clone();
  EXPECT_TRUE(AllClose(mha.forward(x, mem, mem, o).out.value, packed.out.value, kFloatReorder));
}

TEST(MultiheadAttention, NonContiguousInputsAndOddSizes) {
  // E = 7 with H = 7 (D = 1), Tq = 1, a query whose last dim has stride 2, a key that is a transposed view.
  Rng rng(3);
  MultiheadAttention mha(7, 7, rng);
  randomize_parameters(mha, 4);
  const Tensor qt = randn({2, 1, 14}, 5).slice(2, 0, 14, 2);  // (2, 1, 7), strides (14, 14, 2)
  ASSERT_FALSE(qt.is_contiguous());
  const Tensor k = randn({2, 7, 3}, 6).transpose(1, 2);  // (2, 3, 7)
  ASSERT_FALSE(k.is_contiguous());
  const MhaResult r = mha.forward(qt, k, k);
  const auto ref = mha_reference(qt, k, k, params_of(mha));
  EXPECT_TRUE(AllClose(r.out.value, ref.out, kModuleVsDouble));
}

TEST(MultiheadAttention, NeedWeightsAveragedIsMeanOfPerHead) {
  const MhaCase c;
  Rng rng(1);
  MultiheadAttention mha(c.E, c.H, rng);
  randomize_parameters(mha, 9);
  const Tensor q = randn({c.B, c.Tq, c.E}, 10), k = randn({c.B, c.Tk, c.E}, 11);
  const MhaResult avg = mha.forward(q, k, k);  // PyTorch defaults: need_weights, averaged
  MhaForwardOptions o;
  o.average_attn_weights = false;
  const MhaResult per = mha.forward(q, k, k, o);
  ASSERT_EQ(avg.weights.shape(), Shape({c.B, c.Tq, c.Tk}));
  const auto ref = mha_reference(q, k, k, params_of(mha));
  EXPECT_TRUE(AllClose(avg.weights, mean_heads(ref.weights, c.B, c.H, c.Tq, c.Tk), kModuleVsDouble));
  EXPECT_TRUE(AllClose(avg.weights, mean_heads(qkv::testing::to_double(per.weights), c.B, c.H, c.Tq, c.Tk),
                       kFloatReorder));
  EXPECT_TRUE(BitIdentical(avg.out.value, per.out.value));
  // Each averaged row is a distribution.
  const auto w = avg.weights.to_vector();
  for (int64_t row = 0; row < c.B * c.Tq; ++row) {
    double s = 0;
    for (int64_t j = 0; j < c.Tk; ++j) s += w[row * c.Tk + j];
    EXPECT_NEAR(s, 1.0, 1e-5);
  }
}

TEST(MultiheadAttention, KeyPaddingMaskNonzeroMeansIgnore) {
  const MhaCase c;
  Rng rng(1);
  MultiheadAttention mha(c.E, c.H, rng);
  randomize_parameters(mha, 12);
  const Tensor q = randn({c.B, c.Tq, c.E}, 13), k = randn({c.B, c.Tk, c.E}, 14);
  // batch 0 pads its last 2 keys, batch 1 its first key. Nonzero = ignore (any nonzero value, e.g. 0.5).
  Tensor kpm = Tensor::zeros({c.B, c.Tk});
  kpm.at({0, c.Tk - 1}) = 1.0f;
  kpm.at({0, c.Tk - 2}) = 0.5f;
  kpm.at({1, 0}) = 1.0f;
  MhaForwardOptions o;
  o.key_padding_mask = kpm;
  o.average_attn_weights = false;
  const MhaResult r = mha.forward(q, k, k, o);
  const auto ref = mha_reference(q, k, k, params_of(mha), [&](int64_t b, int64_t, int64_t, int64_t j) {
    return kpm.at({b, j}) != 0.0f ? kNegInf : 0.0;
  });
  EXPECT_TRUE(AllClose(r.out.value, ref.out, kModuleVsDouble));
  EXPECT_TRUE(AllClose(r.weights, ref.weights, kModuleVsDouble));
  for (int64_t h = 0; h < c.H; ++h)
    for (int64_t i = 0; i < c.Tq; ++i) {
      EXPECT_EQ(r.weights.at({0, h, i, c.Tk - 1}), 0.0f);
      EXPECT_EQ(r.weights.at({1, h, i, 0}), 0.0f);
      EXPECT_GT(r.weights.at({1, h, i, 1}), 0.0f);
    }
  // Padding the last two keys of batch 0 equals dropping them.
  const Tensor q0 = q.slice(0, 0, 1), k0 = k.slice(0, 0, 1).slice(1, 0, c.Tk - 2);
  MhaForwardOptions plain;
  plain.need_weights = false;
  EXPECT_TRUE(AllClose(r.out.value.slice(0, 0, 1), mha.forward(q0, k0, k0, plain).out.value, kFloatReorder));
  // kKeep is the opposite polarity; kAdditive with -inf is the same as kBlock.
  MhaForwardOptions keep = o;
  Tensor inverted = Tensor::zeros({c.B, c.Tk});
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t j = 0; j < c.Tk; ++j) inverted.at({b, j}) = kpm.at({b, j}) != 0.0f ? 0.0f : 1.0f;
  keep.key_padding_mask = inverted;
  keep.key_padding_mask_kind = MaskKind::kKeep;
  EXPECT_TRUE(BitIdentical(mha.forward(q, k, k, keep).out.value, r.out.value));
  MhaForwardOptions additive = o;
  Tensor add = Tensor::zeros({c.B, c.Tk});
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t j = 0; j < c.Tk; ++j)
      add.at({b, j}) = kpm.at({b, j}) != 0.0f ? -std::numeric_limits<float>::infinity() : 0.0f;
  additive.key_padding_mask = add;
  additive.key_padding_mask_kind = MaskKind::kAdditive;
  EXPECT_TRUE(AllClose(mha.forward(q, k, k, additive).out.value, r.out.value, kFloatReorder));
}

TEST(MultiheadAttention, AttnMaskBoolTrueMeansNotAllowed) {
  const MhaCase c;
  Rng rng(1);
  MultiheadAttention mha(c.E, c.H, rng);
  randomize_parameters(mha, 15);
  const Tensor q = randn({c.B, c.Tq, c.E}, 16), k = randn({c.B, c.Tk, c.E}, 17);
  Tensor m = Tensor::zeros({c.Tq, c.Tk});
  for (int64_t i = 0; i < c.Tq; ++i) m.at({i, (i + 2) % c.Tk}) = 1.0f;  // one blocked key per query
  MhaForwardOptions o;
  o.attn_mask = m;  // default kind kBlock
  o.average_attn_weights = false;
  const MhaResult r = mha.forward(q, k, k, o);
  const auto ref = mha_reference(q, k, k, params_of(mha), [&](int64_t, int64_t, int64_t i, int64_t j) {
    return m.at({i, j}) != 0.0f ? kNegInf : 0.0;
  });
  EXPECT_TRUE(AllClose(r.out.value, ref.out, kModuleVsDouble));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < c.Tq; ++i) EXPECT_EQ(r.weights.at({b, h, i, (i + 2) % c.Tk}), 0.0f);
  // A float mask given as kAdditive is added to the scores (finite values are a bias, not a block).
  Tensor bias = randn({c.Tq, c.Tk}, 18);
  MhaForwardOptions a;
  a.attn_mask = bias;
  a.attn_mask_kind = MaskKind::kAdditive;
  const auto ref_a = mha_reference(q, k, k, params_of(mha), [&](int64_t, int64_t, int64_t i, int64_t j) {
    return static_cast<double>(bias.at({i, j}));
  });
  EXPECT_TRUE(AllClose(mha.forward(q, k, k, a).out.value, ref_a.out, kModuleVsDouble));
}

TEST(MultiheadAttention, PerBatchHeadMaskRowIsBTimesHPlusH) {
  const MhaCase c;
  Rng rng(1);
  MultiheadAttention mha(c.E, c.H, rng);
  randomize_parameters(mha, 19);
  const Tensor q = randn({c.B, c.Tq, c.E}, 20), k = randn({c.B, c.Tk, c.E}, 21);
  // (B*H, Tq, Tk): row n = b*H + h blocks key (n mod Tk) for every query.
  Tensor m = Tensor::zeros({c.B * c.H, c.Tq, c.Tk});
  for (int64_t n = 0; n < c.B * c.H; ++n)
    for (int64_t i = 0; i < c.Tq; ++i) m.at({n, i, n % c.Tk}) = 1.0f;
  MhaForwardOptions o;
  o.attn_mask = m;
  o.average_attn_weights = false;
  const MhaResult r = mha.forward(q, k, k, o);
  const auto ref = mha_reference(q, k, k, params_of(mha), [&](int64_t b, int64_t h, int64_t, int64_t j) {
    return j == (b * c.H + h) % c.Tk ? kNegInf : 0.0;
  });
  EXPECT_TRUE(AllClose(r.out.value, ref.out, kModuleVsDouble));
  EXPECT_TRUE(AllClose(r.weights, ref.weights, kModuleVsDouble));
}

TEST(MultiheadAttention, KeyPaddingAndAttnMaskAndBiasCombine) {
  const MhaCase c;
  Rng rng(1);
  MultiheadAttention mha(c.E, c.H, rng);
  randomize_parameters(mha, 22);
  const Tensor q = randn({c.B, c.Tq, c.E}, 23), k = randn({c.B, c.Tk, c.E}, 24);
  Tensor kpm = Tensor::zeros({c.B, c.Tk});
  kpm.at({0, 1}) = 1.0f;
  kpm.at({1, 4}) = 1.0f;
  Tensor am = Tensor::zeros({c.Tq, c.Tk});
  for (int64_t i = 0; i < c.Tq; ++i) am.at({i, c.Tk - 1 - i}) = 1.0f;
  const Tensor bias = randn({1, c.H, c.Tq, c.Tk}, 25);  // per-head score bias (T5 / ALiBi style)
  MhaForwardOptions o;
  o.key_padding_mask = kpm;
  o.attn_mask = am;
  o.attn_bias = bias;
  o.average_attn_weights = false;
  const MhaResult r = mha.forward(q, k, k, o);
  const auto ref = mha_reference(q, k, k, params_of(mha), [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    if (kpm.at({b, j}) != 0.0f || am.at({i, j}) != 0.0f) return kNegInf;
    return static_cast<double>(bias.at({0, h, i, j}));
  });
  EXPECT_TRUE(AllClose(r.out.value, ref.out, kModuleVsDouble));
  EXPECT_TRUE(AllClose(r.weights, ref.weights, kModuleVsDouble));
  // attn_bias alone equals the same values passed as a (B*H, Tq, Tk) additive attn_mask.
  MhaForwardOptions only_bias;
  only_bias.attn_bias = bias;
  MhaForwardOptions as_mask;
  as_mask.attn_mask = bias.expand({c.B, c.H, c.Tq, c.Tk}).reshape({c.B * c.H, c.Tq, c.Tk});
  as_mask.attn_mask_kind = MaskKind::kAdditive;
  EXPECT_TRUE(BitIdentical(mha.forward(q, k, k, only_bias).out.value, mha.forward(q, k, k, as_mask).out.value));
}

TEST(MultiheadAttention, FullyMaskedRowIsZeroNotNaN) {
  // PyTorch returns NaN for a query whose keys are all masked; qkv returns attention output 0, so the module's
  // output is exactly out_proj.bias, and the weights are 0.
  const MhaCase c;
  Rng rng(1);
  MultiheadAttention mha(c.E, c.H, rng);
  randomize_parameters(mha, 26);
  const Tensor q = randn({c.B, c.Tq, c.E}, 27), k = randn({c.B, c.Tk, c.E}, 28);
  Tensor kpm = Tensor::zeros({c.B, c.Tk});
  for (int64_t j = 0; j < c.Tk; ++j) kpm.at({0, j}) = 1.0f;  // batch 0: every key padded
  MhaForwardOptions o;
  o.key_padding_mask = kpm;
  const MhaResult r = mha.forward(q, k, k, o);
  EXPECT_FALSE(AnyNaN(r.out.value));
  EXPECT_FALSE(AnyNaN(r.weights));
  for (int64_t i = 0; i < c.Tq; ++i)
    for (int64_t e = 0; e < c.E; ++e) EXPECT_EQ(r.out.value.at({0, i, e}), mha.out_proj.bias.at({e}));
  for (int64_t i = 0; i < c.Tq; ++i)
    for (int64_t j = 0; j < c.Tk; ++j) EXPECT_EQ(r.weights.at({0, i, j}), 0.0f);
  // The fused path (no weights) agrees.
  o.need_weights = false;
  EXPECT_TRUE(AllClose(mha.forward(q, k, k, o).out.value, r.out.value, kFloatReorder));
}

TEST(MultiheadAttention, IsCausalNoLeakFromFuture) {
  const MhaCase c;
  Rng rng(1);
  MultiheadAttention mha(c.E, c.H, rng);
  randomize_parameters(mha, 29);
  const int64_t T = 6;
  const Tensor x = randn({c.B, T, c.E}, 30);
  Tensor y = x.clone();
  // Change every position from t = 3 on.
  const Tensor noise = randn({c.B, T - 3, c.E}, 31);
  y.slice(1, 3, T).copy_from(noise);
  for (bool need_weights : {false, true}) {
    MhaForwardOptions o;
    o.is_causal = true;
    o.need_weights = need_weights;
    const Tensor ox = mha.forward(x, x, x, o).out.value, oy = mha.forward(y, y, y, o).out.value;
    EXPECT_TRUE(BitIdentical(ox.slice(1, 0, 3), oy.slice(1, 0, 3))) << "need_weights " << need_weights;
    EXPECT_FALSE(BitIdentical(ox.slice(1, 3, T), oy.slice(1, 3, T)));
  }
  MhaForwardOptions o;
  o.is_causal = true;
  o.average_attn_weights = false;
  const MhaResult r = mha.forward(x, x, x, o);
  const auto ref = mha_reference(x, x, x, params_of(mha), {}, /*causal=*/true);
  EXPECT_TRUE(AllClose(r.out.value, ref.out, kModuleVsDouble));
  EXPECT_TRUE(AllClose(r.weights, ref.weights, kModuleVsDouble));
  // is_causal with an explicit causal attn_mask (PyTorch's hint usage) gives the same result.
  Tensor causal = Tensor::zeros({T, T});
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = i + 1; j < T; ++j) causal.at({i, j}) = 1.0f;
  MhaForwardOptions both = o;
  both.attn_mask = causal;
  EXPECT_TRUE(BitIdentical(mha.forward(x, x, x, both).out.value, r.out.value));
}

TEST(MultiheadAttention, EmptyQueryAndEmptyKeys) {
  Rng rng(1);
  MultiheadAttention mha(8, 2, rng);
  randomize_parameters(mha, 49);
  const Tensor k = randn({2, 4, 8}, 50);
  const MhaResult none = mha.forward(Tensor::zeros({2, 0, 8}), k, k);
  EXPECT_EQ(none.out.value.shape(), Shape({2, 0, 8}));
  EXPECT_EQ(none.weights.shape(), Shape({2, 0, 4}));
  // No keys at all: every row is fully masked, so the output is out_proj.bias and the weights are empty.
  const Tensor empty_k = Tensor::zeros({2, 0, 8});
  const MhaResult r = mha.forward(randn({2, 3, 8}, 51), empty_k, empty_k);
  EXPECT_EQ(r.weights.shape(), Shape({2, 3, 0}));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t e = 0; e < 8; ++e) EXPECT_EQ(r.out.value.at({1, i, e}), mha.out_proj.bias.at({e}));
}

TEST(MultiheadAttention, IsCausalIsTopLeftWhenTqDiffersFromTk) {
  // Query i sees keys j <= i (PyTorch SDPA's is_causal alignment), for Tq < Tk and Tq > Tk.
  Rng rng(1);
  MultiheadAttention mha(12, 3, rng);
  randomize_parameters(mha, 46);
  for (auto [Tq, Tk] : {std::pair<int64_t, int64_t>{3, 6}, {6, 3}}) {
    const Tensor q = randn({2, Tq, 12}, 47), k = randn({2, Tk, 12}, 48);
    MhaForwardOptions o;
    o.is_causal = true;
    o.average_attn_weights = false;
    const MhaResult r = mha.forward(q, k, k, o);
    const auto ref = mha_reference(q, k, k, params_of(mha), {}, /*causal=*/true);
    EXPECT_TRUE(AllClose(r.out.value, ref.out, kModuleVsDouble)) << Tq << "x" << Tk;
    EXPECT_TRUE(AllClose(r.weights, ref.weights, kModuleVsDouble)) << Tq << "x" << Tk;
  }
}

TEST(MultiheadAttention, KdimVdimUseSeparateProjections) {
  Rng rng(1);
  const int64_t E = 8, H = 2, kdim = 5, vdim = 3;
  MultiheadAttention mha(E, H, rng, 0.0f, true, kdim, vdim);
  EXPECT_FALSE(mha.packed());
  const std::map<std::string, Shape> want = {
      {"q_proj_weight", {E, E}},       {"k_proj_weight", {E, kdim}}, {"v_proj_weight", {E, vdim}},
      {"in_proj_bias", {3 * E}},       {"out_proj.weight", {E, E}},  {"out_proj.bias", {E}}};
  EXPECT_EQ(names_and_shapes(mha), want);
  randomize_parameters(mha, 32);
  const Tensor q = randn({2, 4, E}, 33), k = randn({2, 6, kdim}, 34), v = randn({2, 6, vdim}, 35);
  MhaForwardOptions o;
  o.average_attn_weights = false;
  const MhaResult r = mha.forward(q, k, v, o);
  const auto ref = mha_reference(q, k, v, params_of(mha));
  EXPECT_TRUE(AllClose(r.out.value, ref.out, kModuleVsDouble));
  EXPECT_TRUE(AllClose(r.weights, ref.weights, kModuleVsDouble));
  // kdim == embed_dim but vdim differs: still separate.
  MultiheadAttention mixed(E, H, rng, 0.0f, true, E, vdim);
  EXPECT_FALSE(mixed.packed());
  EXPECT_EQ(mixed.named_parameters()[1].first, "k_proj_weight");
}

TEST(MultiheadAttention, BiasFalseHasNoBiasesAndMapsZeroToZero) {
  Rng rng(1);
  MultiheadAttention mha(8, 2, rng, 0.0f, /*bias=*/false);
  const std::map<std::string, Shape> want = {{"in_proj_weight", {24, 8}}, {"out_proj.weight", {8, 8}}};
  EXPECT_EQ(names_and_shapes(mha), want);
  EXPECT_FALSE(mha.in_proj_bias.defined());
  randomize_parameters(mha, 36);
  const Tensor zeros = Tensor::zeros({1, 3, 8});
  for (float v : mha.forward(zeros, zeros, zeros).out.value.to_vector()) EXPECT_EQ(v, 0.0f);
  const Tensor x = randn({2, 3, 8}, 37);
  EXPECT_TRUE(AllClose(mha.forward(x, x, x).out.value, mha_reference(x, x, x, params_of(mha)).out, kModuleVsDouble));
}

TEST(MultiheadAttention, StateDictNamesShapesAreTorchs) {
  Rng rng(1);
  MultiheadAttention mha(16, 4, rng);
  // torch.nn.MultiheadAttention(16, 4).state_dict(), in order.
  const std::vector<std::pair<std::string, Shape>> want = {{"in_proj_weight", {48, 16}},
                                                           {"in_proj_bias", {48}},
                                                           {"out_proj.weight", {16, 16}},
                                                           {"out_proj.bias", {16}}};
  std::vector<std::pair<std::string, Shape>> got;
  for (auto& [name, p] : mha.named_parameters()) got.emplace_back(name, p->shape());
  EXPECT_EQ(got, want);
  EXPECT_EQ(mha.num_parameters(), 48 * 16 + 48 + 16 * 16 + 16);
}

TEST(MultiheadAttention, InitIsTorchLike) {
  Rng rng(1);
  const int64_t E = 32;
  MultiheadAttention mha(E, 4, rng);
  const float xavier = std::sqrt(6.0f / (E + 3 * E)), kaiming = 1.0f / std::sqrt(static_cast<float>(E));
  float mx = 0;
  for (float v : mha.in_proj_weight.to_vector()) mx = std::max(mx, std::fabs(v));
  EXPECT_LE(mx, xavier);
  EXPECT_GT(mx, 0.9f * xavier);
  mx = 0;
  for (float v : mha.out_proj.weight.to_vector()) mx = std::max(mx, std::fabs(v));
  EXPECT_LE(mx, kaiming);
  EXPECT_GT(mx, 0.9f * kaiming);
  for (float v : mha.in_proj_bias.to_vector()) EXPECT_EQ(v, 0.0f);
  for (float v : mha.out_proj.bias.to_vector()) EXPECT_EQ(v, 0.0f);
}

TEST(MultiheadAttention, StateDictRoundTripGivesIdenticalOutputs) {
  Rng r1(1), r2(2);
  MultiheadAttention a(12, 3, r1), b(12, 3, r2);
  randomize_parameters(a, 38);
  const Tensor x = randn({2, 4, 12}, 39);
  EXPECT_FALSE(BitIdentical(a.forward(x, x, x).out.value, b.forward(x, x, x).out.value));
  StateDict sd = a.state_dict();
  b.load_state_dict(sd);
  EXPECT_TRUE(BitIdentical(a.forward(x, x, x).out.value, b.forward(x, x, x).out.value));
  // state_dict holds copies: changing it does not touch the module.
  sd["in_proj_weight"].fill(0.0f);
  EXPECT_NE(a.in_proj_weight.at({0, 0}), 0.0f);
}

TEST(MultiheadAttention, LoadStateDictRejectsMissingUnexpectedMisshapen) {
  Rng rng(1);
  MultiheadAttention mha(8, 2, rng);
  const StateDict good = mha.state_dict();
  const float before = mha.in_proj_weight.at({0, 0});

  StateDict missing = good;
  missing.erase("out_proj.bias");
  EXPECT_TRUE(ThrowsArg([&] { mha.load_state_dict(missing); }, "missing: out_proj.bias"));
  StateDict unexpected = good;
  unexpected["in_proj.weight"] = Tensor::zeros({24, 8});
  EXPECT_TRUE(ThrowsArg([&] { mha.load_state_dict(unexpected); }, "unexpected: in_proj.weight"));
  StateDict misshapen = good;
  misshapen["in_proj_weight"] = Tensor::zeros({8, 24});
  EXPECT_TRUE(ThrowsArg([&] { mha.load_state_dict(misshapen); }, "in_proj_weight has shape (8, 24)"));
  // All-or-nothing: nothing changed.
  EXPECT_EQ(mha.in_proj_weight.at({0, 0}), before);
  // Non-strict accepts missing and unexpected names, loading what matches.
  StateDict partial;
  partial["in_proj_weight"] = Tensor::zeros({24, 8});
  partial["extra"] = Tensor::zeros({1});
  mha.load_state_dict(partial, /*strict=*/false);
  EXPECT_EQ(mha.in_proj_weight.at({0, 0}), 0.0f);
}

TEST(MultiheadAttention, EvalDeterministicTrainDropoutDiffers) {
  Rng rng(1);
  MultiheadAttention mha(12, 3, rng, /*dropout=*/0.5f);
  randomize_parameters(mha, 40);
  const Tensor x = randn({2, 6, 12}, 41);
  mha.eval();
  const Tensor e1 = mha.forward(x, x, x).out.value, e2 = mha.forward(x, x, x).out.value;
  EXPECT_TRUE(BitIdentical(e1, e2));
  mha.train();
  MhaForwardOptions o;
  o.average_attn_weights = false;
  const MhaResult t1 = mha.forward(x, x, x, o), t2 = mha.forward(x, x, x, o);
  EXPECT_FALSE(BitIdentical(t1.out.value, t2.out.value));
  EXPECT_FALSE(BitIdentical(t1.out.value, e1));
  // Returned weights are the dropped ones (as PyTorch): every entry 0 or 2x an undropped weight.
  o.need_weights = true;
  mha.eval();
  const MhaResult ev = mha.forward(x, x, x, o);
  int zeros = 0;
  const auto tw = t1.weights.to_vector(), ew = ev.weights.to_vector();
  for (size_t i = 0; i < tw.size(); ++i) {
    if (tw[i] == 0.0f) {
      ++zeros;
    } else {
      EXPECT_NEAR(tw[i], 2.0f * ew[i], 1e-6f);
    }
  }
  EXPECT_GT(zeros, static_cast<int>(tw.size()) / 4);
  EXPECT_LT(zeros, static_cast<int>(3 * tw.size()) / 4);
  // Back in eval the result is the deterministic one again.
  EXPECT_TRUE(BitIdentical(mha.forward(x, x, x).out.value, e1));
}

TEST(MultiheadAttention, UnbatchedEqualsBatchOfOne) {
  Rng rng(1);
  MultiheadAttention mha(12, 3, rng);
  randomize_parameters(mha, 42);
  const Tensor q = randn({4, 12}, 43), k = randn({5, 12}, 44);
  Tensor kpm = Tensor::zeros({5});
  kpm.at({2}) = 1.0f;
  MhaForwardOptions o;
  o.key_padding_mask = kpm;
  const MhaResult u = mha.forward(q, k, k, o);
  ASSERT_EQ(u.out.value.shape(), Shape({4, 12}));
  ASSERT_EQ(u.weights.shape(), Shape({4, 5}));
  MhaForwardOptions ob;
  ob.key_padding_mask = kpm.unsqueeze(0);
  const MhaResult b = mha.forward(q.unsqueeze(0), k.unsqueeze(0), k.unsqueeze(0), ob);
  EXPECT_TRUE(BitIdentical(u.out.value, b.out.value.squeeze(0)));
  EXPECT_TRUE(BitIdentical(u.weights, b.weights.squeeze(0)));
}

TEST(MultiheadAttention, ConstructorErrorsNameTheModule) {
  Rng rng(1);
  EXPECT_TRUE(ThrowsArg([&] { MultiheadAttention m(10, 3, rng); }, "[MultiheadAttention] embed_dim 10 must be divisible by num_heads 3"));
  EXPECT_TRUE(ThrowsArg([&] { MultiheadAttention m(0, 1, rng); }, "[MultiheadAttention]"));
  EXPECT_TRUE(ThrowsArg([&] { MultiheadAttention m(8, 0, rng); }, "[MultiheadAttention]"));
  EXPECT_TRUE(ThrowsArg([&] { MultiheadAttention m(8, 2, rng, 1.0f); }, "[MultiheadAttention] dropout"));
  EXPECT_TRUE(ThrowsArg([&] { MultiheadAttention m(8, 2, rng, 0.0f, true, -1); }, "[MultiheadAttention] kdim"));
}

TEST(MultiheadAttention, ForwardShapeErrorsNameTheModule) {
  Rng rng(1);
  MultiheadAttention mha(8, 2, rng);
  const Tensor x = randn({2, 3, 8}, 45);
  const std::string op = "[MultiheadAttention]";
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(randn({2, 3, 4, 8}, 1), x, x); }, op));  // rank 4
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, randn({3, 8}, 1), x); }, op));        // ranks differ
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(randn({2, 3, 6}, 1), x, x); }, "embed_dim = 8"));
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, randn({2, 3, 6}, 1), x); }, "kdim = 8"));
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, randn({1, 3, 8}, 1), randn({1, 3, 8}, 2)); }, "disagree"));
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, randn({2, 4, 8}, 1)); }, "disagree"));
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(Tensor(), x, x); }, op));
  MhaForwardOptions o;
  o.key_padding_mask = Tensor::zeros({2, 4});
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, o); }, "[MultiheadAttention] key_padding_mask (2, 4)"));
  o = {};
  o.key_padding_mask = Tensor::zeros({2, 3});
  o.key_padding_mask_kind = MaskKind::kNone;
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, o); }, "key_padding_mask_kind is kNone"));
  o = {};
  o.attn_mask = Tensor::zeros({3, 4});
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, o); }, "[MultiheadAttention] 2-D attn_mask (3, 4)"));
  o.attn_mask = Tensor::zeros({2, 3, 3});  // needs B*H = 4 rows
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, o); }, "(B*H, Tq, Tk) = (4, 3, 3)"));
  o.attn_mask = Tensor::zeros({1, 4, 3, 3});
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, o); }, "[MultiheadAttention] attn_mask"));
  o.attn_mask = Tensor::zeros({3, 3});
  o.attn_mask_kind = MaskKind::kNone;
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, o); }, "attn_mask_kind is kNone"));
  o = {};
  o.attn_bias = Tensor::zeros({1, 3, 3, 3});  // H = 2
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, o); }, "[MultiheadAttention] attn_bias (1, 3, 3, 3)"));
}


// Incremental decoding through the module's one forward: chunks of 3, 1 and 2 new positions appended to a KV cache
// with is_causal (bottom-right) equal the whole sequence's causal self-attention against the float64 oracle.
TEST(MultiheadAttention, KvCacheChunksEqualCausalSelfAttentionOfTheWholeSequence) {
  const MhaCase c;
  Rng rng(3);
  MultiheadAttention mha(c.E, c.H, rng);
  randomize_parameters(mha, 41);
  const int64_t T = 6;
  const Tensor x = randn({c.B, T, c.E}, 42);
  const auto ref = mha_reference(x, x, x, params_of(mha), {}, /*causal=*/true);
  KvCache cache;
  MhaForwardOptions o;
  o.is_causal = true;
  o.need_weights = false;
  o.kv_cache = &cache;
  Tensor out = Tensor::empty({c.B, T, c.E});
  int64_t at = 0;
  for (int64_t n : {3, 1, 2}) {
    const Tensor chunk = x.slice(1, at, at + n).contiguous();
    out.slice(1, at, at + n).copy_from(mha.forward(chunk, chunk, chunk, o).out.value);
    at += n;
  }
  EXPECT_TRUE(AllClose(out, ref.out, kModuleVsDouble));
  EXPECT_EQ(cache.length(), T);
}

// Cross-attention on a fixed memory: project_kv once, then kv_cache_fixed, equals attending to the memory directly;
// for packed and for separate (kdim, vdim) projections.
TEST(MultiheadAttention, FixedKvCacheEqualsCrossAttentionOnTheMemory) {
  const MhaCase c;
  for (int64_t kdim : {int64_t{0}, int64_t{5}}) {
    Rng rng(4);
    MultiheadAttention mha(c.E, c.H, rng, 0.0f, true, kdim, kdim);
    randomize_parameters(mha, 43);
    const int64_t dim = kdim ? kdim : c.E;
    const Tensor x = randn({c.B, c.Tq, c.E}, 44), mem = randn({c.B, c.Tk, dim}, 45);
    MhaForwardOptions o;
    o.average_attn_weights = false;
    const MhaResult direct = mha.forward(x, mem, mem, o);
    KvCache cache;
    auto [k, v] = mha.project_kv(mem, mem);
    cache.reset(c.B, c.H, c.E / c.H);
    cache.append(k, v);
    MhaForwardOptions f = o;
    f.kv_cache = &cache;
    f.kv_cache_fixed = true;
    const MhaResult cached = mha.forward(x, Tensor(), Tensor(), f);
    EXPECT_TRUE(AllClose(cached.out.value, direct.out.value, kFloatReorder)) << "kdim " << kdim;
    EXPECT_TRUE(AllClose(cached.weights, direct.weights, kFloatReorder)) << "kdim " << kdim;
    EXPECT_EQ(cache.length(), c.Tk);  // a fixed cache is never appended to
  }
}

TEST(MultiheadAttention, KvCacheIsRefusedOnATapeAndForUnbatchedInput) {
  Rng rng(5);
  MultiheadAttention mha(8, 2, rng);
  KvCache cache;
  MhaForwardOptions o;
  o.kv_cache = &cache;
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(randn({5, 8}, 1), randn({5, 8}, 2), randn({5, 8}, 3), o); },
                        "[MultiheadAttention] kv_cache needs batched"));
  ad::Tape tape;
  ad::ParameterSet params(mha);
  const Context train(tape, params);
  const Tensor x = randn({1, 3, 8}, 4);
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(train, x, x, x, o); }, "[MultiheadAttention] kv_cache is for inference"));
}

}  // namespace
}  // namespace qkv::nn
