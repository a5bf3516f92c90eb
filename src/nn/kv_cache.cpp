// KvCache storage: amortised-doubling capacity along the time axis, row gathers for beam search, and paged rows of
// their own lengths over one shared pool of pages.
#include "qkv/nn/kv_cache.h"

#include <algorithm>
#include <memory>

#include "qkv/core/error.h"
#include "qkv/ops/lowp.h"

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

void KvCache::reset(int64_t rows, int64_t heads, int64_t head_dim, int64_t capacity, int64_t page_size,
                    Precision storage) {
  QKV_CHECK_ARG(rows >= 0 && heads >= 1 && head_dim >= 1 && capacity >= 1 && page_size >= 0, "[KvCache] reset(rows ",
                rows, ", heads ", heads, ", head_dim ", head_dim, ", capacity ", capacity, ", page_size ", page_size,
                ") needs rows >= 0, page_size >= 0 and the rest >= 1");
  QKV_CHECK_ARG(storage == Precision::kFloat32 || storage == Precision::kBFloat16, "[KvCache] storage ",
                precision_name(storage), " is not one of fp32, bf16");
  QKV_CHECK_ARG(storage != Precision::kBFloat16 || head_dim % 2 == 0, "[KvCache] bf16 storage pairs the elements of ",
                "a head: head_dim ", head_dim, " must be even");
  rows_ = rows;
  heads_ = heads;
  dim_ = head_dim;
  storage_ = storage;
  cols_ = storage == Precision::kBFloat16 ? head_dim / 2 : head_dim;
  len_ = 0;
  page_ = page_size;
  table_.clear();
  lens_.clear();
  if (page_ == 0) {
    pool_.reset();
    max_pages_ = 0;
    k_ = Tensor::empty({rows, heads, capacity, cols_});
    v_ = Tensor::empty({rows, heads, capacity, cols_});
    return;
  }
  k_ = Tensor();
  v_ = Tensor();
  // Unused table entries hold page 0, a valid index (the attention reads only each row's first pages).
  max_pages_ = (capacity + page_ - 1) / page_;
  table_.assign(static_cast<size_t>(rows * max_pages_), 0);
  lens_.assign(static_cast<size_t>(rows), 0);
  pool_ = std::make_shared<Pool>();
  reserve_pages(std::max<int64_t>(1, rows * max_pages_));
}

void KvCache::check_paged(const char* what) const {
  QKV_CHECK_ARG(pool_ != nullptr, "[KvCache] ", what, " needs a paged cache (reset with page_size > 0)");
}

void KvCache::reset_shared(const KvCache& other, int64_t rows) {
  other.check_paged("reset_shared");
  QKV_CHECK_ARG(rows >= 0, "[KvCache] reset_shared with rows ", rows, " < 0");
  if (pool_ != nullptr && this != &other) reorder({});  // this cache's references go back to its pool
  const std::shared_ptr<Pool> pool = other.pool_;
  rows_ = rows;
  heads_ = other.heads_;
  dim_ = other.dim_;
  storage_ = other.storage_;
  cols_ = other.cols_;
  len_ = 0;
  page_ = other.page_;
  max_pages_ = std::max<int64_t>(1, other.max_pages_);
  table_.assign(static_cast<size_t>(rows * max_pages_), 0);
  lens_.assign(static_cast<size_t>(rows), 0);
  pool_ = pool;
  k_ = Tensor();
  v_ = Tensor();
}

int64_t KvCache::row_length(int64_t row) const {
  QKV_CHECK_ARG(row >= 0 && row < rows_, "[KvCache] row ", row, " is outside [0, ", rows_, ")");
  return paged() ? lens_[static_cast<size_t>(row)] : len_;
}

bool KvCache::ragged() const {
  return std::any_of(lens_.begin(), lens_.end(), [&](int64_t l) { return l != len_; });
}

int64_t KvCache::pages_in_use() const {
  return pool_ ? static_cast<int64_t>(pool_->refs.size() - pool_->free.size()) : 0;
}

int64_t KvCache::pool_pages() const { return pool_ ? static_cast<int64_t>(pool_->refs.size()) : 0; }

