// Fused attention on the CPU (FlashAttention-2): the entry points and their drivers. Kernel set choice, the context
// (operands, mask, tile sizes), GQA head stacking, OpenMP work splitting (query tiles, paired causal tiles, split
// keys when there are too few tiles, the backward's key-tile chunks) and the fixed-order merges of their partials.
// The tile math is attention_flash_tiles.cpp.
#include "qkv/kernels/attention_flash.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "attention_flash_impl.h"
#include "attention_flash_kernels.h"
#include "qkv/core/error.h"
#include "qkv/kernels/attention_reference.h"
#include "qkv/kernels/cpu.h"
#include "qkv/kernels/grad.h"

namespace qkv::kernels {
namespace {

using flash::BwdCtx;
using flash::BwdWork;
using flash::ceil_div;
using flash::Ctx;
using flash::FwdWork;
using flash::Kernels;
using flash::kLn2;
using flash::kLog2e;
using flash::kNegInf;
using flash::kPosInf;
using flash::kShortTile;
using flash::kShortTk;
using flash::MaskView;
using flash::Operand;

// The named sets, widest first: what each needs and what a request on a CPU without it says. kAuto takes the first
// that active_isa() (hence QKV_ISA) allows, skipping the emulated tiles (AVX512-VNNI and AVX-VNNI add nothing here:
// avx2vnni runs the AVX2 set; AVX512-BF16 adds the bf16 products, AMX puts them on tiles).
struct NamedSet {
  FlashIsa isa;
  Isa needs;
  bool automatic;
  const Kernels& (*set)();
  const char* refusal;
};
constexpr NamedSet kNamedSets[] = {
    {FlashIsa::kAmx, Isa::kAmx, true, flash::amx_kernels,
     "[attention] the AMX kernels were requested but this CPU lacks AMX or its tile data permission"},
    {FlashIsa::kAmxEmulated, Isa::kAvx512Bf16, false, flash::amx_emulated_kernels,
     "[attention] the emulated AMX kernels were requested but this CPU lacks AVX512-BF16"},
    {FlashIsa::kAvx512Bf16, Isa::kAvx512Bf16, true, flash::avx512bf16_kernels,
     "[attention] the AVX512-BF16 kernels were requested but this CPU lacks them"},
    {FlashIsa::kAvx512, Isa::kAvx512, true, flash::avx512_kernels,
     "[attention] the AVX-512 kernels were requested but this CPU lacks them"},
    {FlashIsa::kAvx2, Isa::kAvx2, true, flash::avx2_kernels,
     "[attention] the AVX2+FMA kernels were requested but this CPU lacks them"},
};

const Kernels& pick(FlashIsa isa) {
  if (isa == FlashIsa::kPortable) return flash::portable_kernels();
  const Isa active = active_isa();
  for (const NamedSet& n : kNamedSets) {
    if (n.isa == isa) {
      QKV_CHECK_RUNTIME(cpu_supports(n.needs), n.refusal);
      return n.set();
    }
    if (isa == FlashIsa::kAuto && n.automatic && active >= n.needs) return n.set();
  }
  return flash::portable_kernels();
}

int thread_count(const FlashConfig& config) {
  return config.threads > 0 ? config.threads : std::max(1, omp_get_max_threads());
}

// Threads actually started for `work` multiply-adds: small problems run on fewer threads (a parallel region costs
// more than they do). Only the team size changes; the work decomposition, hence every result bit, does not.
int team_size(int threads, double work, int64_t items, double work_per_thread) {
  const double by_work = work_per_thread > 0.0 ? std::max(1.0, std::floor(work / work_per_thread)) : threads;
  return static_cast<int>(std::clamp<double>(std::min<double>(by_work, static_cast<double>(items)), 1.0, threads));
}

// group > 1: a GQA kv input whose head h / group serves batch head h (qkv/kernels/attention_reference.h).
Operand operand(const Tensor& t, const Shape& batch, int64_t group = 1) {
  Operand o;
  o.t = (t.size(-1) == 1 || t.stride(-1) == 1) ? t : t.contiguous();
  o.base = o.t.data();
  o.rs = o.t.stride(-2);
  o.offs = matrix_offsets(o.t, batch, group);
  return o;
}

MaskView mask_view(const AttentionOptions& options, const Shape& batch, int64_t tq, int64_t tk) {
  MaskView m;
  m.kind = options.mask_kind;
  if (m.kind == MaskKind::kNone || !options.mask.defined()) {
    m.kind = MaskKind::kNone;
    return m;
  }
  Shape full = batch;
  full.push_back(tq);
  full.push_back(tk);
  const Tensor e = options.mask.expand(full);
  m.op.t = e;
  m.op.base = e.data();
  m.op.rs = e.stride(-2);
  m.cs = e.stride(-1);
  const Shape strides(e.strides().begin(), e.strides().begin() + static_cast<int64_t>(batch.size()));
  m.op.offs.resize(static_cast<size_t>(shape_numel(batch)));
  for_each_offset(batch, strides, [&](int64_t i, int64_t off) { m.op.offs[static_cast<size_t>(i)] = off; });
  return m;
}

// tk >= 0 overrides k's length (a paged cache, whose k and v are placeholders for the first block).
Ctx make_ctx(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
             const Shape& batch, float scale, const FlashConfig& config, int64_t tk = -1) {
  Ctx cx;
  cx.kr = &pick(config.isa);
  cx.tq = q.size(-2);
  cx.tk = tk >= 0 ? tk : k.size(-2);
  cx.dk = q.size(-1);
  cx.kv_bf16 = config.kv_bf16;
  cx.dv = v.size(-1) * (cx.kv_bf16 ? 2 : 1);
  QKV_CHECK_ARG(!cx.kv_bf16 || k.size(-1) * 2 == cx.dk, "[attention] k ", str(k.shape()),
                " of bf16 pairs must hold Dk / 2 words for q ", str(q.shape()));
  const int64_t group = gqa_group(options, k, batch);
  cx.q = operand(q, batch);
  cx.k = operand(k, batch, group);
  cx.v = operand(v, batch, group);
  cx.mask = mask_view(options, batch, cx.tq, cx.tk);
  cx.bounds.causal = options.causal;
  cx.bounds.window_left = options.window_left;
  cx.bounds.window_right = options.window_right;
  cx.causal = options.causal != Causal::kNone;
  cx.bounded = cx.causal || options.window_left >= 0 || options.window_right >= 0;
  cx.scale = scale;
  cx.cap = options.softcap;
  cx.cap2 = static_cast<float>(cx.cap * kLog2e);
  cx.c2 = cx.cap > 0.0f ? static_cast<float>(double{scale} / cx.cap) : static_cast<float>(scale * kLog2e);
  cx.bf16 = options.precision == Precision::kBFloat16 && cx.kr->gemm_bf16 != nullptr;
  cx.bf16_grads = options.precision == Precision::kBFloat16;
  const int64_t tiles[4] = {config.fwd_q_tile, config.fwd_k_tile, config.bwd_q_tile, config.bwd_k_tile};
  for (int64_t t : tiles)
    QKV_CHECK_ARG(t == 0 || (t > 0 && t % 8 == 0), "[attention] tile size ", t,
                  " must be 0 (default) or a positive multiple of 8");
  if (cx.tk <= kShortTk) cx.fk = cx.bq = cx.bk = kShortTile;
  if (config.fwd_q_tile) cx.fq = config.fwd_q_tile;
  if (config.fwd_k_tile) cx.fk = config.fwd_k_tile;
  if (config.bwd_q_tile) cx.bq = config.bwd_q_tile;
  if (config.bwd_k_tile) cx.bk = config.bwd_k_tile;
  return cx;
}

// GQA without a mask stacks each group's query heads as the rows of one tile (Ctx::qdiv): (batch..., Hq, T, C) as
// (batch..., Hkv, T·group, C), row t·group + g holding head g of the group at position t. Causal and window bounds
// stay monotone in the row, and every K/V tile a query tile loads serves the whole group: decoding reads each K/V
// tile once per group, and the backward packs each key tile and accumulates its dK, dV once per group.
bool stacks_heads(int64_t group, const AttentionOptions& options, const Shape& batch) {
  return group > 1 && options.mask_kind == MaskKind::kNone && shape_numel(batch) > 0;
}

Shape group_batch(Shape batch, int64_t group) {
  batch.back() /= group;
  return batch;
}

// x broadcasts to (batch..., T, C); returns the stacked (group_batch..., T·group, C), contiguous.
Tensor stack_heads(const Tensor& x, const Shape& batch, int64_t group) {
  const int64_t t = x.size(-2), c = x.size(-1), hkv = batch.back() / group;
  Shape full = batch, split(batch.begin(), batch.end() - 1), stacked = split;
  full.insert(full.end(), {t, c});
  if (t == 1 && x.shape() == full) {  // decoding: the group's heads are already its rows, in order
    stacked.insert(stacked.end(), {hkv, group, c});
    return x.contiguous().view(stacked);
  }
  split.insert(split.end(), {hkv, group, t, c});
  stacked.insert(stacked.end(), {hkv, t * group, c});
  return x.expand(full).contiguous().view(split).transpose(-3, -2).contiguous().view(stacked);
}

// The inverse of stack_heads: (group_batch..., t·group, C) back to (batch..., t, C), contiguous.
Tensor unstack_heads(const Tensor& x, const Shape& batch, int64_t group, int64_t t) {
  const int64_t c = x.size(-1), hkv = batch.back() / group;
  if (t == 1) {  // one row a head: the stacked rows are already the heads, in order
    Shape full = batch;
    full.insert(full.end(), {1, c});
    return x.contiguous().view(full);
  }
  Shape split(batch.begin(), batch.end() - 1), full = batch;
  split.insert(split.end(), {hkv, t, group, c});
  full.insert(full.end(), {t, c});
  return x.contiguous().view(split).transpose(-3, -2).contiguous().view(full);
}

constexpr int64_t kSplitKeys = 16;
// The team the key splits are made for, whatever the threads at hand, so a row's bits never depend on the thread
// count (the splits decide the merge order). 4 parts' multiples balance 1, 2 and 4 threads.
constexpr int64_t kSplitTeam = 4;

// Key splits per query tile: 1 while there are enough tiles to keep every thread of a kSplitTeam busy and balanced;
// otherwise (decoding one query against a long cache, few heads) the keys of each tile are split and the partial
// (max, sum, output) merged afterwards in a fixed order. Each part is an equal share of its tile's keys (in
// multiples of kSplitKeys), so the fewest parts that are a multiple of the team balance it (3 KV heads: 4 parts
// each, 12 in all) where the keys allow it; more parts would only add each one's setup and merge.
int64_t forward_splits(int64_t units, int64_t team, int64_t max_key_tiles) {
  if (units >= 4 * team || units % team == 0) return 1;
  int64_t s = ceil_div(team, units);
  while (s < max_key_tiles && (units * s) % team != 0) ++s;
  return std::clamp<int64_t>(s, 1, std::max<int64_t>(1, max_key_tiles));
}

}  // namespace

const char* flash_isa_name(FlashIsa isa) { return pick(isa).name; }

static AttentionResult forward(Ctx cx, const Shape& batch, const FlashConfig& config);

AttentionResult attention_flash_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionOptions& options, const Shape& batch, float scale,
                                        const FlashConfig& config) {
  const int64_t group = gqa_group(options, k, batch);
  if (!stacks_heads(group, options, batch)) return forward(make_ctx(q, k, v, options, batch, scale, config), batch, config);
  const int64_t tq = q.size(-2);
  const Shape kv_batch = group_batch(batch, group);
  AttentionOptions o = options;
  o.enable_gqa = false;  // k's heads now match kv_batch
  Ctx cx = make_ctx(stack_heads(q, batch, group), k, v, o, kv_batch, scale, config);
  cx.qdiv = group;
  AttentionResult r = forward(std::move(cx), kv_batch, config);
  r.out = unstack_heads(r.out, batch, group, tq);
  r.lse = unstack_heads(r.lse.unsqueeze(-1), batch, group, tq).squeeze(-1);
  return r;
}

