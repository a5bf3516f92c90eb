// Training at bf16 compute: the fused attention backward at bf16 on every flash set by name, against a float64
// oracle of the same rounding scheme (P and dS rounded before their products) and against the exact gradient; the
// bf16 linear's gradients against float64 products of the rounded operands; and modules that train at bf16 on
// their live weights (never a copy prepared before an optimizer step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention_flash_testing.h"
#include "nn_testing.h"
#include "ops_testing.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/nn/context.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/multihead_attention.h"
#include "qkv/ops/functional.h"
#include "qkv/ops/lowp.h"
#include "qkv/train/optim.h"

namespace qkv {
namespace {

using kernels::FlashConfig;
using kernels::FlashIsa;
using testing::randn;

// max |a - ref| / max |ref|.
double rel_err(const std::vector<double>& a, const std::vector<double>& ref) {
  double err = 0.0, mag = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(a[i] - ref[i]));
    mag = std::max(mag, std::fabs(ref[i]));
  }
  return err / std::max(mag, 1e-30);
}
std::vector<double> doubles(const Tensor& t) {
  const std::vector<float> v = t.contiguous().to_vector();
  return {v.begin(), v.end()};
}

struct Case {
  Shape q, k;
  int64_t dv;
  AttentionOptions o;
  const char* name;
};

std::vector<Case> cases() {
  std::vector<Case> cs;
  const auto add = [&](Shape q, Shape k, int64_t dv, const char* name, auto set) {
    Case c{q, k, dv, {}, name};
    set(c.o);
    cs.push_back(c);
  };
  const auto none = [](AttentionOptions&) {};
  add({2, 3, 37, 64}, {2, 3, 53, 64}, 64, "plain Tq != Tk", none);
  add({1, 2, 1, 80}, {1, 2, 29, 80}, 80, "T = 1", none);
  add({1, 2, 45, 1}, {1, 2, 45, 1}, 1, "D = 1 causal", [](AttentionOptions& o) { o.causal = Causal::kTopLeft; });
  add({2, 2, 70, 128}, {2, 2, 70, 128}, 48, "D 128, Dv 48, bottom-right causal",
      [](AttentionOptions& o) { o.causal = Causal::kBottomRight; });
  add({1, 4, 33, 64}, {1, 2, 90, 64}, 64, "GQA 4/2 window", [](AttentionOptions& o) {
    o.enable_gqa = true;
    o.window_left = 20;
    o.window_right = 3;
  });
  add({1, 2, 41, 64}, {1, 2, 41, 64}, 64, "softcap causal", [](AttentionOptions& o) {
    o.softcap = 2.5f;
    o.causal = Causal::kTopLeft;
  });
  add({2, 2, 19, 64}, {2, 2, 67, 64}, 64, "bool mask", [](AttentionOptions& o) {
    std::vector<float> m(static_cast<size_t>(2 * 19 * 67));
    for (size_t i = 0; i < m.size(); ++i) m[i] = (i * 7919 % 5) != 0 ? 1.0f : 0.0f;
    o.mask = Tensor::from_vector({2, 1, 19, 67}, m);
    o.mask_kind = MaskKind::kKeep;
  });
  add({1, 3, 24, 64}, {1, 3, 31, 64}, 64, "additive mask", [](AttentionOptions& o) {
    o.mask = randn({24, 31}, 77);
    o.mask_kind = MaskKind::kAdditive;
  });
  return cs;
}

