// nn::LayerNorm: weight = 1, bias = 0 at init (PyTorch's), forward through qkv::layer_norm.
// Parameters may be absent (elementwise_affine = false, bias = false); then the op gets undefined tensors.
#include "qkv/nn/layer_norm.h"

#include <cmath>

#include "qkv/core/error.h"
#include "qkv/ops/functional.h"

namespace qkv::nn {

LayerNorm::LayerNorm(int64_t normalized_shape, float eps, bool elementwise_affine, bool bias)
    : size_(normalized_shape), eps_(eps) {
  QKV_CHECK_ARG(normalized_shape > 0, "[LayerNorm] normalized_shape must be > 0, got ", normalized_shape);
  QKV_CHECK_ARG(eps > 0.0f && std::isfinite(eps), "[LayerNorm] eps must be positive and finite, got ", eps);
  if (elementwise_affine) {
    weight = Tensor::ones({normalized_shape});
    register_parameter("weight", &weight);
    if (bias) {
      this->bias = Tensor::zeros({normalized_shape});
      register_parameter("bias", &this->bias);
    }
  }
}

ad::Var LayerNorm::forward(const Context& c, const ad::Var& x) const {
  QKV_CHECK_ARG(x.defined(), "[LayerNorm] input is undefined");
  QKV_CHECK_ARG(x.dim() >= 1 && x.size(-1) == size_, "[LayerNorm] input ", str(x.shape()),
                " must have last dim ", size_);
  return ad::layer_norm(x, c.param(weight), c.param(bias), eps_);
}

}  // namespace qkv::nn
