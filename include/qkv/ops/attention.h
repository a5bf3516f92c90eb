// Scaled dot-product attention, softmax(q·kᵀ·scale + mask)·v: the one entry point, its options and its backward.
// The reference path materialises the weights and is the oracle for every test; the fused path never does.
#pragma once

#include <optional>

#include "qkv/core/attention_types.h"
#include "qkv/core/tensor.h"

namespace qkv {

// q: (..., Tq, Dk)  k: (..., Tk, Dk)  v: (..., Tk, Dv)  ->  out: (..., Tq, Dv)
// Leading dims of q, k, v broadcast together into `batch`; the mask broadcasts to (batch..., Tq, Tk) (it does not
// widen the batch). Inputs may be strided views.
// A fully masked row gives out 0, weights 0, lse -inf: never NaN.
// The one entry that decides what attention means: it checks its arguments once (attention_check), then takes
// the empty-sequence rule (options.allow_empty), the reference with dropped weights (options.dropout_p), the
// reference when weights are asked for, else the fused kernel.
AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options = {});

// attention() over k and v stored as bf16 pairs (a bf16 nn::KvCache's storage, qkv::to_bf16_pairs): k (..., Tk,
// Dk/2) and v (..., Tk, Dv/2) words. The same result, bit for bit, as attention(q, from_bf16_pairs(k),
// from_bf16_pairs(v), options): the fused kernel reads the words in place (half the bytes of float32 k and v), the
// other paths widen them first. Inference only (no backward).
AttentionResult attention_kv_bf16(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionOptions& options = {});

// The plain composed path (scores -> mask -> softmax -> weights·v), always materialising the weights.
AttentionResult attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});


// Reference backward of attention_reference (recomputes the weights; never the fused kernel).
// q, k, v as for attention(); out, d_out: (batch..., Tq, Dv); lse: (batch..., Tq) from the forward
// (out and lse may be undefined: they are then recomputed).  ->  dq, dk, dv with the shapes of q, k, v,
// summed over the batch axes along which each was broadcast. A fully masked row contributes zero gradient.
// No gradient flows to the mask.
AttentionGrads attention_backward_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& out, const Tensor& lse, const Tensor& d_out,
                                            const AttentionOptions& options = {});

// The fused O(T)-memory path (FlashAttention-2 kernel, kernels/attention_flash.cpp) that attention() takes when
// weights are not requested. Same contract as attention(); options.return_weights must be false.
AttentionResult attention_fused(const Tensor& q, const Tensor& k, const Tensor& v,
                                const AttentionOptions& options = {});

// Backward of attention() through the fused kernel: recomputes the scores block by block from the lse and never
// forms (Tq, Tk). Inputs and outputs as for attention_backward_reference; out and lse are the forward's
// (attention(..., return_lse)); when either is undefined the fused forward recomputes both.
// Deterministic: the same bits on every run with the same thread count (no atomics).
// Empty sequences (options.allow_empty) give zero gradients. Dropout is not differentiated here (ad::attention
// composes it on a tape).
AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& d_out, const AttentionOptions& options = {});

// Validates q, k, v and options exactly as attention() does; returns the broadcast batch shape.
// Exposed so that every attention path (reference, fused, bindings) rejects the same inputs with the same words.
Shape attention_check(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                      const char* op);
// attention_check, and d_out (and out, lse where defined) against the output's shapes: as attention_backward does.
Shape attention_backward_check(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, const Tensor& d_out, const AttentionOptions& options,
                               const char* op);

// A mask of any kind as an additive float tensor of its shape (0 = takes part, -inf = blocked); kAdditive returns
// the mask itself. Any strides.
Tensor mask_to_additive(const Tensor& mask, MaskKind kind);
// options with `bias` (an additive score bias, broadcastable like the mask) joined to its mask: one kAdditive mask.
// An undefined bias returns options unchanged.
AttentionOptions with_additive_bias(AttentionOptions options, const Tensor& bias);

// Effective scale: options.scale or 1/sqrt(Dk).
float attention_scale(const AttentionOptions& options, int64_t dk);

// options with precision kFloat32 (what a bf16 entry point passes on once it has rounded q, k and v).
AttentionOptions at_fp32(AttentionOptions options);

}  // namespace qkv
