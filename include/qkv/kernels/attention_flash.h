// Fused O(T)-memory attention on the CPU (FlashAttention-2): tiled forward with an online softmax that keeps the
// log-sum-exp, and the backward that recomputes the scores block by block from it. Never materialises Tq x Tk.
#pragma once

#include <cstdint>

#include "qkv/core/attention_types.h"

namespace qkv::kernels {

// Which microkernels run. kAuto picks the widest set active_isa() allows (qkv/kernels/cpu.h: AVX512-BF16, which is
// the AVX-512 set plus the bf16 products that precision kBFloat16 runs on vdpbf16ps, else AVX-512 F/BW/DQ/VL, else
// AVX2+FMA (avx2vnni included), else portable; QKV_ISA caps it). A named set runs whatever QKV_ISA says, and throws
// std::runtime_error when the CPU lacks it.
// kAmx: the avx512bf16 set with its bf16 products on AMX tiles (tdpbf16ps; the CPU must have AMX and Linux must
// have granted the tile data). kAmxEmulated: the same walk over an emulated tile unit in plain loops, for tests on
// any AVX512-BF16 CPU (slow: not for use).
enum class FlashIsa { kAuto, kPortable, kAvx2, kAvx512, kAvx512Bf16, kAmx, kAmxEmulated };

struct FlashConfig {
  FlashIsa isa = FlashIsa::kAuto;
  int threads = 0;  // 0 = omp_get_max_threads(); results are bit-identical across runs for a given count
  // Multiply-adds per started thread: smaller problems start fewer threads (never changes the results).
  // 0 starts every thread whatever the size (tests, sanitizers). 2^18 is about 5 us of one core's fp32 products, as
  // the gated MLP's threshold: a decoding step's attention over 600 cached keys (charged 3.5 M, kWeightReadWork per
  // K/V element) takes both threads, where 2^21 kept it on one while the other waited.
  double min_work_per_thread = 1 << 18;
  // Tile sizes (queries x keys) of the forward and the backward; 0 = the tuned default. Positive multiples of 8.
  int64_t fwd_q_tile = 0, fwd_k_tile = 0, bwd_q_tile = 0, bwd_k_tile = 0;
  // false: the forward never splits a query tile's keys (it splits them when the query tiles are too few for a
  // fixed team of 4, as in decoding; the splits, hence the bits, never depend on the threads at hand). The paged
  // decoding path (attention_with_kvcache) does not split, so a sequence has the same bits alone or batched.
  bool split_keys = true;
  // k and v (or a KvPages' caches) hold bf16 pairs, as a bf16 KV cache stores them (nn::KvCache,
  // qkv::to_bf16_pairs): (..., Tk, D/2) float-sized words, element 2i of a row in the low half of word i. The
  // forward widens each key and value tile to float32 right before its products: the same bits as over float32
  // k and v holding those bf16 values, with half the bytes read. Forward only.
  bool kv_bf16 = false;
};

// Name of the microkernel set `isa` resolves to on this CPU: "avx512", "avx2" or "portable".
const char* flash_isa_name(FlashIsa isa = FlashIsa::kAuto);

// q: (..., Tq, Dk)  k: (..., Tk, Dk)  v: (..., Tk, Dv)  ->  out: (batch..., Tq, Dv), lse: (batch..., Tq)
// `batch` is attention_check's broadcast batch shape, `scale` the effective scale. Inputs: any strides whose last
// dim is contiguous (others are copied). The lse is always returned (-inf on a fully masked row, whose out is 0).
// options.return_weights is ignored (the fused path never forms the weights). Extra memory O(threads · tile).
AttentionResult attention_flash_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionOptions& options, const Shape& batch, float scale,
                                        const FlashConfig& config = {});

// One sequence's paged KV cache for attention_flash_forward_paged.
struct KvPages {
  Tensor k_cache, v_cache;               // (num_blocks, block_size, Hkv, Dk / Dv), contiguous
  const int32_t* block_table = nullptr;  // physical block of each logical block: ceil(tk / block_size) entries
  int64_t tk = 0;                        // keys of this sequence (> 0)
};

// q: (Hq, Tq, Dk), any strides with a contiguous last dim, against the first kv.tk keys of the cache, read in place
// block by block (a key tile never crosses a block)  ->  out (Hq, Tq, Dv), lse (Hq, Tq). Hq % Hkv == 0 (GQA).
// options: causal, window_*, softcap, no mask. Forward only: the decoding path (qkv::attention_with_kvcache).
AttentionResult attention_flash_forward_paged(const Tensor& q, const KvPages& kv, const AttentionOptions& options,
                                              float scale, const FlashConfig& config = {});

// q, k, v as above; out, d_out: (batch..., Tq, Dv); lse: (batch..., Tq) from attention_flash_forward (or any
// forward: natural-log LSE, -inf for a fully masked row).  ->  dq, dk, dv with the shapes of q, k, v (summed over
// the batch axes each one was broadcast along). Fully masked rows give zero gradient. Deterministic: no atomics.
AttentionGrads attention_flash_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                        const Tensor& lse, const Tensor& d_out, const AttentionOptions& options,
                                        const Shape& batch, float scale, const FlashConfig& config = {});

}  // namespace qkv::kernels
