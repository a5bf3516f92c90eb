// Fused attention on the CPU (FlashAttention-2): tiling, online softmax, causal and mask block skipping, OpenMP work
// splitting (query tiles, paired causal tiles, split keys when there are too few tiles) and the deterministic backward.
#include "qkv/kernels/attention_flash.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_flash_kernels.h"
#include "qkv/core/error.h"
#include "qkv/kernels/attention_reference.h"
#include "qkv/kernels/cpu.h"

namespace qkv::kernels {
namespace {

using flash::Gemm;
using flash::GemmBf16;
using flash::Kernels;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2 = 0.6931471805599453;

// Tile sizes. Forward: a query tile (columns of the transposed score tile, packed Qᵀ) against key tiles read in
// place. Backward: a key tile (packed Kᵀ, Vᵀ, dK and dV accumulators) against query tiles read in place.
// Defaults (FlashConfig can override them; tests use small tiles to cross many tile edges on small shapes).
// A wide forward query tile reads each K/V tile once for 480 queries: at long T the K/V of a head outgrow L2, and
// 96-query tiles lost 10-15 % there. Causal diagonal tiles skip the columns that see no key, so width costs nothing.
constexpr int64_t kFwdQ = 480;
constexpr int64_t kFwdK = 96;
constexpr int64_t kSmallQ = 8;     // query tiles this small score by dot products (decode) instead of the packed GEMM
constexpr int64_t kSmallQK = 512;  // ... and take keys in tiles this long (the buffers hold fk x fq floats)
constexpr int64_t kSmallPV = 32;   // ... and, with several rows, P·V in blocks of this many keys (see fwd_tile)
constexpr int64_t kBwdQ = 48;
constexpr int64_t kBwdK = 96;
// Short sequences (Tk <= kShortTk) take kShortTile-key tiles in both passes and kShortTile-query tiles in the
// backward: the causal diagonal then wastes a smaller share of the products (T = 128: 10 of 16 32x32 blocks instead
// of 13312 of 16384 score pairs), and the dK/dV accumulators stay in L1. About 15 % faster at T = 128, D = 32.
constexpr int64_t kShortTk = 256;
constexpr int64_t kShortTile = 32;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

const Kernels& pick(FlashIsa isa) {
  if (isa == FlashIsa::kPortable) return flash::portable_kernels();
  if (isa == FlashIsa::kAvx2) {
    QKV_CHECK_RUNTIME(cpu_supports(Isa::kAvx2),
                      "[attention] the AVX2+FMA kernels were requested but this CPU lacks them");
    return flash::avx2_kernels();
  }
  if (isa == FlashIsa::kAvx512) {
    QKV_CHECK_RUNTIME(cpu_supports(Isa::kAvx512),
                      "[attention] the AVX-512 kernels were requested but this CPU lacks them");
    return flash::avx512_kernels();
  }
  if (isa == FlashIsa::kAvx512Bf16) {
    QKV_CHECK_RUNTIME(cpu_supports(Isa::kAvx512Bf16),
                      "[attention] the AVX512-BF16 kernels were requested but this CPU lacks them");
    return flash::avx512bf16_kernels();
  }
  // kAuto: the widest path QKV_ISA allows (AVX512-VNNI adds nothing here; AVX512-BF16 adds the bf16 products).
  const Isa active = active_isa();
  if (active >= Isa::kAvx512Bf16) return flash::avx512bf16_kernels();
  if (active >= Isa::kAvx512) return flash::avx512_kernels();
  if (active == Isa::kAvx2) return flash::avx2_kernels();
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

// A (batch..., R, C) input read in place: the storage offset of each batch's matrix, and its row stride.
struct Operand {
  Tensor t;  // keeps the storage alive; a copy only when the last dim was not contiguous
  const float* base = nullptr;
  std::vector<int64_t> offs;
  int64_t rs = 0;
  // Paged (a KV cache in blocks): row j of every matrix lives in block pages[j / page_rows], page_stride floats
  // apart; offs then holds the offset of each matrix within a block. pages == nullptr: rows are rs apart.
  const int32_t* pages = nullptr;
  int64_t page_rows = 0, page_stride = 0;
  const float* at(int64_t b) const { return base + offs[static_cast<size_t>(b)]; }
  const float* row(int64_t b, int64_t j) const {
    if (!pages) return at(b) + j * rs;
    return at(b) + pages[j / page_rows] * page_stride + (j % page_rows) * rs;
  }
  // Rows j.. that stay contiguous (within one block): at most `n`.
  int64_t run(int64_t j, int64_t n) const { return pages ? std::min(n, page_rows - j % page_rows) : n; }
};

// group > 1: a GQA kv input whose head h / group serves batch head h (qkv/kernels/attention_reference.h).
Operand operand(const Tensor& t, const Shape& batch, int64_t group = 1) {
  Operand o;
  o.t = (t.size(-1) == 1 || t.stride(-1) == 1) ? t : t.contiguous();
  o.base = o.t.data();
  o.rs = o.t.stride(-2);
  o.offs = matrix_offsets(o.t, batch, group);
  return o;
}

// The mask broadcast to (batch..., Tq, Tk), read through its strides; converted to log2-unit biases per tile.
struct MaskView {
  MaskKind kind = MaskKind::kNone;
  Operand op;
  int64_t cs = 0;  // column (key) stride; may be 0
  float bias(float m) const {
    switch (kind) {
      case MaskKind::kKeep: return m != 0.0f ? 0.0f : kNegInf;
      case MaskKind::kBlock: return m != 0.0f ? kNegInf : 0.0f;
      case MaskKind::kAdditive: return static_cast<float>(m * kLog2e);
      case MaskKind::kNone: break;
    }
    return 0.0f;
  }
};

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

// What both passes share: inputs, sizes, the causal offset, the window, the soft cap and the microkernels.
struct Ctx {
  const Kernels* kr = nullptr;
  Operand q, k, v;
  MaskView mask;
  AttentionOptions bounds;  // causal and window_* only: what visible_keys reads
  bool causal = false;
  bool bounded = false;  // causal or a window hides some keys of some rows
  // Query rows per query position: GQA decoding stacks the `qdiv` query heads of a group as the rows of one tile
  // (row r is query r / qdiv of Tq / qdiv), so that each K/V tile is read once per group.
  int64_t qdiv = 1;
  int64_t tq = 0, tk = 0, dk = 0, dv = 0;
  float scale = 1.0f;
  float c2 = 1.0f;    // what q·k is multiplied by before the tile math: scale · log2(e), or scale / cap when capped
  float cap = 0.0f;   // soft cap c (0 = off)
  float cap2 = 0.0f;  // c · log2(e): a capped score in log2 units is cap2 · tanh(scale · q·k / c)
  // Precision kBFloat16 on a set with bf16 products: the forward's query tiles (all but decoding's few-query ones)
  // run Q·Kᵀ and P·V on bf16 pairs, P rounded to bf16 after the float32 softmax.
  bool bf16 = false;
  int64_t fq = kFwdQ, fk = kFwdK, bq = kBwdQ, bk = kBwdK;  // tile sizes
  KeyRange keys(int64_t i) const { return visible_keys(bounds, i / qdiv, tq / qdiv, tk); }
  // Keys [key_begin(i0), key_end(i_last)) hold every key visible to query rows i0..i_last (bounds are monotone).
  int64_t key_begin(int64_t i0) const { return bounded ? keys(i0).begin : 0; }
  int64_t key_end(int64_t i_last) const { return bounded ? keys(i_last).end : tk; }
  // The tile (rows i0..i0+bq, keys j0..j0+n) has a pair hidden by causal or the window.
  bool diagonal(int64_t i0, int64_t bq, int64_t j0, int64_t n) const {
    return bounded && (keys(i0 + bq - 1).begin > j0 || keys(i0).end < j0 + n);
  }
  // The first query row whose visible keys reach past key j (end > j), and the first that starts past key j
  // (begin > j); tq when none.
  int64_t first_row_ending_after(int64_t j) const {
    return first_row([&](const KeyRange& r) { return r.end > j; });
  }
  int64_t first_row_starting_after(int64_t j) const {
    return first_row([&](const KeyRange& r) { return r.begin > j; });
  }
  // Binary search for the first row whose keys satisfy `pred`, which the monotone bounds keep false, then true.
  template <typename Pred>
  int64_t first_row(const Pred& pred) const {
    int64_t lo = 0, hi = tq;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (pred(keys(mid))) hi = mid; else lo = mid + 1;
    }
    return lo;
  }
};

// Soft cap of a score tile in place: x = scale·q·k / c  ->  cap2 · tanh(x) (log2 units); dcap (may be null)
// receives 1 - tanh², the derivative the backward needs. rows x cols of a tile with row stride ld.
void apply_softcap(const Ctx& cx, float* s, int64_t ld, int64_t rows, int64_t c0, int64_t c1, float* dcap) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const float t = std::tanh(s[r * ld + c]);
      s[r * ld + c] = cx.cap2 * t;
      if (dcap) dcap[r * ld + c] = 1.0f - t * t;
    }
}