// Every flash set on this CPU by name, default and small tiles: the bf16 backward follows its scheme (within float
// rounding of the float32 kernel, far closer to the scheme than the float32 backward is) and its error against the
// exact gradient of the rounded inputs is at most twice the scheme's own.
TEST(Bf16AttentionBackward, EveryFlashSetFollowsTheBf16SchemeAndItsAccuracy) {
  std::vector<FlashIsa> sets;
  std::string ran;
  for (FlashIsa isa : {FlashIsa::kPortable, FlashIsa::kAvx2, FlashIsa::kAvx512, FlashIsa::kAvx512Bf16,
                       FlashIsa::kAmx, FlashIsa::kAmxEmulated})
    if (testing::flash::available(isa)) {
      sets.push_back(isa);
      ran += std::string(ran.empty() ? "" : ",") + kernels::flash_isa_name(isa);
    }
  std::cout << "[ paths    ] bf16 attention backward: ran " << ran << "\n";
  uint64_t seed = 100;
  for (const Case& c : cases()) {
    Shape v_shape = c.k;
    v_shape.back() = c.dv;
    Shape o_shape = c.q;
    o_shape.back() = c.dv;
    const Tensor q = round_to_bf16(randn(c.q, ++seed)), k = round_to_bf16(randn(c.k, ++seed));
    const Tensor v = round_to_bf16(randn(v_shape, ++seed)), g = round_to_bf16(randn(o_shape, ++seed));
    const testing::flash::Oracle exact = testing::flash::oracle(q, k, v, c.o, g);
    const testing::flash::Oracle scheme = testing::flash::oracle(q, k, v, c.o, g, /*bf16_grads=*/true);
    AttentionOptions ob = c.o;
    ob.precision = Precision::kBFloat16;
    for (FlashIsa isa : sets)
      for (int64_t tile : {int64_t{0}, int64_t{16}}) {
        FlashConfig cfg;
        cfg.isa = isa;
        cfg.bwd_q_tile = cfg.bwd_k_tile = tile;
        const testing::flash::Fused f = testing::flash::run_fused(q, k, v, ob, g, cfg);
        const testing::flash::Fused f32 = testing::flash::run_fused(q, k, v, c.o, g, cfg);
        // The scheme with delta from the output this set's bf16 forward gave (AVX512-BF16 rounds P before P·V).
        const testing::flash::Oracle scheme_set = testing::flash::oracle(q, k, v, c.o, g, true, f.fwd.out);
        const std::string where = std::string(c.name) + " on " + kernels::flash_isa_name(isa) +
                                  (tile ? " (16-wide tiles)" : "");
        const std::pair<const Tensor*, const std::vector<double>*> grads[3][3] = {
            {{&f.grads.dq, &exact.dq}, {&f.grads.dq, &scheme_set.dq}, {&f32.grads.dq, &scheme_set.dq}},
            {{&f.grads.dk, &exact.dk}, {&f.grads.dk, &scheme_set.dk}, {&f32.grads.dk, &scheme_set.dk}},
            {{&f.grads.dv, &exact.dv}, {&f.grads.dv, &scheme_set.dv}, {&f32.grads.dv, &scheme_set.dv}}};
        const char* names[3] = {"dq", "dk", "dv"};
        const std::vector<double>* scheme_of[3] = {&scheme.dq, &scheme.dk, &scheme.dv};
        const std::vector<double>* exact_of[3] = {&exact.dq, &exact.dk, &exact.dv};
        for (int t = 0; t < 3; ++t) {
          const double scheme_err = rel_err(*scheme_of[t], *exact_of[t]);
          const double err = rel_err(doubles(*grads[t][0].first), *grads[t][0].second);
          const double to_scheme = rel_err(doubles(*grads[t][1].first), *grads[t][1].second);
          const double fp32_to_scheme = rel_err(doubles(*grads[t][2].first), *grads[t][2].second);
          // A float32 kernel rounds P or dS to the other bf16 neighbour of a float64 value only where the two
          // straddle a rounding midpoint: rare, one bf16 step of one term. kBackwardRtol covers the float32 sums.
          EXPECT_LE(to_scheme, 0.25 * scheme_err + testing::flash::kBackwardRtol) << names[t] << ", " << where;
          EXPECT_LE(err, 2.0 * scheme_err + testing::flash::kBackwardRtol) << names[t] << ", " << where;
          if (scheme_err > 10 * testing::flash::kBackwardRtol)  // the float32 backward does not follow the scheme
            EXPECT_GT(fp32_to_scheme, to_scheme) << names[t] << ", " << where;
        }
      }
  }
}

