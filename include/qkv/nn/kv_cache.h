// KvCache: one attention layer's keys and values for incremental decoding, (N, H, T, D) per row, growing by
// doubling; rows can be reordered (beam forks, finished rows dropped) without recomputation. Paged (page_size > 0):
// the positions live in pages of page_size positions in one pool (num_pages, page_size, H, D), row r's logical
// page i being pool page block_table()[r * max_pages() + i], the layout attention_with_kvcache reads in place.
// A reorder copies no page: rows forked from one row share its pages (reference counts, as vLLM's block tables),
// a shared page is copied only when an append writes into it (copy on write), and pages no row holds any more
// return to the pool for reuse.
// Ragged rows (paged only): each row has its own length, so sequences at different positions share one pool (a
// server's running batch): rows join (add_row, take_rows from a cache on the same pool) and leave (reorder) at any
// step, and an append writes each row's new positions after its own length. Caches made with reset_shared draw
// their pages from one pool; extra references (retain_pages) keep pages alive after their rows left (a prefix cache).
// Storage precision (reset's `storage`, as llama.cpp's --cache-type-k/v and vLLM's kv_cache_dtype): kFloat32 keeps
// the keys and values as given; kBFloat16 rounds them to bfloat16 (round to nearest even) on append and holds half
// the bytes: the storage tensors (key_pages, value_pages) then hold (..., D/2) float-sized words, each a pair of
// bf16 (qkv::to_bf16_pairs: element 2i in the low half), copied as bits and never computed on; keys() and values()
// widen them to float32, and the fused attention reads them in place (nn::attend).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "qkv/core/precision.h"
#include "qkv/core/tensor.h"

namespace qkv::nn {

class KvCache {
 public:
  KvCache() = default;
  // Empties the cache for `rows` rows of `heads` x `head_dim`; reserves `capacity` positions (grows as needed).
  // page_size > 0: paged storage, pages taken from the pool as positions arrive (0: one contiguous block a row).
  // storage: kFloat32 or kBFloat16 (head_dim even); kInt8 throws std::invalid_argument.
  void reset(int64_t rows, int64_t heads, int64_t head_dim, int64_t capacity = 16, int64_t page_size = 0,
             Precision storage = Precision::kFloat32);
  // k, v: (N, H, Tn, D), any strides  ->  row r's at its positions [row_length(r), row_length(r) + Tn) (bf16
  // storage: rounded to bfloat16).
  void append(const Tensor& k, const Tensor& v);
  // Row i of the result is row rows[i] of the current cache (repeats allowed; a subset drops the other rows, whose
  // pages no other row holds go back to the pool). Every index in [0, this->rows()).
  void reorder(const std::vector<int64_t>& rows);
  // (N, H, length, D): a view into the cache; a gathered copy when paged; a widened float32 copy when bf16; not
  // when ragged.
  Tensor keys() const;
  Tensor values() const;  // (N, H, length, D)
  Precision storage() const { return storage_; }  // kFloat32 or kBFloat16
  int64_t head_dim() const { return dim_; }
  // The positions the rows hold: every row's, or the longest row's when ragged.
  int64_t length() const { return len_; }
  int64_t row_length(int64_t row) const;  // row in [0, rows())
  bool ragged() const;                    // rows of different lengths (paged only)
  bool ready() const { return k_.defined() || pool_ != nullptr; }  // reset() has been called
  int64_t rows() const { return rows_; }

  // Paged storage (page_size > 0 at reset): the pools (num_pages, page_size, H, D) and the block table (rows x
  // max_pages, int32; entries past a row's length are unused). bf16 storage: D/2 words in place of D floats.
  bool paged() const { return page_ > 0; }
  int64_t page_size() const { return page_; }
  const Tensor& key_pages() const { return pool_ ? pool_->k : k_; }  // not paged: the (N, H, capacity, D) storage
  const Tensor& value_pages() const { return pool_ ? pool_->v : v_; }
  std::span<const int32_t> block_table() const { return table_; }
  int64_t max_pages() const { return max_pages_; }
  // Pool pages held by at least one row or retain, of every cache on this pool (a shared page counts once).
  int64_t pages_in_use() const;
  int64_t pool_pages() const;             // pages in the pool, used or free
  void reserve_pages(int64_t pages);      // the pool grows to at least `pages` pages (it also grows by itself)

  // Paged only. Empties this cache to `rows` empty rows whose pages come from `other`'s pool (shared: rows move
  // between the two caches by take_rows without copying a page). Heads, head_dim, page_size and storage are other's.
  void reset_shared(const KvCache& other, int64_t rows = 0);
  // Adds a row (the last) holding positions [0, length) in `pages`, ceil(length / page_size) pages of this pool that
  // other rows or retain_pages hold (each gets one more reference). -> the row's index.
  int64_t add_row(std::span<const int32_t> pages, int64_t length);
  // Moves every row of `other` (which must share this cache's pool, hence its storage) after this cache's rows;
  // other keeps none.
  void take_rows(KvCache& other);
  // The pool pages of row r's positions [0, row_length(r)), in order.
  std::vector<int32_t> row_pages(int64_t row) const;
  // One more (retain) or one less (release) reference on each page, held outside any row (a prefix cache); a page
  // no row and no retain holds goes back to the pool.
  void retain_pages(std::span<const int32_t> pages);
  void release_pages(std::span<const int32_t> pages);

 private:
  struct Pool {  // the pages shared by the caches of reset_shared
    Tensor k, v;                 // (num_pages, page_size, H, cols)
    std::vector<int32_t> refs;   // per pool page: the table entries (and retains) that name it
    std::vector<int32_t> free;   // pool pages with no reference, the next one taken last
  };
  void widen(int64_t pages);
  void grow(int64_t need);
  void grow_pages(int64_t tn);
  int32_t take_page();
  void release_page(int32_t page);
  Tensor gather(const Tensor& pool) const;
  Tensor stored_keys() const;    // (N, H, length, cols): the storage as it is (words when bf16)
  Tensor stored_values() const;
  void check_paged(const char* what) const;
  int64_t pages_of(int64_t length) const { return (length + page_ - 1) / page_; }
  Tensor k_, v_;  // (N, H, capacity, cols); unused when paged
  int64_t rows_ = 0, heads_ = 0, dim_ = 0, len_ = 0;
  Precision storage_ = Precision::kFloat32;
  int64_t cols_ = 0;  // the storage's last dim: dim_, or dim_ / 2 words when bf16
  int64_t page_ = 0, max_pages_ = 0;
  std::vector<int32_t> table_;
  std::vector<int64_t> lens_;   // paged: each row's length (len_ is their maximum)
  std::shared_ptr<Pool> pool_;  // paged
};

// Row i of the result is x.select(0, rows[i]) (a copy); x: (R, ...)  ->  (N, ...). Indices in [0, R).
Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& rows, int64_t axis = 0);

// True when rows == {0, 1, ..., n - 1} (nothing to reorder).
bool is_identity(const std::vector<int64_t>& rows, int64_t n);

}  // namespace qkv::nn