// tk >= 0 overrides k's length (a paged cache, whose k and v are placeholders for the first block).
Ctx make_ctx(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
             const Shape& batch, float scale, const FlashConfig& config, int64_t tk = -1) {
  Ctx cx;
  cx.kr = &pick(config.isa);
  cx.tq = q.size(-2);
  cx.tk = tk >= 0 ? tk : k.size(-2);
  cx.dk = q.size(-1);
  cx.dv = v.size(-1);
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

// Fills the log2-unit bias of the tile rows i0..i0+bq, keys j0..j0+n: the mask (if any) and -inf outside the keys
// causal and the window let each row see (if diag). Element (i, j) goes to bias[i*i_step + j*j_step]. Returns
// whether any pair is allowed.
bool build_bias(const Ctx& cx, int64_t b, int64_t i0, int64_t bq, int64_t j0, int64_t n, bool diag, float* bias,
                int64_t i_step, int64_t j_step) {
  const bool has_mask = cx.mask.kind != MaskKind::kNone;
  const float* mb = has_mask ? cx.mask.op.at(b) : nullptr;
  bool any = false;
  for (int64_t i = 0; i < bq; ++i) {
    const KeyRange r = diag ? cx.keys(i0 + i) : KeyRange{j0, j0 + n};
    const int64_t first = r.begin - j0, last = r.end - 1 - j0;  // allowed local keys [first, last]
    const float* mrow = has_mask ? mb + (i0 + i) * cx.mask.op.rs + j0 * cx.mask.cs : nullptr;
    float* brow = bias + i * i_step;
    for (int64_t j = 0; j < n; ++j) {
      const float x = (j < first || j > last) ? kNegInf : (has_mask ? cx.mask.bias(mrow[j * cx.mask.cs]) : 0.0f);
      brow[j * j_step] = x;
      any = any || x > kNegInf;
    }
  }
  return any;
}

// ---------------------------------------------------------------------------------------------------------------
// Forward

// A bf16 pair word: x0 in the low half, x1 in the high half, each rounded to nearest even.
inline uint32_t bf16_pair(float x0, float x1) {
  auto bits = [](float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return ((u | 0x00400000u) >> 16) & 0xffffu;
    return ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) & 0xffffu;
  };
  return bits(x0) | (bits(x1) << 16);
}