// The op entry rounds q, k, v and d_out itself: unrounded inputs give the bits of the rounded ones.
TEST(Bf16AttentionBackward, OpRoundsItsInputsAndTheTapeUsesIt) {
  const Tensor q = randn({2, 2, 13, 64}, 1), k = randn({2, 2, 21, 64}, 2), v = randn({2, 2, 21, 64}, 3);
  const Tensor g = randn({2, 2, 13, 64}, 4);
  AttentionOptions o;
  o.precision = Precision::kBFloat16;
  o.causal = Causal::kBottomRight;
  const AttentionGrads a = attention_backward(q, k, v, Tensor(), Tensor(), g, o);
  const AttentionGrads b =
      attention_backward(round_to_bf16(q), round_to_bf16(k), round_to_bf16(v), Tensor(), Tensor(), round_to_bf16(g), o);
  EXPECT_TRUE(testing::flash::bit_equal(a.dq, b.dq));
  EXPECT_TRUE(testing::flash::bit_equal(a.dk, b.dk));
  EXPECT_TRUE(testing::flash::bit_equal(a.dv, b.dv));
  // ad::attention at bf16 records the bf16 backward.
  ad::Tape tape;
  const ad::Var vq = tape.leaf(q), vk = tape.leaf(k), vv = tape.leaf(v);
  const ad::Var out = ad::attention(vq, vk, vv, o);
  tape.backward(ad::sum(ad::mul(out, ad::Var(g))));
  EXPECT_TRUE(testing::flash::bit_equal(vq.grad(), a.dq));
  EXPECT_TRUE(testing::flash::bit_equal(vk.grad(), a.dk));
  EXPECT_TRUE(testing::flash::bit_equal(vv.grad(), a.dv));
}

// float64 products of bf16-rounded operands: c = a·b (a: m x k, b: k x n, row-major) and the sums of |terms|.
void product_f64(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t k, int64_t n,
                 std::vector<double>& c, std::vector<double>& mag) {
  c.assign(static_cast<size_t>(m * n), 0.0);
  mag.assign(c.size(), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) {
        const double t = a[i * k + p] * b[p * n + j];
        c[i * n + j] += t;
        mag[i * n + j] += std::fabs(t);
      }
}
std::vector<double> rounded(const Tensor& t) { return doubles(round_to_bf16(t)); }
std::vector<double> transposed(const std::vector<double>& x, int64_t r, int64_t c) {
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) y[j * r + i] = x[i * c + j];
  return y;
}

// dx = bf16(dy)·bf16(W), dW = bf16(dy)ᵀ·bf16(x) with float32 accumulation: within float32 summation error
// (depth · 2⁻²⁴ of the sum of |terms|, a bound, not a fit) of the float64 products of the rounded operands.
TEST(Bf16Linear, GradientsAreTheBf16ProductsOfTheRoundedOperands) {
  for (const auto& [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{5, 67, 33}, {64, 384, 96}, {1, 40, 130}}) {
    const Tensor x = randn({rows, in}, 11), w = randn({out, in}, 12), b = randn({out}, 13), dy = randn({rows, out}, 14);
    ad::Tape tape;
    const ad::Var vx = tape.leaf(x), vw = tape.leaf(w), vb = tape.leaf(b);
    const ad::Var y = ad::linear(vx, vw, vb, Precision::kBFloat16);
    tape.backward(ad::sum(ad::mul(y, ad::Var(dy))));
    std::vector<double> want, mag;
    const auto check = [&](const Tensor& got, int64_t depth, const char* what) {
      const std::vector<double> g = doubles(got);
      for (size_t i = 0; i < g.size(); ++i)
        ASSERT_LE(std::fabs(g[i] - want[i]), double(depth) * 0x1p-24 * mag[i] + 1e-30)
            << what << "[" << i << "] rows " << rows << " in " << in << " out " << out;
    };
    // forward: bf16(x)·bf16(W)ᵀ + b
    product_f64(rounded(x), transposed(rounded(w), out, in), rows, in, out, want, mag);
    const std::vector<double> bias = doubles(b);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < out; ++j) want[i * out + j] += bias[j], mag[i * out + j] += std::fabs(bias[j]);
    check(y.value, in + 1, "y");
    product_f64(rounded(dy), rounded(w), rows, out, in, want, mag);
    check(vx.grad(), out, "dx");
    product_f64(transposed(rounded(dy), rows, out), rounded(x), out, rows, in, want, mag);
    check(vw.grad(), rows, "dW");
    // the bias gradient stays float32: the column sums of dy itself
    const std::vector<double> d = doubles(dy), gb = doubles(vb.grad());
    for (int64_t j = 0; j < out; ++j) {
      double s = 0.0, m = 0.0;
      for (int64_t i = 0; i < rows; ++i) s += d[i * out + j], m += std::fabs(d[i * out + j]);
      ASSERT_LE(std::fabs(gb[j] - s), double(rows) * 0x1p-24 * m + 1e-30) << "db[" << j << "]";
    }
  }
}