AttentionResult attention_flash_forward_paged(const Tensor& q, const KvPages& kv, const AttentionOptions& options,
                                              float scale, const FlashConfig& config) {
  const char* op = "[attention_with_kvcache]";
  QKV_CHECK_ARG(q.dim() == 3 && kv.k_cache.dim() == 4 && kv.v_cache.dim() == 4, op, " q ", str(q.shape()),
                " must be (Hq, Tq, D) and the caches ", str(kv.k_cache.shape()), ", ", str(kv.v_cache.shape()),
                " (num_blocks, block_size, Hkv, D)");
  QKV_CHECK_ARG(kv.k_cache.is_contiguous() && kv.v_cache.is_contiguous() && kv.block_table && kv.tk > 0, op,
                " the caches must be contiguous, with a block table and tk > 0 (tk ", kv.tk, ")");
  // Placeholders (Hkv, block_size, D) over block 0: make_ctx reads their heads, strides and D; rows come from pages.
  const Tensor k0 = kv.k_cache.select(0, 0).transpose(0, 1), v0 = kv.v_cache.select(0, 0).transpose(0, 1);
  const int64_t hq = q.size(0), hkv = k0.size(0), group = hq / std::max<int64_t>(hkv, 1);
  QKV_CHECK_ARG(hkv > 0 && hq % hkv == 0, op, " the query heads of q ", str(q.shape()),
                " must be a multiple of the kv heads of the cache ", str(kv.k_cache.shape()));
  AttentionOptions o = options;
  o.enable_gqa = true;
  // GQA: the group's heads stacked as the rows of one tile, as in attention_flash_forward, so each block is read
  // once per group.
  const bool stack = stacks_heads(group, o, Shape{hq});
  const Shape batch{stack ? hkv : hq};
  Ctx cx = make_ctx(stack ? stack_heads(q, Shape{hq}, group) : q, k0, v0, o, batch, scale, config, kv.tk);
  if (stack) cx.qdiv = group;
  for (Operand* x : {&cx.k, &cx.v}) {
    x->pages = kv.block_table;
    x->page_rows = kv.k_cache.size(1);
    x->page_stride = kv.k_cache.stride(0);
  }
  AttentionResult r = forward(std::move(cx), batch, config);
  if (stack) {
    r.out = unstack_heads(r.out, Shape{hq}, group, q.size(1));
    r.lse = unstack_heads(r.lse.unsqueeze(-1), Shape{hq}, group, q.size(1)).squeeze(-1);
  }
  return r;
}