struct FwdWork {
  std::vector<float> qt, st, bias, o, m, l, alpha;
  // bf16: Qᵀ, the K tile, P and the V tile as pair words (Qᵀ and P pair along k / keys, K along d, V along keys).
  std::vector<uint32_t> q2, k2, p2, v2;
  explicit FwdWork(const Ctx& cx)
      : qt(static_cast<size_t>(cx.dk * cx.fq)),
        st(static_cast<size_t>(cx.fk * cx.fq)),
        bias(cx.mask.kind != MaskKind::kNone ? static_cast<size_t>(cx.fk * cx.fq) : 0),
        o(static_cast<size_t>(cx.fq * cx.dv)),
        m(static_cast<size_t>(cx.fq)),
        l(static_cast<size_t>(cx.fq)),
        alpha(static_cast<size_t>(cx.fq)) {
    if (cx.bf16) {
      const int64_t dk2 = ceil_div(cx.dk, 2), fk2 = ceil_div(cx.fk, 2), ld = round_up(cx.fq, 8);
      q2.resize(static_cast<size_t>(dk2 * ld));
      k2.resize(static_cast<size_t>(cx.fk * dk2));
      p2.resize(static_cast<size_t>(fk2 * ld));
      v2.resize(static_cast<size_t>(fk2 * cx.dv));
    }
  }
};

