// nn::MultiheadAttention with grouped-query heads (num_kv_heads < num_heads): outputs and per-head weights against a
// float64 twin (projections in double, then the library's plain attention with enable_gqa), the same numbers as a
// num_kv_heads == num_heads module whose K/V rows repeat, gradients by finite differences of the twin, cached and
// packed decoding, the sequence shard, parameter shapes and the errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nn_testing.h"
#include "ops_testing.h"
#include "qkv/core/rng.h"
#include "qkv/nn/multihead_attention.h"
#include "qkv/ops/attention_plain.h"
#include "qkv/parallel/comm.h"
#include "qkv/train/data_parallel.h"

namespace qkv::nn {
namespace {

using qkv::testing::AllClose;
using qkv::testing::BitIdentical;
using qkv::testing::kFloatReorder;
using qkv::testing::kModuleVsDouble;
using qkv::testing::names_and_shapes;
using qkv::testing::randn;
using qkv::testing::randomize_parameters;
using qkv::testing::ThrowsArg;
using qkv::testing::to_double;
using DVec = std::vector<double>;

// Float32 gradients against central differences of the float64 twin.
constexpr qkv::testing::Tol kGradTol{1e-5, 1e-4};

// The module's weights in double, q, k and v apart (wk, wv: (Ekv, kdim), (Ekv, vdim)).
using Weights = qkv::testing::MhaParams;
using qkv::testing::params_of;

// x (rows, in) · wᵀ + b  ->  (rows, out).
DVec linear64(const DVec& x, const DVec& w, const DVec& b, int64_t in, int64_t out) {
  const int64_t rows = static_cast<int64_t>(x.size()) / in;
  DVec y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[static_cast<size_t>(o)];
      for (int64_t i = 0; i < in; ++i) s += x[static_cast<size_t>(r * in + i)] * w[static_cast<size_t>(o * in + i)];
      y[static_cast<size_t>(r * out + o)] = s;
    }
  return y;
}

// (B, T, heads·D) -> (B, heads, T, D).
Array64 heads_of(const DVec& p, int64_t B, int64_t T, int64_t heads, int64_t D) {
  Array64 a{{B, heads, T, D}, DVec(p.size())};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < D; ++d)
          a.data[static_cast<size_t>(((b * heads + h) * T + t) * D + d)] =
              p[static_cast<size_t>(((b * T + t) * heads + h) * D + d)];
  return a;
}

struct Dims {
  int64_t B, Tq, Tk, E, H, Hkv, kdim, vdim;
  int64_t D() const { return E / H; }
};

struct Twin {
  DVec out;      // (B, Tq, E)
  DVec weights;  // (B, H, Tq, Tk)
};

// The float64 twin: projections, heads, attention_plain with GQA (mask: (B, H, Tq, Tk) additive or null), merge,
// out_proj.
Twin twin(const DVec& query, const DVec& key, const DVec& value, const Weights& w, const Dims& d,
          AttentionOptions o = {}, const Array64* mask = nullptr) {
  const int64_t D = d.D(), Ekv = d.Hkv * D;
  const Array64 q = heads_of(linear64(query, w.wq, w.bq, d.E, d.E), d.B, d.Tq, d.H, D);
  const Array64 k = heads_of(linear64(key, w.wk, w.bk, d.kdim, Ekv), d.B, d.Tk, d.Hkv, D);
  const Array64 v = heads_of(linear64(value, w.wv, w.bv, d.vdim, Ekv), d.B, d.Tk, d.Hkv, D);
  o.enable_gqa = d.H != d.Hkv;
  if (mask != nullptr) o.mask_kind = MaskKind::kAdditive;
  const PlainAttention a = attention_plain(q, k, v, mask, o);
  DVec merged(static_cast<size_t>(d.B * d.Tq * d.E));  // (B, H, Tq, D) -> (B, Tq, E)
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t t = 0; t < d.Tq; ++t)
        for (int64_t i = 0; i < D; ++i)
          merged[static_cast<size_t>((b * d.Tq + t) * d.E + h * D + i)] =
              a.out[static_cast<size_t>(((b * d.H + h) * d.Tq + t) * D + i)];
  return {linear64(merged, w.wo, w.bo, d.E, d.E), a.weights};
}

