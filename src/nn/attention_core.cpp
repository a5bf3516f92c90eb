// nn::attend: rotary positions, the KV cache's append and read (contiguous, paged in place, ragged rows), the
// sequence shard, one call of the op (or of its packed / in-place / relative forms) and the probabilities.
#include "qkv/nn/attention_core.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/attention_varlen.h"
#include "qkv/ops/functional.h"
#include "qkv/ops/lowp.h"
#include "qkv/ops/positional/relative.h"

namespace qkv::nn {
namespace {

std::string shape_of(const ad::Var& x) { return x.defined() ? str(x.shape()) : std::string("(undefined)"); }

// The probabilities (B, Hq, Tq, Tk) of q over the keys k (B, Hkv, Tk, D) under o, recomputed by the reference
// softmax beside the output (scale, soft-cap, mask, bias, causal alignment, window and GQA as the output ran them,
// no dropout); the values take no part: a zero column stands in for them.
Tensor probabilities(const Tensor& q, const Tensor& k, AttentionOptions o, const Tensor& bias) {
  o = with_additive_bias(o, bias);
  o.return_weights = true;
  o.return_lse = false;
  o.dropout_p = 0.0f;
  o.dropout_rng = nullptr;
  Shape zero = k.shape();
  zero.back() = 1;
  return attention_reference(q, k, Tensor::zeros(zero), o).weights;
}

// Packed variable-length rows (N, H, D): attention_varlen per sequence. At bf16 q, k and v are rounded once here
// for every sequence (scores and softmax stay float32).
AttendResult attend_packed(const Context& c, const ad::Var& q, const ad::Var& k, const ad::Var& v,
                           const AttendOptions& o) {
  const AttentionOptions& a = o.attention;
  QKV_CHECK_ARG(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "[", o.op, "] packed input (cu_seqlens): q ",
                shape_of(q), ", k ", shape_of(k), " and v ", shape_of(v), " must be (N, H, D)");
  QKV_CHECK_ARG(o.cache == nullptr && !o.rotary.enabled && !o.rel_k.defined() && !a.mask.defined() &&
                    !o.bias.defined() && o.dropout == 0.0f && o.weights == AttendWeights::kNone &&
                    !o.head_mask.defined(),
                "[", o.op, "] packed input (cu_seqlens), q ", shape_of(q), ", takes no KV cache, rotary or "
                "relative positions, mask, bias, weight dropout, weights or head_mask");
  QKV_CHECK_ARG(c.sequence_shard() == nullptr, "[", o.op, "] packed input (cu_seqlens), query ", shape_of(q),
                ": its attention is local, so it does not run with the sequence split across processes (context "
                "parallelism)");
  int64_t max_len = 0;
  for (size_t b = 0; b + 1 < o.cu_seqlens.size(); ++b)
    max_len = std::max<int64_t>(max_len, o.cu_seqlens[b + 1] - o.cu_seqlens[b]);
  const bool bf16 = a.precision == Precision::kBFloat16;
  auto rounded = [bf16](const ad::Var& x) { return bf16 ? ad::round_to_bf16(x) : x; };
  AttendResult r;
  r.out = ad::attention_varlen(rounded(q), rounded(k), rounded(v), o.cu_seqlens, o.cu_seqlens, max_len, max_len,
                               at_fp32(a));
  return r;
}

// Row b of q rotated by queries[b] and row b of k by keys[b] (tables of Tq and Tn rows): rows at their own
// positions, on the tape when q or k is.
void rotate_rows(ad::Var& q, ad::Var& k, const std::vector<std::shared_ptr<const RopeTable>>& queries,
                 const std::vector<std::shared_ptr<const RopeTable>>& keys, RopeVariant variant) {
  std::vector<ad::Var> qs, ks;
  for (size_t b = 0; b < keys.size(); ++b) {
    const auto i = static_cast<int64_t>(b);
    qs.push_back(ad::rope(ad::slice(q, 0, i, i + 1), queries[b], variant));
    ks.push_back(ad::rope(ad::slice(k, 0, i, i + 1), keys[b], variant));
  }
  q = ad::concat(qs, 0);
  k = ad::concat(ks, 0);
}

// Rotates q (its rows at new rows query_first ..) and the new keys k (Tn rows) in place of the Vars.
void rotate(const Context& c, ad::Var& q, ad::Var& k, int64_t offset, const AttendOptions& o) {
  const AttendRotary& r = o.rotary;
  const int64_t B = q.size(0), Tq = q.size(2), Tn = k.size(2), D = q.size(3);
  const int64_t first = o.query_first;
  QKV_CHECK_ARG(first >= 0, "[", o.op, "] query_first ", first, " must be >= 0 (q ", shape_of(q), ")");
  std::vector<std::shared_ptr<const RopeTable>> queries(static_cast<size_t>(B)), keys(static_cast<size_t>(B));
  auto queries_of = [&](const std::shared_ptr<const RopeTable>& row_keys, int64_t row_offset) {
    return first == 0 && Tq == Tn ? row_keys
           : first + Tq <= Tn     ? std::make_shared<const RopeTable>(rope_table_rows(*row_keys, first, Tq))
                                  : std::make_shared<const RopeTable>(
                                        rope_table(row_offset + first, Tq, D, r.base, r.scaling));
  };
  if (o.cache != nullptr && o.cache->ready() && o.cache->ragged()) {
    // Rows at different positions (a server's running batch): row b's angles start at its own cache length.
    // A model's shared table (the rows of one position range) does not apply to them.
    QKV_CHECK_ARG(!c.tape() && r.positions == nullptr && (r.table == nullptr || r.table->rows == Tn) &&
                      o.cache->rows() == B,
                  "[", o.op, "] the ragged KV cache of ", o.cache->rows(), " rows takes q ", shape_of(q),
                  " at inference, without positions");
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = o.cache->row_length(b);
      const auto i = static_cast<size_t>(b);
      keys[i] = std::make_shared<const RopeTable>(rope_table(len, Tn, D, r.base, r.scaling));
      queries[i] = queries_of(keys[i], len);
    }
    rotate_rows(q, k, queries, keys, r.variant);
    return;
  }
  const int64_t given = r.table != nullptr       ? r.table->rows
                        : r.positions != nullptr ? static_cast<int64_t>(r.positions->size())
                                                 : Tn;
  QKV_CHECK_ARG(given == Tn || given == B * Tn, "[", o.op, "] ", given, " rotary ",
                r.table != nullptr ? "angles" : "positions", " for the new keys ", shape_of(k),
                " (Tn shared by the rows, or B*Tn: one set per row)");
  if (given != Tn) {  // per-row positions: row b's angles are rows [b·Tn, (b + 1)·Tn) of the table
    QKV_CHECK_ARG(first + Tq <= Tn, "[", o.op, "] q ", shape_of(q), " has rows beyond the new keys ", shape_of(k),
                  " whose per-row rotary positions were given");
    const std::shared_ptr<const RopeTable> all =
        r.table != nullptr ? r.table : std::make_shared<const RopeTable>(rope_table(*r.positions, D, r.base, r.scaling));
    for (int64_t b = 0; b < B; ++b) {
      const auto i = static_cast<size_t>(b);
      keys[i] = std::make_shared<const RopeTable>(rope_table_rows(*all, b * Tn, Tn));
      queries[i] = queries_of(keys[i], 0);
    }
    rotate_rows(q, k, queries, keys, r.variant);
    return;
  }
  const std::shared_ptr<const RopeTable> shared =
      r.table != nullptr ? r.table
                         : std::make_shared<const RopeTable>(
                               r.positions != nullptr ? rope_table(*r.positions, D, r.base, r.scaling)
                                                      : rope_table(offset, Tn, D, r.base, r.scaling));
  if (first + Tq > Tn)  // more queries than new keys (cross-attention): their positions continue from offset
    QKV_CHECK_ARG(r.table == nullptr && r.positions == nullptr, "[", o.op, "] q ", shape_of(q),
                  " has rows beyond the new keys ", shape_of(k), " whose rotary positions were given");
  q = ad::rope(q, queries_of(shared, offset), r.variant);
  k = ad::rope(k, shared, r.variant);
}

}  // namespace