// cx by value: the bf16 pairs of K and V are made here and pointed to from it.
static AttentionResult forward(Ctx cx, const Shape& batch, const FlashConfig& config) {
  const int64_t nb = shape_numel(batch), tq = cx.tq, dv = cx.dv;
  Shape out_shape = batch, lse_shape = batch;
  out_shape.push_back(tq);
  out_shape.push_back(dv);
  lse_shape.push_back(tq);
  AttentionResult r;
  r.out = Tensor::empty(out_shape);
  r.lse = Tensor::empty(lse_shape);
  if (nb == 0) return r;
  float* out = r.out.data();
  float* lse = r.lse.data();

  const int threads = thread_count(config);
  const int64_t fq = cx.fq, fk = cx.fk;
  const int64_t nqt = ceil_div(tq, fq);
  // bf16 products: K and V paired once per head where more than one query tile reads them (more than one tile of
  // a head, or heads that share K and V), instead of once per tile that reads them.
  flash::PairedKv paired;
  if (cx.bf16 && cx.fwd_rows() > flash::kSmallQ) {
    paired = flash::pair_kv(cx, nb, nqt, threads);
    if (paired.k != nullptr) cx.paired = &paired;
  }
  const int64_t units = nb * nqt;
  const int64_t splits = config.split_keys ? forward_splits(units, kSplitTeam, ceil_div(cx.tk, fk)) : 1;
  // Work for the team size: the multiply-adds, or, where the rows are few (decoding), the K/V reads, each charged as
  // a weight read (kernels::kWeightReadWork): one query row over 1000 cached keys is memory-bound, not small.
  const int64_t keys = tq > 0 ? std::max<int64_t>(0, cx.key_end(tq - 1) - cx.key_begin(0)) : 0;
  const double work = std::max(static_cast<double>(nb) * static_cast<double>(tq) * static_cast<double>(cx.tk) *
                                   static_cast<double>(cx.dk + dv),
                               static_cast<double>(nb) * static_cast<double>(keys) *
                                   static_cast<double>(cx.dk + dv) * kWeightReadWork);

  if (splits == 1) {
    // Causal: work item p runs query tiles p and nqt-1-p (a cheap and an expensive one), so items cost the same.
    const bool paired = cx.causal && nqt > 1;
    const int64_t per_b = paired ? ceil_div(nqt, 2) : nqt;
    const int64_t items = nb * per_b;
#pragma omp parallel num_threads(team_size(threads, work, items, config.min_work_per_thread))
    {
      FwdWork w(cx);
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < items; ++it) {
        const int64_t p = it / nb, b = it % nb;  // tile-major: the short last tiles come last (balance)
        const int64_t tiles[2] = {p, nqt - 1 - p};
        const int ntiles = (paired && tiles[1] != tiles[0]) ? 2 : 1;
        for (int t = 0; t < ntiles; ++t) {
          const int64_t i0 = tiles[t] * fq, bq = std::min(fq, tq - i0);
          fwd_tile(cx, b, i0, bq, cx.key_begin(i0), cx.key_end(i0 + bq - 1), w);
          fwd_finish(w, bq, dv, out + (b * tq + i0) * dv, lse + b * tq + i0);
        }
      }
    }
    return r;
  }

  // Split keys: partial (m, l, o) per (unit, split), then a fixed-order merge. A part holds the rows a tile has (a
  // decoding step's few query rows, not a whole query tile), and nothing reads it before fwd_tile writes it.
  const int64_t rows = cx.fwd_rows(), part_floats = 2 * rows + rows * dv;
  const std::unique_ptr<float[]> parts(new float[static_cast<size_t>(units * splits * part_floats)]);
