// attention_varlen: one fused-kernel call per packed sequence on (H, T, D) views of the (total, H, D) inputs;
// attention_with_kvcache: the in-place append, then one paged fused forward per sequence.
#include "qkv/ops/attention_varlen.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/lowp.h"

namespace qkv {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The packed operands as the kernel reads them: rounded to bf16 at precision kBFloat16 (as attention_fused rounds
// its inputs), else the tensors themselves.
struct Rounded {
  std::vector<Tensor> t;
  Rounded(const AttentionOptions& o, std::initializer_list<const Tensor*> xs) {
    for (const Tensor* x : xs) t.push_back(o.precision == Precision::kBFloat16 ? round_to_bf16(*x) : *x);
  }
};

std::string offsets_str(std::span<const int32_t> cu) {
  std::string s = "[";
  for (size_t i = 0; i < cu.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(cu[i]);
  return s + (cu.size() > 8 ? ", ...]" : "]");
}

void check_offsets(std::span<const int32_t> cu, int64_t total, int64_t max_len, const char* name, const char* op,
                   const Tensor& t) {
  QKV_CHECK_ARG(cu.size() >= 2, "[", op, "] ", name, " ", offsets_str(cu),
                " must hold B + 1 >= 2 offsets (one sequence at least)");
  QKV_CHECK_ARG(cu[0] == 0, "[", op, "] ", name, " ", offsets_str(cu), " must start at 0");
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    QKV_CHECK_ARG(cu[b + 1] >= cu[b], "[", op, "] ", name, " ", offsets_str(cu),
                  " must be non-decreasing: entry ", b + 1, " (", cu[b + 1], ") < entry ", b, " (", cu[b], ")");
    QKV_CHECK_ARG(cu[b + 1] - cu[b] <= max_len, "[", op, "] sequence ", b, " of ", name, " has length ",
                  cu[b + 1] - cu[b], " > max_seqlen ", max_len);
  }
  QKV_CHECK_ARG(cu.back() == total, "[", op, "] the last entry of ", name, " (", cu.back(),
                ") must equal the packed length ", total, " of ", str(t.shape()));
}

struct Packed {
  int64_t nseq = 0, hq = 0, hkv = 0, dk = 0, dv = 0, total_q = 0, total_k = 0;
};

Packed check_varlen(const Tensor& q, const Tensor& k, const Tensor& v, std::span<const int32_t> cu_q,
                    std::span<const int32_t> cu_k, int64_t max_q, int64_t max_k, const AttentionOptions& o,
                    const char* op) {
  QKV_CHECK_ARG(q.defined() && k.defined() && v.defined(), "[", op, "] q, k and v must be defined tensors");
  QKV_CHECK_ARG(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "[", op, "] q ", str(q.shape()), ", k ",
                str(k.shape()), " and v ", str(v.shape()), " must be packed as (total_tokens, heads, D)");
  QKV_CHECK_ARG(q.size(2) == k.size(2) && k.size(0) == v.size(0) && k.size(1) == v.size(1), "[", op, "] q ",
                str(q.shape()), ", k ", str(k.shape()), " and v ", str(v.shape()),
                ": q and k must share D, k and v their tokens and heads");
  QKV_CHECK_ARG(k.size(1) > 0 && q.size(1) % k.size(1) == 0 && q.size(2) > 0 && v.size(2) > 0, "[", op,
                "] the query heads of q ", str(q.shape()), " must be a multiple of the kv heads of k ",
                str(k.shape()), ", and D, Dv nonzero");
  QKV_CHECK_ARG(!o.mask.defined() && o.mask_kind == MaskKind::kNone, "[", op,
                "] takes no mask (q ", str(q.shape()), "): use causal, the window or per-sequence lengths");
  QKV_CHECK_ARG(cu_q.size() == cu_k.size(), "[", op, "] cu_seqlens_q ", offsets_str(cu_q), " and cu_seqlens_k ",
                offsets_str(cu_k), " must have the same length B + 1");
  QKV_CHECK_ARG(max_q >= 0 && max_k >= 0, "[", op, "] max_seqlen_q ", max_q, " and max_seqlen_k ", max_k,
                " must be >= 0");
  check_offsets(cu_q, q.size(0), max_q, "cu_seqlens_q", op, q);
  check_offsets(cu_k, k.size(0), max_k, "cu_seqlens_k", op, k);
  QKV_CHECK_ARG(o.window_left >= -1 && o.window_right >= -1, "[", op, "] window_size (", o.window_left, ", ",
                o.window_right, ") must be >= -1 on each side");
  QKV_CHECK_ARG(std::isfinite(o.softcap) && o.softcap >= 0.0f, "[", op, "] softcap ", o.softcap,
                " must be finite and >= 0");
  QKV_CHECK_ARG(!o.scale || std::isfinite(*o.scale), "[", op, "] scale must be finite");
  Packed p;
  p.nseq = static_cast<int64_t>(cu_q.size()) - 1;
  p.hq = q.size(1), p.hkv = k.size(1), p.dk = q.size(2), p.dv = v.size(2);
  p.total_q = q.size(0), p.total_k = k.size(0);
  return p;
}

// (total, H, D) rows [a, b) as (H, b - a, D): a strided view, nothing copied.
Tensor seq_view(const Tensor& t, int64_t a, int64_t b) { return t.slice(0, a, b).transpose(0, 1); }

// Runs body(b, config) for every sequence: many sequences share the threads (one kernel thread each, longest
// first would need sorting; dynamic scheduling balances them), few sequences each take every thread.
template <typename Body>
void for_each_sequence(int64_t nseq, const Body& body) {
  const int threads = std::max(1, omp_get_max_threads());
  if (nseq >= 2 * threads) {
    kernels::FlashConfig one;
    one.threads = 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t b = 0; b < nseq; ++b) body(b, one);
  } else {
    for (int64_t b = 0; b < nseq; ++b) body(b, kernels::FlashConfig{});
  }
}

AttentionOptions kernel_options(const AttentionOptions& o, const Packed& p) {
  AttentionOptions k = o;
  k.enable_gqa = p.hq != p.hkv;
  k.return_weights = false;
  return k;
}

}  // namespace

