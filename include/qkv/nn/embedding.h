// nn::Embedding: a (V, E) lookup table named "weight", as torch.nn.Embedding (init N(0, 1)).
// An optional padding_idx zeroes that row at construction, like PyTorch (no gradient semantics here: forward only).
#pragma once

#include <cstdint>
#include <optional>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/context.h"
#include "qkv/nn/module.h"
#include "qkv/ops/embedding.h"
#include "qkv/ops/lowp.h"

namespace qkv::nn {

class Embedding : public Module {
 public:
  // V > 0, E > 0; padding_idx in [-V, V) (negative counts from the end, as PyTorch).
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Rng& rng,
            std::optional<int64_t> padding_idx = std::nullopt);

  // From a given table, as torch.nn.Embedding.from_pretrained: weight (V, E), V > 0, E > 0, shared (not copied);
  // draws no random numbers. padding_idx as above (that row of weight is zeroed).
  explicit Embedding(const Tensor& weight, std::optional<int64_t> padding_idx = std::nullopt);

  // ids: shape S, values in [0, V)  ->  S + (E)
  // Records its backward when `c` trains (a padding_idx row gets no gradient, as torch.nn.Embedding).
  ad::Var forward(const Context& c, const Ids& ids) const;
  Tensor forward(const Ids& ids) const { return forward(Context(), ids).value; }

  int64_t num_embeddings() const { return num_; }
  int64_t embedding_dim() const { return dim_; }
  std::optional<int64_t> padding_idx() const { return padding_idx_; }

  // Rows read as a file stores them (a GGUF's quantized token embedding, LinearWeight::quantized of shape (V, E)):
  // `weight` is released and forward dequantizes the rows it looks up. Inference only (a training forward throws).
  void use_stored(LinearWeight stored);
  const LinearWeight& stored() const { return stored_; }

  Tensor weight;  // (V, E); undefined after use_stored

 private:
  void set_padding_idx(std::optional<int64_t> padding_idx);  // checks it against num_, stores it non-negative

  int64_t num_;
  int64_t dim_;
  std::optional<int64_t> padding_idx_;
  LinearWeight stored_;
};

}  // namespace qkv::nn
