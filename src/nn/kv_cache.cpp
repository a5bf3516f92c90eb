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

void KvCache::reset(int64_t rows, int64_t heads, int64_t head_dim, int64_t capacity) {
  QKV_CHECK_ARG(rows >= 0 && heads >= 1 && head_dim >= 1 && capacity >= 1, "[KvCache] reset(rows ", rows, ", heads ",
                heads, ", head_dim ", head_dim, ", capacity ", capacity, ") needs rows >= 0 and the rest >= 1");
  rows_ = rows;
  heads_ = heads;
  dim_ = head_dim;
  len_ = 0;
  k_ = Tensor::empty({rows, heads, capacity, head_dim});
  v_ = Tensor::empty({rows, heads, capacity, head_dim});
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

void KvCache::append(const Tensor& k, const Tensor& v) {
  QKV_CHECK_ARG(k_.defined(), "[KvCache] append before reset");
  QKV_CHECK_ARG(k.defined() && v.defined() && k.dim() == 4 && k.shape() == v.shape() && k.size(0) == rows_ &&
                    k.size(1) == heads_ && k.size(3) == dim_,
                "[KvCache] append k ", k.defined() ? str(k.shape()) : "()", " and v ",
                v.defined() ? str(v.shape()) : "()", " must both be (N, H, Tn, D) = ",
                str(Shape{rows_, heads_, -1, dim_}).c_str());
  const int64_t tn = k.size(2);
  grow(len_ + tn);
  k_.slice(2, len_, len_ + tn).copy_from(k);
  v_.slice(2, len_, len_ + tn).copy_from(v);
  len_ += tn;
}

void KvCache::reorder(const std::vector<int64_t>& rows) {
  QKV_CHECK_ARG(k_.defined(), "[KvCache] reorder before reset");
  if (is_identity(rows, rows_)) return;
  const int64_t cap = std::max<int64_t>(k_.size(2), 1);
  Tensor k = Tensor::empty({static_cast<int64_t>(rows.size()), heads_, cap, dim_});
  Tensor v = Tensor::empty({static_cast<int64_t>(rows.size()), heads_, cap, dim_});
  for (size_t i = 0; i < rows.size(); ++i) {
    QKV_CHECK_ARG(rows[i] >= 0 && rows[i] < rows_, "[KvCache] reorder row ", rows[i], " is outside [0, ", rows_, ")");
    if (len_ == 0) continue;
    k.select(0, static_cast<int64_t>(i)).slice(1, 0, len_).copy_from(keys().select(0, rows[i]));
    v.select(0, static_cast<int64_t>(i)).slice(1, 0, len_).copy_from(values().select(0, rows[i]));
  }
  k_ = k;
  v_ = v;
  rows_ = static_cast<int64_t>(rows.size());
}

Tensor KvCache::keys() const {
  QKV_CHECK_ARG(k_.defined(), "[KvCache] keys before reset");
  return k_.slice(2, 0, len_);
}

Tensor KvCache::values() const {
  QKV_CHECK_ARG(v_.defined(), "[KvCache] values before reset");
  return v_.slice(2, 0, len_);
}

}  // namespace qkv::nn