#pragma omp parallel num_threads(team_size(threads, work, units * splits, config.min_work_per_thread))
  {
    FwdWork w(cx);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < units * splits; ++it) {
      const int64_t u = it / splits, s = it % splits;
      const int64_t b = u / nqt, i0 = (u % nqt) * fq, bq = std::min(fq, tq - i0);
      const int64_t kbeg = cx.key_begin(i0), kend = std::max(kbeg, cx.key_end(i0 + bq - 1));
      const int64_t per = ceil_div(ceil_div(kend - kbeg, kSplitKeys), splits) * kSplitKeys;
      const int64_t j_begin = std::min(kend, kbeg + s * per), j_end = std::min(kend, kbeg + (s + 1) * per);
      fwd_tile(cx, b, i0, bq, j_begin, j_end, w);
      float* part = parts.get() + it * part_floats;
      std::copy(w.m.begin(), w.m.begin() + bq, part);
      std::copy(w.l.begin(), w.l.begin() + bq, part + rows);
      std::copy(w.o.begin(), w.o.begin() + bq * dv, part + 2 * rows);
    }
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t b = u / nqt, i0 = (u % nqt) * fq, bq = std::min(fq, tq - i0);
      const float* first = parts.get() + u * splits * part_floats;
      for (int64_t i = 0; i < bq; ++i) {
        float mx = kNegInf;
        for (int64_t s = 0; s < splits; ++s) mx = std::max(mx, first[s * part_floats + i]);
        float* orow = out + (b * tq + i0 + i) * dv;
        std::fill(orow, orow + dv, 0.0f);
        float l = 0.0f;
        if (mx > kNegInf) {
          for (int64_t s = 0; s < splits; ++s) {
            const float* part = first + s * part_floats;
            const float wgt = std::exp2(part[i] - mx);  // 0 for a split that saw no key of this row
            l += wgt * part[rows + i];
            const float* src = part + 2 * rows + i * dv;
            for (int64_t c = 0; c < dv; ++c) orow[c] += wgt * src[c];
          }
        }
        if (l > 0.0f || l != l) {  // NaN l: a NaN score took part, out and lse become NaN
          const float inv = 1.0f / l;
          for (int64_t c = 0; c < dv; ++c) orow[c] *= inv;
          lse[b * tq + i0 + i] = static_cast<float>((double{mx} + std::log2(double{l})) * kLn2);
        } else {
          std::fill(orow, orow + dv, 0.0f);
          lse[b * tq + i0 + i] = kNegInf;
        }
      }
    }
  }
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// Backward