DVec mean_over_heads(const DVec& w, const Dims& d) {
  return qkv::testing::mean_heads(w, d.B, d.H, d.Tq, d.Tk);
}

// Fills `full` (num_kv_heads == num_heads, the same sizes and bias) with m's weights, each of m's K/V heads repeated
// H / Hkv times (the explicit repeat).
void copy_repeated(const MultiheadAttention& m, MultiheadAttention& full) {
  const int64_t E = m.embed_dim(), D = m.head_dim(), H = m.num_heads(), group = H / m.num_kv_heads();
  const int64_t Ekv = m.num_kv_heads() * D;
  auto copy_kv = [&](const Tensor& src, int64_t src0, Tensor dst, int64_t dst0) {  // rows along dim 0
    for (int64_t h = 0; h < H; ++h)
      dst.slice(0, dst0 + h * D, dst0 + (h + 1) * D)
          .copy_from(src.slice(0, src0 + h / group * D, src0 + (h / group + 1) * D));
  };
  for (const bool weight : {true, false}) {
    const Tensor& src = weight ? m.in_proj_weight : m.in_proj_bias;
    if (!src.defined()) continue;
    Tensor dst = weight ? full.in_proj_weight : full.in_proj_bias;
    dst.slice(0, 0, E).copy_from(src.slice(0, 0, E));
    copy_kv(src, E, dst, E);
    copy_kv(src, E + Ekv, dst, 2 * E);
  }
  if (!m.packed()) {
    full.q_proj_weight.copy_from(m.q_proj_weight);
    copy_kv(m.k_proj_weight, 0, full.k_proj_weight, 0);
    copy_kv(m.v_proj_weight, 0, full.v_proj_weight, 0);
  }
  full.out_proj.weight.copy_from(m.out_proj.weight);
  if (m.out_proj.bias.defined()) full.out_proj.bias.copy_from(m.out_proj.bias);
}

// Self-attention (one projection), cross-attention on a memory (key is value), three distinct inputs, and separate
// kdim/vdim projections; 4 query heads over 2 and over 1 kv heads; weights with the output, recomputed, averaged.
TEST(MultiheadAttentionGqa, OutputAndWeightsEqualTheFloat64TwinForEveryLayout) {
  for (const int64_t Hkv : {int64_t{2}, int64_t{1}}) {
    for (const int layout : {0, 1, 2, 3}) {
      const int64_t kdim = layout == 3 ? 5 : 0, vdim = layout == 3 ? 6 : 0;
      Dims d{2, 5, layout == 0 ? 5 : 7, 16, 4, Hkv, kdim ? kdim : 16, vdim ? vdim : 16};
      Rng rng(10 + layout);
      MultiheadAttention mha(d.E, d.H, rng, 0.0f, true, kdim, vdim, Hkv);
      ASSERT_EQ(mha.num_kv_heads(), Hkv);
      randomize_parameters(mha, 20 + layout);
      const Tensor x = randn({d.B, d.Tq, d.E}, 30 + layout);
      const Tensor mem = randn({d.B, d.Tk, d.kdim}, 40 + layout);
      const Tensor key = layout == 0 ? x : mem;
      const Tensor value = layout == 0 ? x : layout == 1 ? mem : randn({d.B, d.Tk, d.vdim}, 50 + layout);
      MhaForwardOptions o;
      o.is_causal = layout == 0;
      o.average_attn_weights = false;
      AttentionOptions ao;
      ao.causal = o.is_causal ? Causal::kTopLeft : Causal::kNone;
      const Twin ref = twin(to_double(x), to_double(key), to_double(value), params_of(mha), d, ao);
      const std::string where = "Hkv " + std::to_string(Hkv) + ", layout " + std::to_string(layout);
      const MhaResult with_output = mha.forward(x, key, value, o);
      ASSERT_EQ(with_output.weights.shape(), Shape({d.B, d.H, d.Tq, d.Tk})) << where;
      EXPECT_TRUE(AllClose(with_output.out.value, ref.out, kModuleVsDouble)) << where;
      EXPECT_TRUE(AllClose(with_output.weights, ref.weights, kModuleVsDouble)) << where;
      o.recompute_weights = true;
      const MhaResult recomputed = mha.forward(x, key, value, o);
      EXPECT_TRUE(AllClose(recomputed.out.value, ref.out, kModuleVsDouble)) << where;
      EXPECT_TRUE(AllClose(recomputed.weights, ref.weights, kModuleVsDouble)) << where;
      o.need_weights = false;  // the fused kernel
      EXPECT_TRUE(AllClose(mha.forward(x, key, value, o).out.value, ref.out, kModuleVsDouble)) << where;
      MhaForwardOptions avg;  // need_weights, averaged over the query heads
      avg.is_causal = o.is_causal;
      const MhaResult averaged = mha.forward(x, key, value, avg);
      ASSERT_EQ(averaged.weights.shape(), Shape({d.B, d.Tq, d.Tk})) << where;
      EXPECT_TRUE(AllClose(averaged.weights, mean_over_heads(ref.weights, d), kModuleVsDouble)) << where;
    }
  }
}

