// Private (not installed): what the fused attention's drivers (attention_flash.cpp) and its tile math
// (attention_flash_tiles.cpp) share: tile sizes, the in-place operands, the mask view, Ctx and the per-thread buffers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "attention_flash_kernels.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/core/storage_pool.h"
#include "qkv/kernels/attention_reference.h"

namespace qkv::kernels::flash {

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
constexpr int64_t kSmallQK = 512;  // ... and take keys in tiles this long (at most fk x fq / 8 of them)
constexpr int64_t kSmallPV = 32;   // ... and, with several rows, P·V in blocks of this many keys (see fwd_tile)
constexpr int64_t kBwdQ = 48;
constexpr int64_t kBwdK = 96;
// Short sequences (Tk <= kShortTk) take kShortTile-key tiles in both passes and kShortTile-query tiles in the
// backward: the causal diagonal then wastes a smaller share of the products (T = 128: 10 of 16 32x32 blocks instead
// of 13312 of 16384 score pairs), and the dK/dV accumulators stay in L1. About 15 % faster at T = 128, D = 32.
constexpr int64_t kShortTk = 256;
constexpr int64_t kShortTile = 32;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

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

// The bf16 forward's K and V as pair words, made once per kv head before the query tiles (each of which would
// otherwise pair every key tile it reads again): K paired along d, Tk rows of ceil(Dk/2) words; V paired across
// keys (2r, 2r + 1), ceil(Tk/2) rows of Dv words, the row past an odd Tk 0. kv[b]: batch b's head in them. The
// words live in buffers of the tensors' caching pool (qkv/core/storage_pool.h: reused by the next call, bounded).
struct PairedKv {
  std::shared_ptr<float> k, v;  // float-sized buffers holding the words (none: nothing paired)
  std::vector<int64_t> kv;
  int64_t k_words = 0, v_words = 0;  // words per head
  int64_t dk2 = 0, dv = 0;
  static uint32_t* words(const std::shared_ptr<float>& buf) { return reinterpret_cast<uint32_t*>(buf.get()); }
  const uint32_t* k_rows(int64_t b, int64_t j) const {
    return words(k) + kv[static_cast<size_t>(b)] * k_words + j * dk2;
  }
  // Keys j.. (j even) as pair rows.
  const uint32_t* v_pairs(int64_t b, int64_t j) const {
    return words(v) + kv[static_cast<size_t>(b)] * v_words + j / 2 * dv;
  }
};

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
  const PairedKv* paired = nullptr;  // bf16: K and V paired once per head (null: each tile pairs its own)
  // K and V are bf16 pair words (FlashConfig::kv_bf16): k.rs and v.rs count words; a tile is widened to float32
  // (FwdWork::kf, vf) before its products.
  bool kv_bf16 = false;
  // Precision kBFloat16 in the backward (every set): P and dS rounded to bf16 before the dV, dK and dQ products,
  // as a bf16 FlashAttention backward does (its inputs are rounded by attention_flash_backward; scores, LSE,
  // delta and every accumulation stay float32).
  bool bf16_grads = false;
  int64_t fq = kFwdQ, fk = kFwdK, bq = kBwdQ, bk = kBwdK;  // tile sizes
  // Query rows a forward tile holds: fq, or fewer when the whole query is shorter (decoding: a few rows), so that the
  // work buffers of a decoding step stay small (no large zero-filled allocation per call).
  int64_t fwd_rows() const { return std::min(fq, round_up(std::max<int64_t>(tq, 1), 8)); }
  // Key tile of a few-query (decoding) tile: longer tiles switch less often between streaming K and V.
  int64_t small_fk() const { return std::max(fk, std::min<int64_t>(kSmallQK, fk * fq / 8)); }
  // The most keys a forward tile takes (a few-query tile's or another's), at most tk.
  int64_t max_key_tile() const { return std::min(std::max(fk, small_fk()), std::max<int64_t>(tk, 1)); }
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

struct FwdWork {
  // A score (or bias) tile: fk keys x the tile's rows, or a few-query tile's small_fk() keys x 8.
  static int64_t tile_floats(const Ctx& cx) {
    const int64_t rows = round_up(cx.fwd_rows(), 8);
    return std::max(cx.fk * rows, rows <= kSmallQ ? cx.small_fk() * rows : 0);
  }
  std::vector<float> qt, st, bias, o, m, l, alpha;
  // bf16: Qᵀ, the K tile, P and the V tile as pair words (Qᵀ and P pair along k / keys, K along d, V along keys).
  std::vector<uint32_t> q2, k2, p2, v2;
  // kv_bf16: a key tile and a value tile widened to float32 (rows dk and dv floats apart), in buffers of the
  // tensors' caching pool (reused by the next call; not zero-filled).
  std::shared_ptr<float> kf, vf;
  explicit FwdWork(const Ctx& cx)
      : qt(static_cast<size_t>(cx.dk * cx.fwd_rows())),
        st(static_cast<size_t>(tile_floats(cx))),
        bias(cx.mask.kind != MaskKind::kNone ? static_cast<size_t>(tile_floats(cx)) : 0),
        o(static_cast<size_t>(cx.fwd_rows() * cx.dv)),
        m(static_cast<size_t>(cx.fwd_rows())),
        l(static_cast<size_t>(cx.fwd_rows())),
        alpha(static_cast<size_t>(cx.fwd_rows())) {
    if (cx.kv_bf16) {
      kf = storage_pool::allocate(cx.max_key_tile() * cx.dk);
      vf = storage_pool::allocate(cx.max_key_tile() * cx.dv);
    }
    if (cx.bf16) {
      const int64_t dk2 = ceil_div(cx.dk, 2), fk2 = ceil_div(cx.fk, 2), ld = round_up(cx.fwd_rows(), 8);
      q2.resize(static_cast<size_t>(dk2 * ld));
      k2.resize(static_cast<size_t>(cx.fk * dk2));
      p2.resize(static_cast<size_t>(fk2 * ld));
      v2.resize(static_cast<size_t>(fk2 * cx.dv));
    }
  }
};

struct BwdWork {
  std::vector<float> kt, vt, s, dp, bias, dcap, dka, dva;
  // bf16 products: Kᵀ, Vᵀ (pairs along d), K (across keys), Q, dO (along d), P, dS (across queries; dS then along
  // keys), Q and dO (across queries) as pair words.
  std::vector<uint32_t> kt2, vt2, k2, q2, g2, p2, ds2, q2r, g2r;
  explicit BwdWork(const Ctx& cx)
      : kt(static_cast<size_t>(cx.dk * cx.bk)),
        vt(static_cast<size_t>(cx.dv * cx.bk)),
        s(static_cast<size_t>(cx.bq * cx.bk)),
        dp(static_cast<size_t>(cx.bq * cx.bk)),
        bias(cx.mask.kind != MaskKind::kNone ? static_cast<size_t>(cx.bq * cx.bk) : 0),
        dcap(cx.cap > 0.0f ? static_cast<size_t>(cx.bq * cx.bk) : 0),
        dka(static_cast<size_t>(cx.bk * cx.dk)),
        dva(static_cast<size_t>(cx.bk * cx.dv)) {
    if (cx.bf16_grads && cx.kr->gemm_bf16 != nullptr) {
      const int64_t dk2 = ceil_div(cx.dk, 2), dv2 = ceil_div(cx.dv, 2), bk = round_up(cx.bk, 8);
      const int64_t bq2 = ceil_div(cx.bq, 2), bk2 = ceil_div(cx.bk, 2);
      kt2.resize(static_cast<size_t>(dk2 * bk));
      vt2.resize(static_cast<size_t>(dv2 * bk));
      k2.resize(static_cast<size_t>(bk2 * cx.dk));
      q2.resize(static_cast<size_t>(cx.bq * dk2));
      g2.resize(static_cast<size_t>(cx.bq * dv2));
      p2.resize(static_cast<size_t>(bq2 * bk));
      ds2.resize(static_cast<size_t>(std::max(bq2 * bk, cx.bq * bk2)));
      q2r.resize(static_cast<size_t>(bq2 * cx.dk));
      g2r.resize(static_cast<size_t>(bq2 * cx.dv));
    }
  }
};

struct BwdCtx {
  Operand d_out;
  const float* lse2 = nullptr;   // (nb, Tq): lse·log2(e); +inf on fully masked rows (so p = 0 there)
  const float* delta = nullptr;  // (nb, Tq): rowsum(dO ∘ O)
};

// The tile math (attention_flash_tiles.cpp, where each states its contract in full):
// fwd_tile: the online softmax of query rows i0..i0+bq of batch b over keys [j_begin, j_end), leaving m, l, o in w.
void fwd_tile(const Ctx& cx, int64_t b, int64_t i0, int64_t bq, int64_t j_begin, int64_t j_end, FwdWork& w);
// pair_kv: K and V of the nb batches as PairedKv (each distinct head once), OpenMP over heads and rows, where a head
// is read by more than one query tile (`tiles` per batch, or heads that batches share); otherwise none (k null).
PairedKv pair_kv(const Ctx& cx, int64_t nb, int64_t tiles, int threads);
// fwd_finish: out rows = o / l and lse from w (0 and -inf for a row that saw no key).
void fwd_finish(const FwdWork& w, int64_t bq, int64_t dv, float* out, float* lse);
// bwd_key_tile: dK, dV of key tile kt of batch b, and its share of dQ added into dq (Tq x Dk).
void bwd_key_tile(const Ctx& cx, const BwdCtx& bx, int64_t b, int64_t kt, float* dq, float* dk_full, float* dv_full,
                  BwdWork& w);

}  // namespace qkv::kernels::flash
