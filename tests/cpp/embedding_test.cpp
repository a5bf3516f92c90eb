// embedding: rows copied exactly for any ids shape, strided tables, and out-of-range ids named in the error.
// Also the Ids bookkeeping: data length must match the shape.
#include "qkv/ops/embedding.h"

#include <gtest/gtest.h>

#include "ops_testing.h"

namespace qkv {
namespace {

using testing::AllClose;
using testing::kExact;
using testing::randn;
using testing::ThrowsArg;

std::vector<double> embedding_ref(const Tensor& w, const Ids& ids) {
  const std::vector<double> W = testing::to_double(w);
  const int64_t e = w.size(1);
  std::vector<double> r;
  for (int64_t id : ids.data) r.insert(r.end(), W.begin() + id * e, W.begin() + (id + 1) * e);
  return r;
}

TEST(Embedding, PicksRowsForBatchedIds) {
  const Tensor w = randn({7, 17}, 1);
  const Ids ids{{0, 6, 3, 3, 1, 5}, {2, 3}};
  const Tensor y = embedding(w, ids);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 17}));
  EXPECT_TRUE(AllClose(y, embedding_ref(w, ids), kExact));
}

TEST(Embedding, ScalarAndEmptyIds) {
  const Tensor w = randn({3, 4}, 2);
  EXPECT_EQ(embedding(w, Ids{{2}, {}}).shape(), (Shape{4}));
  EXPECT_TRUE(AllClose(embedding(w, Ids{{2}, {}}), embedding_ref(w, Ids{{2}, {}}), kExact));
  EXPECT_EQ(embedding(w, Ids{{}, {2, 0}}).shape(), (Shape{2, 0, 4}));
}

TEST(Embedding, StridedTable) {
  const Tensor base = randn({5, 9}, 3);
  const Ids ids{{4, 0, 2}, {3}};
  const Tensor t = base.transpose(0, 1);              // (9, 5) column-major table
  EXPECT_TRUE(AllClose(embedding(t, ids), embedding_ref(t.contiguous(), ids), kExact));
  const Tensor s = base.slice(1, 1, 9, 2);            // (5, 4) column stride 2
  EXPECT_TRUE(AllClose(embedding(s, ids), embedding_ref(s.contiguous(), ids), kExact));
}

TEST(Embedding, OutOfRangeIdNamesIdAndV) {
  const Tensor w = randn({5, 3}, 4);
  EXPECT_TRUE(ThrowsArg([&] { embedding(w, Ids{{1, 5}, {2}}); }, "[embedding] id 5"));
  EXPECT_TRUE(ThrowsArg([&] { embedding(w, Ids{{1, 5}, {2}}); }, "V = 5"));
  EXPECT_TRUE(ThrowsArg([&] { embedding(w, Ids{{-1}, {1}}); }, "id -1"));
}

TEST(Embedding, RejectsBadTableAndIdsShape) {
  EXPECT_TRUE(ThrowsArg([] { embedding(randn({5}, 1), Ids{{0}, {1}}); }, "[embedding]"));
  EXPECT_TRUE(ThrowsArg([] { embedding(randn({5, 2}, 1), Ids{{0, 1}, {3}}); }, "[embedding]"));
  EXPECT_TRUE(ThrowsArg([] { embedding(Tensor(), Ids{{0}, {1}}); }, "[embedding]"));
}

// --- backward ----------------------------------------------------------------------------------------------

TEST(EmbeddingBackward, RepeatedIdsAccumulateIntoExistingGrad) {
  const int64_t v = 5, e = 3;
  const Ids ids{{1, 4, 1, 0, 1, 4}, {2, 3}};
  const Tensor dy = randn({2, 3, e}, 10);
  Tensor dw = randn({v, e}, 11);  // pre-existing gradient: the backward adds, never overwrites
  std::vector<double> want = testing::to_double(dw);
  const std::vector<double> g = testing::to_double(dy);
  for (size_t i = 0; i < ids.data.size(); ++i)
    for (int64_t j = 0; j < e; ++j) want[ids.data[i] * e + j] += g[i * e + j];
  embedding_backward(dw, ids, dy);
  EXPECT_TRUE(AllClose(dw, want, testing::kFloatVsDouble));
}

TEST(EmbeddingBackward, StridedGradAndDy) {
  Tensor base = Tensor::zeros({3, 8});
  Tensor dw = base.transpose(0, 1).slice(0, 0, 8, 2);  // (4, 3) view, strides (2, 8)
  const Ids ids{{3, 0}, {2}};
  const Tensor dy = randn({3, 2}, 12).transpose(0, 1);  // (2, 3) strided
  embedding_backward(dw, ids, dy);
  EXPECT_TRUE(AllClose(dw.select(0, 3), testing::to_double(dy.select(0, 0)), kExact));
  EXPECT_TRUE(AllClose(dw.select(0, 0), testing::to_double(dy.select(0, 1)), kExact));
  EXPECT_TRUE(AllClose(dw.select(0, 1), std::vector<double>(3, 0.0), kExact));
  EXPECT_EQ(base.at({0, 1}), 0.0f);  // odd rows of the base were never touched
}

TEST(EmbeddingBackward, RejectsBadInputs) {
  Tensor dw = Tensor::zeros({5, 3});
  EXPECT_TRUE(ThrowsArg([&] { embedding_backward(dw, Ids{{5}, {1}}, randn({1, 3}, 1)); }, "[embedding_backward] id 5"));
  EXPECT_TRUE(ThrowsArg([&] { embedding_backward(dw, Ids{{1}, {1}}, randn({1, 4}, 1)); }, "[embedding_backward]"));
  EXPECT_TRUE(ThrowsArg([&] { embedding_backward(dw, Ids{{1, 2}, {1}}, randn({1, 3}, 1)); }, "[embedding_backward]"));
  Tensor expanded = Tensor::zeros({1, 3}).expand({5, 3});
  EXPECT_TRUE(ThrowsArg([&] { embedding_backward(expanded, Ids{{1}, {1}}, randn({1, 3}, 1)); }, "[embedding_backward]"));
  Tensor flat = Tensor::zeros({5});
  EXPECT_TRUE(ThrowsArg([&] { embedding_backward(flat, Ids{{1}, {1}}, randn({1, 3}, 1)); }, "[embedding_backward]"));
}

}  // namespace
}  // namespace qkv