// Masks stay per query head: a (B*H, Tq, Tk) attn_mask with a key_padding_mask, against the twin's (B, H, Tq, Tk).
TEST(MultiheadAttentionGqa, PerQueryHeadMasksAndHeadMask) {
  const Dims d{2, 4, 6, 12, 6, 2, 12, 12};
  Rng rng(3);
  MultiheadAttention mha(d.E, d.H, rng, 0.0f, true, 0, 0, d.Hkv);
  randomize_parameters(mha, 4);
  const Tensor x = randn({d.B, d.Tq, d.E}, 5), mem = randn({d.B, d.Tk, d.E}, 6);
  Tensor am = randn({d.B * d.H, d.Tq, d.Tk}, 7);
  Tensor kpm = Tensor::zeros({d.B, d.Tk});
  kpm.data()[1 * d.Tk + 4] = 1.0f;  // row 1 ignores key 4
  MhaForwardOptions o;
  o.attn_mask = am;
  o.attn_mask_kind = MaskKind::kAdditive;
  o.key_padding_mask = kpm;
  o.average_attn_weights = false;
  Array64 mask{{d.B, d.H, d.Tq, d.Tk}, to_double(am)};
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t r = 0; r < d.H * d.Tq; ++r)
      for (int64_t j = 0; j < d.Tk; ++j)
        if (kpm.data()[b * d.Tk + j] != 0.0f)
          mask.data[static_cast<size_t>((b * d.H * d.Tq + r) * d.Tk + j)] = -std::numeric_limits<double>::infinity();
  const Twin ref = twin(to_double(x), to_double(mem), to_double(mem), params_of(mha), d, {}, &mask);
  const MhaResult r = mha.forward(x, mem, mem, o);
  EXPECT_TRUE(AllClose(r.out.value, ref.out, kModuleVsDouble));
  EXPECT_TRUE(AllClose(r.weights, ref.weights, kModuleVsDouble));
  // head_mask gates the query heads: the module of repeated kv heads under the same gates gives the same output.
  Rng rng_full(0);
  MultiheadAttention full(d.E, d.H, rng_full);
  copy_repeated(mha, full);
  Tensor gate = Tensor::zeros({d.H});
  gate.data()[5] = 1.0f;
  gate.data()[2] = 0.5f;
  o.head_mask = gate;
  const MhaResult gated = mha.forward(x, mem, mem, o);
  EXPECT_TRUE(AllClose(gated.out.value, full.forward(x, mem, mem, o).out.value, kFloatReorder));
  EXPECT_TRUE(AllClose(gated.weights, r.weights, qkv::testing::kExact));  // the weights are not gated
}

// The same numbers as the module of num_heads kv heads whose K/V rows repeat each kv head (the explicit repeat).
TEST(MultiheadAttentionGqa, EqualsTheModuleWithRepeatedKvHeads) {
  for (const int64_t kdim : {int64_t{0}, int64_t{5}}) {
    Rng rng(7);
    MultiheadAttention gqa(16, 4, rng, 0.0f, true, kdim, kdim, 2);
    randomize_parameters(gqa, 8);
    MultiheadAttention full(16, 4, rng, 0.0f, true, kdim, kdim);
    copy_repeated(gqa, full);
    const Tensor x = randn({2, 5, 16}, 9), mem = randn({2, 6, kdim ? kdim : 16}, 10);
    MhaForwardOptions o;
    o.average_attn_weights = false;
    const MhaResult a = gqa.forward(Context(), x, mem, mem, o), b = full.forward(Context(), x, mem, mem, o);
    EXPECT_TRUE(AllClose(a.out.value, b.out.value, kFloatReorder)) << "kdim " << kdim;
    EXPECT_TRUE(AllClose(a.weights, b.weights, kFloatReorder)) << "kdim " << kdim;
    if (kdim == 0) {
      o.is_causal = true;
      o.need_weights = false;
      EXPECT_TRUE(AllClose(gqa.forward(Context(), x, x, x, o).out.value, full.forward(Context(), x, x, x, o).out.value,
                           kFloatReorder));
    }
  }
}

