// Bahdanau (additive) and Luong (dot, general) scorers and the shared masked-softmax + context step.
// One forward each, on a Context (differentiable ops: linear, add, tanh, matmul, softmax); the Tensor calls wrap it.
// The encoder-side projection is cached by prepare().
#include "qkv/nn/additive_attention.h"
#include "qkv/nn/init.h"

#include <cmath>
#include <limits>

#include "qkv/core/error.h"
#include "qkv/ops/functional.h"

namespace qkv::nn {

Tensor lengths_to_keep_mask(const std::vector<int64_t>& lengths, int64_t max_len) {
  QKV_CHECK_ARG(!lengths.empty() && max_len > 0, "[lengths_to_keep_mask] need B > 0 lengths (got ",
                lengths.size(), ") and max_len > 0 (got ", max_len, ")");
  const int64_t nb = static_cast<int64_t>(lengths.size());
  Tensor m = Tensor::zeros({nb, max_len});
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t len = lengths[static_cast<size_t>(b)];
    QKV_CHECK_ARG(len >= 0 && len <= max_len, "[lengths_to_keep_mask] length ", len, " outside [0, ", max_len,
                  "]");
    for (int64_t t = 0; t < len; ++t) m.data()[b * max_len + t] = 1.0f;
  }
  return m;
}

AlignmentVars align(const ad::Var& scores, const ad::Var& keys, const Tensor& keep_mask) {
  QKV_CHECK_ARG(scores.defined() && keys.defined(), "[align] scores and keys must be defined");
  QKV_CHECK_ARG(keys.dim() == 3 && keys.size(0) > 0 && keys.size(1) > 0, "[align] keys ", str(keys.shape()),
                " must be a non-empty (B, Ts, Hk)");
  const int64_t nb = keys.size(0), ts = keys.size(1);
  QKV_CHECK_ARG((scores.dim() == 2 || scores.dim() == 3) && scores.size(0) == nb && scores.size(-1) == ts,
                "[align] scores ", str(scores.shape()), " must be (B, Ts) or (B, Tq, Ts) for keys ",
                str(keys.shape()));
  const Shape mask_shape{nb, ts};
  QKV_CHECK_ARG(!keep_mask.defined() || keep_mask.shape() == mask_shape, "[align] keep_mask ",
                str(keep_mask.shape()), " must be (B, Ts) = ", str(mask_shape));
  const bool rank2 = scores.dim() == 2;
  ad::Var s = rank2 ? ad::unsqueeze(scores, 1) : scores;  // (B, Tq, Ts)
  if (keep_mask.defined()) {  // masked positions -> -inf (x + 0 keeps every kept score exactly)
    const Tensor m = keep_mask.contiguous();
    Tensor additive = Tensor::zeros({nb, 1, ts});
    for (int64_t i = 0; i < nb * ts; ++i)
      if (m.data()[i] == 0.0f) additive.data()[i] = -std::numeric_limits<float>::infinity();
    s = ad::add(s, ad::Var(additive));
  }
  AlignmentVars res;
  res.weights = ad::softmax(s, -1);                // all -inf row -> 0
  res.context = ad::matmul(res.weights, keys);     // (B, Tq, Ts)·(B, Ts, Hk) -> (B, Tq, Hk)
  if (rank2) {
    res.weights = ad::squeeze(res.weights, 1);
    res.context = ad::squeeze(res.context, 1);
  }
  return res;
}

AlignmentResult align(const Tensor& scores, const Tensor& keys, const Tensor& keep_mask) {
  const AlignmentVars a = align(ad::Var(scores), ad::Var(keys), keep_mask);
  return {a.weights.value, a.context.value};
}

// --- AttentionScorer ---------------------------------------------------------------

AttentionScorer::AttentionScorer(const char* op, int64_t query_size, int64_t key_size)
    : op_(op), query_size_(query_size), key_size_(key_size) {
  QKV_CHECK_ARG(query_size > 0 && key_size > 0, "[", op, "] query_size ", query_size, " and key_size ",
                key_size, " must be positive");
}

void AttentionScorer::check_keys(const Tensor& keys) const {
  QKV_CHECK_ARG(keys.defined(), "[", op_, "] keys are undefined");
  QKV_CHECK_ARG(keys.dim() == 3 && keys.size(0) > 0 && keys.size(1) > 0 && keys.size(2) == key_size_, "[", op_,
                "] keys ", str(keys.shape()), " must be a non-empty (B, Ts, Hk) with Hk = ", key_size_);
}

ad::Var AttentionScorer::query3(const ad::Var& query) const {
  QKV_CHECK_ARG(query.defined(), "[", op_, "] query is undefined");
  QKV_CHECK_ARG((query.dim() == 2 || query.dim() == 3) && query.size(-1) == query_size_ && query.size(0) > 0,
                "[", op_, "] query ", str(query.shape()), " must be (B, Hq) or (B, Tq, Hq) with Hq = ",
                query_size_);
  return query.dim() == 2 ? ad::unsqueeze(query, 1) : query;
}

