// concat and stack: exact copies along every axis, strided and empty inputs, mismatched shapes rejected.
// The reference builds the result element by element from at().
#include "qkv/ops/shape_ops.h"

#include <gtest/gtest.h>

#include "ops_testing.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::kExact;
using testing::randn;
using testing::ThrowsArg;

TEST(Concat, EveryAxisMatchesElementwiseReference) {
  const Tensor a = randn({2, 3, 4}, 1);
  for (int64_t axis : {0, 1, 2, -1}) {
    Shape sb = a.shape();
    const int64_t ax = axis < 0 ? axis + 3 : axis;
    sb[ax] = 5;
    const Tensor b = randn(sb, 2);
    const Tensor c = concat({a, b}, axis);
    Shape sc = a.shape();
    sc[ax] = a.shape()[ax] + 5;
    ASSERT_EQ(c.shape(), sc);
    std::vector<double> ref;
    for (int64_t i = 0; i < sc[0]; ++i)
      for (int64_t j = 0; j < sc[1]; ++j)
        for (int64_t k = 0; k < sc[2]; ++k) {
          int64_t idx[3] = {i, j, k};
          const bool from_a = idx[ax] < a.shape()[ax];
          if (!from_a) idx[ax] -= a.shape()[ax];
          ref.push_back(from_a ? a.at({idx[0], idx[1], idx[2]}) : b.at({idx[0], idx[1], idx[2]}));
        }
    EXPECT_TRUE(AllClose(c, ref, kExact)) << axis;
  }
}

TEST(Concat, StridedAndEmptyPieces) {
  const Tensor a = randn({4, 3}, 3).transpose(0, 1);  // (3, 4)
  const Tensor e = Tensor::zeros({3, 0});
  const Tensor b = randn({3, 8}, 4).slice(1, 0, 8, 4);  // (3, 2)
  const Tensor c = concat({a, e, b}, 1);
  EXPECT_EQ(c.shape(), (Shape{3, 6}));
  EXPECT_TRUE(AllClose(c.slice(1, 0, 4), testing::to_double(a), kExact));
  EXPECT_TRUE(AllClose(c.slice(1, 4, 6), testing::to_double(b), kExact));
  EXPECT_EQ(concat({e, e}, 1).shape(), (Shape{3, 0}));
}

TEST(Stack, InsertsNewAxis) {
  const Tensor a = randn({2, 3}, 5), b = randn({2, 3}, 6);
  const Tensor s0 = stack({a, b}, 0), s2 = stack({a, b}, -1);
  EXPECT_EQ(s0.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(s2.shape(), (Shape{2, 3, 2}));
  EXPECT_TRUE(AllClose(s0.select(0, 1), testing::to_double(b), kExact));
  EXPECT_TRUE(AllClose(s2.select(2, 0), testing::to_double(a), kExact));
  EXPECT_EQ(stack({Tensor::scalar(1.0f), Tensor::scalar(2.0f)}, 0).to_vector(), (std::vector<float>{1, 2}));
}

TEST(ShapeOps, RejectMismatchedOrEmptyLists) {
  EXPECT_TRUE(ThrowsArg([] { concat({}, 0); }, "[concat]"));
  EXPECT_TRUE(ThrowsArg([] { concat({randn({2, 3}, 1), randn({3, 3}, 2)}, 1); }, "[concat]"));
  EXPECT_TRUE(ThrowsArg([] { concat({randn({2, 3}, 1), randn({2, 3, 1}, 2)}, 0); }, "[concat]"));
  EXPECT_TRUE(ThrowsArg([] { concat({randn({2, 3}, 1)}, 2); }, "[concat]"));
  EXPECT_TRUE(ThrowsArg([] { concat({Tensor::scalar(1.0f)}, 0); }, "[concat]"));
  EXPECT_TRUE(ThrowsArg([] { stack({}, 0); }, "[stack]"));
  EXPECT_TRUE(ThrowsArg([] { stack({randn({2}, 1), randn({3}, 2)}, 0); }, "[stack]"));
  EXPECT_TRUE(ThrowsArg([] { stack({randn({2}, 1)}, 2); }, "[stack]"));
}

TEST(Split, ViewsUndoConcat) {
  const Tensor a = randn({2, 3}, 7), b = randn({2, 0}, 8), c = randn({2, 4}, 9);
  const Tensor cat = concat({a, b, c}, 1);
  const std::vector<Tensor> parts = split(cat, {3, 0, 4}, -1);
  ASSERT_EQ(parts.size(), 3u);
  for (const Tensor& t : parts) EXPECT_TRUE(t.shares_storage(cat));
  EXPECT_TRUE(AllClose(parts[0], testing::to_double(a), kExact));
  EXPECT_EQ(parts[1].shape(), (Shape{2, 0}));
  EXPECT_TRUE(AllClose(parts[2], testing::to_double(c), kExact));
}

TEST(Split, RejectsSizesThatDoNotAddUp) {
  EXPECT_TRUE(ThrowsArg([] { split(randn({2, 5}, 1), {2, 2}, 1); }, "[split]"));
  EXPECT_TRUE(ThrowsArg([] { split(randn({2, 5}, 1), {6, -1}, 1); }, "[split]"));
  EXPECT_TRUE(ThrowsArg([] { split(randn({2, 5}, 1), {5}, 2); }, "[split]"));
  EXPECT_TRUE(ThrowsArg([] { split(Tensor::scalar(1.0f), {1}, 0); }, "[split]"));
}

}  // namespace
}  // namespace qkv
