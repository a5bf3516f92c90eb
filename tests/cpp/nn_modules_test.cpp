// The small nn modules: Linear, LayerNorm, Embedding, Dropout, FeedForward. PyTorch names and init ranges,
// hand-derived forward values, train/eval behaviour and every constructor / forward error path.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "nn_testing.h"
#include "qkv/nn/dropout.h"
#include "qkv/nn/embedding.h"
#include "qkv/nn/feed_forward.h"
#include "qkv/nn/layer_norm.h"
#include "qkv/nn/linear.h"

namespace qkv::nn {
namespace {

using qkv::testing::AllClose;
using qkv::testing::BitIdentical;
using qkv::testing::kExact;
using qkv::testing::kFloatVsDouble;
using qkv::testing::randn;
using qkv::testing::ThrowsArg;

std::map<std::string, Shape> names_and_shapes(Module& m) {
  std::map<std::string, Shape> out;
  for (auto& [name, p] : m.named_parameters()) out[name] = p->shape();
  return out;
}

float max_abs(const Tensor& t) {
  float m = 0;
  for (float v : t.to_vector()) m = std::max(m, std::fabs(v));
  return m;
}

// --- Linear ---------------------------------------------------------------------------------------------------

TEST(Linear, NamesShapesAndTorchInitBound) {
  Rng rng(1);
  Linear lin(64, 10, true, rng);
  EXPECT_EQ(names_and_shapes(lin), (std::map<std::string, Shape>{{"weight", {10, 64}}, {"bias", {10}}}));
  const float bound = 1.0f / 8.0f;  // 1/sqrt(64)
  EXPECT_LE(max_abs(lin.weight), bound);
  EXPECT_GT(max_abs(lin.weight), 0.9f * bound);
  EXPECT_LE(max_abs(lin.bias), bound);
  EXPECT_GT(max_abs(lin.bias), 0.0f);
  Linear nobias(64, 10, false, rng);
  EXPECT_EQ(names_and_shapes(nobias), (std::map<std::string, Shape>{{"weight", {10, 64}}}));
  EXPECT_FALSE(nobias.has_bias());
}

TEST(Linear, ForwardHandValues) {
  Rng rng(1);
  Linear lin(2, 3, true, rng);
  lin.weight.copy_from(Tensor::from_vector({3, 2}, {1, 2, 3, 4, 5, 6}));
  lin.bias.copy_from(Tensor::from_vector({3}, {0.5f, -1, 0}));
  const Tensor y = lin.forward(Tensor::from_vector({1, 1, 2}, {1, -1}));
  EXPECT_TRUE(AllClose(y, std::vector<double>{-0.5, -2.0, -1.0}, kExact));
  EXPECT_EQ(y.shape(), Shape({1, 1, 3}));
}

TEST(Linear, SameSeedSameInit) {
  Rng a(7), b(7);
  Linear la(5, 4, true, a), lb(5, 4, true, b);
  EXPECT_TRUE(BitIdentical(la.weight, lb.weight));
  EXPECT_TRUE(BitIdentical(la.bias, lb.bias));
}

TEST(Linear, ErrorsNameTheModule) {
  Rng rng(1);
  EXPECT_TRUE(ThrowsArg([&] { Linear l(-1, 3, true, rng); }, "[Linear]"));
  Linear lin(4, 3, true, rng);
  EXPECT_TRUE(ThrowsArg([&] { lin.forward(Tensor::zeros({2, 5})); }, "[Linear] input (2, 5)"));
  EXPECT_TRUE(ThrowsArg([&] { lin.forward(Tensor()); }, "[Linear]"));
}

// --- LayerNorm ------------------------------------------------------------------------------------------------

TEST(LayerNorm, HandValuesWithAffine) {
  LayerNorm ln(4);
  EXPECT_EQ(names_and_shapes(ln), (std::map<std::string, Shape>{{"weight", {4}}, {"bias", {4}}}));
  for (float v : ln.weight.to_vector()) EXPECT_EQ(v, 1.0f);
  for (float v : ln.bias.to_vector()) EXPECT_EQ(v, 0.0f);
  ln.weight.copy_from(Tensor::from_vector({4}, {1, 2, 1, 1}));
  ln.bias.copy_from(Tensor::from_vector({4}, {0, 0, 1, 0}));
  // x = [1, 2, 3, 4]: mean 2.5, biased variance 1.25.
  const double r = 1.0 / std::sqrt(1.25 + 1e-5);
  const Tensor y = ln.forward(Tensor::from_vector({1, 4}, {1, 2, 3, 4}));
  EXPECT_TRUE(AllClose(y, std::vector<double>{-1.5 * r, 2 * -0.5 * r, 0.5 * r + 1, 1.5 * r}, kFloatVsDouble));
}

TEST(LayerNorm, NoAffineAndNoBiasVariants) {
  LayerNorm plain(3, 1e-5f, /*elementwise_affine=*/false);
  EXPECT_TRUE(names_and_shapes(plain).empty());
  LayerNorm nob(3, 1e-5f, true, /*bias=*/false);
  EXPECT_EQ(names_and_shapes(nob), (std::map<std::string, Shape>{{"weight", {3}}}));
  const Tensor x = randn({2, 3}, 1);
  EXPECT_TRUE(BitIdentical(plain.forward(x), nob.forward(x)));  // weight 1, no bias
}

TEST(LayerNorm, ErrorsNameTheModule) {
  EXPECT_TRUE(ThrowsArg([] { LayerNorm l(0); }, "[LayerNorm]"));
  EXPECT_TRUE(ThrowsArg([] { LayerNorm l(4, 0.0f); }, "[LayerNorm] eps"));
  LayerNorm ln(4);
  EXPECT_TRUE(ThrowsArg([&] { ln.forward(Tensor::zeros({2, 3})); }, "[LayerNorm] input (2, 3)"));
}

// --- Embedding ------------------------------------------------------------------------------------------------

TEST(Embedding, PicksRowsAndZeroesPaddingRow) {
  Rng rng(1);
  Embedding emb(6, 3, rng, /*padding_idx=*/-1);  // the last row, as PyTorch's negative index
  EXPECT_EQ(emb.padding_idx(), 5);
  EXPECT_EQ(names_and_shapes(emb), (std::map<std::string, Shape>{{"weight", {6, 3}}}));
  for (int64_t e = 0; e < 3; ++e) EXPECT_EQ(emb.weight.at({5, e}), 0.0f);
  const Tensor y = emb.forward(Ids{{2, 5, 0, 2}, {2, 2}});
  ASSERT_EQ(y.shape(), Shape({2, 2, 3}));
  EXPECT_TRUE(BitIdentical(y.select(0, 0).select(0, 0), emb.weight.select(0, 2)));
  EXPECT_TRUE(BitIdentical(y.select(0, 1).select(0, 1), emb.weight.select(0, 2)));
  EXPECT_TRUE(BitIdentical(y.select(0, 1).select(0, 0), emb.weight.select(0, 0)));
  for (int64_t e = 0; e < 3; ++e) EXPECT_EQ(y.at({0, 1, e}), 0.0f);
}

TEST(Embedding, InitIsStandardNormal) {
  Rng rng(3);
  Embedding emb(200, 50, rng);
  double s = 0, s2 = 0;
  const auto v = emb.weight.to_vector();
  for (float x : v) s += x, s2 += double(x) * x;
  const double mean = s / v.size(), sd = std::sqrt(s2 / v.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.03);  // 10000 draws: 3 standard errors
  EXPECT_NEAR(sd, 1.0, 0.03);
}

TEST(Embedding, ErrorsNameTheModule) {
  Rng rng(1);
  EXPECT_TRUE(ThrowsArg([&] { Embedding e(0, 3, rng); }, "[Embedding]"));
  EXPECT_TRUE(ThrowsArg([&] { Embedding e(4, 3, rng, 4); }, "[Embedding] padding_idx 4"));
  Embedding emb(4, 3, rng);
  EXPECT_TRUE(ThrowsArg([&] { emb.forward(Ids{{0, 4}, {2}}); }, "[Embedding] id 4 out of range"));
  EXPECT_TRUE(ThrowsArg([&] { emb.forward(Ids{{-1}, {1}}); }, "[Embedding] id -1"));
  EXPECT_TRUE(ThrowsArg([&] { emb.forward(Ids{{0, 1, 2}, {2}}); }, "[Embedding] ids shape (2,)"));
}

// --- Dropout --------------------------------------------------------------------------------------------------

TEST(Dropout, EvalAndZeroPAreIdentityWithoutCopy) {
  Dropout d(0.5f, 1);
  const Tensor x = randn({4, 5}, 2);
  d.eval();
  const Tensor y = d.forward(x);
  EXPECT_TRUE(y.shares_storage(x));
  Dropout zero(0.0f, 1);  // training by default
  EXPECT_TRUE(zero.training());
  EXPECT_TRUE(zero.forward(x).shares_storage(x));
  EXPECT_TRUE(names_and_shapes(d).empty());
}

TEST(Dropout, TrainKeepsScaledOrZeroAndIsSeeded) {
  const float p = 0.25f;
  Dropout a(p, 42), b(p, 42);
  const Tensor x = Tensor::ones({100, 40});
  const Tensor ya = a.forward(x), yb = b.forward(x);
  EXPECT_TRUE(BitIdentical(ya, yb));               // same seed, same mask
  EXPECT_FALSE(BitIdentical(ya, a.forward(x)));    // the stream advances
  int dropped = 0;
  for (float v : ya.to_vector()) {
    if (v == 0.0f) {
      ++dropped;
    } else {
      EXPECT_FLOAT_EQ(v, 1.0f / (1.0f - p));
    }
  }
  EXPECT_NEAR(dropped / 4000.0, p, 0.03);  // ~4.4 standard errors
}

TEST(Dropout, POneZeroesInTraining) {
  Dropout d(1.0f, 3);
  for (float v : d.forward(randn({3, 3}, 4)).to_vector()) EXPECT_EQ(v, 0.0f);
}

TEST(Dropout, ErrorsNameTheModule) {
  EXPECT_TRUE(ThrowsArg([] { Dropout d(-0.1f); }, "[Dropout] p"));
  EXPECT_TRUE(ThrowsArg([] { Dropout d(1.5f); }, "[Dropout] p"));
  Dropout d(0.5f);
  EXPECT_TRUE(ThrowsArg([&] { d.forward(Tensor()); }, "[Dropout]"));
}

// --- FeedForward ----------------------------------------------------------------------------------------------

TEST(FeedForward, NamesAndHandValuesReluGelu) {
  Rng rng(1);
  FeedForward ff(2, 3, rng, Activation::kRelu);
  EXPECT_EQ(names_and_shapes(ff), (std::map<std::string, Shape>{{"linear1.weight", {3, 2}},
                                                                 {"linear1.bias", {3}},
                                                                 {"linear2.weight", {2, 3}},
                                                                 {"linear2.bias", {2}}}));
  ff.linear1.weight.copy_from(Tensor::from_vector({3, 2}, {1, 0, 0, 1, 1, 1}));
  ff.linear1.bias.copy_from(Tensor::from_vector({3}, {0, 0, -1}));
  ff.linear2.weight.copy_from(Tensor::from_vector({2, 3}, {1, 1, 1, 1, -1, 2}));
  ff.linear2.bias.copy_from(Tensor::from_vector({2}, {0.5f, 0}));
  // x = [2, -1]: h = [2, -1, 0] -> relu [2, 0, 0] -> [2.5, 2]
  const Tensor x = Tensor::from_vector({1, 2}, {2, -1});
  EXPECT_TRUE(AllClose(ff.forward(x), std::vector<double>{2.5, 2.0}, kFloatVsDouble));
  // gelu(h) = h * Phi(h): [2 Phi(2), -Phi(-1), 0]
  FeedForward fg(2, 3, rng, Activation::kGelu);
  fg.load_state_dict(ff.state_dict());
  const double g2 = 2 * 0.5 * (1 + std::erf(2 / std::sqrt(2.0))), gm1 = -0.5 * (1 + std::erf(-1 / std::sqrt(2.0)));
  EXPECT_TRUE(AllClose(fg.forward(x), std::vector<double>{g2 + gm1 + 0.5, g2 - gm1}, kFloatVsDouble));
}

TEST(FeedForward, DropoutFollowsTrainEval) {
  Rng rng(1);
  FeedForward ff(8, 32, rng, Activation::kRelu, 0.5f);
  const Tensor x = randn({4, 8}, 2);
  ff.eval();
  EXPECT_FALSE(ff.dropout.training());
  const Tensor e = ff.forward(x);
  EXPECT_TRUE(BitIdentical(e, ff.forward(x)));
  ff.train();
  EXPECT_TRUE(ff.dropout.training());
  EXPECT_FALSE(BitIdentical(e, ff.forward(x)));
}

TEST(FeedForward, ActivationFromStringAndErrors) {
  EXPECT_EQ(activation_from_string("relu"), Activation::kRelu);
  EXPECT_EQ(activation_from_string("gelu"), Activation::kGelu);
  EXPECT_EQ(activation_from_string("gelu_tanh"), Activation::kGeluTanh);
  EXPECT_TRUE(ThrowsArg([] { activation_from_string("swish", "TransformerEncoderLayer"); },
                        "[TransformerEncoderLayer] activation"));
  Rng rng(1);
  EXPECT_TRUE(ThrowsArg([&] { FeedForward f(0, 3, rng); }, "[FeedForward]"));
  EXPECT_TRUE(ThrowsArg([&] { FeedForward f(2, 3, rng, Activation::kRelu, 1.0f); }, "[FeedForward] dropout"));
  FeedForward ff(2, 3, rng);
  EXPECT_TRUE(ThrowsArg([&] { ff.forward(Tensor::zeros({1, 3})); }, "[FeedForward] input (1, 3)"));
}

}  // namespace
}  // namespace qkv::nn
