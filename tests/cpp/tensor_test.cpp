// Tensor and Shape: views share storage, view/reshape rules, copies, strided walks, bounds and checked sizes.
// Values are checked against row-major indices computed by hand, never against another Tensor method alone.
#include "qkv/core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <numeric>

#include "ops_testing.h"
#include "qkv/core/shape.h"

namespace qkv {
namespace {

using testing::ThrowsArg;

// 0, 1, 2, ... in row-major order.
Tensor iota(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::from_vector(shape, v);
}

TEST(Shape, StrAndNumel) {
  EXPECT_EQ(str({2, 10, 64}), "(2, 10, 64)");
  EXPECT_EQ(str({}), "()");
  EXPECT_EQ(str({3}), "(3,)");
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({2, 0, 5}), 0);
  EXPECT_EQ(shape_numel({2, 3, 4}), 24);
}

TEST(Shape, NumelOverflowThrows) {
  const int64_t big = int64_t{1} << 32;
  EXPECT_TRUE(ThrowsArg([&] { shape_numel({big, big}); }, "overflows"));
  EXPECT_TRUE(ThrowsArg([&] { shape_numel({2, -1}); }, "negative"));
  EXPECT_TRUE(ThrowsArg([&] { Tensor::empty({big, big}); }, "[shape]"));
}

TEST(Shape, BroadcastAndAxes) {
  EXPECT_EQ(broadcast_shapes({2, 1, 5}, {3, 1}, "t"), (Shape{2, 3, 5}));
  EXPECT_EQ(broadcast_shapes({}, {4}, "t"), (Shape{4}));
  EXPECT_TRUE(ThrowsArg([] { broadcast_shapes({2, 3}, {4}, "myop"); }, "[myop]"));
  EXPECT_TRUE(broadcastable_to({1, 3}, {2, 4, 3}));
  EXPECT_FALSE(broadcastable_to({2, 3}, {3, 3}));
  EXPECT_FALSE(broadcastable_to({1, 1, 3}, {2, 3}));
  EXPECT_EQ(normalize_axis(-1, 3, "t"), 2);
  EXPECT_TRUE(ThrowsArg([] { normalize_axis(3, 3, "myop"); }, "[myop]"));
  EXPECT_TRUE(ThrowsArg([] { normalize_axis(-4, 3, "myop"); }, "[myop]"));
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Shape{12, 4, 1}));
}

