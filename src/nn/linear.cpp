// nn::Linear: PyTorch-named weight/bias with kaiming-uniform(a=sqrt(5)) init, i.e. U(-1/sqrt(in), 1/sqrt(in)).
// The forward is qkv::linear.
#include "qkv/nn/linear.h"
#include "qkv/nn/init.h"

#include <cmath>

#include "qkv/core/error.h"
#include "qkv/ops/functional.h"

namespace qkv::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Rng& rng)
    : in_features_(in_features), out_features_(out_features) {
  QKV_CHECK_ARG(in_features >= 0 && out_features >= 0, "[Linear] in_features ", in_features,
                " and out_features ", out_features, " must be >= 0");
  // kaiming_uniform_(a=sqrt(5)) on (out, in): gain sqrt(1/3), bound = gain*sqrt(3/fan_in) = 1/sqrt(fan_in).
  const float bound = in_features > 0 ? 1.0f / std::sqrt(static_cast<float>(in_features)) : 0.0f;
  weight = bound > 0 ? init_uniform(rng, {out_features, in_features}, -bound, bound)
                     : Tensor::zeros({out_features, in_features});
  register_parameter("weight", &weight);
  register_linear_weight(&weight);
  if (bias) {
    this->bias = bound > 0 ? init_uniform(rng, {out_features}, -bound, bound) : Tensor::zeros({out_features});
    register_parameter("bias", &this->bias);
  }
}

ad::Var Linear::forward(const Context& c, const ad::Var& x, bool with_bias) const {
  QKV_CHECK_ARG(x.defined(), "[Linear] input is undefined");
  QKV_CHECK_ARG(x.dim() >= 1 && x.size(-1) == in_features_, "[Linear] input ", str(x.shape()),
                " must have last dim in_features = ", in_features_);
  if (uses_prepared_weights(c.tape() != nullptr, "Linear", x.shape()))
    return ad::Var(linear_at(x.value, weight, with_bias ? bias : Tensor()));
  // fp32, or bf16 on the live weight (training, or evaluating between training steps); c.param: the member itself
  return ad::linear(x, c.param(weight), with_bias ? c.param(bias) : ad::Var(), precision());
}

}  // namespace qkv::nn
