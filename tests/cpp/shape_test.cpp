// Shape, the inline small vector of dims and strides (qkv/core/small_vector.h): inline and heap storage, growth
// across the inline boundary, insert/erase, copies and moves both ways, comparison, std::vector conversions; and
// that a tensor's views allocate nothing up to the inline rank.
#include "qkv/core/shape.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <new>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "qkv/core/tensor.h"

// Counts this thread's calls of the global operator new while a test's window is open.
namespace {
thread_local bool counting = false;
thread_local int64_t news = 0;
}  // namespace

void* operator new(size_t n) {
  if (counting) ++news;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace qkv {
namespace {

constexpr size_t kInline = Shape::inline_capacity;

// 1, 2, ..., n
Shape iota(size_t n) {
  Shape s(n);
  std::iota(s.begin(), s.end(), int64_t{1});
  return s;
}
std::vector<int64_t> iota_vec(size_t n) { return iota(n).vec(); }

// Heap allocations (operator new) made by f on this thread.
template <typename F>
int64_t allocations(F&& f) {
  news = 0;
  counting = true;
  f();
  counting = false;
  return news;
}

TEST(Shape, InlineCapacityIsSixDims) {
  EXPECT_EQ(kInline, 6u);
  Shape s;
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.capacity(), kInline);
  EXPECT_TRUE(s.is_inline());
}

TEST(Shape, ConstructorsMatchStdVector) {
  EXPECT_EQ((Shape{2, 3, 4}).vec(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(Shape(3).vec(), std::vector<int64_t>(3));  // value-initialised: zeros
  EXPECT_EQ(Shape(4, 7).vec(), std::vector<int64_t>(4, 7));
  const std::vector<int64_t> v{5, 6, 7, 8, 9, 10, 11, 12};
  EXPECT_EQ(Shape(v.begin() + 1, v.end() - 1).vec(), std::vector<int64_t>(v.begin() + 1, v.end() - 1));
  const Shape from_vec = v;  // implicit
  EXPECT_EQ(from_vec.vec(), v);
  EXPECT_FALSE(from_vec.is_inline());
  std::istringstream in("4 5 6");  // single-pass iterators
  const Shape read{std::istream_iterator<int64_t>(in), std::istream_iterator<int64_t>()};
  EXPECT_EQ(read, (Shape{4, 5, 6}));
  EXPECT_EQ(Shape(size_t{0}).size(), 0u);
}

TEST(Shape, PushBackGrowsAcrossTheInlineBoundary) {
  Shape s;
  std::vector<int64_t> want;
  for (int64_t i = 0; i < 3 * static_cast<int64_t>(kInline) + 1; ++i) {
    s.push_back(i * 10);
    want.push_back(i * 10);
    ASSERT_EQ(s.vec(), want) << "after " << i + 1 << " push_backs";
    EXPECT_EQ(s.is_inline(), want.size() <= kInline);
    EXPECT_GE(s.capacity(), s.size());
  }
  EXPECT_EQ(s.front(), 0);
  EXPECT_EQ(s.back(), 180);
  s.pop_back();
  EXPECT_EQ(s.back(), 170);
  EXPECT_EQ(s.emplace_back(42), 42);
  EXPECT_EQ(s.back(), 42);
}

TEST(Shape, PushBackOfItsOwnElementWhileGrowing) {
  Shape s = iota(kInline);
  s.push_back(s[0]);  // the reference dies with the inline buffer; the value must not
  EXPECT_EQ(s.back(), 1);
  Shape h = iota(2 * kInline);
  h.resize(h.capacity());
  h.push_back(h[1]);
  EXPECT_EQ(h.back(), 2);
  Shape r = iota(kInline);
  r.resize(3 * kInline, r[2]);
  EXPECT_EQ(r.back(), 3);
}

TEST(Shape, ResizeAssignReserveClear) {
  Shape s{1, 2};
  s.resize(kInline + 2);
  EXPECT_EQ(s.size(), kInline + 2);
  EXPECT_EQ(s[0], 1);
  EXPECT_EQ(s[kInline + 1], 0);
  s.resize(1);
  EXPECT_EQ(s.vec(), std::vector<int64_t>{1});
  s.resize(3, 9);
  EXPECT_EQ(s.vec(), (std::vector<int64_t>{1, 9, 9}));
  s.assign(kInline + 1, 5);
  EXPECT_EQ(s.vec(), std::vector<int64_t>(kInline + 1, 5));
  s.assign({3, 4});
  EXPECT_EQ(s.vec(), (std::vector<int64_t>{3, 4}));
  const std::vector<int64_t> big = iota_vec(20);
  s.assign(big.begin(), big.end());
  EXPECT_EQ(s.vec(), big);
  s = {8};
  EXPECT_EQ(s.vec(), std::vector<int64_t>{8});
  Shape r;
  r.reserve(100);
  EXPECT_GE(r.capacity(), 100u);
  EXPECT_TRUE(r.empty());
  r.clear();
  EXPECT_TRUE(r.empty());
}

TEST(Shape, AtChecksBounds) {
  Shape s{1, 2, 3};
  EXPECT_EQ(s.at(2), 3);
  EXPECT_THROW(s.at(3), std::out_of_range);
  const Shape& c = s;
  EXPECT_THROW(c.at(10), std::out_of_range);
}

TEST(Shape, IteratorsAndReverseIterators) {
  const Shape s = iota(kInline + 3);
  EXPECT_EQ(s.end() - s.begin(), static_cast<std::ptrdiff_t>(s.size()));
  EXPECT_EQ(s.data(), &s[0]);
  const std::vector<int64_t> reversed(s.rbegin(), s.rend());
  std::vector<int64_t> want = s.vec();
  std::reverse(want.begin(), want.end());
  EXPECT_EQ(reversed, want);
  int64_t sum = 0;
  for (int64_t d : s) sum += d;
  EXPECT_EQ(sum, static_cast<int64_t>((kInline + 3) * (kInline + 4) / 2));
}

// insert and erase at the front, the middle and the end, inline and on the heap, against std::vector.
TEST(Shape, InsertAndEraseMatchStdVector) {
  for (size_t n : {size_t{0}, size_t{1}, kInline - 1, kInline, kInline + 1, 3 * kInline}) {
    for (size_t at = 0; at <= n; ++at) {
      SCOPED_TRACE("size " + std::to_string(n) + " position " + std::to_string(at));
      Shape s = iota(n);
      std::vector<int64_t> v = iota_vec(n);
      EXPECT_EQ(*s.insert(s.begin() + at, -1), -1);
      v.insert(v.begin() + at, -1);
      EXPECT_EQ(s.vec(), v);
      const std::vector<int64_t> more{-2, -3, -4};
      s.insert(s.begin() + at, more.begin(), more.end());
      v.insert(v.begin() + at, more.begin(), more.end());
      EXPECT_EQ(s.vec(), v);
      s.insert(s.begin() + at, {-5, -6});
      v.insert(v.begin() + at, {-5, -6});
      EXPECT_EQ(s.vec(), v);
      s.insert(s.begin() + at, 2, -7);
      v.insert(v.begin() + at, 2, -7);
      EXPECT_EQ(s.vec(), v);
      EXPECT_EQ(s.erase(s.begin() + at) - s.begin(), static_cast<std::ptrdiff_t>(at));
      v.erase(v.begin() + at);
      EXPECT_EQ(s.vec(), v);
      s.erase(s.begin() + at, s.begin() + at + 3);
      v.erase(v.begin() + at, v.begin() + at + 3);
      EXPECT_EQ(s.vec(), v);
      s.erase(s.begin(), s.begin());  // empty range
      EXPECT_EQ(s.vec(), v);
    }
  }
}

TEST(Shape, InsertOfItsOwnRange) {
  for (size_t n : {size_t{3}, kInline, 2 * kInline}) {
    Shape s = iota(n);
    std::vector<int64_t> v = iota_vec(n);
    s.insert(s.begin() + 1, s.begin(), s.end());
    const std::vector<int64_t> copy = v;
    v.insert(v.begin() + 1, copy.begin(), copy.end());
    EXPECT_EQ(s.vec(), v);
    s.insert(s.begin(), s[2]);
    v.insert(v.begin(), v[2]);
    EXPECT_EQ(s.vec(), v);
  }
}

// Copy and move between every pair of inline and heap sizes; moved-from vectors are empty and usable.
TEST(Shape, CopyAndMoveBetweenInlineAndHeap) {
  for (size_t from : {size_t{0}, size_t{2}, kInline, kInline + 1, 4 * kInline}) {
    for (size_t to : {size_t{0}, size_t{3}, kInline, kInline + 2, 5 * kInline}) {
      SCOPED_TRACE(std::to_string(from) + " -> " + std::to_string(to));
      const Shape src = iota(from);
      Shape copy_assigned = iota(to);
      copy_assigned = src;
      EXPECT_EQ(copy_assigned, src);
      const Shape copy_constructed(src);
      EXPECT_EQ(copy_constructed, src);
      EXPECT_NE(copy_constructed.data(), src.data());

      Shape moving = src;
      Shape move_assigned = iota(to);
      move_assigned = std::move(moving);
      EXPECT_EQ(move_assigned, src);
      EXPECT_TRUE(moving.empty());  // NOLINT: a moved-from Shape is empty
      moving.push_back(7);
      EXPECT_EQ(moving.vec(), std::vector<int64_t>{7});

      Shape moving2 = src;
      const Shape move_constructed(std::move(moving2));
      EXPECT_EQ(move_constructed, src);
      EXPECT_TRUE(moving2.empty());  // NOLINT
      EXPECT_TRUE(moving2.is_inline());

      Shape a = iota(from), b = iota(to);
      a.swap(b);
      EXPECT_EQ(a, iota(to));
      EXPECT_EQ(b, iota(from));
    }
  }
}

TEST(Shape, SelfAssignment) {
  for (size_t n : {size_t{2}, 3 * kInline}) {
    Shape s = iota(n);
    Shape& alias = s;
    s = alias;
    EXPECT_EQ(s, iota(n));
    s = std::move(alias);
    EXPECT_EQ(s, iota(n));
  }
}

TEST(Shape, ComparisonIsLexicographic) {
  EXPECT_EQ((Shape{1, 2}), (Shape{1, 2}));
  EXPECT_NE((Shape{1, 2}), (Shape{1, 2, 3}));
  EXPECT_NE((Shape{1, 2}), (Shape{1, 3}));
  EXPECT_LT((Shape{1, 2}), (Shape{1, 2, 3}));
  EXPECT_LT((Shape{1, 2, 9}), (Shape{1, 3}));
  EXPECT_LT(Shape{}, Shape{0});
  EXPECT_GT((Shape{2}), (Shape{1, 9}));
  EXPECT_EQ(iota(3 * kInline), Shape(iota_vec(3 * kInline)));  // inline-vs-heap storage does not matter
  // A std::vector converts for comparison, either side.
  const std::vector<int64_t> v{4, 5};
  EXPECT_TRUE((Shape{4, 5}) == v);
  EXPECT_TRUE(v == (Shape{4, 5}));
  EXPECT_TRUE(v != (Shape{4}));
}

TEST(Shape, HelpersTakeShapes) {
  EXPECT_EQ(str(Shape{2, 10, 64}), "(2, 10, 64)");
  EXPECT_EQ(str(Shape{3}), "(3,)");
  EXPECT_EQ(str(Shape{}), "()");
  EXPECT_EQ(str(iota(8)), "(1, 2, 3, 4, 5, 6, 7, 8)");
  EXPECT_EQ(shape_numel(iota(8)), 40320);
  EXPECT_EQ(contiguous_strides(Shape{2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(contiguous_strides(Shape(8, 2)), (Shape{128, 64, 32, 16, 8, 4, 2, 1}));
  EXPECT_EQ(broadcast_shapes(Shape{3, 1, 5}, Shape{4, 1}, "t"), (Shape{3, 4, 5}));
}

// The point of inline dims: views, reshapes and shape arithmetic of tensors up to rank 6 touch no heap.
TEST(Shape, ViewsUpToTheInlineRankAllocateNothing) {
  const Tensor x = Tensor::zeros({2, 3, 4, 5});
  Tensor sink;
  const int64_t n = allocations([&] {
    Tensor t = x.view({6, 20});
    t = t.reshape({2, 3, 20});
    t = t.permute({2, 0, 1});
    t = t.transpose(0, 1);
    t = t.unsqueeze(0).unsqueeze(-1);
    t = t.slice(1, 0, 1).select(0, 0);
    t = t.expand({4, 2, 20, 3, 1});
    t = t.squeeze(-1);
    const Shape strides = contiguous_strides(t.shape());
    const Shape b = broadcast_shapes(t.shape(), Shape{3}, "t");
    sink = t;
    (void)strides;
    (void)b;
  });
  EXPECT_EQ(n, 0);
  EXPECT_EQ(sink.shape(), (Shape{4, 2, 20, 3}));
  // Beyond the inline rank the dims go to the heap, and still work.
  const Tensor big = Tensor::zeros(Shape(8, 1));
  EXPECT_GT(allocations([&] { sink = big.unsqueeze(0); }), 0);
  EXPECT_EQ(sink.shape(), Shape(9, 1));
  EXPECT_EQ(sink.strides(), Shape(9, 1));
}

}  // namespace
}  // namespace qkv