AttentionResult attention_varlen(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                 std::span<const int32_t> cu_q, std::span<const int32_t> cu_k, int64_t max_q,
                                 int64_t max_k, const AttentionOptions& options) {
  const char* op = "attention_varlen";
  const Packed p = check_varlen(q_in, k_in, v_in, cu_q, cu_k, max_q, max_k, options, op);
  const AttentionOptions o = kernel_options(options, p);
  const float scale = attention_scale(options, p.dk);
  const Rounded in(options, {&q_in, &k_in, &v_in});
  const Tensor &q = in.t[0], &k = in.t[1], &v = in.t[2];
  AttentionResult r;
  r.out = Tensor::empty({p.total_q, p.hq, p.dv});  // every row is written below: no zero-fill pass
  Tensor lse = Tensor::empty({p.hq, p.total_q});
  float* out = r.out.data();
  float* lp = lse.data();
  const Shape batch{p.hq};
  for_each_sequence(p.nseq, [&](int64_t b, const kernels::FlashConfig& cfg) {
    const int64_t qa = cu_q[b], qb = cu_q[b + 1], ka = cu_k[b], kb = cu_k[b + 1], tq = qb - qa;
    if (tq == 0) return;
    if (kb == ka) {  // no key: out 0, lse -inf
      std::fill(out + qa * p.hq * p.dv, out + qb * p.hq * p.dv, 0.0f);
      for (int64_t h = 0; h < p.hq; ++h) std::fill(lp + h * p.total_q + qa, lp + h * p.total_q + qb, kNegInf);
      return;
    }
    const AttentionResult s = kernels::attention_flash_forward(seq_view(q, qa, qb), seq_view(k, ka, kb),
                                                               seq_view(v, ka, kb), o, batch, scale, cfg);
    const float* so = s.out.data();  // (Hq, tq, Dv)
    const float* sl = s.lse.data();  // (Hq, tq)
    for (int64_t h = 0; h < p.hq; ++h)
      for (int64_t i = 0; i < tq; ++i) {
        std::copy(so + (h * tq + i) * p.dv, so + (h * tq + i + 1) * p.dv, out + ((qa + i) * p.hq + h) * p.dv);
        lp[h * p.total_q + qa + i] = sl[h * tq + i];
      }
  });
  if (options.return_lse) r.lse = lse;
  return r;
}