namespace {

// Sums `full` (contiguous, shape full_shape) into a tensor of `shape` that broadcasts to it; `full` itself when
// the shapes agree. Serial, so the order of the sum is fixed.
Tensor sum_to(const Tensor& full, const Shape& shape) {
  if (full.shape() == shape) return full;
  Tensor r = Tensor::zeros(shape);
  const Tensor e = r.expand(full.shape());
  float* dst = r.data();
  const float* src = full.data();
  for_each_offset(full.shape(), e.strides(), [&](int64_t i, int64_t off) { dst[off] += src[i]; });
  return r;
}

// sum_to for a GQA kv gradient: `full` (batch..., T, D) with batch.back() = Hq is viewed as (..., Hkv, group, T, D)
// and summed over the group and the broadcast dims into `shape` (..., Hkv, T, D).
Tensor sum_to_kv(const Tensor& full, const Shape& shape, int64_t group) {
  if (group == 1) return sum_to(full, shape);
  Shape split = full.shape();
  const size_t h = split.size() - 3;
  split[h] /= group;
  split.insert(split.begin() + static_cast<int64_t>(h) + 1, group);
  Shape target = shape;
  target.insert(target.end() - 2, 1);
  return sum_to(full.view(split), target).view(shape);
}

}  // namespace

static AttentionGrads backward(const Ctx& cx, const Tensor& out, const Tensor& lse, const Tensor& d_out,
                               const Shape& batch, const FlashConfig& config);