// The pool grows to `pages` pages (they keep their indices; the new ones are free, the lowest taken first).
void KvCache::reserve_pages(int64_t pages) {
  check_paged("reserve_pages");
  Pool& p = *pool_;
  const int64_t old = static_cast<int64_t>(p.refs.size());
  if (pages <= old) return;
  Tensor k = Tensor::empty({pages, page_, heads_, cols_});
  Tensor v = Tensor::empty({pages, page_, heads_, cols_});
  if (old > 0) {
    k.slice(0, 0, old).copy_from(p.k);
    v.slice(0, 0, old).copy_from(p.v);
  }
  p.k = k;
  p.v = v;
  p.refs.resize(static_cast<size_t>(pages), 0);
  std::vector<int32_t> fresh;
  for (int64_t q = pages; q-- > old;) fresh.push_back(static_cast<int32_t>(q));
  p.free.insert(p.free.begin(), fresh.begin(), fresh.end());  // pages freed earlier are still taken first
}

// A free pool page with one reference; the pool doubles when none is free (pages keep their indices).
int32_t KvCache::take_page() {
  if (pool_->free.empty()) reserve_pages(2 * static_cast<int64_t>(pool_->refs.size()));
  const int32_t p = pool_->free.back();
  pool_->free.pop_back();
  pool_->refs[static_cast<size_t>(p)] = 1;
  return p;
}

void KvCache::release_page(int32_t page) {
  QKV_ASSERT(page >= 0 && static_cast<size_t>(page) < pool_->refs.size() && pool_->refs[static_cast<size_t>(page)] > 0);
  if (--pool_->refs[static_cast<size_t>(page)] == 0) pool_->free.push_back(page);
}

void KvCache::retain_pages(std::span<const int32_t> pages) {
  check_paged("retain_pages");
  for (int32_t p : pages) {
    QKV_CHECK_ARG(p >= 0 && static_cast<size_t>(p) < pool_->refs.size() && pool_->refs[static_cast<size_t>(p)] > 0,
                  "[KvCache] retain_pages: page ", p, " is not a held page of the pool of ", pool_->refs.size());
    ++pool_->refs[static_cast<size_t>(p)];
  }
}

void KvCache::release_pages(std::span<const int32_t> pages) {
  check_paged("release_pages");
  for (int32_t p : pages) {
    QKV_CHECK_ARG(p >= 0 && static_cast<size_t>(p) < pool_->refs.size() && pool_->refs[static_cast<size_t>(p)] > 0,
                  "[KvCache] release_pages: page ", p, " is not a held page of the pool of ", pool_->refs.size());
    release_page(p);
  }
}

void KvCache::grow(int64_t need) {
  const int64_t cap = k_.size(2);
  if (need <= cap) return;
  const int64_t new_cap = std::max(need, 2 * cap);
  Tensor k = Tensor::empty({rows_, heads_, new_cap, cols_});
  Tensor v = Tensor::empty({rows_, heads_, new_cap, cols_});
  if (len_ > 0) {
    k.slice(2, 0, len_).copy_from(stored_keys());
    v.slice(2, 0, len_).copy_from(stored_values());
  }
  k_ = k;
  v_ = v;
}

// The block table holds at least `pages` entries a row (it doubles; rows keep their entries).
void KvCache::widen(int64_t pages) {
  if (pages <= max_pages_) return;
  const int64_t wider = std::max(pages, 2 * max_pages_);
  std::vector<int32_t> t(static_cast<size_t>(rows_ * wider), 0);
  for (int64_t r = 0; r < rows_; ++r)
    std::copy(table_.begin() + r * max_pages_, table_.begin() + (r + 1) * max_pages_, t.begin() + r * wider);
  table_ = std::move(t);
  max_pages_ = wider;
}

// Pages for positions [length(r), length(r) + tn) of every row r, taken from the pool in the order rows reach them
// (so rows' pages interleave); the table widens and the pool doubles (pages keep their indices) as needed. A row's
// last, partly filled page that others share is first copied into a page of its own (copy on write).
void KvCache::grow_pages(int64_t tn) {
  if (tn <= 0) return;
  int64_t want_max = 0;
  for (int64_t r = 0; r < rows_; ++r) {
    const int64_t len = lens_[static_cast<size_t>(r)];
    want_max = std::max(want_max, pages_of(len + tn));
    if (len % page_ == 0) continue;
    int32_t& e = table_[static_cast<size_t>(r * max_pages_ + len / page_)];
    if (pool_->refs[static_cast<size_t>(e)] == 1) continue;
    const int32_t own = take_page();  // may grow the pool: read its tensors after it
    pool_->k.select(0, own).copy_from(pool_->k.select(0, e));
    pool_->v.select(0, own).copy_from(pool_->v.select(0, e));
    release_page(e);
    e = own;
  }
  widen(want_max);
  for (int64_t i = 0; i < want_max; ++i)
    for (int64_t r = 0; r < rows_; ++r) {
      const int64_t len = lens_[static_cast<size_t>(r)];
      if (i >= pages_of(len) && i < pages_of(len + tn)) table_[static_cast<size_t>(r * max_pages_ + i)] = take_page();
    }
}

