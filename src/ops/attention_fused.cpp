// The fused attention entry points: attention_fused (what attention() runs when weights are not requested) and
// attention_backward. Validation is attention_check's; the math is kernels/attention_flash.cpp.
// NaN propagates as in PyTorch: the kernels' exp2 maps a NaN score to NaN (tests/cpp/attention_nan_test.cpp).
#include "qkv/core/error.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/lowp.h"

namespace qkv {

AttentionResult attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  const Shape batch = attention_check(q, k, v, options, "attention");
  QKV_CHECK_ARG(!options.return_weights, "[attention] the fused path never forms the weights; q ", str(q.shape()),
                " k ", str(k.shape()), ": call attention() or attention_reference() for return_weights");
  // bf16: the inputs rounded once here; the kernel keeps the precision, and where the CPU has AVX512-BF16 it runs
  // both products on vdpbf16ps with P rounded to bf16 (softmax, LSE and sums in float32), else float32 products.
  const bool bf16 = options.precision == Precision::kBFloat16;
  AttentionResult r = kernels::attention_flash_forward(bf16 ? round_to_bf16(q) : q, bf16 ? round_to_bf16(k) : k,
                                                       bf16 ? round_to_bf16(v) : v, options, batch,
                                                       attention_scale(options, q.size(-1)));
  if (!options.return_lse) r.lse = Tensor();
  return r;
}

AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& d_out, const AttentionOptions& options) {
  const Shape batch = attention_backward_check(q, k, v, out, lse, d_out, options, "attention_backward");
  const float scale = attention_scale(options, q.size(-1));
  // bf16: q, k, v and d_out rounded as the forward rounded q, k and v; the kernel rounds P and dS.
  const bool bf16 = options.precision == Precision::kBFloat16;
  const Tensor qr = bf16 ? round_to_bf16(q) : q, kr = bf16 ? round_to_bf16(k) : k, vr = bf16 ? round_to_bf16(v) : v;
  const Tensor gr = bf16 ? round_to_bf16(d_out) : d_out;
  if (out.defined() && lse.defined())
    return kernels::attention_flash_backward(qr, kr, vr, out, lse, gr, options, batch, scale);
  const AttentionResult f = kernels::attention_flash_forward(qr, kr, vr, options, batch, scale);
  return kernels::attention_flash_backward(qr, kr, vr, f.out, f.lse, gr, options, batch, scale);
}

}  // namespace qkv
