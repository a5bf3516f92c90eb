// Attention over packed variable-length batches (FlashAttention-2's varlen API) and over a paged KV cache for
// decoding. Both run the fused kernel of qkv/kernels/attention_flash.h on strided views, one sequence at a time: no
// padded position is ever computed, and K/V are read in place.
#pragma once

#include <cstdint>
#include <span>

#include "qkv/core/attention_types.h"
#include "qkv/core/tensor.h"

namespace qkv {

// q: (total_q, Hq, Dk)  k: (total_k, Hkv, Dk)  v: (total_k, Hkv, Dv): B sequences packed along dim 0, sequence b
// taking rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q and [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k and v.
// cu_seqlens_*: B + 1 non-decreasing offsets from 0 to total_*; every length at most max_seqlen_*.
// Hq % Hkv == 0 (GQA/MQA when they differ: query head h reads kv head h / (Hq / Hkv)).
// options: causal, window_*, softcap, scale, return_lse as for attention() within each sequence (causal
// kBottomRight is FlashAttention's); no mask (its shape would be per sequence). enable_gqa is implied.
// -> out (total_q, Hq, Dv); lse (Hq, total_q) when return_lse (FlashAttention's layout; -inf on a row that sees no
// key, whose out is 0). A sequence with no key gives zeros.
AttentionResult attention_varlen(const Tensor& q, const Tensor& k, const Tensor& v,
                                 std::span<const int32_t> cu_seqlens_q, std::span<const int32_t> cu_seqlens_k,
                                 int64_t max_seqlen_q, int64_t max_seqlen_k, const AttentionOptions& options = {});

// Backward of attention_varlen: out and lse (Hq, total_q) are its results (computed with return_lse), d_out has
// out's shape. -> dq, dk, dv with the shapes of q, k, v (dK, dV summed over each GQA group).
AttentionGrads attention_varlen_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                         const Tensor& lse, const Tensor& d_out,
                                         std::span<const int32_t> cu_seqlens_q,
                                         std::span<const int32_t> cu_seqlens_k, int64_t max_seqlen_q,
                                         int64_t max_seqlen_k, const AttentionOptions& options = {});

// Decoding against a KV cache, FlashAttention's flash_attn_with_kvcache.
// q: (B, Tq, Hq, Dk). k_cache, v_cache: (num_blocks, block_size, Hkv, D), contiguous; sequence b's logical block i
// is physical block block_table[b * max_blocks + i]. An empty block_table is a contiguous cache (B, max_len, Hkv, D):
// block b of size max_len for sequence b. cache_seqlens (B): the keys already cached per sequence (empty: all
// max_blocks · block_size, or max_len, are). k_new, v_new (B, Tnew, Hkv, D) or undefined: written into the caches
// in place at positions cache_seqlens[b] .. + Tnew (the caller advances cache_seqlens, as in FlashAttention).
// Then each sequence attends over its cache_seqlens[b] + Tnew keys, read in place block by block.
// options: causal (kBottomRight is FlashAttention's: the last query sees every key), window_*, softcap, scale;
// no mask. Hq % Hkv == 0 (GQA). -> out (B, Tq, Hq, Dv); lse (B, Hq, Tq) when return_lse.
// precision kBFloat16: q and the appended k_new / v_new are rounded to bf16 (what the cache then holds), as
// attention() rounds its inputs; keys cached before are read as they are (append them at bf16 too).
// Batch invariance: each sequence's out and lse are the same bits whatever the other sequences of the call and the
// thread count (one fixed reduction order over its keys: they are never split across threads).
// cache_storage kBFloat16: the caches hold bf16 pairs (a bf16 nn::KvCache's pages, qkv::to_bf16_pairs), their last
// dim D / 2 words; k_new and v_new are rounded into them, and the attention is the float32 one over those bf16
// values (half the bytes read). kInt8 is refused.
AttentionResult attention_with_kvcache(const Tensor& q, Tensor& k_cache, Tensor& v_cache, const Tensor& k_new,
                                       const Tensor& v_new, std::span<const int32_t> cache_seqlens,
                                       std::span<const int32_t> block_table, int64_t max_blocks,
                                       const AttentionOptions& options = {},
                                       Precision cache_storage = Precision::kFloat32);

}  // namespace qkv