void KvCache::append(const Tensor& k, const Tensor& v) {
  QKV_CHECK_ARG(ready(), "[KvCache] append before reset");
  QKV_CHECK_ARG(k.defined() && v.defined() && k.dim() == 4 && k.shape() == v.shape() && k.size(0) == rows_ &&
                    k.size(1) == heads_ && k.size(3) == dim_,
                "[KvCache] append k ", k.defined() ? str(k.shape()) : "()", " and v ",
                v.defined() ? str(v.shape()) : "()", " must both be (N, H, Tn, D) = ",
                str(Shape{rows_, heads_, -1, dim_}).c_str());
  const int64_t tn = k.size(2);
  const bool bf16 = storage_ == Precision::kBFloat16;
  // The rows as stored (bf16: pairs of words, contiguous); float32 rows as given: copy_from reads any strides.
  const Tensor ks = bf16 ? to_bf16_pairs(k) : k, vs = bf16 ? to_bf16_pairs(v) : v;
  if (!paged()) {
    grow(len_ + tn);
    k_.slice(2, len_, len_ + tn).copy_from(ks);
    v_.slice(2, len_, len_ + tn).copy_from(vs);
    len_ += tn;
    return;
  }
  grow_pages(tn);
  const Tensor kc = ks.contiguous(), vc = vs.contiguous();  // the pages' rows copied from contiguous ones
  float* kp = pool_->k.data();
  float* vp = pool_->v.data();
  for (int64_t r = 0; r < rows_; ++r) {
    int64_t& len = lens_[static_cast<size_t>(r)];
    for (int64_t t = 0; t < tn; ++t) {
      const int64_t pos = len + t;
      const int64_t slot = table_[static_cast<size_t>(r * max_pages_ + pos / page_)] * page_ + pos % page_;
      for (int64_t h = 0; h < heads_; ++h) {
        const int64_t src = ((r * heads_ + h) * tn + t) * cols_, dst = (slot * heads_ + h) * cols_;
        std::copy(kc.data() + src, kc.data() + src + cols_, kp + dst);
        std::copy(vc.data() + src, vc.data() + src + cols_, vp + dst);
      }
    }
    len += tn;
  }
  len_ = rows_ > 0 ? *std::max_element(lens_.begin(), lens_.end()) : len_ + tn;
}

int64_t KvCache::add_row(std::span<const int32_t> pages, int64_t length) {
  check_paged("add_row");
  QKV_CHECK_ARG(length >= 0 && static_cast<int64_t>(pages.size()) == pages_of(length), "[KvCache] add_row: ",
                pages.size(), " pages for a row of ", length, " positions in pages of ", page_);
  retain_pages(pages);
  widen(std::max<int64_t>(1, pages_of(length)));
  table_.resize(static_cast<size_t>((rows_ + 1) * max_pages_), 0);
  std::copy(pages.begin(), pages.end(), table_.begin() + rows_ * max_pages_);
  lens_.push_back(length);
  len_ = rows_ == 0 ? length : std::max(len_, length);
  return rows_++;
}

void KvCache::take_rows(KvCache& other) {
  check_paged("take_rows");
  QKV_CHECK_ARG(other.storage_ == storage_, "[KvCache] take_rows from a ", precision_name(other.storage_),
                " cache into a ", precision_name(storage_), " one (caches on one pool share its storage)");
  QKV_CHECK_ARG(other.pool_ == pool_, "[KvCache] take_rows from a cache on another pool (make it with reset_shared)");
  if (&other == this) return;
  widen(other.max_pages_);
  table_.resize(static_cast<size_t>((rows_ + other.rows_) * max_pages_), 0);
  for (int64_t r = 0; r < other.rows_; ++r) {
    const int64_t len = other.lens_[static_cast<size_t>(r)];
    const auto src = other.table_.begin() + r * other.max_pages_;
    std::copy(src, src + pages_of(len), table_.begin() + (rows_ + r) * max_pages_);
    lens_.push_back(len);
    len_ = rows_ + r == 0 ? len : std::max(len_, len);
  }
  rows_ += other.rows_;
  other.rows_ = 0;
  other.len_ = 0;
  other.table_.clear();
  other.lens_.clear();
}