// Online softmax of query rows i0..i0+bq of batch b over keys [j_begin, j_end): leaves the running max m (log2
// units), sum l and unnormalised output o (bq x Dv) in w.
void fwd_tile(const Ctx& cx, int64_t b, int64_t i0, int64_t bq, int64_t j_begin, int64_t j_end, FwdWork& w) {
  const Kernels& kr = *cx.kr;
  const int64_t dk = cx.dk, dv = cx.dv;
  const int64_t ld = round_up(bq, 8);
  const bool small = bq <= kSmallQ;
  const bool bf16 = cx.bf16 && !small;
  const int64_t dk2 = ceil_div(dk, 2);
  const float* qb = cx.q.at(b) + i0 * cx.q.rs;
  float* qt = w.qt.data();
  if (bf16) {  // Qᵀ as pairs along d (dk2 x ld words), unscaled (c2 scales the float scores), zero-padded columns
    uint32_t* q2 = w.q2.data();
    for (int64_t d2 = 0; d2 < dk2; ++d2)
      for (int64_t i = 0; i < ld; ++i) {
        const float x0 = i < bq ? qb[i * cx.q.rs + 2 * d2] : 0.0f;
        const float x1 = i < bq && 2 * d2 + 1 < dk ? qb[i * cx.q.rs + 2 * d2 + 1] : 0.0f;
        q2[d2 * ld + i] = bf16_pair(x0, x1);
      }
  } else if (small) {  // scaled rows, for the dot-product scores
    for (int64_t i = 0; i < bq; ++i)
      for (int64_t d = 0; d < dk; ++d) qt[i * dk + d] = qb[i * cx.q.rs + d] * cx.c2;
  } else {  // scaled Qᵀ (dk x ld), zero-padded columns
    for (int64_t i = 0; i < bq; ++i)
      for (int64_t d = 0; d < dk; ++d) qt[d * ld + i] = qb[i * cx.q.rs + d] * cx.c2;
    for (int64_t d = 0; d < dk; ++d)
      for (int64_t i = bq; i < ld; ++i) qt[d * ld + i] = 0.0f;
  }
  std::fill(w.m.begin(), w.m.begin() + ld, kNegInf);
  std::fill(w.l.begin(), w.l.begin() + ld, 0.0f);
  std::fill(w.o.begin(), w.o.begin() + bq * dv, 0.0f);

  const bool has_mask = cx.mask.kind != MaskKind::kNone;
  float* st = w.st.data();
  // A few queries (decoding) stream K and V from memory: longer key tiles switch less often between the two.
  const int64_t fk = small ? std::max(cx.fk, std::min<int64_t>(kSmallQK, cx.fk * cx.fq / 8)) : cx.fk;
  int64_t n = 0;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += n) {
    n = cx.k.run(j0, std::min(fk, j_end - j0));  // a tile never crosses a cache block
    const float* kj = cx.k.row(b, j0);
    const float* vj = cx.v.row(b, j0);
    const bool diag = cx.diagonal(i0, bq, j0, n);
    if (has_mask && !build_bias(cx, b, i0, bq, j0, n, diag, w.bias.data(), 1, ld)) continue;  // all blocked
    // On the causal diagonal the queries before c0 see none of these keys, and under a left window those from c1
    // on: they are left out (a skipped column is exactly an all -inf one: m, l and O stay as they are), so a wide
    // query tile wastes no work outside the band.
    int64_t c0 = 0, c1 = ld;
    if (diag && !small) {
      c0 = std::clamp<int64_t>(cx.first_row_ending_after(j0) - i0, 0, bq) / 8 * 8;
      c1 = std::min(ld, round_up(std::clamp<int64_t>(cx.first_row_starting_after(j0 + n - 1) - i0, 0, bq), 8));
      if (c1 <= c0) continue;
    }
    const int64_t nc = c1 - c0;
    const int64_t qend = std::min(bq, c1);  // query rows c0..qend of this tile take part
    float* sc = st + c0;
    // Sᵀ (n keys x nc queries), log2 units.
    if (small) {
      kr.dot_scores(qt, bq, dk, kj, cx.k.rs, n, st, ld);
    } else if (bf16) {
      uint32_t* k2 = w.k2.data();  // the key tile as pairs along d (n x dk2 words)
      for (int64_t j = 0; j < n; ++j) {
        kr.pairs_of_adjacent(kj + j * cx.k.rs, dk / 2, k2 + j * dk2);
        if (dk % 2) k2[j * dk2 + dk2 - 1] = bf16_pair(kj[j * cx.k.rs + dk - 1], 0.0f);
      }
      GemmBf16 g;
      g.rows = n, g.cols = nc, g.depth = dk2;
      g.a = k2, g.a_rs = dk2, g.a_ks = 1;
      g.b = w.q2.data() + c0, g.b_ks = ld;
      g.c = sc, g.c_rs = ld;
      kr.gemm_bf16(g);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < nc; ++i) sc[j * ld + i] *= cx.c2;
    } else {
      Gemm g;
      g.rows = n, g.cols = nc, g.depth = dk;
      g.a = kj, g.a_rs = cx.k.rs, g.a_ks = 1;
      g.b = qt + c0, g.b_ks = ld;
      g.c = sc, g.c_rs = ld;
      kr.gemm(g);
    }
    if (cx.cap > 0.0f) apply_softcap(cx, st, ld, n, c0, qend, nullptr);
    if (has_mask) {  // mask, causal and window together
      const float* bias = w.bias.data();
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = c0; i < qend; ++i) st[j * ld + i] += bias[j * ld + i];
    } else if (diag) {  // causal and window only: query i sees the keys of its range
      for (int64_t i = c0; i < qend; ++i) {
        const KeyRange r = cx.keys(i0 + i);
        for (int64_t j = 0; j < n; ++j)
          if (j0 + j < r.begin || j0 + j >= r.end) st[j * ld + i] = kNegInf;
      }
    }
    kr.softmax_cols(sc, ld, n, nc, w.m.data() + c0, w.l.data() + c0, w.alpha.data() + c0);
    // O = alpha·O + P·V, P read from its transpose Sᵀ. A few stacked rows (GQA decoding) take the product in blocks
    // of kSmallPV keys: the register blocks of a few rows cover Dv in column strips, and one pass over the whole
    // tile per strip would read each V row from memory in Dv/16 strided pieces; per block, the strips find the
    // block's rows in L1. The same products in the same order (C is reloaded exactly), so the same bits.
    if (bf16) {  // P (rounded) as pairs along keys, the V tile likewise; then O = alpha·O + P·V on the pairs
      const int64_t n2 = ceil_div(n, 2);
      uint32_t* p2 = w.p2.data();
      uint32_t* v2 = w.v2.data();
      for (int64_t j2 = 0; j2 < n2; ++j2) {
        const float* s0 = st + 2 * j2 * ld;
        const bool odd = 2 * j2 + 1 >= n;
        kr.pairs_of_rows(s0 + c0, odd ? nullptr : s0 + ld + c0, qend - c0, p2 + j2 * ld + c0);
        const float* r0 = vj + 2 * j2 * cx.v.rs;
        kr.pairs_of_rows(r0, odd ? nullptr : r0 + cx.v.rs, dv, v2 + j2 * dv);
      }
      GemmBf16 g;
      g.rows = qend - c0, g.cols = dv, g.depth = n2;
      g.a = p2 + c0, g.a_rs = 1, g.a_ks = ld;
      g.b = v2, g.b_ks = dv;
      g.c = w.o.data() + c0 * dv, g.c_rs = dv;
      g.row_scale = w.alpha.data() + c0;
      g.accumulate = true;
      kr.gemm_bf16(g);
      continue;
    }
    const int64_t pv = small && qend - c0 > 1 ? kSmallPV : n;
    for (int64_t k0 = 0; k0 < n; k0 += pv) {
      Gemm g;
      g.rows = qend - c0, g.cols = dv, g.depth = std::min(pv, n - k0);
      g.a = sc + k0 * ld, g.a_rs = 1, g.a_ks = ld;
      g.b = vj + k0 * cx.v.rs, g.b_ks = cx.v.rs;
      g.c = w.o.data() + c0 * dv, g.c_rs = dv;
      g.row_scale = k0 == 0 ? w.alpha.data() + c0 : nullptr;
      g.accumulate = true;
      kr.gemm(g);
    }
  }
}