// Prepared bf16 / int8 weights take the grouped rows of the packed in_proj: the same numbers as the module of
// repeated kv heads at the same precision (each repeated row is rounded or quantized as its original).
TEST(MultiheadAttentionGqa, LowPrecisionWeightsEqualTheRepeatedModuleAtTheSamePrecision) {
  Rng rng(61);
  MultiheadAttention gqa(16, 4, rng, 0.0f, true, 0, 0, 2);
  randomize_parameters(gqa, 62);
  Rng rng_full(0);
  MultiheadAttention full(16, 4, rng_full);
  copy_repeated(gqa, full);
  const Tensor x = randn({2, 5, 16}, 63), mem = randn({2, 4, 16}, 64);
  const Tensor ref = gqa.forward(x, x, x).out.value;
  for (const Precision p : {Precision::kBFloat16, Precision::kInt8}) {
    gqa.set_precision(p);
    full.set_precision(p);
    const std::string where = p == Precision::kInt8 ? "int8" : "bf16";
    const Tensor y = gqa.forward(x, x, x).out.value;
    EXPECT_TRUE(AllClose(y, full.forward(x, x, x).out.value, {1e-4, 1e-3})) << where;
    EXPECT_TRUE(AllClose(gqa.forward(x, mem, mem).out.value, full.forward(x, mem, mem).out.value, {1e-4, 1e-3}))
        << where;
    // bf16 stays near fp32 (precision_fronts_test's bound); int8's error is the quantizer's, tested with it.
    if (p == Precision::kBFloat16) EXPECT_TRUE(AllClose(y, ref, {2e-2, 2e-2}));
    EXPECT_FALSE(AllClose(y, ref, qkv::testing::kExact)) << where;
  }
}

// Weight dropout with grouped heads: training mode draws a mask per query head (two calls differ, eval does not)
// and, on a tape, the gradients reach every parameter.
TEST(MultiheadAttentionGqa, WeightDropoutInTrainingMode) {
  Rng rng(71);
  MultiheadAttention mha(12, 6, rng, 0.5f, true, 0, 0, 2);
  randomize_parameters(mha, 72);
  const Tensor x = randn({2, 5, 12}, 73);
  mha.eval();
  const Tensor e = mha.forward(x, x, x).out.value;
  EXPECT_TRUE(BitIdentical(e, mha.forward(x, x, x).out.value));
  mha.train();
  const Tensor t1 = mha.forward(x, x, x).out.value, t2 = mha.forward(x, x, x).out.value;
  EXPECT_FALSE(BitIdentical(t1, t2));
  EXPECT_FALSE(BitIdentical(t1, e));
  ad::Tape tape;
  ad::ParameterSet params(mha);
  Rng drop(74);
  const Context c(tape, params, &drop);
  MhaForwardOptions o;
  o.need_weights = false;
  const ad::Var out = mha.forward(c, x, x, x, o).out;
  tape.backward(out, Tensor::ones(out.shape()));
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].has_grad) << params[i].name;
}

// num_kv_heads unset or equal to num_heads is torch's module: the same parameters drawn and the same bits out.
TEST(MultiheadAttentionGqa, DefaultIsTorchsModuleBitForBit) {
  Rng a(5), b(5);
  MultiheadAttention plain(12, 3, a), explicit_heads(12, 3, b, 0.0f, true, 0, 0, 3);
  EXPECT_EQ(plain.num_kv_heads(), 3);
  EXPECT_EQ(names_and_shapes(plain), names_and_shapes(explicit_heads));
  EXPECT_TRUE(BitIdentical(plain.in_proj_weight, explicit_heads.in_proj_weight));
  EXPECT_TRUE(BitIdentical(plain.out_proj.weight, explicit_heads.out_proj.weight));
  const Tensor x = randn({2, 4, 12}, 6);
  EXPECT_TRUE(BitIdentical(plain.forward(x, x, x).out.value, explicit_heads.forward(x, x, x).out.value));
}

