// nn::KvCache's ragged rows over one shared pool: each row appends after its own length, rows join (add_row,
// take_rows from a cache on the same pool) and leave (reorder) at any step, retained pages outlive their rows, and
// every position stays where a contiguous cache of that row alone holds it.
#include "qkv/nn/kv_cache.h"

#include <gtest/gtest.h>

#include <omp.h>

#include <vector>

#include "qkv/core/rng.h"
#include "qkv/ops/attention_varlen.h"

namespace qkv {
namespace {

using nn::KvCache;

constexpr int64_t kHeads = 2, kDim = 3;

Tensor random_kv(int64_t rows, int64_t t, uint64_t seed) {
  Rng rng(seed);
  return rng.normal({rows, kHeads, t, kDim});
}

// Row r of a paged cache, positions [0, length), read through the block table: (H, length, D).
Tensor read_row(const KvCache& c, const Tensor& pool, int64_t r) {
  const int64_t len = c.row_length(r), page = c.page_size();
  Tensor out = Tensor::empty({kHeads, len, kDim});
  for (int64_t pos = 0; pos < len; ++pos) {
    const int32_t blk = c.block_table()[static_cast<size_t>(r * c.max_pages() + pos / page)];
    for (int64_t h = 0; h < kHeads; ++h)
      out.select(0, h).select(0, pos).copy_from(pool.select(0, blk).select(0, pos % page).select(0, h));
  }
  return out;
}

void expect_row(const KvCache& c, int64_t r, const KvCache& alone) {
  ASSERT_EQ(c.row_length(r), alone.length());
  EXPECT_EQ(read_row(c, c.key_pages(), r).to_vector(), alone.keys().select(0, 0).contiguous().to_vector());
  EXPECT_EQ(read_row(c, c.value_pages(), r).to_vector(), alone.values().select(0, 0).contiguous().to_vector());
}

TEST(KvCacheRagged, RowsOfTheirOwnLengthsJoinAppendAndLeave) {
  for (int64_t page : {1, 2, 5}) {
    SCOPED_TRACE("page " + std::to_string(page));
    KvCache batch, fresh;
    batch.reset(0, kHeads, kDim, 4, page);
    std::vector<KvCache> alone(3);
    // Three prompts of 3, 7 and 1 positions prefilled one at a time in a cache on the batch's pool, then moved in.
    const int64_t lengths[] = {3, 7, 1};
    for (int64_t i = 0; i < 3; ++i) {
      fresh.reset_shared(batch);
      fresh.add_row({}, 0);
      const Tensor k = random_kv(1, lengths[i], 10 + static_cast<uint64_t>(i));
      const Tensor v = random_kv(1, lengths[i], 20 + static_cast<uint64_t>(i));
      fresh.append(k, v);
      alone[static_cast<size_t>(i)].reset(1, kHeads, kDim, 4, 0);
      alone[static_cast<size_t>(i)].append(k, v);
      batch.take_rows(fresh);
      EXPECT_EQ(fresh.rows(), 0);
    }
    ASSERT_EQ(batch.rows(), 3);
    EXPECT_TRUE(batch.ragged());
    EXPECT_EQ(batch.length(), 7);
    // Decode steps: one position a row, each after its own length.
    for (int64_t step = 0; step < 4; ++step) {
      const Tensor k = random_kv(batch.rows(), 1, 30 + static_cast<uint64_t>(step));
      const Tensor v = random_kv(batch.rows(), 1, 40 + static_cast<uint64_t>(step));
      batch.append(k, v);
      for (int64_t r = 0; r < batch.rows(); ++r) alone[static_cast<size_t>(r)].append(k.slice(0, r, r + 1), v.slice(0, r, r + 1));
      for (int64_t r = 0; r < batch.rows(); ++r) expect_row(batch, r, alone[static_cast<size_t>(r)]);
      if (step == 1) {  // the middle row leaves; its pages go back to the pool
        const int64_t before = batch.pages_in_use();
        batch.reorder({0, 2});
        alone.erase(alone.begin() + 1);
        EXPECT_LT(batch.pages_in_use(), before);
        for (int64_t r = 0; r < batch.rows(); ++r) expect_row(batch, r, alone[static_cast<size_t>(r)]);
      }
    }
    EXPECT_THROW(batch.keys(), std::invalid_argument);  // ragged: read through the block table
    batch.reorder({});
    EXPECT_EQ(batch.pages_in_use(), 0);
  }
}

TEST(KvCacheRagged, RetainedPagesOutliveTheirRowAndSeedANewRow) {
  const int64_t page = 2;
  KvCache batch;
  batch.reset(1, kHeads, kDim, 4, page);
  const Tensor k = random_kv(1, 5, 1), v = random_kv(1, 5, 2);
  batch.append(k, v);
  KvCache alone;
  alone.reset(1, kHeads, kDim, 4, 0);
  alone.append(k.slice(2, 0, 4), v.slice(2, 0, 4));
  // A prefix cache keeps the two whole pages; the row leaves.
  std::vector<int32_t> prefix = batch.row_pages(0);
  ASSERT_EQ(prefix.size(), 3u);
  prefix.resize(2);
  batch.retain_pages(prefix);
  batch.reorder({});
  EXPECT_EQ(batch.pages_in_use(), 2);
  // A new row starts from them (shared, not copied) and appends after position 4.
  EXPECT_EQ(batch.add_row(prefix, 4), 0);
  expect_row(batch, 0, alone);
  const Tensor k2 = random_kv(1, 3, 3), v2 = random_kv(1, 3, 4);
  batch.append(k2, v2);
  alone.append(k2, v2);
  expect_row(batch, 0, alone);
  EXPECT_EQ(batch.row_pages(0)[0], prefix[0]);
  EXPECT_EQ(batch.pages_in_use(), 4);
  batch.release_pages(prefix);
  EXPECT_EQ(batch.pages_in_use(), 4);  // the row still holds them
  batch.reorder({});
  EXPECT_EQ(batch.pages_in_use(), 0);
}

TEST(KvCacheRagged, AppendIntoASharedPartlyFilledPageCopiesIt) {
  KvCache batch;
  batch.reset(1, kHeads, kDim, 4, 4);
  batch.append(random_kv(1, 3, 5), random_kv(1, 3, 6));
  const std::vector<int32_t> pages = batch.row_pages(0);
  batch.add_row(pages, 3);  // a second row on the same partly filled page
  const Tensor before = read_row(batch, batch.key_pages(), 0);
  const Tensor k = random_kv(2, 1, 7), v = random_kv(2, 1, 8);
  batch.append(k, v);
  EXPECT_NE(batch.row_pages(0)[0], batch.row_pages(1)[0]);
  EXPECT_EQ(read_row(batch, batch.key_pages(), 0).slice(1, 0, 3).contiguous().to_vector(),
            before.to_vector());
  EXPECT_EQ(read_row(batch, batch.key_pages(), 1).slice(1, 0, 3).contiguous().to_vector(),
            before.to_vector());
}

TEST(KvCacheRagged, ThePoolGrowsPastItsReserveAndKeepsPages) {
  KvCache batch;
  batch.reset(0, kHeads, kDim, 1, 1);
  batch.reserve_pages(3);
  EXPECT_EQ(batch.pool_pages(), 3);
  batch.add_row({}, 0);
  KvCache alone;
  alone.reset(1, kHeads, kDim, 1, 0);
  for (uint64_t i = 0; i < 9; ++i) {
    const Tensor k = random_kv(1, 1, 50 + i), v = random_kv(1, 1, 60 + i);
    batch.append(k, v);
    alone.append(k, v);
  }
  EXPECT_GE(batch.pool_pages(), 9);
  expect_row(batch, 0, alone);
}

TEST(KvCacheRagged, MisuseIsRefused) {
  KvCache flat, a, b;
  flat.reset(1, kHeads, kDim, 4, 0);
  a.reset(0, kHeads, kDim, 4, 2);
  b.reset(0, kHeads, kDim, 4, 2);
  EXPECT_THROW(flat.add_row({}, 0), std::invalid_argument);
  EXPECT_THROW(flat.reset_shared(flat), std::invalid_argument);
  EXPECT_THROW(b.reset_shared(flat), std::invalid_argument);
  EXPECT_THROW(a.take_rows(b), std::invalid_argument);  // another pool
  EXPECT_THROW(a.add_row({}, 3), std::invalid_argument);  // 0 pages for 3 positions
  const std::vector<int32_t> unheld = {0};
  EXPECT_THROW(a.add_row(unheld, 2), std::invalid_argument);  // a free page
  EXPECT_THROW(a.retain_pages(unheld), std::invalid_argument);
  EXPECT_THROW(a.release_pages(unheld), std::invalid_argument);
  EXPECT_THROW(a.row_length(0), std::invalid_argument);
  EXPECT_THROW(a.reset_shared(b, -1), std::invalid_argument);
}

// The decoding attention over ragged rows of one pool gives each row the bits it gets alone, on 1 and on 2 threads
// (its keys are never split across threads): continuous batching's invariance at the attention.
TEST(KvCacheRagged, AttentionOfARowIsTheSameBitsAloneBatchedAndAtAnyThreadCount) {
  // 3 kv heads: a count of units (heads x query tiles) that 2 threads do not divide, where a forward splits keys.
  const int64_t n = 8, page = 16, hkv = 3, hq = 6, d = 16;
  Rng rng(3);
  KvCache batch, fresh;
  batch.reset(0, hkv, d, page, page);
  std::vector<KvCache> alone(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = 20 + 37 * i;  // 20 .. 279 keys: one to many key tiles
    const Tensor k = rng.normal({1, hkv, len, d}), v = rng.normal({1, hkv, len, d});
    fresh.reset_shared(batch);
    fresh.add_row({}, 0);
    fresh.append(k, v);
    batch.take_rows(fresh);
    alone[static_cast<size_t>(i)].reset(1, hkv, d, 16, page);
    alone[static_cast<size_t>(i)].append(k, v);
  }
  const Tensor q = rng.normal({n, 1, hq, d});
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  std::vector<int32_t> lens;
  for (int64_t i = 0; i < n; ++i) lens.push_back(static_cast<int32_t>(batch.row_length(i)));
  const int saved = omp_get_max_threads();
  std::vector<float> first;
  for (int threads : {2, 1}) {
    omp_set_num_threads(threads);
    Tensor kp = batch.key_pages(), vp = batch.value_pages();
    const Tensor all = attention_with_kvcache(q, kp, vp, Tensor(), Tensor(), lens, batch.block_table(),
                                              batch.max_pages(), o).out.contiguous();
    if (first.empty()) first = all.to_vector();
    EXPECT_EQ(all.to_vector(), first) << threads << " threads";
    for (int64_t i = 0; i < n; ++i) {
      KvCache& a = alone[static_cast<size_t>(i)];
      Tensor ka = a.key_pages(), va = a.value_pages();
      const std::vector<int32_t> one{static_cast<int32_t>(a.length())};
      const Tensor row = attention_with_kvcache(q.slice(0, i, i + 1), ka, va, Tensor(), Tensor(), one,
                                                a.block_table(), a.max_pages(), o).out;
      EXPECT_EQ(row.contiguous().to_vector(), all.slice(0, i, i + 1).contiguous().to_vector())
          << "row " << i << " of " << lens[static_cast<size_t>(i)] << " keys, " << threads << " threads";
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace qkv