AttentionGrads attention_flash_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                        const Tensor& lse, const Tensor& d_out, const AttentionOptions& options,
                                        const Shape& batch, float scale, const FlashConfig& config) {
  const char* op = "[attention_backward]";
  QKV_CHECK_ARG(!config.kv_bf16, op, " k and v of bf16 pairs (FlashConfig::kv_bf16) are read by the forward only");
  const int64_t tq = q.size(-2), dv = v.size(-1);
  Shape out_shape = batch, lse_shape = batch;
  out_shape.push_back(tq);
  out_shape.push_back(dv);
  lse_shape.push_back(tq);
  QKV_CHECK_ARG(out.defined() && out.shape() == out_shape, op, " out ", out.defined() ? str(out.shape()) : "()",
                " must have shape (batch..., Tq, Dv) = ", str(out_shape));
  QKV_CHECK_ARG(d_out.defined() && d_out.shape() == out_shape, op, " d_out ",
                d_out.defined() ? str(d_out.shape()) : "()", " must have shape (batch..., Tq, Dv) = ",
                str(out_shape));
  QKV_CHECK_ARG(lse.defined() && lse.shape() == lse_shape, op, " lse ", lse.defined() ? str(lse.shape()) : "()",
                " must have shape (batch..., Tq) = ", str(lse_shape));
  const int64_t group = gqa_group(options, k, batch);
  if (!stacks_heads(group, options, batch)) {
    const AttentionGrads g = backward(make_ctx(q, k, v, options, batch, scale, config), out, lse, d_out, batch, config);
    return {sum_to(g.dq, q.shape()), sum_to_kv(g.dk, k.shape(), group), sum_to_kv(g.dv, v.shape(), group)};
  }
  // The group's heads as the rows of one tile (stacks_heads): dK and dV come out per kv head, summed over the group.
  const Shape kv_batch = group_batch(batch, group);
  AttentionOptions o = options;
  o.enable_gqa = false;
  Ctx cx = make_ctx(stack_heads(q, batch, group), k, v, o, kv_batch, scale, config);
  cx.qdiv = group;
  const AttentionGrads g = backward(cx, stack_heads(out, batch, group),
                                    stack_heads(lse.unsqueeze(-1), batch, group).squeeze(-1),
                                    stack_heads(d_out, batch, group), kv_batch, config);
  return {sum_to(unstack_heads(g.dq, batch, group, tq), q.shape()), sum_to(g.dk, k.shape()), sum_to(g.dv, v.shape())};
}