TEST(MultiheadAttentionGqa, StateDictNamesShapesAndRoundTrip) {
  Rng rng(1);
  MultiheadAttention packed(16, 4, rng, 0.0f, true, 0, 0, 1), separate(16, 4, rng, 0.0f, true, 5, 6, 2);
  const std::map<std::string, Shape> want_packed = {{"in_proj_weight", {24, 16}},
                                                    {"in_proj_bias", {24}},
                                                    {"out_proj.weight", {16, 16}},
                                                    {"out_proj.bias", {16}}};
  EXPECT_EQ(names_and_shapes(packed), want_packed);
  const std::map<std::string, Shape> want_separate = {{"q_proj_weight", {16, 16}}, {"k_proj_weight", {8, 5}},
                                                      {"v_proj_weight", {8, 6}},   {"in_proj_bias", {32}},
                                                      {"out_proj.weight", {16, 16}}, {"out_proj.bias", {16}}};
  EXPECT_EQ(names_and_shapes(separate), want_separate);
  randomize_parameters(packed, 2);
  Rng rng2(99);
  MultiheadAttention loaded(16, 4, rng2, 0.0f, true, 0, 0, 1);
  loaded.load_state_dict(packed.state_dict());
  const Tensor x = randn({1, 3, 16}, 3);
  EXPECT_TRUE(BitIdentical(loaded.forward(x, x, x).out.value, packed.forward(x, x, x).out.value));
  // torch's (3E, E) packing does not load into the grouped module: the shape error names the key.
  Rng rng3(4);
  MultiheadAttention torch_shaped(16, 4, rng3);
  EXPECT_TRUE(ThrowsArg([&] { loaded.load_state_dict(torch_shaped.state_dict()); }, "in_proj_weight"));
}

