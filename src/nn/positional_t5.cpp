// T5 relative attention bias: HF-exact bucketing of key_pos - query_pos and the (1, H, Tq, Tk) additive bias.
// The log bucket is computed in float32 like the reference (torch float32 ops, then truncation toward zero).
#include <cmath>
#include <cstdlib>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/nn/init.h"
#include "qkv/nn/positional/t5_bias.h"

namespace qkv::nn {
namespace {

void check_module_args(int64_t num_buckets, int64_t max_distance, int64_t num_heads, bool bidirectional) {
  QKV_CHECK_ARG(num_heads >= 1, "[T5RelativeBias] num_heads must be >= 1, got ", num_heads);
  t5_check_bucket_args(bidirectional, num_buckets, max_distance, "T5RelativeBias");
}

}  // namespace

T5RelativeBias::T5RelativeBias(int64_t num_buckets, int64_t max_distance, int64_t num_heads, bool bidirectional)
    : num_buckets_(num_buckets), max_distance_(max_distance), num_heads_(num_heads), bidirectional_(bidirectional) {
  check_module_args(num_buckets, max_distance, num_heads, bidirectional);
  weight = Tensor::zeros({num_buckets, num_heads});
  register_parameter("relative_attention_bias.weight", &weight);
}

T5RelativeBias::T5RelativeBias(int64_t num_buckets, int64_t max_distance, int64_t num_heads, bool bidirectional,
                               Rng& rng, float init_std)
    : num_buckets_(num_buckets), max_distance_(max_distance), num_heads_(num_heads), bidirectional_(bidirectional) {
  check_module_args(num_buckets, max_distance, num_heads, bidirectional);
  QKV_CHECK_ARG(std::isfinite(init_std) && init_std >= 0.0f,
                "[T5RelativeBias] init_std must be finite and >= 0, got ", init_std);
  weight = init_normal(rng, {num_buckets, num_heads}, 0.0f, init_std);
  register_parameter("relative_attention_bias.weight", &weight);
}

Tensor T5RelativeBias::forward(int64_t Tq, int64_t Tk, int64_t query_offset) const {
  QKV_CHECK_ARG(Tq >= 0 && Tk >= 0, "[T5RelativeBias] Tq (", Tq, ") and Tk (", Tk, ") must be >= 0");
  QKV_CHECK_ARG(weight.defined() && weight.shape() == Shape({num_buckets_, num_heads_}), "[T5RelativeBias] weight ",
                weight.defined() ? str(weight.shape()) : std::string("(undefined)"), " must be (", num_buckets_, ", ",
                num_heads_, ")");
  return t5_relative_bias(weight, Tq, Tk, bidirectional_, max_distance_, query_offset);
}

}  // namespace qkv::nn
