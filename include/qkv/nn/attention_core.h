// nn::attend: the one multi-head attention core under nn::MultiheadAttention (torch's names) and
// models::LlamaAttention (HF's names). Heads in, heads out: rotary positions, the KV cache's append and read, the
// sequence shard, the op (qkv::attention / ad::attention, which own what attention means) and the probabilities.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "qkv/core/attention_types.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/context.h"
#include "qkv/nn/kv_cache.h"
#include "qkv/ops/autograd.h"
#include "qkv/ops/positional/rope.h"

namespace qkv::nn {

// Where the attention weights come from when they are asked for. Both are (B, Hq, Tq, Tk), never differentiated.
enum class AttendWeights {
  kNone,
  // Off a tape, the op returns them with the output in one pass (its reference path; after weight dropout, as
  // PyTorch's MultiheadAttention). On a tape the output keeps the fused node and they are recomputed (pre-dropout).
  kWithOutput,
  // The output from the fused kernel (or the in-place paged read); the probabilities recomputed beside it from q
  // and the keys under the same options (pre-dropout). What a model's output_attentions asks for.
  kRecomputed,
};

// Rotary positions (RoPE) on the queries and the new keys, before the keys enter the cache.
struct AttendRotary {
  bool enabled = false;
  float base = 10000.0f;
  RopeScaling scaling;                             // linear / llama3 / yarn (default: none)
  RopeVariant variant = RopeVariant::kHalfSplit;   // HF's rotate_half pairing
  // The angles of the new keys' Tn rows, made once by a model for all its layers; null: made here from base and
  // scaling at `positions`, else at offset .. offset + Tn - 1. A ragged cache's rows get their own (made here).
  // Per-row positions (a left-padded batch, transformers' position_ids (B, Tn)): a table of B·Tn rows, or B·Tn
  // positions, row b's at [b·Tn, (b + 1)·Tn); the queries are among the new rows then (query_first + Tq <= Tn).
  std::shared_ptr<const RopeTable> table;
  // Tn positions shared by the rows (context parallelism: the global ones), B·Tn (one set per row), or null.
  const std::vector<int64_t>* positions = nullptr;
};

struct AttendOptions {
  const char* op = "attend";  // the caller's name, first in every error ("[MultiheadAttention] ...")
  // Handed to the op as they are: mask (any kind, broadcast to (B, Hq, Tq, Tk)), causal, scale, window, softcap,
  // precision, allow_empty. attend sets enable_gqa from the head counts and the dropout fields from `dropout`.
  AttentionOptions attention;
  ad::Var bias;          // an additive score bias broadcast to (B, Hq, Tq, Tk) that may take a gradient (T5)
  float dropout = 0.0f;  // weight dropout p in [0, 1), drawn from c.dropout_rng() (the caller passes 0 in eval)
  AttendRotary rotary;
  // The position of the first new key row: -1 = the cache's length (0 without a cache). With a cache, a given
  // offset must equal its length.
  int64_t offset = -1;
  // The queries' place among the new rows, for their rotary angles: q row i sits at new row query_first + i (0: the
  // first rows, torch's convention; Tn - Tq: the last rows, a prefill that needs the last rows' outputs only).
  int64_t query_first = 0;
  // Incremental decoding (inference only). The new keys and values (rounded to bf16 first at bf16 precision, as the
  // op would round them) are appended (the cache is reset for (B, Hkv, D) on first use) and the queries attend to
  // every cached position; causal masks should align bottom-right. A paged cache is read in place (a ragged one,
  // rows at different lengths, only so: no mask, bias, dropout or kWithOutput weights then), each row's rotary
  // angles starting at its own length. cache_fixed: the cache already holds the keys and values (a fixed memory);
  // k and v are not used and may be undefined.
  KvCache* cache = nullptr;
  bool cache_fixed = false;
  // Shaw et al. relative positions (the one path beside the op: ad::relative_attention composes its scores):
  // rel_k (2·clip+1, D) and rel_v (2·clip+1, Dv) or undefined. Not with cache_fixed, dropout or a trained bias.
  ad::Var rel_k, rel_v;
  Tensor head_mask;  // (Hq): each head's output multiplied by head_mask[h] (the weights are not)
  // Packed variable-length rows: q (N, Hq, D), k, v (N, Hkv, D) hold B sequences end to end, sequence b taking rows
  // [cu_seqlens[b], cu_seqlens[b + 1]); each attends to its own rows only (attention_varlen). No cache, rotary,
  // relative positions, mask, bias, dropout, weights, head_mask or shard then; causal applies within each sequence.
  std::vector<int32_t> cu_seqlens;
  AttendWeights weights = AttendWeights::kNone;
};

struct AttendResult {
  ad::Var out;     // (B, Hq, Tq, Dv) [(N, Hq, Dv) packed]: on the tape when an input is
  Tensor weights;  // (B, Hq, Tq, Tk) when asked for, else undefined
};

// q: (B, Hq, Tq, D)  k: (B, Hkv, Tn, D)  v: (B, Hkv, Tn, Dv), Hq % Hkv == 0 (grouped-query heads read in place)
// ->  out (B, Hq, Tq, Dv) over the Tk = cached + Tn keys. Heads may be strided views of the projections.
// Under c.sequence_shard() (context parallelism) the attention runs across the processes: rotary needs the rows'
// global positions (rotary.positions or rotary.table) and there is no cache, dropout, weights, trained bias,
// window or relative positions. Errors: std::invalid_argument "[<op>] ..." naming the shapes.
AttendResult attend(const Context& c, const ad::Var& q, const ad::Var& k, const ad::Var& v,
                    const AttendOptions& options);

}  // namespace qkv::nn
