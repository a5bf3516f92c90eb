// KvCache storage: amortised-doubling capacity along the time axis, row gathers for beam search.
#include "qkv/nn/kv_cache.h"

#include <algorithm>

#include "qkv/core/error.h"

namespace qkv::nn {

Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& rows, int64_t axis) {
  QKV_CHECK_ARG(x.defined() && x.dim() >= 1, "[gather_rows] needs a tensor of rank >= 1");
  const int64_t ax = axis < 0 ? axis + x.dim() : axis;
  QKV_CHECK_ARG(ax >= 0 && ax < x.dim(), "[gather_rows] axis ", axis, " is outside a tensor ", str(x.shape()));
  Shape shape = x.shape();
  shape[static_cast<size_t>(ax)] = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::empty(shape);
  for (size_t i = 0; i < rows.size(); ++i) {
    QKV_CHECK_ARG(rows[i] >= 0 && rows[i] < x.size(ax), "[gather_rows] row ", rows[i], " is outside [0, ",
                  x.size(ax), ") of ", str(x.shape()));
    out.select(ax, static_cast<int64_t>(i)).copy_from(x.select(ax, rows[i]));
  }
  return out;
}

bool is_identity(const std::vector<int64_t>& rows, int64_t n) {
  if (static_cast<int64_t>(rows.size()) != n) return false;
  for (int64_t i = 0; i < n; ++i)
    if (rows[static_cast<size_t>(i)] != i) return false;
  return true;
}

void KvCache::reset(int64_t rows, int64_t heads, int64_t head_dim, int64_t capacity, int64_t page_size) {
  QKV_CHECK_ARG(rows >= 0 && heads >= 1 && head_dim >= 1 && capacity >= 1 && page_size >= 0, "[KvCache] reset(rows ",
                rows, ", heads ", heads, ", head_dim ", head_dim, ", capacity ", capacity, ", page_size ", page_size,
                ") needs rows >= 0, page_size >= 0 and the rest >= 1");
  rows_ = rows;
  heads_ = heads;
  dim_ = head_dim;
  len_ = 0;
  page_ = page_size;
  if (page_ == 0) {
    table_.clear();
    refs_.clear();
    free_.clear();
    max_pages_ = 0;
    k_ = Tensor::empty({rows, heads, capacity, head_dim});
    v_ = Tensor::empty({rows, heads, capacity, head_dim});
    return;
  }
  // Unused table entries hold page 0, a valid index (the attention reads only each row's first pages).
  max_pages_ = (capacity + page_ - 1) / page_;
  table_.assign(static_cast<size_t>(rows * max_pages_), 0);
  const int64_t pool = std::max<int64_t>(1, rows * max_pages_);
  k_ = Tensor::empty({pool, page_, heads, head_dim});
  v_ = Tensor::empty({pool, page_, heads, head_dim});
  refs_.assign(static_cast<size_t>(pool), 0);
  free_.clear();
  for (int64_t p = pool; p-- > 0;) free_.push_back(static_cast<int32_t>(p));  // page 0 is taken first
}

// A free pool page with one reference; the pool doubles when none is free (pages keep their indices).
int32_t KvCache::take_page() {
  if (free_.empty()) {
    const int64_t old = k_.size(0), pool = 2 * old;
    Tensor k = Tensor::empty({pool, page_, heads_, dim_});
    Tensor v = Tensor::empty({pool, page_, heads_, dim_});
    k.slice(0, 0, old).copy_from(k_);
    v.slice(0, 0, old).copy_from(v_);
    k_ = k;
    v_ = v;
    refs_.resize(static_cast<size_t>(pool), 0);
    for (int64_t p = pool; p-- > old;) free_.push_back(static_cast<int32_t>(p));
  }
  const int32_t p = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(p)] = 1;
  return p;
}

void KvCache::release_page(int32_t page) {
  QKV_ASSERT(refs_[static_cast<size_t>(page)] > 0);
  if (--refs_[static_cast<size_t>(page)] == 0) free_.push_back(page);
}

void KvCache::grow(int64_t need) {
  const int64_t cap = k_.size(2);
  if (need <= cap) return;
  const int64_t new_cap = std::max(need, 2 * cap);
  Tensor k = Tensor::empty({rows_, heads_, new_cap, dim_});
  Tensor v = Tensor::empty({rows_, heads_, new_cap, dim_});
  if (len_ > 0) {
    k.slice(2, 0, len_).copy_from(keys());
    v.slice(2, 0, len_).copy_from(values());
  }
  k_ = k;
  v_ = v;
}

// Pages for positions [len_, need) of every row, taken from the pool in the order rows reach them (so rows'
// pages interleave); the table widens and the pool doubles (pages keep their indices) as needed. A row's last,
// partly filled page that other rows share is first copied into a page of its own (copy on write).
void KvCache::grow_pages(int64_t need) {
  const int64_t have = (len_ + page_ - 1) / page_, want = (need + page_ - 1) / page_;
  if (need > len_ && len_ % page_ != 0)
    for (int64_t r = 0; r < rows_; ++r) {
      int32_t& e = table_[static_cast<size_t>(r * max_pages_ + have - 1)];
      if (refs_[static_cast<size_t>(e)] == 1) continue;
      const int32_t own = take_page();  // may grow the pool: read k_ / v_ after it
      k_.select(0, own).copy_from(k_.select(0, e));
      v_.select(0, own).copy_from(v_.select(0, e));
      release_page(e);
      e = own;
    }
  if (want <= have) return;
  if (want > max_pages_) {
    const int64_t wider = std::max(want, 2 * max_pages_);
    std::vector<int32_t> t(static_cast<size_t>(rows_ * wider), 0);
    for (int64_t r = 0; r < rows_; ++r)
      std::copy(table_.begin() + r * max_pages_, table_.begin() + r * max_pages_ + have, t.begin() + r * wider);
    table_ = std::move(t);
    max_pages_ = wider;
  }
  for (int64_t i = have; i < want; ++i)
    for (int64_t r = 0; r < rows_; ++r) table_[static_cast<size_t>(r * max_pages_ + i)] = take_page();
}

