// The fused attention entry points: attention_fused (what attention() runs when weights are not requested) and
// attention_backward. Validation is attention_check's; the math is kernels/attention_flash.cpp.
// NaN: the kernel's online softmax treats a NaN score like a masked one, so an input holding a NaN (rare, and a
// bug upstream) is routed to the reference path, which propagates it as PyTorch does. The scan is O(inputs),
// negligible next to the O(Tq·Tk·D) attention.
#include <cstdint>

#include "qkv/core/error.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/ops/attention.h"

namespace qkv {
namespace {

// True when any of the n floats at p is NaN; a branch-free OR so that the compiler vectorises it.
bool span_has_nan(const float* p, int64_t n) {
  int any = 0;
#pragma omp simd reduction(| : any)
  for (int64_t i = 0; i < n; ++i) any |= static_cast<int>(p[i] != p[i]);
  return any != 0;
}

// True when any element of the strided tensor `t` is NaN: one span when contiguous, else one span per row when the
// last dim is contiguous (the case of (B, T, H, D) views), else element by element.
bool has_nan(const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return false;
  const float* p = t.data();
  if (t.is_contiguous()) return span_has_nan(p, t.numel());
  const Shape& shape = t.shape();
  const Shape& strides = t.strides();
  const int64_t inner = shape.back(), step = strides.back();
  bool any = false;
  for_each_offset(Shape(shape.begin(), shape.end() - 1), Shape(strides.begin(), strides.end() - 1),
                  [&](int64_t, int64_t off) {
                    if (step == 1) {
                      any = any || span_has_nan(p + off, inner);
                    } else {
                      for (int64_t i = 0; i < inner; ++i) any = any || p[off + i * step] != p[off + i * step];
                    }
                  });
  return any;
}

bool any_nan(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  return has_nan(q) || has_nan(k) || has_nan(v) || (o.mask_kind == MaskKind::kAdditive && has_nan(o.mask));
}

}  // namespace

AttentionResult attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  const Shape batch = attention_check(q, k, v, options, "attention");
  QKV_CHECK_ARG(!options.return_weights, "[attention] the fused path never forms the weights; q ", str(q.shape()),
                " k ", str(k.shape()), ": call attention() or attention_reference() for return_weights");
  if (any_nan(q, k, v, options)) {
    AttentionResult r = attention_reference(q, k, v, options);
    r.weights = Tensor();
    if (!options.return_lse) r.lse = Tensor();
    return r;
  }
  AttentionResult r =
      kernels::attention_flash_forward(q, k, v, options, batch, attention_scale(options, q.size(-1)));
  if (!options.return_lse) r.lse = Tensor();
  return r;
}

AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& d_out, const AttentionOptions& options) {
  const char* op = "attention_backward";
  const Shape batch = attention_check(q, k, v, options, op);
  Shape out_shape = batch, lse_shape = batch;
  out_shape.push_back(q.size(-2));
  out_shape.push_back(v.size(-1));
  lse_shape.push_back(q.size(-2));
  QKV_CHECK_ARG(d_out.defined() && d_out.shape() == out_shape, "[", op, "] d_out ",
                d_out.defined() ? str(d_out.shape()) : "(undefined)", " must have the shape of out ",
                str(out_shape), " (q ", str(q.shape()), ", v ", str(v.shape()), ")");
  QKV_CHECK_ARG(!out.defined() || out.shape() == out_shape, "[", op, "] out ", str(out.shape()),
                " must have shape (batch..., Tq, Dv) = ", str(out_shape));
  QKV_CHECK_ARG(!lse.defined() || lse.shape() == lse_shape, "[", op, "] lse ", str(lse.shape()),
                " must have shape (batch..., Tq) = ", str(lse_shape));
  if (any_nan(q, k, v, options) || has_nan(d_out))
    return attention_backward_reference(q, k, v, Tensor(), Tensor(), d_out, options);
  const float scale = attention_scale(options, q.size(-1));
  if (out.defined() && lse.defined())
    return kernels::attention_flash_backward(q, k, v, out, lse, d_out, options, batch, scale);
  const AttentionResult f = kernels::attention_flash_forward(q, k, v, options, batch, scale);
  return kernels::attention_flash_backward(q, k, v, f.out, f.lse, d_out, options, batch, scale);
}

}  // namespace qkv