TEST(Tensor, ConstructionAndFromVectorMismatch) {
  EXPECT_FALSE(Tensor().defined());
  const Tensor z = Tensor::zeros({2, 3});
  EXPECT_TRUE(z.is_contiguous());
  EXPECT_EQ(z.to_vector(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(Tensor::full({2}, 7.0f).to_vector(), (std::vector<float>{7, 7}));
  EXPECT_EQ(Tensor::scalar(3.0f).item(), 3.0f);
  EXPECT_EQ(Tensor::scalar(3.0f).dim(), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(Tensor::empty({5}).data()) % 64, 0u);
  EXPECT_TRUE(ThrowsArg([] { Tensor::from_vector({2, 3}, {1, 2, 3}); }, "[tensor]"));
  EXPECT_TRUE(ThrowsArg([] { Tensor::ones({2}).item(); }, "[tensor.item]"));
  EXPECT_TRUE(ThrowsArg([] { Tensor().data(); }, "[tensor]"));
}

TEST(Tensor, AtBoundsChecked) {
  Tensor t = iota({2, 3});
  EXPECT_EQ(t.at({1, 2}), 5.0f);
  t.at({0, 1}) = 42.0f;
  EXPECT_EQ(t.to_vector()[1], 42.0f);
  EXPECT_TRUE(ThrowsArg([&] { t.at({2, 0}); }, "[tensor.at]"));
  EXPECT_TRUE(ThrowsArg([&] { t.at({0, -1}); }, "[tensor.at]"));
  EXPECT_TRUE(ThrowsArg([&] { t.at({0}); }, "[tensor.at]"));
  EXPECT_TRUE(ThrowsArg([&] { t.size(2); }, "[tensor.size]"));
}

TEST(Tensor, ViewsShareStorage) {
  const Tensor t = iota({2, 3, 4});
  for (const Tensor& v : {t.view({6, 4}), t.reshape({4, 6}), t.transpose(0, 2), t.permute({2, 0, 1}),
                          t.slice(1, 1, 3), t.select(0, 1), t.unsqueeze(0), t.expand({5, 2, 3, 4})})
    EXPECT_TRUE(v.shares_storage(t));
  // Writes through a view are seen by the base.
  Tensor s = t.select(1, 2);
  s.at({1, 3}) = -1.0f;
  EXPECT_EQ(t.at({1, 2, 3}), -1.0f);
}

TEST(Tensor, TransposePermuteSliceSelectValues) {
  const Tensor t = iota({2, 3, 4});  // t[i, j, k] = 12 i + 4 j + k
  const Tensor tr = t.transpose(0, 2);
  EXPECT_EQ(tr.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(tr.at({3, 1, 1}), 12 + 4 + 3);
  const Tensor p = t.permute({1, 2, 0});
  EXPECT_EQ(p.at({2, 3, 1}), 12 + 8 + 3);
  const Tensor sl = t.slice(2, 1, 4, 2);  // k in {1, 3}
  EXPECT_EQ(sl.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(sl.at({1, 2, 1}), 12 + 8 + 3);
  EXPECT_EQ(t.slice(2, -2, 100).shape(), (Shape{2, 3, 2}));   // Python-style clamping
  EXPECT_EQ(t.slice(2, 3, 1).shape(), (Shape{2, 3, 0}));      // empty, not negative
  EXPECT_EQ(t.select(1, -1).at({1, 2}), 12 + 8 + 2);
  EXPECT_EQ(t.unsqueeze(0).squeeze(0).shape(), (Shape{2, 3, 4}));
  EXPECT_TRUE(ThrowsArg([&] { t.squeeze(0); }, "[squeeze]"));
  EXPECT_TRUE(ThrowsArg([&] { t.select(1, 3); }, "[select]"));
  EXPECT_TRUE(ThrowsArg([&] { t.slice(0, 0, 1, 0); }, "[slice]"));
  EXPECT_TRUE(ThrowsArg([&] { t.permute({0, 0, 1}); }, "[permute]"));
  EXPECT_TRUE(ThrowsArg([&] { t.permute({0, 1}); }, "[permute]"));
  EXPECT_TRUE(ThrowsArg([&] { t.transpose(0, 3); }, "[transpose]"));
}

TEST(Tensor, UnsqueezeAnywhere) {
  const Tensor t = iota({2, 3});
  EXPECT_EQ(t.unsqueeze(0).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(t.unsqueeze(1).shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(t.unsqueeze(-1).shape(), (Shape{2, 3, 1}));
  EXPECT_TRUE(t.unsqueeze(2).is_contiguous());
  EXPECT_EQ(t.unsqueeze(1).to_vector(), t.to_vector());
  EXPECT_TRUE(ThrowsArg([&] { t.unsqueeze(4); }, "[unsqueeze]"));
}

TEST(Tensor, ExpandBroadcastsWithZeroStride) {
  const Tensor t = iota({3, 1});
  const Tensor e = t.expand({2, 3, 4});
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(e.strides()[2], 0);
  EXPECT_EQ(e.at({1, 2, 3}), 2.0f);
  EXPECT_FALSE(e.is_contiguous());
  EXPECT_TRUE(ThrowsArg([&] { t.expand({3, 2, 2}); }, "[expand]"));
  EXPECT_TRUE(ThrowsArg([&] { t.expand({3, -2}); }, "["));
  EXPECT_EQ(Tensor::scalar(5.0f).expand({2, 2}).to_vector(), (std::vector<float>{5, 5, 5, 5}));
}

TEST(Tensor, ViewOnNonViewableStridesThrowsReshapeCopies) {
  const Tensor t = iota({2, 3});
  const Tensor tr = t.transpose(0, 1);  // (3, 2), strides (1, 3)
  EXPECT_TRUE(ThrowsArg([&] { tr.view({6}); }, "[view]"));
  const Tensor r = tr.reshape({6});
  EXPECT_FALSE(r.shares_storage(t));
  EXPECT_EQ(r.to_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  // A view that splits a dim of a transposed tensor is still a view.
  const Tensor v = iota({4, 6}).transpose(0, 1).view({2, 3, 4});
  EXPECT_EQ(v.at({1, 2, 3}), 3 * 6 + 5);
  // -1 inference and errors.
  EXPECT_EQ(t.view({-1}).shape(), (Shape{6}));
  EXPECT_EQ(t.view({3, -1}).shape(), (Shape{3, 2}));
  EXPECT_TRUE(ThrowsArg([&] { t.view({-1, -1}); }, "[view]"));
  EXPECT_TRUE(ThrowsArg([&] { t.view({4, -1}); }, "[view]"));
  EXPECT_TRUE(ThrowsArg([&] { t.view({7}); }, "[view]"));
  // Sliced rows: a view across the sliced dim is impossible, so reshape copies.
  const Tensor sl = iota({4, 4}).slice(1, 0, 2);
  EXPECT_TRUE(ThrowsArg([&] { sl.view({8}); }, "[view]"));
  EXPECT_EQ(sl.reshape({8}).to_vector(), (std::vector<float>{0, 1, 4, 5, 8, 9, 12, 13}));
}

TEST(Tensor, ViewOfScalarAndSizeOneDims) {
  const Tensor s = Tensor::scalar(2.0f);
  EXPECT_EQ(s.view({1}).shape(), (Shape{1}));
  EXPECT_EQ(s.view({1, 1}).item(), 2.0f);
  EXPECT_EQ(s.reshape({1, 1, 1}).shape(), (Shape{1, 1, 1}));
  EXPECT_EQ(Tensor::ones({1}).view({}).dim(), 0);
  EXPECT_EQ(iota({2, 1, 3}).view({2, 3}).at({1, 2}), 5.0f);
  EXPECT_EQ(Tensor::zeros({0, 3}).view({3, 0}).shape(), (Shape{3, 0}));
}

TEST(Tensor, ContiguousAndClone) {
  const Tensor t = iota({3, 4});
  EXPECT_TRUE(t.contiguous().shares_storage(t));
  const Tensor tr = t.transpose(0, 1);
  const Tensor c = tr.contiguous();
  EXPECT_FALSE(c.shares_storage(t));
  EXPECT_TRUE(c.is_contiguous());
  std::vector<float> want;
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 3; ++i) want.push_back(static_cast<float>(4 * i + j));
  EXPECT_EQ(c.to_vector(), want);
  const Tensor cl = t.clone();
  EXPECT_FALSE(cl.shares_storage(t));
  EXPECT_EQ(cl.to_vector(), t.to_vector());
  // A slice with offset and an expanded view.
  EXPECT_EQ(t.slice(0, 1, 3).select(1, 2).contiguous().to_vector(), (std::vector<float>{6, 10}));
  EXPECT_EQ(t.select(0, 2).unsqueeze(0).expand({2, 4}).contiguous().to_vector(),
            (std::vector<float>{8, 9, 10, 11, 8, 9, 10, 11}));
}

TEST(Tensor, CopyFromBroadcastsAndHandlesOverlap) {
  Tensor t = Tensor::zeros({2, 3});
  t.copy_from(Tensor::from_vector({3}, {1, 2, 3}));
  EXPECT_EQ(t.to_vector(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  Tensor col = t.select(1, 0);
  col.fill(9.0f);
  EXPECT_EQ(t.to_vector(), (std::vector<float>{9, 2, 3, 9, 2, 3}));
  // Overlapping: copy a transposed view of itself.
  Tensor sq = iota({3, 3});
  sq.copy_from(sq.transpose(0, 1));
  EXPECT_EQ(sq.to_vector(), (std::vector<float>{0, 3, 6, 1, 4, 7, 2, 5, 8}));
  // Contiguous and overlapping (one block): rows 0-1 of a 3-row tensor from rows 1-2, and back.
  Tensor rows = iota({3, 2});
  rows.slice(0, 0, 2).copy_from(rows.slice(0, 1, 3));
  EXPECT_EQ(rows.to_vector(), (std::vector<float>{2, 3, 4, 5, 4, 5}));
  rows.slice(0, 1, 3).copy_from(rows.slice(0, 0, 2));
  EXPECT_EQ(rows.to_vector(), (std::vector<float>{2, 3, 2, 3, 4, 5}));
  EXPECT_TRUE(ThrowsArg([&] { t.copy_from(Tensor::zeros({4})); }, "[expand]"));
}

TEST(Tensor, CopyFromStridedRowsOfAnotherStorage) {
  // A KV cache's append: a transposed (B, T, H, D) -> (B, H, T, D) view into a slice of the cache's time axis,
  // large enough for the threaded rows (2^18 elements and more).
  const Tensor src = iota({4, 70, 8, 128}).transpose(1, 2);
  Tensor cache = Tensor::zeros({4, 8, 100, 128});
  cache.slice(2, 10, 80).copy_from(src);
  EXPECT_EQ(cache.slice(2, 10, 80).to_vector(), src.to_vector());
  for (const Tensor& rest : {cache.slice(2, 0, 10), cache.slice(2, 80, 100)})
    for (float x : rest.to_vector()) ASSERT_EQ(x, 0.0f);
  // Last dims strided on either side.
  const Tensor a = iota({6, 5});
  Tensor d = Tensor::zeros({5, 6});
  d.transpose(0, 1).copy_from(a);
  EXPECT_EQ(d.to_vector(), a.transpose(0, 1).contiguous().to_vector());
  Tensor e = Tensor::zeros({6, 5});
  e.transpose(0, 1).copy_from(a.transpose(0, 1));
  EXPECT_EQ(e.to_vector(), a.to_vector());
  // Two wrappers of one buffer (numpy views, say) whose spans overlap: the source is staged as within one storage
  // (copied row by row in place, row 0 would overwrite elements 3 and 6 before they are read).
  std::vector<float> buf(12);
  std::iota(buf.begin(), buf.end(), 0.0f);
  const Tensor lo = Tensor::from_blob(buf.data(), {3, 3}, {}, nullptr);
  Tensor hi = Tensor::from_blob(buf.data() + 3, {3, 3}, {}, nullptr);
  const std::vector<float> want = lo.transpose(0, 1).contiguous().to_vector();
  hi.transpose(0, 1).copy_from(lo.transpose(0, 1));
  EXPECT_EQ(hi.transpose(0, 1).contiguous().to_vector(), want);
  // Scalars.
  Tensor s = Tensor::zeros({});
  s.copy_from(Tensor::from_vector({1}, {7}).view({}));
  EXPECT_EQ(s.to_vector(), std::vector<float>{7});
}

TEST(Tensor, FromBlobWrapsWithoutCopy) {
  auto buf = std::make_shared<std::vector<float>>(std::vector<float>{0, 1, 2, 3, 4, 5});
  const Tensor t = Tensor::from_blob(buf->data(), {3, 2}, {1, 3}, buf);
  EXPECT_EQ(t.to_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  (*buf)[0] = 7.0f;
  EXPECT_EQ(t.at({0, 0}), 7.0f);
  EXPECT_TRUE(ThrowsArg([&] { Tensor::from_blob(nullptr, {2}, {}, nullptr); }, "[tensor]"));
  EXPECT_TRUE(ThrowsArg([&] { Tensor::from_blob(buf->data(), {2}, {1, 1}, buf); }, "[tensor]"));
}

TEST(Tensor, ForEachOffsetWalksRowMajor) {
  std::vector<std::pair<int64_t, int64_t>> seen;
  for_each_offset({2, 3}, {1, 2}, [&](int64_t i, int64_t off) { seen.emplace_back(i, off); });
  const std::vector<std::pair<int64_t, int64_t>> want{{0, 0}, {1, 2}, {2, 4}, {3, 1}, {4, 3}, {5, 5}};
  EXPECT_EQ(seen, want);
  int calls = 0;
  for_each_offset({}, {}, [&](int64_t i, int64_t off) { calls += 1 + static_cast<int>(i + off); });
  EXPECT_EQ(calls, 1);  // a scalar is one element at offset 0
  for_each_offset({3, 0}, {0, 1}, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 1);  // no elements
  // Zero strides revisit the same offset.
  std::vector<int64_t> offs;
  for_each_offset({2, 2}, {0, 1}, [&](int64_t, int64_t off) { offs.push_back(off); });
  EXPECT_EQ(offs, (std::vector<int64_t>{0, 1, 0, 1}));
}

}  // namespace
}  // namespace qkv