AttentionGrads attention_varlen_backward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                         const Tensor& out, const Tensor& lse, const Tensor& d_out,
                                         std::span<const int32_t> cu_q,
                                         std::span<const int32_t> cu_k, int64_t max_q, int64_t max_k,
                                         const AttentionOptions& options) {
  const char* op = "attention_varlen_backward";
  const Packed p = check_varlen(q_in, k_in, v_in, cu_q, cu_k, max_q, max_k, options, op);
  const Shape out_shape{p.total_q, p.hq, p.dv}, lse_shape{p.hq, p.total_q};
  QKV_CHECK_ARG(out.defined() && out.shape() == out_shape, "[", op, "] out ",
                out.defined() ? str(out.shape()) : "(undefined)", " must be (total_q, Hq, Dv) = ", str(out_shape));
  QKV_CHECK_ARG(d_out.defined() && d_out.shape() == out_shape, "[", op, "] d_out ",
                d_out.defined() ? str(d_out.shape()) : "(undefined)", " must be (total_q, Hq, Dv) = ",
                str(out_shape));
  QKV_CHECK_ARG(lse.defined() && lse.shape() == lse_shape, "[", op, "] lse ",
                lse.defined() ? str(lse.shape()) : "(undefined)", " must be (Hq, total_q) = ", str(lse_shape));
  const AttentionOptions o = kernel_options(options, p);
  const float scale = attention_scale(options, p.dk);
  // bf16: the inputs and d_out rounded as the forward rounded its inputs; the kernel rounds P and dS.
  const Rounded in(options, {&q_in, &k_in, &v_in, &d_out});
  const Tensor &q = in.t[0], &k = in.t[1], &v = in.t[2], &g_out = in.t[3];
  AttentionGrads g;
  g.dq = Tensor::zeros(q.shape());
  g.dk = Tensor::zeros(k.shape());
  g.dv = Tensor::zeros(v.shape());
  float* dq = g.dq.data();
  float* dk = g.dk.data();
  float* dv = g.dv.data();
  const Shape batch{p.hq};
  for_each_sequence(p.nseq, [&](int64_t b, const kernels::FlashConfig& cfg) {
    const int64_t qa = cu_q[b], qb = cu_q[b + 1], ka = cu_k[b], kb = cu_k[b + 1], tq = qb - qa, tk = kb - ka;
    if (tq == 0 || tk == 0) return;  // no pair: no gradient
    const AttentionGrads s = kernels::attention_flash_backward(
        seq_view(q, qa, qb), seq_view(k, ka, kb), seq_view(v, ka, kb), seq_view(out, qa, qb),
        lse.slice(1, qa, qb), seq_view(g_out, qa, qb), o, batch, scale, cfg);
    // s.dq (Hq, tq, Dk), s.dk (Hkv, tk, Dk), s.dv (Hkv, tk, Dv): back into the packed rows of this sequence.
    const auto scatter = [](const Tensor& src, float* dst, int64_t a, int64_t heads, int64_t t, int64_t d) {
      const Tensor c = src.contiguous();
      const float* sp = c.data();
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < t; ++i)
          std::copy(sp + (h * t + i) * d, sp + (h * t + i + 1) * d, dst + ((a + i) * heads + h) * d);
    };
    scatter(s.dq, dq, qa, p.hq, tq, p.dk);
    scatter(s.dk, dk, ka, p.hkv, tk, p.dk);
    scatter(s.dv, dv, ka, p.hkv, tk, p.dv);
  });
  return g;
}

