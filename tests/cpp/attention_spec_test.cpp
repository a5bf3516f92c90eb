// Tests of what qkv::attention decides beyond the math: dropout on the weights with the caller's Rng (against the
// reference weights dropped by hand), PyTorch's empty-sequence rule under allow_empty, and their error paths.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops_testing.h"
#include "qkv/core/rng.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/dropout.h"
#include "qkv/ops/matmul.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::randn;
using testing::ThrowsArg;

TEST(AttentionSpec, DropoutIsTheReferenceWeightsDroppedTimesV) {
  const Tensor q = randn({2, 3, 5, 4}, 1), k = randn({2, 3, 7, 4}, 2), v = randn({2, 3, 7, 6}, 3);
  Rng rng(11), same(11);
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  o.dropout_p = 0.25f;
  o.dropout_rng = &rng;
  o.return_weights = true;
  const AttentionResult r = attention(q, k, v, o);
  AttentionOptions plain = o;
  plain.dropout_p = 0.0f;
  const Tensor w = dropout(attention_reference(q, k, v, plain).weights, 0.25f, true, same).y;
  EXPECT_TRUE(AllClose(r.weights, w, testing::kExact));  // the dropped weights come back
  EXPECT_TRUE(AllClose(r.out, matmul(w, v), testing::kExact));
}

TEST(AttentionSpec, DropoutWithGqaReadsEachKvHeadForItsGroup) {
  const Tensor q = randn({1, 4, 3, 8}, 4), k = randn({1, 2, 5, 8}, 5), v = randn({1, 2, 5, 3}, 6);
  Rng rng(7), same(7);
  AttentionOptions o;
  o.enable_gqa = true;
  o.dropout_p = 0.5f;
  o.dropout_rng = &rng;
  const Tensor out = attention(q, k, v, o).out;
  const auto repeated = [](const Tensor& t) {
    return t.unsqueeze(2).expand({1, 2, 2, t.size(2), t.size(3)}).contiguous().reshape({1, 4, t.size(2), t.size(3)});
  };
  AttentionOptions plain;
  plain.return_weights = true;
  const Tensor w = dropout(attention_reference(q, repeated(k), repeated(v), plain).weights, 0.5f, true, same).y;
  EXPECT_TRUE(AllClose(out, matmul(w, repeated(v)), testing::kFloatVsDouble));
}

TEST(AttentionSpec, EmptySequencesGiveZerosUnderAllowEmpty) {
  AttentionOptions o;
  o.allow_empty = true;
  o.return_lse = true;
  const AttentionResult no_query = attention(randn({2, 0, 4}, 1), randn({2, 5, 4}, 2), randn({2, 5, 6}, 3), o);
  EXPECT_EQ(no_query.out.shape(), (Shape{2, 0, 6}));
  const Tensor q = randn({2, 3, 4}, 4), k = Tensor::zeros({2, 0, 4}), v = Tensor::zeros({2, 0, 6});
  const AttentionResult no_key = attention(q, k, v, o);
  ASSERT_EQ(no_key.out.shape(), (Shape{2, 3, 6}));
  for (float x : no_key.out.to_vector()) EXPECT_EQ(x, 0.0f);
  for (float x : no_key.lse.to_vector()) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
  const AttentionGrads g = attention_backward(q, k, v, Tensor(), Tensor(), Tensor::ones({2, 3, 6}), o);
  EXPECT_EQ(g.dq.shape(), q.shape());
  for (float x : g.dq.to_vector()) EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(g.dk.shape(), k.shape());
  EXPECT_TRUE(ThrowsArg([&] { attention(q, k, v); }, "[attention] q (2, 3, 4), k (2, 0, 4) and v (2, 0, 6)"));
  EXPECT_TRUE(ThrowsArg([&] { attention(q, randn({2, 0, 5}, 5), v, o); }, "same last dimension"));
}

TEST(AttentionSpecErrors, DropoutOutsideZeroOneOrWithoutRng) {
  const Tensor q = randn({2, 3, 4}, 1);
  Rng rng(1);
  AttentionOptions o;
  o.dropout_rng = &rng;
  for (float p : {-0.1f, 1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    o.dropout_p = p;
    EXPECT_TRUE(ThrowsArg([&] { attention(q, q, q, o); }, "[attention] dropout_p must be in [0, 1), got "));
  }
  o.dropout_p = 0.5f;
  o.dropout_rng = nullptr;
  EXPECT_TRUE(ThrowsArg([&] { attention(q, q, q, o); }, "[attention] dropout_p 0.5 needs a dropout_rng"));
  o.dropout_rng = &rng;
  EXPECT_TRUE(ThrowsArg([&] { attention_fused(q, q, q, o); }, "[attention] the fused path never forms the weights"));
}

}  // namespace
}  // namespace qkv