// The gradients of cx's inputs at full size, (batch..., T, D); out, lse and d_out have cx's shapes.
static AttentionGrads backward(const Ctx& cx, const Tensor& out, const Tensor& lse, const Tensor& d_out,
                               const Shape& batch, const FlashConfig& config) {
  const int64_t nb = shape_numel(batch), tq = cx.tq, tk = cx.tk, dk = cx.dk, dv = cx.dv;
  Shape qf = batch, kf = batch, vf = batch;
  qf.insert(qf.end(), {tq, dk});
  kf.insert(kf.end(), {tk, dk});
  vf.insert(vf.end(), {tk, dv});
  // dQ accumulates; every row of dK and dV is written once by its key tile (no zero-fill needed when nb > 0).
  Tensor dq_full = Tensor::zeros(qf);
  Tensor dk_full = nb == 0 ? Tensor::zeros(kf) : Tensor::empty(kf);
  Tensor dv_full = nb == 0 ? Tensor::zeros(vf) : Tensor::empty(vf);
  if (nb == 0) return {dq_full, dk_full, dv_full};

  const int threads = thread_count(config);
  const double work = 2.5 * static_cast<double>(nb) * static_cast<double>(tq) * static_cast<double>(tk) *
                      static_cast<double>(dk + dv);
  BwdCtx bx;
  bx.d_out = operand(d_out, batch);
  const Operand o = operand(out, batch);
  const Tensor lse_c = lse.contiguous();
  std::vector<float> lse2(static_cast<size_t>(nb * tq)), delta(static_cast<size_t>(nb * tq));
  {
    const float* ls = lse_c.data();
#pragma omp parallel for schedule(static) num_threads(team_size(threads, double(nb * tq * dv) * 64.0, nb * tq, config.min_work_per_thread))
    for (int64_t r = 0; r < nb * tq; ++r) {
      const int64_t b = r / tq, i = r % tq;
      lse2[static_cast<size_t>(r)] = ls[r] == kNegInf ? kPosInf : static_cast<float>(ls[r] * kLog2e);
      const float* g = bx.d_out.at(b) + i * bx.d_out.rs;
      const float* y = o.at(b) + i * o.rs;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)  // vector lanes: a fixed order for a given build, whatever the threads
      for (int64_t c = 0; c < dv; ++c) s += g[c] * y[c];
      delta[static_cast<size_t>(r)] = s;
    }
  }
  bx.lse2 = lse2.data();
  bx.delta = delta.data();

  // Work item = (batch, chunk of key tiles). One chunk per batch when the batches keep the threads busy: dQ then
  // accumulates straight into its rows. Otherwise key tiles are dealt to chunks in snake order (balances causal
  // cost), each chunk adds into its own dQ partial, and the partials are summed in chunk order: no atomics, and
  // the same bits on every run with the same thread count.
  const int64_t nkt = ceil_div(tk, cx.bk);
  const int64_t chunks =
      (nb % threads == 0 || nb >= 4 * threads) ? 1 : std::clamp<int64_t>(ceil_div(4 * threads, nb), 1, nkt);
  std::vector<float> partial(chunks > 1 ? static_cast<size_t>(nb * chunks * tq * dk) : 0);
  float* dqp = dq_full.data();
  float* dkp = dk_full.data();
  float* dvp = dv_full.data();
#pragma omp parallel num_threads(team_size(threads, work, nb * chunks, config.min_work_per_thread))
  {
    BwdWork w(cx);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < nb * chunks; ++it) {
      const int64_t b = it / chunks, ch = it % chunks;
      float* dq = chunks == 1 ? dqp + b * tq * dk : partial.data() + it * tq * dk;
      for (int64_t t = 0; t < nkt; ++t) {
        const int64_t pos = t % (2 * chunks);
        if ((pos < chunks ? pos : 2 * chunks - 1 - pos) == ch) bwd_key_tile(cx, bx, b, t, dq, dkp, dvp, w);
      }
    }
    if (chunks > 1) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < nb * tq; ++r) {
        const int64_t b = r / tq, i = r % tq;
        float* dst = dqp + r * dk;
        for (int64_t ch = 0; ch < chunks; ++ch) {
          const float* src = partial.data() + ((b * chunks + ch) * tq + i) * dk;
          for (int64_t c = 0; c < dk; ++c) dst[c] += src[c];
        }
      }
    }
  }
  return {dq_full, dk_full, dv_full};
}

}  // namespace qkv::kernels
