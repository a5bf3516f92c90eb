// nn::LayerNorm: weight = 1, bias = 0 at init (PyTorch's), forward through qkv::layer_norm; nn::RmsNorm beside it.
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

RmsNorm::RmsNorm(int64_t normalized_shape, float eps, bool unit_offset)
    : size_(normalized_shape), eps_(eps), unit_offset_(unit_offset) {
  QKV_CHECK_ARG(normalized_shape > 0, "[RmsNorm] normalized_shape must be > 0, got ", normalized_shape);
  QKV_CHECK_ARG(eps >= 0.0f && std::isfinite(eps), "[RmsNorm] eps must be finite and >= 0, got ", eps);
  weight = unit_offset ? Tensor::zeros({normalized_shape}) : Tensor::ones({normalized_shape});
  register_parameter("weight", &weight);
}

ad::Var RmsNorm::forward(const Context& c, const ad::Var& x) const {
  QKV_CHECK_ARG(x.defined(), "[RmsNorm] input is undefined");
  QKV_CHECK_ARG(x.dim() >= 1 && x.size(-1) == size_, "[RmsNorm] input ", str(x.shape()), " must have last dim ",
                size_);
  return ad::rms_norm(x, c.param(weight), eps_, unit_offset_);
}

}  // namespace qkv::nn
