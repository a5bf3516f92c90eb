// NaN in attention inputs: the fused entry points must propagate it exactly where the reference (and PyTorch) do,
// never hide it behind a finite output (the kernel's online softmax alone would treat a NaN score as masked).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops_testing.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/ops/attention.h"

namespace qkv {
namespace {

using testing::randn;

// Element-wise: both NaN, or both finite and close.
void ExpectSameNaNPattern(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> g = got.contiguous().to_vector(), w = want.contiguous().to_vector();
  int64_t nans = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(std::isnan(g[i]), std::isnan(w[i])) << what << " element " << i;
    if (std::isnan(w[i])) ++nans;
    else EXPECT_NEAR(g[i], w[i], 1e-5 + 1e-5 * std::fabs(w[i])) << what << " element " << i;
  }
  EXPECT_GT(nans, 0) << what << ": the case must produce some NaN";
}

// A copy of `t` with a NaN at `index`.
Tensor with_nan(const Tensor& t, const std::vector<int64_t>& index) {
  Tensor c = t.clone();
  int64_t off = 0;
  for (size_t d = 0; d < index.size(); ++d) off += index[d] * c.strides()[d];
  c.data()[off] = NAN;
  return c;
}

TEST(AttentionNaN, NaNInOneKeyReachesEveryQueryThatSeesIt) {
  const Tensor q = randn({2, 5, 8}, 1), v = randn({2, 7, 8}, 3);
  const Tensor k = with_nan(randn({2, 7, 8}, 2), {1, 4, 0});
  for (Causal c : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight}) {
    AttentionOptions o;
    o.causal = c;
    ExpectSameNaNPattern(attention(q, k, v, o).out, attention_reference(q, k, v, o).out, "out");
  }
}

TEST(AttentionNaN, NaNInOneQueryOrValueRowAndAdditiveMask) {
  const Tensor q = randn({1, 2, 6, 4}, 4), k = randn({1, 2, 9, 4}, 5), v = randn({1, 2, 9, 3}, 6);
  const Tensor qn = with_nan(q, {0, 1, 2, 3});
  ExpectSameNaNPattern(attention(qn, k, v).out, attention_reference(qn, k, v).out, "q");
  const Tensor vn = with_nan(v, {0, 0, 8, 1});
  ExpectSameNaNPattern(attention(q, k, vn).out, attention_reference(q, k, vn).out, "v");
  AttentionOptions o;
  o.mask_kind = MaskKind::kAdditive;
  o.mask = with_nan(randn({6, 9}, 7), {3, 5});
  ExpectSameNaNPattern(attention(q, k, v, o).out, attention_reference(q, k, v, o).out, "mask");
}

TEST(AttentionNaN, BackwardPropagatesLikeTheReference) {
  const Tensor q = randn({3, 5, 4}, 8), k = with_nan(randn({3, 6, 4}, 9), {0, 2, 1}), v = randn({3, 6, 4}, 10);
  const Tensor d_out = randn({3, 5, 4}, 11);
  const AttentionGrads f = attention_backward(q, k, v, Tensor(), Tensor(), d_out, {});
  const AttentionGrads r = attention_backward_reference(q, k, v, Tensor(), Tensor(), d_out, {});
  ExpectSameNaNPattern(f.dq, r.dq, "dq");
  ExpectSameNaNPattern(f.dk, r.dk, "dk");
  ExpectSameNaNPattern(f.dv, r.dv, "dv");
}

// Each instruction set's kernels directly (auto dispatch above covers only the widest one), forward and backward.
TEST(AttentionNaN, EveryKernelSetPropagatesLikeTheReference) {
  using kernels::FlashIsa;
  const Tensor q = with_nan(randn({2, 19, 16}, 15), {1, 3, 5}), v = randn({2, 23, 16}, 17);
  const Tensor k = with_nan(randn({2, 23, 16}, 16), {0, 20, 2}), d_out = randn({2, 19, 16}, 18);
  for (Causal c : {Causal::kNone, Causal::kTopLeft}) {
    AttentionOptions o;
    o.causal = c;
    const Tensor ref = attention_reference(q, k, v, o).out;
    const AttentionGrads gref = attention_backward_reference(q, k, v, Tensor(), Tensor(), d_out, o);
    for (FlashIsa isa : {FlashIsa::kPortable, FlashIsa::kAvx2, FlashIsa::kAvx512}) {
      kernels::FlashConfig cfg;
      cfg.isa = isa;
      AttentionResult f;
      try {
        f = kernels::attention_flash_forward(q, k, v, o, Shape{2}, 0.25f, cfg);
      } catch (const std::runtime_error&) {
        continue;  // this CPU lacks the set (attention_flash_isa_test checks the dispatch)
      }
      ExpectSameNaNPattern(f.out, ref, kernels::flash_isa_name(isa));
      const AttentionGrads g = kernels::attention_flash_backward(q, k, v, f.out, f.lse, d_out, o, Shape{2}, 0.25f, cfg);
      ExpectSameNaNPattern(g.dq, gref.dq, "dq");
      ExpectSameNaNPattern(g.dk, gref.dk, "dk");
      ExpectSameNaNPattern(g.dv, gref.dv, "dv");
    }
  }
}

TEST(AttentionNaN, FiniteInputsStayOnTheFusedPathAndFinite) {
  const Tensor q = randn({2, 33, 16}, 12), k = randn({2, 40, 16}, 13), v = randn({2, 40, 16}, 14);
  for (float x : attention(q, k, v).out.to_vector()) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace qkv
