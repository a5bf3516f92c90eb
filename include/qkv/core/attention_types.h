// The attention types shared by every layer that speaks attention (kernels, ops, nn, bindings): mask kinds, causal
// alignment, the options of one call and its results. They sit in core so that kernels and ops both see them.
#pragma once

#include <cstdint>
#include <optional>

#include "qkv/core/precision.h"
#include "qkv/core/tensor.h"

namespace qkv {

class Rng;

// How `AttentionOptions::mask` is read. Never a bool with two meanings.
enum class MaskKind {
  kNone,      // no mask tensor
  kKeep,      // nonzero = the (query, key) pair takes part   (PyTorch SDPA's bool convention)
  kBlock,     // nonzero = the pair is blocked                 (PyTorch MHA's bool convention)
  kAdditive,  // added to the scaled scores; -inf blocks
};

// Causal masking. For Tq != Tk the two alignments differ:
//   kTopLeft:     query i sees keys j <= i
//   kBottomRight: query i sees keys j <= i + (Tk - Tq)   (the last query sees every key; KV-cache decoding)
enum class Causal { kNone, kTopLeft, kBottomRight };

struct AttentionOptions {
  Tensor mask;                         // broadcastable to (..., Tq, Tk); undefined when kind is kNone
  MaskKind mask_kind = MaskKind::kNone;
  Causal causal = Causal::kNone;       // combines with `mask` (both must allow a pair)
  std::optional<float> scale;          // default 1/sqrt(Dk); any finite value, 1.0 = unscaled
  bool return_weights = false;         // forces the reference path: weights (..., Tq, Tk)
  bool return_lse = false;             // lse (..., Tq): log-sum-exp of the masked, scaled scores
  // Grouped-query attention (GQA/MQA; PyTorch's enable_gqa): q is (..., Hq, Tq, Dk), k and v (..., Hkv, Tk, D)
  // with Hq % Hkv == 0; query head h reads kv head h / (Hq / Hkv). K and V are never copied; the backward sums dK
  // and dV over each group. The dims before the head dim broadcast as usual.
  bool enable_gqa = false;
  // Sliding window (FlashAttention-2's window_size = (left, right); -1 = unbounded on that side): query i sees key
  // j iff i + Tk - Tq - left <= j <= i + Tk - Tq + right (aligned bottom-right whatever `causal` is). Combines
  // with causal and the mask: all must allow a pair. A model config's sliding_window = W is (W - 1, 0).
  int64_t window_left = -1;
  int64_t window_right = -1;
  // Logit soft-capping (Gemma 2), 0 = off: with c > 0 the score is c·tanh(scale·q·k / c), before the mask and
  // any additive bias.
  float softcap = 0.0f;
  // How the two products run (qkv/core/precision.h). kBFloat16 rounds q, k and v to bfloat16 once (round to
  // nearest even) and keeps scores, softmax, LSE and accumulation in float32; kFloat32 is the float32 path bit for
  // bit. kInt8 is refused (int8 is for linear layers only). The backward always runs in float32.
  Precision precision = Precision::kFloat32;
  // Dropout on the weights (PyTorch's dropout_p, in [0, 1)): each weight is zeroed with probability p and the others
  // scaled by 1 / (1 - p), drawn from *dropout_rng (required when p > 0); out = the dropped weights · v, and the
  // weights returned are the dropped ones (lse is not). Runs the reference path (ad::attention composes it on a
  // tape); the fused kernel never drops.
  float dropout_p = 0.0f;
  Rng* dropout_rng = nullptr;
  // Empty sequences (Tq, Tk, Dk or Dv of 0, or an empty batch): refused unless allow_empty. With it, the other
  // shape rules still hold and the result is PyTorch's: out (batch..., Tq, Dv) is zeros (empty when Tq, Dv or the
  // batch is 0; zeros when Tk is 0, no key to attend to), weights 0, lse -inf; the backward gives zero gradients.
  bool allow_empty = false;
};

struct AttentionResult {
  Tensor out;      // (..., Tq, Dv)
  Tensor weights;  // (..., Tq, Tk) when return_weights, else undefined
  Tensor lse;      // (..., Tq) when return_lse, else undefined; -inf on a fully masked row
};

struct AttentionGrads {
  Tensor dq;  // shape of q
  Tensor dk;  // shape of k
  Tensor dv;  // shape of v
};

}  // namespace qkv