AlignmentVars AttentionScorer::forward(const Context& c, const ad::Var& query, const ad::Var& keys,
                                       const ad::Var& prepared, const Tensor& keep_mask) const {
  check_keys(keys.value);
  QKV_CHECK_ARG(prepared.defined() && prepared.dim() == 3 && prepared.size(0) == keys.size(0) &&
                    prepared.size(1) == keys.size(1),
                "[", op_, "] prepared ", str(prepared.shape()), " does not come from keys ", str(keys.shape()),
                " (call prepare(keys))");
  QKV_CHECK_ARG(query.defined() && query.size(0) == keys.size(0), "[", op_, "] query ", str(query.shape()),
                " and keys ", str(keys.shape()), " must share the batch dim");
  const Shape mask_shape{keys.size(0), keys.size(1)};
  QKV_CHECK_ARG(!keep_mask.defined() || keep_mask.shape() == mask_shape, "[", op_,
                "] keep_mask ", str(keep_mask.shape()), " must be (B, Ts) for keys ", str(keys.shape()));
  return align(score(c, query, prepared), keys, keep_mask);
}

AlignmentResult AttentionScorer::forward(const Tensor& query, const Tensor& keys, const Tensor& prepared,
                                         const Tensor& keep_mask) const {
  const AlignmentVars a = forward(Context(), query, keys, prepared, keep_mask);
  return {a.weights.value, a.context.value};
}

AlignmentResult AttentionScorer::attend(const Tensor& query, const Tensor& keys, const Tensor& keep_mask) const {
  return forward(query, keys, prepare(keys), keep_mask);
}

// --- Bahdanau ------------------------------------------------------------------------

BahdanauAttention::BahdanauAttention(int64_t query_size, int64_t key_size, int64_t attention_size, Rng& rng)
    : AttentionScorer("BahdanauAttention", query_size, key_size),
      W(query_size, attention_size, false, rng),
      U(key_size, attention_size, false, rng),
      v(attention_size, 1, false, rng),
      attention_size_(attention_size) {
  QKV_CHECK_ARG(attention_size > 0, "[BahdanauAttention] attention_size ", attention_size, " must be positive");
  register_module("W", &W);
  register_module("U", &U);
  register_module("v", &v);
}

ad::Var BahdanauAttention::prepare(const Context& c, const ad::Var& keys) const {
  check_keys(keys.value);
  return U.forward(c, keys);  // (B, Ts, A)
}

ad::Var BahdanauAttention::score(const Context& c, const ad::Var& query, const ad::Var& prepared) const {
  const ad::Var q = query3(query);  // (B, Tq, Hq)
  QKV_CHECK_ARG(prepared.defined() && prepared.dim() == 3 && prepared.size(0) == q.size(0) &&
                    prepared.size(2) == attention_size_,
                "[BahdanauAttention] prepared ", str(prepared.shape()), " must be U·keys (B, Ts, A) with A = ",
                attention_size_, " for query ", str(query.shape()));
  const ad::Var ws = W.forward(c, q);                                                // (B, Tq, A)
  const ad::Var e = ad::tanh(ad::add(ad::unsqueeze(ws, 2), ad::unsqueeze(prepared, 1)));  // (B, Tq, Ts, A)
  const ad::Var s = ad::squeeze(v.forward(c, e), 3);                                   // (B, Tq, Ts)
  return query.dim() == 2 ? ad::squeeze(s, 1) : s;
}

// --- Luong ------------------------------------------------------------------------------

LuongAttention::LuongAttention(LuongScore kind, int64_t query_size, int64_t key_size, Rng& rng)
    : AttentionScorer("LuongAttention", query_size, key_size), kind_(kind) {
  if (kind == LuongScore::kDot) {
    QKV_CHECK_ARG(query_size == key_size, "[LuongAttention] the dot score needs query_size ", query_size,
                  " == key_size ", key_size);
    return;
  }
  const float bound = 1.0f / std::sqrt(static_cast<float>(key_size));  // as nn.Linear(Hk, Hq)
  w_ = init_uniform(rng, {query_size, key_size}, -bound, bound);
  register_parameter("W.weight", &w_);
}

ad::Var LuongAttention::prepare(const Context& c, const ad::Var& keys) const {
  check_keys(keys.value);
  return kind_ == LuongScore::kDot ? keys : ad::linear(keys, c.param(w_));  // (B, Ts, Hq)
}

ad::Var LuongAttention::score(const Context& c, const ad::Var& query, const ad::Var& prepared) const {
  (void)c;
  const ad::Var q = query3(query);  // (B, Tq, Hq)
  QKV_CHECK_ARG(prepared.defined() && prepared.dim() == 3 && prepared.size(0) == q.size(0) &&
                    prepared.size(2) == query_size_,
                "[LuongAttention] prepared ", str(prepared.shape()), " must be (B, Ts, Hq) with Hq = ",
                query_size_, " for query ", str(query.shape()));
  const ad::Var s = ad::matmul(q, ad::transpose(prepared, 1, 2));  // (B, Tq, Ts)
  return query.dim() == 2 ? ad::squeeze(s, 1) : s;
}

}  // namespace qkv::nn