// L = Σ out ∘ r on a tape: the gradients of the input and of every parameter against central differences of the
// twin, for self-attention (one projection, causal) and for separate kdim/vdim projections.
TEST(MultiheadAttentionGqa, GradientsMatchFiniteDifferencesOfTheTwin) {
  for (const bool self : {true, false}) {
    const Dims d{1, 3, self ? 3 : 4, 4, 2, 1, self ? 4 : 3, self ? 4 : 5};
    Rng rng(11);
    MultiheadAttention mha(d.E, d.H, rng, 0.0f, true, self ? 0 : d.kdim, self ? 0 : d.vdim, d.Hkv);
    randomize_parameters(mha, 12, 0.5f);
    const Tensor x = randn({d.B, d.Tq, d.E}, 13);
    const Tensor k_in = self ? x : randn({d.B, d.Tk, d.kdim}, 14), v_in = self ? x : randn({d.B, d.Tk, d.vdim}, 15);
    MhaForwardOptions o;
    o.need_weights = false;
    o.is_causal = self;
    AttentionOptions ao;
    ao.causal = self ? Causal::kTopLeft : Causal::kNone;
    ad::Tape tape;
    ad::ParameterSet params(mha);
    const Context c(tape, params);
    const ad::Var xv = tape.leaf(x);
    const ad::Var kv = self ? xv : tape.leaf(k_in), vv = self ? xv : tape.leaf(v_in);
    const ad::Var out = mha.forward(c, xv, kv, vv, o).out;
    const Tensor r = randn(out.shape(), 16);
    tape.backward(out, r);
    const DVec rd = to_double(r);
    const Weights w0 = params_of(mha);
    const DVec x0 = to_double(x), k0 = to_double(k_in), v0 = to_double(v_in);
    auto loss = [&](const DVec& q, const DVec& k, const DVec& v, const Weights& w) {
      return qkv::testing::dot(twin(q, k, v, w, d, ao).out, rd);
    };
    auto check = [&](const Tensor& grad, const DVec& at, const std::function<double(const DVec&)>& l,
                     const std::string& name) {
      const DVec fd = qkv::testing::finite_diff(l, at);
      EXPECT_TRUE(AllClose(grad, fd, kGradTol, qkv::testing::grad_scale(fd)))
          << name << (self ? " (self)" : " (cross)");
    };
    if (self) {
      check(xv.grad(), x0, [&](const DVec& q) { return loss(q, q, q, w0); }, "x");
    } else {
      check(xv.grad(), x0, [&](const DVec& q) { return loss(q, k0, v0, w0); }, "query");
      check(kv.grad(), k0, [&](const DVec& k) { return loss(x0, k, v0, w0); }, "key");
      check(vv.grad(), v0, [&](const DVec& v) { return loss(x0, k0, v, w0); }, "value");
    }
    // Each parameter: its gradient against differences of the twin with that parameter (as the module lays it out)
    // perturbed. The packed in_proj rows and bias split into q, k and v as params_of reads them.
    const int64_t E = d.E, Ekv = d.Hkv * d.D();
    auto with = [&](const std::string& name, const DVec& p) {
      Weights w = w0;
      auto part = [&](int64_t r0, int64_t r1, int64_t cols) {
        return DVec(p.begin() + r0 * cols, p.begin() + r1 * cols);
      };
      if (name == "in_proj_weight") {
        w.wq = part(0, E, E), w.wk = part(E, E + Ekv, E), w.wv = part(E + Ekv, E + 2 * Ekv, E);
      } else if (name == "in_proj_bias") {
        w.bq = part(0, E, 1), w.bk = part(E, E + Ekv, 1), w.bv = part(E + Ekv, E + 2 * Ekv, 1);
      } else if (name == "q_proj_weight") {
        w.wq = p;
      } else if (name == "k_proj_weight") {
        w.wk = p;
      } else if (name == "v_proj_weight") {
        w.wv = p;
      } else if (name == "out_proj.weight") {
        w.wo = p;
      } else {
        w.bo = p;
      }
      return w;
    };
    for (size_t i = 0; i < params.size(); ++i) {
      const ad::Parameter& p = params[i];
      ASSERT_TRUE(p.has_grad) << p.name;
      check(p.grad, to_double(*p.value), [&](const DVec& pv) { return loss(x0, k0, v0, with(p.name, pv)); }, p.name);
    }
  }
}

// Decoding: chunks of 3, 1 and 2 positions through a KV cache (contiguous, paged, with rotary positions) equal one
// causal forward over the 6; the cache holds num_kv_heads heads. A fixed cache of project_kv's heads equals
// cross-attention on the memory.
TEST(MultiheadAttentionGqa, CachedDecodingEqualsTheFullForward) {
  const int64_t B = 2, T = 6, E = 16, H = 4, Hkv = 2, D = 4;
  Rng rng(21);
  MultiheadAttention mha(E, H, rng, 0.0f, true, 0, 0, Hkv);
  randomize_parameters(mha, 22);
  const Tensor x = randn({B, T, E}, 23);
  for (const bool rotary : {false, true}) {
    for (const int64_t page : {int64_t{0}, int64_t{2}}) {
      MhaForwardOptions o;
      o.is_causal = true;
      o.need_weights = false;
      o.rotary = rotary;
      const Tensor full = mha.forward(x, x, x, o).out.value;
      KvCache cache;
      if (page > 0) cache.reset(B, Hkv, D, 4, page);
      o.kv_cache = &cache;
      Tensor out = Tensor::empty({B, T, E});
      int64_t at = 0;
      for (const int64_t n : {3, 1, 2}) {
        const Tensor chunk = x.slice(1, at, at + n).contiguous();
        out.slice(1, at, at + n).copy_from(mha.forward(chunk, chunk, chunk, o).out.value);
        at += n;
      }
      const std::string where = std::string(rotary ? "rotary" : "plain") + ", page " + std::to_string(page);
      EXPECT_TRUE(AllClose(out, full, kFloatReorder)) << where;
      EXPECT_EQ(cache.length(), T) << where;
      EXPECT_EQ(cache.keys().shape(), Shape({B, Hkv, T, D})) << where;
    }
  }
  // Weights through a cache: the last step's (B, H, 1, T) rows equal the full forward's last rows.
  MhaForwardOptions w;
  w.is_causal = true;
  w.average_attn_weights = false;
  const Tensor full_w = mha.forward(x, x, x, w).weights;
  KvCache cache;
  w.kv_cache = &cache;
  const Tensor head = x.slice(1, 0, T - 1).contiguous(), last = x.slice(1, T - 1, T).contiguous();
  mha.forward(head, head, head, w);
  const Tensor step_w = mha.forward(last, last, last, w).weights;
  EXPECT_TRUE(AllClose(step_w, full_w.slice(2, T - 1, T).contiguous(), kFloatReorder));

  const Tensor q = randn({B, 3, E}, 24), mem = randn({B, 5, E}, 25);
  MhaForwardOptions f;
  f.average_attn_weights = false;
  const MhaResult direct = mha.forward(q, mem, mem, f);
  auto [k, v] = mha.project_kv(mem, mem);
  ASSERT_EQ(k.shape(), Shape({B, Hkv, 5, D}));
  KvCache fixed;
  fixed.reset(B, Hkv, D);
  fixed.append(k, v);
  f.kv_cache = &fixed;
  f.kv_cache_fixed = true;
  const MhaResult cached = mha.forward(q, Tensor(), Tensor(), f);
  EXPECT_TRUE(AllClose(cached.out.value, direct.out.value, kFloatReorder));
  EXPECT_TRUE(AllClose(cached.weights, direct.weights, kFloatReorder));
}