// out rows (bq x Dv, contiguous) = o / l; lse = ln(2)·(m + log2 l); a row that saw no key: out 0, lse -inf;
// a row where a NaN score took part (l NaN): out NaN, lse NaN, as in PyTorch.
void fwd_finish(const FwdWork& w, int64_t bq, int64_t dv, float* out, float* lse) {
  for (int64_t i = 0; i < bq; ++i) {
    const float l = w.l[static_cast<size_t>(i)];
    float* orow = out + i * dv;
    const float* src = w.o.data() + i * dv;
    if (l > 0.0f || l != l) {  // l is NaN when a NaN score took part: out and lse become NaN below
      const float inv = 1.0f / l;
      for (int64_t c = 0; c < dv; ++c) orow[c] = src[c] * inv;
      lse[i] = static_cast<float>((static_cast<double>(w.m[static_cast<size_t>(i)]) + std::log2(double{l})) * kLn2);
    } else {
      std::fill(orow, orow + dv, 0.0f);
      lse[i] = kNegInf;
    }
  }
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
  split.insert(split.end(), {hkv, group, t, c});
  stacked.insert(stacked.end(), {hkv, t * group, c});
  return x.expand(full).contiguous().view(split).transpose(-3, -2).contiguous().view(stacked);
}

// The inverse of stack_heads: (group_batch..., t·group, C) back to (batch..., t, C), contiguous.
Tensor unstack_heads(const Tensor& x, const Shape& batch, int64_t group, int64_t t) {
  const int64_t c = x.size(-1), hkv = batch.back() / group;
  Shape split(batch.begin(), batch.end() - 1), full = batch;
  split.insert(split.end(), {hkv, t, group, c});
  full.insert(full.end(), {t, c});
  return x.contiguous().view(split).transpose(-3, -2).contiguous().view(full);
}