AttentionResult attention_with_kvcache(const Tensor& q, Tensor& k_cache, Tensor& v_cache, const Tensor& k_new,
                                       const Tensor& v_new, std::span<const int32_t> cache_seqlens,
                                       std::span<const int32_t> block_table, int64_t max_blocks,
                                       const AttentionOptions& options, Precision cache_storage) {
  const char* op = "attention_with_kvcache";
  QKV_CHECK_ARG(cache_storage == Precision::kFloat32 || cache_storage == Precision::kBFloat16, "[", op,
                "] cache storage ", precision_name(cache_storage), " is not one of fp32, bf16");
  // bf16 storage: the caches' last dim holds D / 2 words (pairs of bf16).
  const bool pairs = cache_storage == Precision::kBFloat16;
  const int64_t per_word = pairs ? 2 : 1;
  QKV_CHECK_ARG(q.defined() && k_cache.defined() && v_cache.defined(), "[", op, "] q, k_cache and v_cache must be defined");
  QKV_CHECK_ARG(q.dim() == 4 && k_cache.dim() == 4 && v_cache.dim() == 4, "[", op, "] q ", str(q.shape()),
                " must be (B, Tq, Hq, D) and k_cache ", str(k_cache.shape()), ", v_cache ", str(v_cache.shape()),
                " (num_blocks, block_size, Hkv, D)");
  const int64_t B = q.size(0), tq = q.size(1), hq = q.size(2), dk = q.size(3);
  const int64_t nblocks = k_cache.size(0), bs = k_cache.size(1), hkv = k_cache.size(2);
  const int64_t dv = v_cache.size(3) * per_word;
  QKV_CHECK_ARG(k_cache.size(3) * per_word == dk && v_cache.size(0) == nblocks && v_cache.size(1) == bs &&
                    v_cache.size(2) == hkv && hkv > 0 && hq % hkv == 0 && tq > 0 && dk > 0 && dv > 0,
                "[", op, "] q ", str(q.shape()), ", k_cache ", str(k_cache.shape()), " and v_cache ",
                str(v_cache.shape()), ": D must agree (", pairs ? "bf16 caches: D / 2 words" : "float32 caches",
                "), the caches share blocks and heads, Hq a multiple of Hkv");
  QKV_CHECK_ARG(k_cache.is_contiguous() && v_cache.is_contiguous(), "[", op, "] k_cache ", str(k_cache.shape()),
                " and v_cache must be contiguous (they are updated in place)");
  QKV_CHECK_ARG(!options.mask.defined() && options.mask_kind == MaskKind::kNone, "[", op, "] takes no mask (q ",
                str(q.shape()), ")");
  QKV_CHECK_ARG(options.window_left >= -1 && options.window_right >= -1, "[", op, "] window_size (",
                options.window_left, ", ", options.window_right, ") must be >= -1 on each side");
  QKV_CHECK_ARG(std::isfinite(options.softcap) && options.softcap >= 0.0f, "[", op, "] softcap ", options.softcap,
                " must be finite and >= 0");
  QKV_CHECK_ARG(!options.scale || std::isfinite(*options.scale), "[", op, "] scale must be finite");
  // The block table, or the contiguous cache's one block per sequence.
  std::vector<int32_t> own;
  if (block_table.empty()) {
    QKV_CHECK_ARG(nblocks == B, "[", op, "] without a block_table the caches ", str(k_cache.shape()),
                  " must be (B, max_len, Hkv, D) with B = ", B, " of q ", str(q.shape()));
    for (int64_t b = 0; b < B; ++b) own.push_back(static_cast<int32_t>(b));
    block_table = own;
    max_blocks = 1;
  }
  QKV_CHECK_ARG(max_blocks > 0 && static_cast<int64_t>(block_table.size()) == B * max_blocks, "[", op,
                "] block_table has ", block_table.size(), " entries; (B, max_blocks) = (", B, ", ", max_blocks,
                ") needs ", B * max_blocks);
  for (int32_t blk : block_table)
    QKV_CHECK_ARG(blk >= 0 && blk < nblocks, "[", op, "] block_table entry ", blk, " is outside [0, ", nblocks,
                  ") of k_cache ", str(k_cache.shape()));
  const int64_t capacity = max_blocks * bs;
  QKV_CHECK_ARG(cache_seqlens.empty() || static_cast<int64_t>(cache_seqlens.size()) == B, "[", op,
                "] cache_seqlens has ", cache_seqlens.size(), " entries for B = ", B);
  const bool append = k_new.defined() || v_new.defined();
  int64_t tnew = 0;
  if (append) {
    QKV_CHECK_ARG(k_new.defined() && v_new.defined() && k_new.dim() == 4 && v_new.dim() == 4 &&
                      k_new.size(0) == B && k_new.size(2) == hkv && k_new.size(3) == dk &&
                      v_new.shape() == Shape({B, k_new.size(1), hkv, dv}),
                  "[", op, "] k ", k_new.defined() ? str(k_new.shape()) : "(undefined)", " and v ",
                  v_new.defined() ? str(v_new.shape()) : "(undefined)", " must both be (B, Tnew, Hkv, D) = (", B,
                  ", Tnew, ", hkv, ", ", dk, "/", dv, ")");
    tnew = k_new.size(1);
  }
  std::vector<int64_t> lens(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t cached = cache_seqlens.empty() ? capacity - tnew : cache_seqlens[static_cast<size_t>(b)];
    QKV_CHECK_ARG(cached >= 0 && cached + tnew <= capacity, "[", op, "] sequence ", b, ": ", cached,
                  " cached keys + ", tnew, " new ones exceed the capacity ", capacity, " (max_blocks ", max_blocks,
                  " x block_size ", bs, ")");
    lens[static_cast<size_t>(b)] = cached + tnew;
  }
  // Append in place: the row of position p of sequence b is block table[b][p / bs], row p % bs.
  const bool bf16 = options.precision == Precision::kBFloat16;
  if (append) {  // bf16 storage: the new rows as pairs of bf16 (rounded once, as a bf16 KvCache appends them)
    const auto stored = [&](const Tensor& x) {
      return pairs ? to_bf16_pairs(x) : bf16 ? round_to_bf16(x) : x.contiguous();
    };
    const Tensor kc = stored(k_new), vc = stored(v_new);
    const int64_t kw = hkv * dk / per_word, vw = hkv * dv / per_word;  // floats (or words) a position
    float* kd = k_cache.data();
    float* vd = v_cache.data();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < tnew; ++t) {
        const int64_t pos = lens[static_cast<size_t>(b)] - tnew + t;
        const int64_t blk = block_table[static_cast<size_t>(b * max_blocks + pos / bs)];
        const int64_t row = blk * bs + pos % bs;
        std::copy(kc.data() + (b * tnew + t) * kw, kc.data() + (b * tnew + t + 1) * kw, kd + row * kw);
        std::copy(vc.data() + (b * tnew + t) * vw, vc.data() + (b * tnew + t + 1) * vw, vd + row * vw);
      }
  }
  const float scale = attention_scale(options, dk);
  AttentionOptions o = options;
  o.return_weights = false;
  AttentionResult r;
  r.out = Tensor::zeros({B, tq, hq, dv});
  Tensor lse = Tensor::empty({B, hq, tq});
  float* out = r.out.data();
  float* lp = lse.data();
  const Tensor qr = bf16 ? round_to_bf16(q) : q;
  // Keys never split across threads: a sequence's bits do not depend on the batch around it or the thread count
  // (a server's continuous batching gives a request the same reply alone or among others).
  for_each_sequence(B, [&](int64_t b, const kernels::FlashConfig& team) {
    kernels::FlashConfig cfg = team;
    cfg.split_keys = false;
    cfg.kv_bf16 = pairs;
    const int64_t tk = lens[static_cast<size_t>(b)];
    if (tk == 0) {  // nothing cached: zeros, lse -inf
      std::fill(lp + b * hq * tq, lp + (b + 1) * hq * tq, kNegInf);
      return;
    }
    kernels::KvPages kv;
    kv.k_cache = k_cache;
    kv.v_cache = v_cache;
    kv.block_table = block_table.data() + b * max_blocks;
    kv.tk = tk;
    const AttentionResult s =
        kernels::attention_flash_forward_paged(qr.select(0, b).transpose(0, 1), kv, o, scale, cfg);
    const float* so = s.out.data();  // (Hq, Tq, Dv)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < tq; ++i)
        std::copy(so + (h * tq + i) * dv, so + (h * tq + i + 1) * dv, out + ((b * tq + i) * hq + h) * dv);
    std::copy(s.lse.data(), s.lse.data() + hq * tq, lp + b * hq * tq);
  });
  if (options.return_lse) r.lse = lse;
  return r;
}

}  // namespace qkv