// Packed variable-length rows (cu_seqlens) with grouped heads: each sequence equals its own batched forward.
TEST(MultiheadAttentionGqa, PackedSequencesEqualEachSequenceAlone) {
  Rng rng(31);
  MultiheadAttention mha(12, 6, rng, 0.0f, true, 0, 0, 3);
  randomize_parameters(mha, 32);
  const std::vector<int32_t> cu = {0, 3, 8};
  const Tensor x = randn({8, 12}, 33);
  MhaForwardOptions o;
  o.need_weights = false;
  o.is_causal = true;
  o.cu_seqlens = cu;
  const Tensor packed = mha.forward(x, x, x, o).out.value;
  o.cu_seqlens.clear();
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const Tensor one = x.slice(0, cu[s], cu[s + 1]).unsqueeze(0).contiguous();
    EXPECT_TRUE(AllClose(packed.slice(0, cu[s], cu[s + 1]), mha.forward(one, one, one, o).out.value.squeeze(0),
                         kFloatReorder))
        << "sequence " << s;
  }
}

// Under a sequence shard (context parallelism on this process's world) the grouped heads go around the ring: the
// output and the gradients equal the unsharded ones.
TEST(MultiheadAttentionGqa, SequenceShardRunsGroupedHeadsAroundTheRing) {
  Rng rng(41);
  MultiheadAttention mha(16, 4, rng, 0.0f, true, 0, 0, 1);
  randomize_parameters(mha, 42);
  const train::ContextParallel cp(parallel::Communicator::world());
  const int64_t T = cp.padded_length(4);
  const std::vector<int64_t> mine = cp.positions(T);
  const Tensor whole = randn({1, T, 16}, 43);
  Tensor local = Tensor::empty({1, static_cast<int64_t>(mine.size()), 16});
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto li = static_cast<int64_t>(i);
    local.slice(1, li, li + 1).copy_from(whole.slice(1, mine[i], mine[i] + 1));
  }
  MhaForwardOptions o;
  o.is_causal = true;
  o.need_weights = false;
  auto run = [&](bool sharded, const Tensor& x, Tensor& grad) {
    ad::Tape tape;
    ad::ParameterSet params(mha);
    Context c(tape, params);
    if (sharded) c.set_sequence_shard(&cp);
    const ad::Var xv = tape.leaf(x);
    const ad::Var out = mha.forward(c, xv, xv, xv, o).out;
    tape.backward(out, Tensor::full(out.shape(), 1.0f));
    grad = params.find("in_proj_weight")->grad.clone();
    return out.value;
  };
  Tensor g_whole, g_local;
  const Tensor out_whole = run(false, whole, g_whole), out_local = run(true, local, g_local);
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto li = static_cast<int64_t>(i);
    EXPECT_TRUE(AllClose(out_local.slice(1, li, li + 1), out_whole.slice(1, mine[i], mine[i] + 1), kFloatReorder));
  }
  if (parallel::Communicator::world().size() == 1) EXPECT_TRUE(AllClose(g_local, g_whole, kFloatReorder));
}

