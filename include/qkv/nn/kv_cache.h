// KvCache: one attention layer's keys and values for incremental decoding, (N, H, T, D) per row, growing by
// doubling; rows can be reordered (beam forks, finished rows dropped) without recomputation. Paged (page_size > 0):
// the positions live in pages of page_size positions in one pool (num_pages, page_size, H, D), row r's logical
// page i being pool page block_table()[r * max_pages() + i], the layout attention_with_kvcache reads in place.
// A reorder copies no page: rows forked from one row share its pages (reference counts, as vLLM's block tables),
// a shared page is copied only when an append writes into it (copy on write), and pages no row holds any more
// return to the pool for reuse.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "qkv/core/tensor.h"

namespace qkv::nn {

class KvCache {
 public:
  KvCache() = default;
  // Empties the cache for `rows` rows of `heads` x `head_dim`; reserves `capacity` positions (grows as needed).
  // page_size > 0: paged storage, pages taken from the pool as positions arrive (0: one contiguous block a row).
  void reset(int64_t rows, int64_t heads, int64_t head_dim, int64_t capacity = 16, int64_t page_size = 0);
  // k, v: (N, H, Tn, D), any strides  ->  stored at positions [length, length + Tn).
  void append(const Tensor& k, const Tensor& v);
  // Row i of the result is row rows[i] of the current cache (repeats allowed). Every index in [0, this->rows()).
  void reorder(const std::vector<int64_t>& rows);
  Tensor keys() const;    // (N, H, length, D): a view into the cache; a gathered copy when paged
  Tensor values() const;  // (N, H, length, D)
  int64_t length() const { return len_; }
  bool ready() const { return k_.defined(); }  // reset() has been called
  int64_t rows() const { return rows_; }

  // Paged storage (page_size > 0 at reset): the pools (num_pages, page_size, H, D) and the block table (rows x
  // max_pages, int32; entries past a row's length are unused).
  bool paged() const { return page_ > 0; }
  int64_t page_size() const { return page_; }
  const Tensor& key_pages() const { return k_; }
  const Tensor& value_pages() const { return v_; }
  std::span<const int32_t> block_table() const { return table_; }
  int64_t max_pages() const { return max_pages_; }
  // Pool pages held by at least one row (a page shared by forked rows counts once).
  int64_t pages_in_use() const { return static_cast<int64_t>(refs_.size() - free_.size()); }

 private:
  void grow(int64_t need);
  void grow_pages(int64_t need);
  int32_t take_page();
  void release_page(int32_t page);
  Tensor gather(const Tensor& pool) const;
  Tensor k_, v_;  // (N, H, capacity, D); paged: (num_pages, page_size, H, D)
  int64_t rows_ = 0, heads_ = 0, dim_ = 0, len_ = 0;
  int64_t page_ = 0, max_pages_ = 0;
  std::vector<int32_t> table_;
  std::vector<int32_t> refs_;  // per pool page: the table entries (of positions held) that name it
  std::vector<int32_t> free_;  // pool pages with no reference, the next one taken last
};

// Row i of the result is x.select(0, rows[i]) (a copy); x: (R, ...)  ->  (N, ...). Indices in [0, R).
Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& rows, int64_t axis = 0);

// True when rows == {0, 1, ..., n - 1} (nothing to reorder).
bool is_identity(const std::vector<int64_t>& rows, int64_t n);

}  // namespace qkv::nn