// Key splits per query tile: 1 while there are enough tiles to keep every thread busy and balanced; otherwise
// (decoding one query against a long cache, B·H below the thread count) the keys of each tile are split and the
// partial (max, sum, output) merged afterwards in a fixed order.
int64_t forward_splits(int64_t units, int64_t threads, int64_t max_key_tiles) {
  if (units >= 4 * threads || units % threads == 0) return 1;
  return std::clamp<int64_t>(ceil_div(4 * threads, units), 1, std::max<int64_t>(1, max_key_tiles));
}

}  // namespace

const char* flash_isa_name(FlashIsa isa) { return pick(isa).name; }

static AttentionResult forward(const Ctx& cx, const Shape& batch, const FlashConfig& config);

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
  AttentionResult r = forward(cx, kv_batch, config);
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
  AttentionResult r = forward(cx, batch, config);
  if (stack) {
    r.out = unstack_heads(r.out, Shape{hq}, group, q.size(1));
    r.lse = unstack_heads(r.lse.unsqueeze(-1), Shape{hq}, group, q.size(1)).squeeze(-1);
  }
  return r;
}

static AttentionResult forward(const Ctx& cx, const Shape& batch, const FlashConfig& config) {
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
  const int64_t units = nb * nqt;
  const int64_t splits = forward_splits(units, threads, ceil_div(cx.tk, fk));
  const double work = static_cast<double>(nb) * static_cast<double>(tq) * static_cast<double>(cx.tk) *
                      static_cast<double>(cx.dk + dv);

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

  // Split keys: partial (m, l, o) per (unit, split), then a fixed-order merge.
  const int64_t part_floats = 2 * fq + fq * dv;
  std::vector<float> parts(static_cast<size_t>(units * splits * part_floats));
#pragma omp parallel num_threads(team_size(threads, work, units * splits, config.min_work_per_thread))
  {
    FwdWork w(cx);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < units * splits; ++it) {
      const int64_t u = it / splits, s = it % splits;
      const int64_t b = u / nqt, i0 = (u % nqt) * fq, bq = std::min(fq, tq - i0);
      const int64_t kbeg = cx.key_begin(i0), kend = std::max(kbeg, cx.key_end(i0 + bq - 1));
      const int64_t per = ceil_div(ceil_div(kend - kbeg, fk), splits) * fk;
      const int64_t j_begin = std::min(kend, kbeg + s * per), j_end = std::min(kend, kbeg + (s + 1) * per);
      fwd_tile(cx, b, i0, bq, j_begin, j_end, w);
      float* part = parts.data() + it * part_floats;
      std::copy(w.m.begin(), w.m.begin() + bq, part);
      std::copy(w.l.begin(), w.l.begin() + bq, part + fq);
      std::copy(w.o.begin(), w.o.begin() + bq * dv, part + 2 * fq);
    }
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t b = u / nqt, i0 = (u % nqt) * fq, bq = std::min(fq, tq - i0);
      const float* first = parts.data() + u * splits * part_floats;
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
            l += wgt * part[fq + i];
            const float* src = part + 2 * fq + i * dv;
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

struct BwdWork {
  std::vector<float> kt, vt, s, dp, bias, dcap, dka, dva;
  explicit BwdWork(const Ctx& cx)
      : kt(static_cast<size_t>(cx.dk * cx.bk)),
        vt(static_cast<size_t>(cx.dv * cx.bk)),
        s(static_cast<size_t>(cx.bq * cx.bk)),
        dp(static_cast<size_t>(cx.bq * cx.bk)),
        bias(cx.mask.kind != MaskKind::kNone ? static_cast<size_t>(cx.bq * cx.bk) : 0),
        dcap(cx.cap > 0.0f ? static_cast<size_t>(cx.bq * cx.bk) : 0),
        dka(static_cast<size_t>(cx.bk * cx.dk)),
        dva(static_cast<size_t>(cx.bk * cx.dv)) {}
};

struct BwdCtx {
  Operand d_out;
  const float* lse2 = nullptr;   // (nb, Tq): lse·log2(e); +inf on fully masked rows (so p = 0 there)
  const float* delta = nullptr;  // (nb, Tq): rowsum(dO ∘ O)
};

// dK, dV of key tile kt of batch b (written to dk_full, dv_full) and its share of dQ, added into dq (Tq x Dk).
void bwd_key_tile(const Ctx& cx, const BwdCtx& bx, int64_t b, int64_t kt, float* dq, float* dk_full, float* dv_full,
                  BwdWork& w) {
  const Kernels& kr = *cx.kr;
  const int64_t dk = cx.dk, dv = cx.dv, tq = cx.tq;
  const int64_t j0 = kt * cx.bk, n = std::min(cx.bk, cx.tk - j0), ld = round_up(n, 8);
  const float* kb = cx.k.at(b) + j0 * cx.k.rs;
  const float* vb = cx.v.at(b) + j0 * cx.v.rs;
  const float* qb = cx.q.at(b);
  const float* gb = bx.d_out.at(b);
  float* kt_p = w.kt.data();
  float* vt_p = w.vt.data();
  for (int64_t j = 0; j < n; ++j) {  // Kᵀ scaled to log2 units (or by scale / cap when capped), Vᵀ as is
    for (int64_t d = 0; d < dk; ++d) kt_p[d * ld + j] = kb[j * cx.k.rs + d] * cx.c2;
    for (int64_t d = 0; d < dv; ++d) vt_p[d * ld + j] = vb[j * cx.v.rs + d];
  }
  for (int64_t j = n; j < ld; ++j) {
    for (int64_t d = 0; d < dk; ++d) kt_p[d * ld + j] = 0.0f;
    for (int64_t d = 0; d < dv; ++d) vt_p[d * ld + j] = 0.0f;
  }
  std::fill(w.dka.begin(), w.dka.begin() + n * dk, 0.0f);
  std::fill(w.dva.begin(), w.dva.begin() + n * dv, 0.0f);

  const bool has_mask = cx.mask.kind != MaskKind::kNone;
  // Only the queries [i_first, i_stop) see a key of this tile.
  const int64_t i_first = cx.bounded ? cx.first_row_ending_after(j0) : 0;
  const int64_t i_stop = cx.bounded ? cx.first_row_starting_after(j0 + n - 1) : tq;
  for (int64_t i0 = (i_first / cx.bq) * cx.bq; i0 < i_stop; i0 += cx.bq) {
    const int64_t bq = std::min(cx.bq, tq - i0);
    const bool diag = cx.diagonal(i0, bq, j0, n);
    if (has_mask && !build_bias(cx, b, i0, bq, j0, n, diag, w.bias.data(), ld, 1)) continue;
    const float* qi = qb + i0 * cx.q.rs;
    const float* gi = gb + i0 * bx.d_out.rs;
    Gemm g;  // S = Q·Kᵀ (bq x ld)
    g.rows = bq, g.cols = ld, g.depth = dk;
    g.a = qi, g.a_rs = cx.q.rs, g.a_ks = 1;
    g.b = kt_p, g.b_ks = ld;
    g.c = w.s.data(), g.c_rs = ld;
    kr.gemm(g);
    g.depth = dv;  // dP = dO·Vᵀ
    g.a = gi, g.a_rs = bx.d_out.rs;
    g.b = vt_p;
    g.c = w.dp.data();
    kr.gemm(g);
    if (cx.cap > 0.0f) apply_softcap(cx, w.s.data(), ld, bq, 0, n, w.dcap.data());
    if (diag && !has_mask) {  // causal and window only: query i sees the local keys of its range
      float* s = w.s.data();
      for (int64_t i = 0; i < bq; ++i) {
        const KeyRange r = cx.keys(i0 + i);
        const int64_t first = std::clamp<int64_t>(r.begin - j0, 0, n), end = std::clamp<int64_t>(r.end - j0, 0, n);
        std::fill(s + i * ld, s + i * ld + first, kNegInf);
        std::fill(s + i * ld + std::max(first, end), s + i * ld + n, kNegInf);
      }
    }
    // P and dS = scale·P∘(dP − delta), in place; capped scores then carry the tanh's derivative.
    kr.bwd_probs(w.s.data(), has_mask ? w.bias.data() : nullptr, w.dp.data(), ld, bq, n, bx.lse2 + b * tq + i0,
                 bx.delta + b * tq + i0, cx.scale);
    if (cx.cap > 0.0f) {
      float* dp = w.dp.data();
      const float* dc = w.dcap.data();
      for (int64_t i = 0; i < bq; ++i)
        for (int64_t j = 0; j < n; ++j) dp[i * ld + j] *= dc[i * ld + j];
    }
    Gemm gv;  // dV += Pᵀ·dO
    gv.rows = n, gv.cols = dv, gv.depth = bq;
    gv.a = w.s.data(), gv.a_rs = 1, gv.a_ks = ld;
    gv.b = gi, gv.b_ks = bx.d_out.rs;
    gv.c = w.dva.data(), gv.c_rs = dv;
    gv.accumulate = true;
    kr.gemm(gv);
    Gemm gk = gv;  // dK += dSᵀ·Q
    gk.cols = dk;
    gk.a = w.dp.data();
    gk.b = qi, gk.b_ks = cx.q.rs;
    gk.c = w.dka.data(), gk.c_rs = dk;
    kr.gemm(gk);
    Gemm gq;  // dQ += dS·K
    gq.rows = bq, gq.cols = dk, gq.depth = n;
    gq.a = w.dp.data(), gq.a_rs = ld, gq.a_ks = 1;
    gq.b = kb, gq.b_ks = cx.k.rs;
    gq.c = dq + i0 * dk, gq.c_rs = dk;
    gq.accumulate = true;
    kr.gemm(gq);
  }
  std::copy(w.dka.begin(), w.dka.begin() + n * dk, dk_full + (b * cx.tk + j0) * dk);
  std::copy(w.dva.begin(), w.dva.begin() + n * dv, dv_full + (b * cx.tk + j0) * dv);
}

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