void KvCache::append(const Tensor& k, const Tensor& v) {
  QKV_CHECK_ARG(k_.defined(), "[KvCache] append before reset");
  QKV_CHECK_ARG(k.defined() && v.defined() && k.dim() == 4 && k.shape() == v.shape() && k.size(0) == rows_ &&
                    k.size(1) == heads_ && k.size(3) == dim_,
                "[KvCache] append k ", k.defined() ? str(k.shape()) : "()", " and v ",
                v.defined() ? str(v.shape()) : "()", " must both be (N, H, Tn, D) = ",
                str(Shape{rows_, heads_, -1, dim_}).c_str());
  const int64_t tn = k.size(2);
  if (!paged()) {
    grow(len_ + tn);
    k_.slice(2, len_, len_ + tn).copy_from(k);
    v_.slice(2, len_, len_ + tn).copy_from(v);
    len_ += tn;
    return;
  }
  grow_pages(len_ + tn);
  const Tensor kc = k.contiguous(), vc = v.contiguous();
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t t = 0; t < tn; ++t) {
      const int64_t pos = len_ + t;
      const int64_t slot = table_[static_cast<size_t>(r * max_pages_ + pos / page_)] * page_ + pos % page_;
      for (int64_t h = 0; h < heads_; ++h) {
        const int64_t src = ((r * heads_ + h) * tn + t) * dim_, dst = (slot * heads_ + h) * dim_;
        std::copy(kc.data() + src, kc.data() + src + dim_, k_.data() + dst);
        std::copy(vc.data() + src, vc.data() + src + dim_, v_.data() + dst);
      }
    }
  len_ += tn;
}

void KvCache::reorder(const std::vector<int64_t>& rows) {
  QKV_CHECK_ARG(k_.defined(), "[KvCache] reorder before reset");
  if (is_identity(rows, rows_)) return;
  for (int64_t r : rows)
    QKV_CHECK_ARG(r >= 0 && r < rows_, "[KvCache] reorder row ", r, " is outside [0, ", rows_, ")");
  const auto n = static_cast<int64_t>(rows.size());
  if (paged()) {  // each new row shares its source row's pages; the old rows' references go
    const int64_t have = (len_ + page_ - 1) / page_;
    std::vector<int32_t> t(static_cast<size_t>(n * max_pages_), 0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t p = 0; p < have; ++p) {
        const int32_t src = table_[static_cast<size_t>(rows[static_cast<size_t>(i)] * max_pages_ + p)];
        ++refs_[static_cast<size_t>(src)];
        t[static_cast<size_t>(i * max_pages_ + p)] = src;
      }
    for (int64_t r = 0; r < rows_; ++r)
      for (int64_t p = 0; p < have; ++p) release_page(table_[static_cast<size_t>(r * max_pages_ + p)]);
    table_ = std::move(t);
    rows_ = n;
    return;
  }
  const int64_t cap = std::max<int64_t>(k_.size(2), 1);
  Tensor k = Tensor::empty({n, heads_, cap, dim_});
  Tensor v = Tensor::empty({n, heads_, cap, dim_});
  for (size_t i = 0; i < rows.size(); ++i) {
    if (len_ == 0) continue;
    k.select(0, static_cast<int64_t>(i)).slice(1, 0, len_).copy_from(keys().select(0, rows[i]));
    v.select(0, static_cast<int64_t>(i)).slice(1, 0, len_).copy_from(values().select(0, rows[i]));
  }
  k_ = k;
  v_ = v;
  rows_ = n;
}

// (N, H, length, D) copied out of the pages of `pool`.
Tensor KvCache::gather(const Tensor& pool) const {
  Tensor out = Tensor::empty({rows_, heads_, len_, dim_});
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t pos = 0; pos < len_; ++pos) {
      const int64_t slot = table_[static_cast<size_t>(r * max_pages_ + pos / page_)] * page_ + pos % page_;
      for (int64_t h = 0; h < heads_; ++h)
        std::copy(pool.data() + (slot * heads_ + h) * dim_, pool.data() + (slot * heads_ + h + 1) * dim_,
                  out.data() + ((r * heads_ + h) * len_ + pos) * dim_);
    }
  return out;
}

Tensor KvCache::keys() const {
  QKV_CHECK_ARG(k_.defined(), "[KvCache] keys before reset");
  return paged() ? gather(k_) : k_.slice(2, 0, len_);
}

Tensor KvCache::values() const {
  QKV_CHECK_ARG(v_.defined(), "[KvCache] values before reset");
  return paged() ? gather(v_) : v_.slice(2, 0, len_);
}

}  // namespace qkv::nn
