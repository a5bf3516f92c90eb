// Learned absolute positional embedding: a (max_len, E) table whose first rows are added to the input.
// Exceeding max_len is a caller mistake, never a silent wrap or clamp.
#include <cmath>

#include "qkv/core/error.h"
#include "qkv/nn/init.h"
#include "qkv/nn/positional/learned.h"
#include "qkv/ops/elementwise.h"

namespace qkv::nn {
namespace {

void check_dims(int64_t max_len, int64_t E) {
  QKV_CHECK_ARG(max_len >= 1, "[LearnedPositionalEmbedding] max_len must be >= 1, got ", max_len);
  QKV_CHECK_ARG(E >= 1, "[LearnedPositionalEmbedding] E must be >= 1, got ", E);
}

}  // namespace

LearnedPositionalEmbedding::LearnedPositionalEmbedding(int64_t max_len, int64_t E) : max_len_(max_len), embed_dim_(E) {
  check_dims(max_len, E);
  weight = Tensor::zeros({max_len, E});
  register_parameter("weight", &weight);
}

LearnedPositionalEmbedding::LearnedPositionalEmbedding(int64_t max_len, int64_t E, Rng& rng, float init_std)
    : max_len_(max_len), embed_dim_(E) {
  check_dims(max_len, E);
  QKV_CHECK_ARG(std::isfinite(init_std) && init_std >= 0.0f,
                "[LearnedPositionalEmbedding] init_std must be finite and >= 0, got ", init_std);
  weight = init_normal(rng, {max_len, E}, 0.0f, init_std);
  register_parameter("weight", &weight);
}

Tensor LearnedPositionalEmbedding::rows(int64_t T, int64_t offset) const {
  QKV_CHECK_ARG(T >= 0 && offset >= 0, "[LearnedPositionalEmbedding] T (", T, ") and offset (", offset,
                ") must be >= 0");
  QKV_CHECK_ARG(offset + T <= max_len_, "[LearnedPositionalEmbedding] positions ", offset, "..", offset + T - 1,
                " exceed max_len ", max_len_, " (weight ", str(weight.shape()), ")");
  QKV_CHECK_ARG(weight.defined() && weight.shape() == Shape({max_len_, embed_dim_}),
                "[LearnedPositionalEmbedding] weight must be (", max_len_, ", ", embed_dim_, ")");
  return weight.slice(0, offset, offset + T);
}

Tensor LearnedPositionalEmbedding::forward(const Tensor& x, int64_t offset) const {
  QKV_CHECK_ARG(x.defined(), "[LearnedPositionalEmbedding] x is undefined");
  QKV_CHECK_ARG(x.dim() >= 2 && x.size(-1) == embed_dim_, "[LearnedPositionalEmbedding] x ", str(x.shape()),
                " must be (..., T, ", embed_dim_, ")");
  return add(x, rows(x.size(-2), offset));  // the rows broadcast over the leading dims
}

}  // namespace qkv::nn