TEST(Bf16Linear, Int8OnATapeIsRefusedInOneLine) {
  ad::Tape tape;
  const ad::Var x = tape.leaf(randn({2, 8}, 1)), w = tape.leaf(randn({4, 8}, 2));
  try {
    ad::linear(x, w, ad::Var(), Precision::kInt8);
    FAIL() << "int8 on a tape must throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[linear]"), std::string::npos) << e.what();
  }
  Rng rng(3);
  nn::Linear lin(8, 4, true, rng);
  lin.set_precision(Precision::kInt8);
  ad::ParameterSet ps(lin);
  nn::Context c(tape, ps);
  EXPECT_THROW(lin.forward(c, ad::Var(randn({2, 8}, 4))), std::invalid_argument);
}

// A Linear trained at bf16: the step's forward reads the live weight, and after the optimizer changed it, a
// forward without a tape (evaluation between steps) reads the new weight, not the copy set_precision prepared.
TEST(Bf16Modules, LinearTrainsOnItsLiveWeightAndEvaluatesTheUpdatedOne) {
  Rng rng(5);
  nn::Linear lin(24, 10, true, rng);
  lin.set_precision(Precision::kBFloat16);
  const Tensor x = randn({6, 24}, 6);
  const Tensor before = lin.forward(nn::Context(), ad::Var(x)).value.clone();
  testing::sgd_steps(lin, x, 2);
  const Tensor after = lin.forward(nn::Context(), ad::Var(x)).value;
  const Tensor want = linear(x, LinearWeight(lin.weight, Precision::kBFloat16), lin.bias);
  EXPECT_TRUE(testing::flash::bit_equal(after, want));
  EXPECT_FALSE(testing::flash::bit_equal(after, before));
  // set_precision prepares the trained weight once again: the same bits.
  lin.set_precision(Precision::kBFloat16);
  EXPECT_TRUE(testing::flash::bit_equal(lin.forward(nn::Context(), ad::Var(x)).value, want));
}

// MultiheadAttention on a tape at bf16: every parameter and input gradient close to the float32 ones (bf16 keeps
// 8 bits: a few 2⁻⁸ of the gradient's scale), and not equal to them (the products did run at bf16) except
// out_proj.bias's, the float32 sum of the upstream gradient at both precisions.
TEST(Bf16Modules, MultiheadAttentionGradientsAtBf16TrackFloat32) {
  const auto grads = [](Precision p) {
    Rng rng(9);
    nn::MultiheadAttention mha(32, 4, rng);
    mha.set_precision(p);
    ad::ParameterSet ps(mha);
    ps.zero_grad();
    ad::Tape tape;
    nn::Context c(tape, ps);
    const ad::Var x = tape.leaf(randn({2, 11, 32}, 10));
    nn::MhaForwardOptions mo;
    mo.is_causal = true;
    const ad::Var y = mha.forward(c, x, x, x, mo).out;
    tape.backward(ad::sum(ad::mul(y, ad::Var(randn({2, 11, 32}, 11)))));
    std::vector<std::pair<std::string, std::vector<double>>> g{{"input", doubles(x.grad())}};
    for (size_t i = 0; i < ps.size(); ++i) g.emplace_back(ps[i].name, doubles(ps[i].grad));
    return g;
  };
  const auto f32 = grads(Precision::kFloat32), b16 = grads(Precision::kBFloat16);
  ASSERT_EQ(f32.size(), 5u);
  for (size_t i = 0; i < f32.size(); ++i) {
    const double e = rel_err(b16[i].second, f32[i].second);
    EXPECT_LT(e, 8 * 0x1p-8) << f32[i].first;
    if (f32[i].first == "out_proj.bias") EXPECT_EQ(e, 0.0) << f32[i].first;
    else EXPECT_GT(e, 0.0) << f32[i].first;
  }
}

}  // namespace
}  // namespace qkv