AttendResult attend(const Context& c, const ad::Var& q_in, const ad::Var& k_in, const ad::Var& v_in,
                    const AttendOptions& o) {
  if (!o.cu_seqlens.empty()) return attend_packed(c, q_in, k_in, v_in, o);
  KvCache* cache = o.cache;
  const bool fixed = cache != nullptr && o.cache_fixed;
  QKV_CHECK_ARG(!o.cache_fixed || cache != nullptr, "[", o.op, "] cache_fixed without a KV cache");
  ad::Var q = q_in, k = fixed ? ad::Var(cache->keys()) : k_in, v = fixed ? ad::Var(cache->values()) : v_in;
  QKV_CHECK_ARG(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(0) == q.size(0) && v.size(0) == q.size(0) &&
                    k.size(1) == v.size(1) && k.size(1) > 0 && q.size(1) % k.size(1) == 0 &&
                    k.size(3) == q.size(3) && v.size(2) == k.size(2),
                "[", o.op, "] q ", shape_of(q), ", k ", shape_of(k), " and v ", shape_of(v),
                " must be heads (B, Hq, Tq, D), (B, Hkv, Tn, D) and (B, Hkv, Tn, Dv) with Hq a multiple of Hkv");
  const int64_t B = q.size(0), Hq = q.size(1), Tq = q.size(2), D = q.size(3), Hkv = k.size(1);
  const SequenceShard* shard = c.sequence_shard();
  const bool drop = o.dropout > 0.0f;
  const AttentionOptions& a = o.attention;

  // --- checks: positions, relative tables, head gates, the shard -----------------------------------------------
  QKV_CHECK_ARG(!(fixed && (o.rotary.enabled || o.rel_k.defined())), "[", o.op,
                "] rotary and relative positions need the keys' positions: not with kv_cache_fixed");
  int64_t clip = 0;
  if (o.rel_k.defined()) {
    const Tensor& rk = o.rel_k.value;
    clip = rk.dim() == 2 ? (rk.size(0) - 1) / 2 : 0;
    QKV_CHECK_ARG(rk.dim() == 2 && rk.size(0) % 2 == 1 && rk.size(1) == D, "[", o.op, "] rel_k ", str(rk.shape()),
                  " must be (2*clip+1, head_dim = ", D, ")");
    QKV_CHECK_ARG(!o.rel_v.defined() || o.rel_v.value.shape() == rk.shape(), "[", o.op, "] rel_v ",
                  o.rel_v.defined() ? str(o.rel_v.value.shape()) : "()", " must match rel_k ", str(rk.shape()));
    QKV_CHECK_ARG(!o.bias.defined(), "[", o.op, "] relative attention takes no trained attn_bias (",
                  str(o.bias.value.shape()), "); pass a constant options.attn_bias");
    QKV_CHECK_ARG(!drop, "[", o.op, "] relative attention has no weight dropout (", o.dropout, " in training mode)");
    QKV_CHECK_ARG(Hq == Hkv, "[", o.op, "] relative attention has no grouped-query heads: q ", shape_of(q), ", k ",
                  shape_of(k));
  } else {
    QKV_CHECK_ARG(!o.rel_v.defined(), "[", o.op, "] rel_v ", str(o.rel_v.value.shape()), " is given without rel_k");
  }
  QKV_CHECK_ARG(!o.head_mask.defined() || o.head_mask.shape() == Shape{Hq}, "[", o.op, "] head_mask ",
                o.head_mask.defined() ? str(o.head_mask.shape()) : "()", " must be (num_heads,) = ", str(Shape{Hq}));
  const bool global_rotary = o.rotary.positions != nullptr || o.rotary.table != nullptr;
  QKV_CHECK_ARG(shard == nullptr || (!drop && o.weights == AttendWeights::kNone && cache == nullptr &&
                                     !o.bias.defined() && (!o.rotary.enabled || global_rotary) &&
                                     !o.rel_k.defined() && a.window_left < 0 && a.window_right < 0),
                "[", o.op, "] with the sequence split across processes (context parallelism), query ", shape_of(q),
                ": attention runs around the ring, which has no weight dropout, weights, KV cache, trained bias, "
                "sliding window, rotary without the rows' global positions, or relative positions");
  const bool on_tape = q.requires_grad() || k.requires_grad() || v.requires_grad() || o.bias.requires_grad() ||
                       o.rel_k.requires_grad() || o.rel_v.requires_grad();
  QKV_CHECK_ARG(cache == nullptr || !on_tape, "[", o.op, "] kv_cache is for inference; the Context records a tape");

  // --- rotary positions: the new rows follow the cache's -------------------------------------------------------
  const int64_t cached = cache != nullptr && cache->ready() ? cache->length() : 0;
  QKV_CHECK_ARG(o.offset < 0 || fixed || cache == nullptr || o.offset == cached, "[", o.op, "] the KV cache holds ",
                cached, " positions; the new rows ", shape_of(k), " were given offset ", o.offset);
  if (o.rotary.enabled) rotate(c, q, k, o.offset >= 0 ? o.offset : cached, o);

  // --- the cache: append the new rows, read every position -----------------------------------------------------
  AttentionOptions ao = a;
  ao.enable_gqa = Hq != Hkv;
  if (drop) {
    QKV_CHECK_ARG(c.dropout_rng() != nullptr, "[", o.op, "] dropout ", o.dropout,
                  " in training mode needs a dropout Rng in the Context");
    ao.dropout_p = o.dropout;
    ao.dropout_rng = c.dropout_rng();
  }
  AttendResult result;
  if (cache != nullptr && !fixed) {
    if (!cache->ready()) cache->reset(B, Hkv, k.size(3));
    QKV_CHECK_ARG(cache->rows() == B, "[", o.op, "] the KV cache holds ", cache->rows(), " rows; the new keys are ",
                  shape_of(k));
    const bool in_place = !a.mask.defined() && !o.bias.defined() && !o.rel_k.defined() && !drop &&
                          o.weights != AttendWeights::kWithOutput;
    QKV_CHECK_ARG(in_place || !cache->ragged(), "[", o.op, "] a ragged KV cache (rows at different lengths) is read "
                  "in place: no mask, bias, relative positions, dropout or weights with the output (q ", shape_of(q),
                  ")");
    // bf16: the cache holds the rounded keys and values, as the op would round them at every step (a bf16 cache
    // rounds them itself).
    const bool pairs = cache->storage() == Precision::kBFloat16;
    const bool bf16 = a.precision == Precision::kBFloat16 && !pairs;
    cache->append(bf16 ? round_to_bf16(k.value) : k.value, bf16 ? round_to_bf16(v.value) : v.value);
    // The storage read in place by the fused kernel: the pages (q as (B, Tq, Hq, D), out (B, Tq, Hq, D)), or a
    // contiguous bf16 cache's words. A contiguous float32 cache's keys() are a view: read by the op below.
    if (in_place && (cache->paged() || pairs)) {
      if (o.weights != AttendWeights::kNone) result.weights = probabilities(q.value, cache->keys(), ao, Tensor());
      Tensor out;
      if (cache->paged()) {
        std::vector<int32_t> lens(static_cast<size_t>(B));
        for (int64_t r = 0; r < B; ++r) lens[static_cast<size_t>(r)] = static_cast<int32_t>(cache->row_length(r));
        AttentionOptions po = a;
        po.enable_gqa = false;  // implied by the pages' heads
        Tensor kp = cache->key_pages(), vp = cache->value_pages();
        out = attention_with_kvcache(q.value.transpose(1, 2), kp, vp, Tensor(), Tensor(), lens, cache->block_table(),
                                     cache->max_pages(), po, cache->storage())
                  .out.transpose(1, 2);
      } else {
        const int64_t len = cache->length();
        out = attention_kv_bf16(q.value, cache->key_pages().slice(2, 0, len), cache->value_pages().slice(2, 0, len),
                                ao)
                  .out;
      }
      result.out = ad::Var(out);
      if (o.head_mask.defined()) result.out = ad::mul(result.out, ad::Var(o.head_mask.reshape({1, Hq, 1, 1})));
      return result;
    }
    k = ad::Var(cache->keys());
    v = ad::Var(cache->values());
  }

  // --- the op (B, Hq, Tq, Dv) ----------------------------------------------------------------------------------
  const int64_t Tk = k.size(2);
  ad::Var attn;
  if (o.rel_k.defined() && B * Tq * Tk > 0) {
    // Shaw relative attention, composed on the tape; with a cache the new queries sit at Tk - Tq + i.
    const int64_t offset = cache != nullptr ? Tk - Tq : 0;
    attn = ad::relative_attention(q, k, v, o.rel_k, o.rel_v, clip, ao, offset);
    if (o.weights != AttendWeights::kNone) {
      AttentionOptions wo = ao;
      wo.return_weights = true;
      result.weights =
          relative_attention(q.value, k.value, v.value, o.rel_k.value, o.rel_v.value, clip, wo, offset).weights;
    }
  } else if (!on_tape && (o.weights == AttendWeights::kWithOutput || drop)) {
    // Weights with the output, or dropped weights (the op drops them, as PyTorch, and returns the dropped ones).
    AttentionOptions wo = with_additive_bias(ao, o.bias.value);
    wo.return_weights = true;
    AttentionResult r = attention(q.value, k.value, v.value, wo);
    result.weights = r.weights;
    attn = ad::Var(r.out);
  } else {
    // The fused kernel: one node on a tape (composed there only for weight dropout or a trained bias).
    if (o.weights != AttendWeights::kNone) result.weights = probabilities(q.value, k.value, ao, o.bias.value);
    ad::AttentionExtras ex;
    ex.bias = o.bias;
    attn = shard != nullptr ? shard->attention(q, k, v, ao) : ad::attention(q, k, v, ao, ex);
  }
  if (o.head_mask.defined()) attn = ad::mul(attn, ad::Var(o.head_mask.reshape({1, Hq, 1, 1})));
  result.out = attn;
  return result;
}

}  // namespace qkv::nn
