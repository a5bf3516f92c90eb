// nn::Embedding: "weight" (V, E) ~ N(0, 1) as torch.nn.Embedding, optional zeroed padding row.
// The forward is qkv::embedding (which checks the ids' range).
#include "qkv/nn/embedding.h"

#include "qkv/kernels/quant_gemm.h"
#include "qkv/nn/init.h"

#include "qkv/core/error.h"
#include "qkv/ops/functional.h"

namespace qkv::nn {

namespace {

int64_t checked_rows(const Tensor& weight) {
  QKV_CHECK_ARG(weight.defined() && weight.dim() == 2 && weight.size(0) > 0 && weight.size(1) > 0,
                "[Embedding] weight must be (V, E) with V, E > 0, got ",
                weight.defined() ? str(weight.shape()) : std::string("(undefined)"));
  return weight.size(0);
}

}  // namespace

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Rng& rng, std::optional<int64_t> padding_idx)
    : num_(num_embeddings), dim_(embedding_dim) {
  QKV_CHECK_ARG(num_embeddings > 0 && embedding_dim > 0, "[Embedding] num_embeddings ", num_embeddings,
                " and embedding_dim ", embedding_dim, " must be > 0");
  set_padding_idx(padding_idx);
  weight = init_normal(rng, {num_embeddings, embedding_dim});
  if (padding_idx_) weight.select(0, *padding_idx_).fill(0.0f);
  register_parameter("weight", &weight);
}

Embedding::Embedding(const Tensor& table, std::optional<int64_t> padding_idx)
    : num_(checked_rows(table)), dim_(table.size(1)) {
  set_padding_idx(padding_idx);
  weight = table;
  if (padding_idx_) weight.select(0, *padding_idx_).fill(0.0f);
  register_parameter("weight", &weight);
}

void Embedding::set_padding_idx(std::optional<int64_t> padding_idx) {
  if (!padding_idx) return;
  const int64_t p = *padding_idx;
  QKV_CHECK_ARG(p >= -num_ && p < num_, "[Embedding] padding_idx ", p, " must be in [-", num_, ", ", num_, ")");
  padding_idx_ = p < 0 ? p + num_ : p;
}

ad::Var Embedding::forward(const Context& c, const Ids& ids) const {
  QKV_CHECK_ARG(static_cast<int64_t>(ids.data.size()) == shape_numel(ids.shape), "[Embedding] ids shape ",
                str(ids.shape), " does not match its ", ids.data.size(), " values");
  for (int64_t id : ids.data)
    QKV_CHECK_ARG(id >= 0 && id < num_, "[Embedding] id ", id, " out of range [0, ", num_, ") for ids ",
                  str(ids.shape));
  if (stored_.defined()) {
    QKV_CHECK_ARG(c.tape() == nullptr, "[Embedding] a stored (quantized) table is for inference; ids ", str(ids.shape));
    Shape shape = ids.shape;
    shape.push_back(dim_);
    Tensor out = Tensor::empty(shape);
    kernels::embedding_rows(*stored_.quant(), ids.data.data(), static_cast<int64_t>(ids.data.size()), out.data());
    return ad::Var(out);
  }
  return ad::embedding(c.param(weight), ids, padding_idx_);
}

void Embedding::use_stored(LinearWeight stored) {
  QKV_CHECK_ARG(stored.quantized() && stored.out_features() == num_ && stored.in_features() == dim_,
                "[Embedding] a stored table (", stored.out_features(), ", ", stored.in_features(), ") for (", num_,
                ", ", dim_, ")");
  QKV_CHECK_ARG(!padding_idx_, "[Embedding] a stored table with a padding_idx");
  stored_ = std::move(stored);
  weight = Tensor();
}

}  // namespace qkv::nn