std::vector<int32_t> KvCache::row_pages(int64_t row) const {
  check_paged("row_pages");
  const int64_t len = row_length(row);
  const auto src = table_.begin() + row * max_pages_;
  return std::vector<int32_t>(src, src + pages_of(len));
}

void KvCache::reorder(const std::vector<int64_t>& rows) {
  QKV_CHECK_ARG(ready(), "[KvCache] reorder before reset");
  if (is_identity(rows, rows_)) return;
  for (int64_t r : rows)
    QKV_CHECK_ARG(r >= 0 && r < rows_, "[KvCache] reorder row ", r, " is outside [0, ", rows_, ")");
  const auto n = static_cast<int64_t>(rows.size());
  if (paged()) {  // each new row shares its source row's pages; the old rows' references go
    std::vector<int32_t> t(static_cast<size_t>(n * max_pages_), 0);
    std::vector<int64_t> lens(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t src = rows[static_cast<size_t>(i)], len = lens_[static_cast<size_t>(src)];
      lens[static_cast<size_t>(i)] = len;
      for (int64_t p = 0; p < pages_of(len); ++p) {
        const int32_t e = table_[static_cast<size_t>(src * max_pages_ + p)];
        ++pool_->refs[static_cast<size_t>(e)];
        t[static_cast<size_t>(i * max_pages_ + p)] = e;
      }
    }
    for (int64_t r = 0; r < rows_; ++r)
      for (int64_t p = 0; p < pages_of(lens_[static_cast<size_t>(r)]); ++p)
        release_page(table_[static_cast<size_t>(r * max_pages_ + p)]);
    table_ = std::move(t);
    lens_ = std::move(lens);
    rows_ = n;
    len_ = n > 0 ? *std::max_element(lens_.begin(), lens_.end()) : 0;
    return;
  }
  const int64_t cap = std::max<int64_t>(k_.size(2), 1);
  Tensor k = Tensor::empty({n, heads_, cap, cols_});
  Tensor v = Tensor::empty({n, heads_, cap, cols_});
  for (size_t i = 0; i < rows.size(); ++i) {
    if (len_ == 0) continue;
    k.select(0, static_cast<int64_t>(i)).slice(1, 0, len_).copy_from(stored_keys().select(0, rows[i]));
    v.select(0, static_cast<int64_t>(i)).slice(1, 0, len_).copy_from(stored_values().select(0, rows[i]));
  }
  k_ = k;
  v_ = v;
  rows_ = n;
}

// (N, H, length, cols) copied out of the pages of `pool`.
Tensor KvCache::gather(const Tensor& pool) const {
  QKV_CHECK_ARG(!ragged(), "[KvCache] keys / values of ragged rows (read them through block_table)");
  Tensor out = Tensor::empty({rows_, heads_, len_, cols_});
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t pos = 0; pos < len_; ++pos) {
      const int64_t slot = table_[static_cast<size_t>(r * max_pages_ + pos / page_)] * page_ + pos % page_;
      for (int64_t h = 0; h < heads_; ++h)
        std::copy(pool.data() + (slot * heads_ + h) * cols_, pool.data() + (slot * heads_ + h + 1) * cols_,
                  out.data() + ((r * heads_ + h) * len_ + pos) * cols_);
    }
  return out;
}

Tensor KvCache::stored_keys() const { return paged() ? gather(pool_->k) : k_.slice(2, 0, len_); }

Tensor KvCache::stored_values() const { return paged() ? gather(pool_->v) : v_.slice(2, 0, len_); }

Tensor KvCache::keys() const {
  QKV_CHECK_ARG(ready(), "[KvCache] keys before reset");
  return storage_ == Precision::kBFloat16 ? from_bf16_pairs(stored_keys()) : stored_keys();
}

Tensor KvCache::values() const {
  QKV_CHECK_ARG(ready(), "[KvCache] values before reset");
  return storage_ == Precision::kBFloat16 ? from_bf16_pairs(stored_values()) : stored_values();
}

}  // namespace qkv::nn
