// Tests of attention in 40 lines (qkv/ops/attention_plain.h), the float64 oracle of the attention tests: its
// variants against the definitions they stand for, written out here, and its error paths.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops_testing.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/attention_plain.h"

namespace qkv {
namespace {

using testing::randn;
using testing::ThrowsArg;

constexpr double kInf = std::numeric_limits<double>::infinity();
// Two float64 computations of the same quantity in a different order.
constexpr double kDoubleTol = 1e-12;

void ExpectNear(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], kDoubleTol * (1.0 + std::fabs(b[i]))) << what << " " << i;
}

TEST(AttentionPlain, OneRowByHand) {
  // q = (1, 0), keys (1, 0) and (0, 1), scale 1: weights e/(e + 1) and 1/(e + 1).
  const Array64 q{{1, 2}, {1.0, 0.0}}, k{{2, 2}, {1.0, 0.0, 0.0, 1.0}}, v{{2, 1}, {10.0, 20.0}};
  AttentionOptions o;
  o.scale = 1.0f;
  const PlainAttention r = attention_plain(q, k, v, nullptr, o);
  const double e = std::exp(1.0);
  ExpectNear(r.weights, {e / (e + 1), 1 / (e + 1)}, "weights");
  ExpectNear(r.out, {(10 * e + 20) / (e + 1)}, "out");
  ExpectNear(r.lse, {std::log(e + 1)}, "lse");
}

TEST(AttentionPlain, FullyMaskedRowIsZeroNotNaN) {
  const Tensor q = randn({3, 4}, 1), k = randn({5, 4}, 2), v = randn({5, 2}, 3);
  AttentionOptions o;
  o.mask = Tensor::ones({3, 5});
  for (int64_t j = 0; j < 5; ++j) o.mask.data()[5 + j] = 0.0f;  // row 1 keeps nothing
  o.mask_kind = MaskKind::kKeep;
  const PlainAttention r = attention_plain(q, k, v, o);
  EXPECT_EQ(r.lse[1], -kInf);
  for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(r.weights[5 + j], 0.0);
  for (int64_t c = 0; c < 2; ++c) EXPECT_EQ(r.out[2 + c], 0.0);
}

TEST(AttentionPlain, GqaEqualsKvHeadsRepeated) {
  const Tensor q = randn({2, 6, 3, 4}, 4), k = randn({2, 2, 5, 4}, 5), v = randn({2, 2, 5, 3}, 6);
  AttentionOptions o;
  o.enable_gqa = true;
  o.causal = Causal::kBottomRight;
  // Query head h reads kv head h / 3: the kv heads repeated three times each.
  const auto repeated = [](const Tensor& t) {
    return t.unsqueeze(2).expand({2, 2, 3, t.size(2), t.size(3)}).contiguous().reshape(
        {2, 6, t.size(2), t.size(3)});
  };
  AttentionOptions plain = o;
  plain.enable_gqa = false;
  const PlainAttention a = attention_plain(q, k, v, o), b = attention_plain(q, repeated(k), repeated(v), plain);
  EXPECT_EQ(a.batch, (Shape{2, 6}));
  ExpectNear(a.out, b.out, "out");
  ExpectNear(a.weights, b.weights, "weights");
}

TEST(AttentionPlain, WindowAndSoftcapAsDefined) {
  // Query i sees key j iff i + Tk - Tq - left <= j <= i + Tk - Tq + right; the score becomes c·tanh(s / c).
  const int64_t tq = 4, tk = 7, d = 3, left = 2, right = 1;
  const double cap = 1.5;
  const Tensor q = randn({tq, d}, 7), k = randn({tk, d}, 8), v = randn({tk, 2}, 9);
  AttentionOptions o;
  o.window_left = left;
  o.window_right = right;
  o.softcap = static_cast<float>(cap);
  const PlainAttention r = attention_plain(q, k, v, o);
  const Array64 qd = to_array64(q), kd = to_array64(k);
  for (int64_t i = 0; i < tq; ++i) {
    std::vector<double> s(tk, -kInf);
    double z = 0.0;
    for (int64_t j = i + tk - tq - left; j <= i + tk - tq + right; ++j) {
      if (j < 0 || j >= tk) continue;
      double dot = 0.0;
      for (int64_t c = 0; c < d; ++c) dot += qd.data[i * d + c] * kd.data[j * d + c];
      s[j] = cap * std::tanh(dot / std::sqrt(3.0) / cap);
      z += std::exp(s[j]);
    }
    for (int64_t j = 0; j < tk; ++j)
      EXPECT_NEAR(r.weights[i * tk + j], std::exp(s[j]) / z, kDoubleTol) << i << " " << j;
  }
}

TEST(AttentionPlain, AgreesWithTheFloat32Reference) {
  const Tensor q = randn({2, 1, 6, 8}, 10), k = randn({1, 3, 9, 8}, 11), v = randn({2, 3, 9, 5}, 12);
  AttentionOptions o;
  o.mask = randn({6, 9}, 13);
  o.mask_kind = MaskKind::kAdditive;
  o.causal = Causal::kTopLeft;
  o.return_weights = true;
  const PlainAttention p = attention_plain(q, k, v, o);
  EXPECT_TRUE(testing::AllClose(attention_reference(q, k, v, o).out, p.out, testing::kFloatVsDouble));
}

TEST(AttentionPlainErrors, CheckedAsAttentionChecksWithItsName) {
  const Array64 q{{3, 4}, std::vector<double>(12)}, k{{5, 3}, std::vector<double>(15)};
  const Array64 v{{5, 2}, std::vector<double>(10)};
  EXPECT_TRUE(ThrowsArg([&] { attention_plain(q, k, v, nullptr); }, "[attention_plain] q (3, 4) and k (5, 3)"));
  const Array64 r1{{4}, std::vector<double>(4)};
  EXPECT_TRUE(ThrowsArg([&] { attention_plain(r1, k, v, nullptr); }, "[attention_plain] q (4,) must have rank"));
  const Array64 k4{{5, 4}, std::vector<double>(20)}, mask{{2, 5}, std::vector<double>(10)};
  AttentionOptions o;
  o.mask_kind = MaskKind::kKeep;
  EXPECT_TRUE(ThrowsArg([&] { attention_plain(q, k4, v, &mask, o); }, "[attention_plain] mask (2, 5) does not"));
  EXPECT_TRUE(ThrowsArg([&] { attention_plain(q, k4, v, nullptr, o); }, "[attention_plain] mask_kind kKeep needs"));
}

}  // namespace
}  // namespace qkv