TEST(MultiheadAttentionGqa, ErrorsNameTheModuleAndTheNumbers) {
  Rng rng(1);
  EXPECT_TRUE(ThrowsArg([&] { MultiheadAttention m(16, 4, rng, 0.0f, true, 0, 0, 3); },
                        "[MultiheadAttention] num_kv_heads 3 must be >= 1 and divide num_heads 4"));
  EXPECT_TRUE(ThrowsArg([&] { MultiheadAttention m(16, 4, rng, 0.0f, true, 0, 0, 0); },
                        "[MultiheadAttention] num_kv_heads 0 must be >= 1 and divide num_heads 4"));
  EXPECT_TRUE(ThrowsArg([&] { MultiheadAttention m(16, 4, rng, 0.0f, true, 0, 0, -2); },
                        "[MultiheadAttention] num_kv_heads -2"));
  EXPECT_TRUE(ThrowsArg([&] { MultiheadAttention m(16, 4, rng, 0.0f, true, 0, 0, 8); },
                        "[MultiheadAttention] num_kv_heads 8 must be >= 1 and divide num_heads 4"));
  MultiheadAttention mha(16, 4, rng, 0.0f, true, 0, 0, 2);
  const Tensor x = randn({2, 3, 16}, 2);
  // Shaw relative positions compose per head pair: refused for grouped heads.
  MhaForwardOptions rel;
  rel.rel_k = ad::Var(randn({3, 4}, 3));
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, rel); },
                        "[MultiheadAttention] relative attention has no grouped-query heads"));
  // A fixed cache must hold num_kv_heads heads.
  KvCache wrong;
  wrong.reset(2, 4, 4);
  wrong.append(randn({2, 4, 5, 4}, 4), randn({2, 4, 5, 4}, 5));
  MhaForwardOptions f;
  f.kv_cache = &wrong;
  f.kv_cache_fixed = true;
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, Tensor(), Tensor(), f); },
                        "[MultiheadAttention] query (2, 3, 16) and a fixed kv_cache of (2, 4, 5, 4) must be (B, Tq, E) "
                        "and (B, num_kv_heads = 2, Tk, head_dim = 4)"));
  // A decoding cache made for num_heads heads refuses the grouped keys.
  KvCache made;
  made.reset(2, 4, 4);
  MhaForwardOptions d;
  d.kv_cache = &made;
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, d); }, "[KvCache] append k (2, 2, 3, 4)"));
  // A head_mask is per query head.
  MhaForwardOptions h;
  h.head_mask = Tensor::ones({2});
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, h); },
                        "[MultiheadAttention] head_mask (2,) must be (num_heads,) = (4,)"));
}

// The window and soft-cap errors name the module and the caller's query, on the batched and the packed paths.
TEST(MultiheadAttentionGqa, WindowAndSoftcapErrorsNameTheModule) {
  Rng rng(1);
  MultiheadAttention mha(8, 2, rng, 0.0f, true, 0, 0, 1);
  const Tensor x = randn({1, 3, 8}, 2);
  MhaForwardOptions o;
  o.window_left = -2;
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, o); },
                        "[MultiheadAttention] window_size (-2, -1) must be >= -1 on each side (-1 = unbounded); "
                        "query (1, 3, 8)"));
  o = {};
  o.softcap = -1.0f;
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, o); },
                        "[MultiheadAttention] softcap -1 must be finite and >= 0 (0 = off); query (1, 3, 8)"));
  o.softcap = std::numeric_limits<float>::infinity();
  o.need_weights = false;
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(x, x, x, o); }, "[MultiheadAttention] softcap inf"));
  MhaForwardOptions packed;
  packed.need_weights = false;
  packed.cu_seqlens = {0, 3};
  packed.window_right = -5;
  const Tensor rows = randn({3, 8}, 3);
  EXPECT_TRUE(ThrowsArg([&] { mha.forward(rows, rows, rows, packed); },
                        "[MultiheadAttention] window_size (-1, -5) must be >= -1 on each side (-1 = unbounded); "
                        "query (3, 8)"));
}

}  // namespace
}  // namespace qkv::nn
