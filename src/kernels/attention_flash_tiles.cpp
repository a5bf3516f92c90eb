// Fused attention's tile math (FlashAttention-2 on the CPU): one forward query tile against its key tiles (online
// softmax, masks, causal and window bounds, soft cap, bf16 pairs) and one backward key tile against its query tiles.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "attention_flash_impl.h"
#include "attention_flash_kernels.h"
#include "lowp_impl.h"
#include "qkv/core/storage_pool.h"

namespace qkv::kernels::flash {
namespace {

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

// A bf16 pair word: x0 in the low half, x1 in the high half, each rounded to nearest even.
inline uint32_t bf16_pair(float x0, float x1) {
  return (detail::bf16_round_bits(x0) >> 16) | detail::bf16_round_bits(x1);
}

// Pair words along each row: out[r·ld2 + c2] = (x[r][2c2], x[r][2c2 + 1]) for r < rows (x's rows rs apart, cols
// floats; the half past an odd cols is 0).
void pairs_along_rows(const Kernels& kr, const float* x, int64_t rs, int64_t rows, int64_t cols, uint32_t* out,
                      int64_t ld2) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * rs;
    kr.pairs_of_adjacent(xr, cols / 2, out + r * ld2);
    if (cols % 2) out[r * ld2 + cols / 2] = bf16_pair(xr[cols - 1], 0.0f);
  }
}

// Pair words across row pairs: out[r2·ld + c] = (x[2r2][c], x[2r2 + 1][c]) for c < cols (x's rows rs apart; the
// row past an odd rows is 0).
void pairs_across_rows(const Kernels& kr, const float* x, int64_t rs, int64_t rows, int64_t cols, uint32_t* out,
                       int64_t ld) {
  for (int64_t r2 = 0; r2 < ceil_div(rows, 2); ++r2)
    kr.pairs_of_rows(x + 2 * r2 * rs, 2 * r2 + 1 < rows ? x + (2 * r2 + 1) * rs : nullptr, cols, out + r2 * ld);
}

// Rows j0..j0+n of batch b of a bf16-pairs operand (cols / 2 words a row; rows that never cross a cache block)
// widened to float32: out (n x cols, rows cols apart). A word's halves are elements 2c (low) and 2c + 1 (high) of its
// row, so the row is cols bf16 values in order, widened exactly by kernels::bf16_to_float (vectorized per ISA); a
// contiguous cache's tile is one run of them.
void widen_rows(const Operand& x, int64_t b, int64_t j0, int64_t n, int64_t cols, float* out) {
  if (x.rs * 2 == cols) {
    bf16_to_float(reinterpret_cast<const uint16_t*>(x.row(b, j0)), out, n * cols);
    return;
  }
  for (int64_t j = 0; j < n; ++j)
    bf16_to_float(reinterpret_cast<const uint16_t*>(x.row(b, j0 + j)), out + j * cols, cols);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Forward

PairedKv pair_kv(const Ctx& cx, int64_t nb, int64_t tiles, int threads) {
  const Kernels& kr = *cx.kr;
  PairedKv p;
  p.dk2 = ceil_div(cx.dk, 2);
  p.dv = cx.dv;
  p.k_words = cx.tk * p.dk2;
  p.v_words = ceil_div(cx.tk, 2) * cx.dv;
  // Batches that read one head (GQA under a mask: a group's query heads) share its pairs; a head is known by where
  // its K and V begin.
  std::vector<int64_t> first;  // a batch of each distinct head
  std::map<std::pair<const float*, const float*>, int64_t> head_of;
  p.kv.resize(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) {
    const auto [it, added] = head_of.try_emplace({cx.k.at(b), cx.v.at(b)}, static_cast<int64_t>(first.size()));
    if (added) first.push_back(b);
    p.kv[static_cast<size_t>(b)] = it->second;
  }
  const int64_t heads = static_cast<int64_t>(first.size()), block = 64, blocks = ceil_div(cx.tk, block);
  if (tiles <= 1 && heads == nb) return PairedKv{};  // each key tile would be paired once either way
  p.k = storage_pool::allocate(heads * p.k_words);  // float-sized words, written and read as uint32_t only
  p.v = storage_pool::allocate(heads * p.v_words);
  uint32_t* const k = PairedKv::words(p.k);
  uint32_t* const v = PairedKv::words(p.v);
#pragma omp parallel num_threads(threads)
  {
    // bf16 pairs (kv_bf16): a key row's words are its pairs along d already; two value rows are widened first.
    std::vector<float> wide(cx.kv_bf16 ? static_cast<size_t>(2 * cx.dv) : 0);
#pragma omp for schedule(static)
    for (int64_t it = 0; it < heads * blocks; ++it) {
      const int64_t h = it / blocks, j0 = it % blocks * block, j1 = std::min(cx.tk, j0 + block);
      const int64_t b = first[static_cast<size_t>(h)];
      for (int64_t j = j0; j < j1; ++j) {  // row by row: a paged cache's rows are not evenly spaced
        uint32_t* dst = k + h * p.k_words + j * p.dk2;
        if (cx.kv_bf16) std::memcpy(dst, cx.k.row(b, j), static_cast<size_t>(p.dk2) * sizeof(uint32_t));
        else pairs_along_rows(kr, cx.k.row(b, j), 0, 1, cx.dk, dst, p.dk2);
      }
      for (int64_t j = j0; j < j1; j += 2) {  // block is even: a pair never straddles two blocks
        uint32_t* dst = v + h * p.v_words + j / 2 * p.dv;
        const bool two = j + 1 < cx.tk;
        if (cx.kv_bf16) {
          widen_rows(cx.v, b, j, 1, cx.dv, wide.data());
          if (two) widen_rows(cx.v, b, j + 1, 1, cx.dv, wide.data() + cx.dv);
          kr.pairs_of_rows(wide.data(), two ? wide.data() + cx.dv : nullptr, cx.dv, dst);
        } else {
          kr.pairs_of_rows(cx.v.row(b, j), two ? cx.v.row(b, j + 1) : nullptr, cx.dv, dst);
        }
      }
    }
  }
  return p;
}

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
  const int64_t fk = small ? cx.small_fk() : cx.fk;
  int64_t n = 0;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += n) {
    n = cx.k.run(j0, std::min(fk, j_end - j0));  // a tile never crosses a cache block
    const float* kj = cx.k.row(b, j0);
    const float* vj = cx.v.row(b, j0);
    int64_t krs = cx.k.rs, vrs = cx.v.rs;
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
    // bf16 pairs: the bf16 products take a key tile's words as its pairs along d (or the head's pairs); any other
    // product takes the tile widened to float32, as if K had held those values.
    // A few queries (decoding) widen and score kSmallPV keys at a time, so the widened rows are read back from L1
    // rather than written out to L2 and read again (each key's score is its own dot product: the same bits).
    const bool k_words = cx.kv_bf16 && bf16;
    if (cx.kv_bf16 && !bf16 && !small) {
      widen_rows(cx.k, b, j0, n, dk, w.kf.get());
      kj = w.kf.get(), krs = dk;
    }
    // Sᵀ (n keys x nc queries), log2 units.
    if (small && cx.kv_bf16) {
      for (int64_t k0 = 0; k0 < n; k0 += kSmallPV) {
        const int64_t nk = std::min(kSmallPV, n - k0);
        widen_rows(cx.k, b, j0 + k0, nk, dk, w.kf.get());
        kr.dot_scores(qt, bq, dk, w.kf.get(), dk, nk, st + k0 * ld, ld);
      }
    } else if (small) {
      kr.dot_scores(qt, bq, dk, kj, krs, n, st, ld);
    } else if (bf16) {
      const uint32_t* k2 = w.k2.data();  // the key tile as pairs along d (n x dk2 words, a_rs apart)
      int64_t a_rs = dk2;
      if (cx.paired) k2 = cx.paired->k_rows(b, j0);
      else if (k_words) k2 = reinterpret_cast<const uint32_t*>(kj), a_rs = krs;
      else pairs_along_rows(kr, kj, krs, n, dk, w.k2.data(), dk2);
      GemmBf16 g;
      g.rows = n, g.cols = nc, g.depth = dk2;
      g.a = k2, g.a_rs = a_rs, g.a_ks = 1;
      g.b = w.q2.data() + c0, g.b_ks = ld;
      g.c = sc, g.c_rs = ld;
      g.scale = cx.c2;
      kr.gemm_bf16(g);
    } else {
      Gemm g;
      g.rows = n, g.cols = nc, g.depth = dk;
      g.a = kj, g.a_rs = krs, g.a_ks = 1;
      g.b = qt + c0, g.b_ks = ld;
      g.c = sc, g.c_rs = ld;
      kr.gemm(g);
    }
    if (cx.cap > 0.0f) apply_softcap(cx, st, ld, n, c0, qend, nullptr);
    if (has_mask) {  // mask, causal and window together
      const float* bias = w.bias.data();
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = c0; i < qend; ++i) st[j * ld + i] += bias[j * ld + i];
    } else if (diag) {  // causal and window only: query i sees the keys of its range; only the others are written
      for (int64_t i = c0; i < qend; ++i) {
        const KeyRange r = cx.keys(i0 + i);
        const int64_t lo = std::clamp<int64_t>(r.begin - j0, 0, n), hi = std::clamp<int64_t>(r.end - j0, lo, n);
        for (int64_t j = 0; j < lo; ++j) st[j * ld + i] = kNegInf;
        for (int64_t j = hi; j < n; ++j) st[j * ld + i] = kNegInf;
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
      pairs_across_rows(kr, st + c0, ld, n, qend - c0, p2 + c0, ld);
      // V's pairs of the head serve a tile that starts on an even key and ends on a pair (or at the last key,
      // where the pair's other half is 0); any other tile pairs its own, so no key outside it takes part.
      const uint32_t* v2 = w.v2.data();
      if (cx.paired && j0 % 2 == 0 && (n % 2 == 0 || j0 + n == cx.tk)) {
        v2 = cx.paired->v_pairs(b, j0);
      } else {
        if (cx.kv_bf16) {
          widen_rows(cx.v, b, j0, n, dv, w.vf.get());
          vj = w.vf.get(), vrs = dv;
        }
        pairs_across_rows(kr, vj, vrs, n, dv, w.v2.data(), dv);
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
    // A bf16 V is widened a block at a time (the few-query blocks, or kSmallPV keys: a split of the depth keeps the
    // bits, C being reloaded exactly), its rows found in L1 by the product.
    const int64_t pv = (small && qend - c0 > 1) || (small && cx.kv_bf16) ? kSmallPV : n;
    for (int64_t k0 = 0; k0 < n; k0 += pv) {
      const float* vb = cx.kv_bf16 ? w.vf.get() : vj + k0 * vrs;
      if (cx.kv_bf16) widen_rows(cx.v, b, j0 + k0, std::min(pv, n - k0), dv, w.vf.get());
      Gemm g;
      g.rows = qend - c0, g.cols = dv, g.depth = std::min(pv, n - k0);
      g.a = sc + k0 * ld, g.a_rs = 1, g.a_ks = ld;
      g.b = vb, g.b_ks = cx.kv_bf16 ? dv : vrs;
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

// ---------------------------------------------------------------------------------------------------------------
// Backward

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
  // bf16 on a set with bf16 products: the five products on pair words (vdpbf16ps), the same operands the float32
  // products below take after rounding (q, k, v and dO arrive rounded; P and dS are rounded into their pairs).
  const bool pairs = cx.bf16_grads && kr.gemm_bf16 != nullptr;
  const int64_t dk2 = ceil_div(dk, 2), dv2 = ceil_div(dv, 2), n2 = ceil_div(n, 2);
  float* kt_p = w.kt.data();
  float* vt_p = w.vt.data();
  const float kscale = pairs ? 1.0f : cx.c2;  // pairs: S is scaled after the product, as the bf16 forward does
  for (int64_t j = 0; j < n; ++j) {  // Kᵀ scaled to log2 units (or by scale / cap when capped), Vᵀ as is
    for (int64_t d = 0; d < dk; ++d) kt_p[d * ld + j] = kb[j * cx.k.rs + d] * kscale;
    for (int64_t d = 0; d < dv; ++d) vt_p[d * ld + j] = vb[j * cx.v.rs + d];
  }
  for (int64_t j = n; j < ld; ++j) {
    for (int64_t d = 0; d < dk; ++d) kt_p[d * ld + j] = 0.0f;
    for (int64_t d = 0; d < dv; ++d) vt_p[d * ld + j] = 0.0f;
  }
  if (pairs) {  // Kᵀ and Vᵀ paired along d (for S and dP), K paired across keys (for dQ)
    pairs_across_rows(kr, kt_p, ld, dk, ld, w.kt2.data(), ld);
    pairs_across_rows(kr, vt_p, ld, dv, ld, w.vt2.data(), ld);
    pairs_across_rows(kr, kb, cx.k.rs, n, dk, w.k2.data(), dk);
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
    const int64_t bq2 = ceil_div(bq, 2);
    if (pairs) {  // S = Q·Kᵀ, scaled as it is stored; dP = dO·Vᵀ
      pairs_along_rows(kr, qi, cx.q.rs, bq, dk, w.q2.data(), dk2);
      pairs_along_rows(kr, gi, bx.d_out.rs, bq, dv, w.g2.data(), dv2);
      GemmBf16 g;
      g.rows = bq, g.cols = ld, g.depth = dk2;
      g.a = w.q2.data(), g.a_rs = dk2, g.a_ks = 1;
      g.b = w.kt2.data(), g.b_ks = ld;
      g.c = w.s.data(), g.c_rs = ld;
      g.scale = cx.c2;
      kr.gemm_bf16(g);
      g.scale = 1.0f;
      g.depth = dv2;
      g.a = w.g2.data(), g.a_rs = dv2;
      g.b = w.vt2.data();
      g.c = w.dp.data();
      kr.gemm_bf16(g);
    } else {
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
    }
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
    if (pairs) {  // dV += Pᵀ·dO, dK += dSᵀ·Q (pairs across queries), dQ += dS·K (dS paired across keys)
      pairs_across_rows(kr, w.s.data(), ld, bq, n, w.p2.data(), ld);
      pairs_across_rows(kr, w.dp.data(), ld, bq, n, w.ds2.data(), ld);
      pairs_across_rows(kr, gi, bx.d_out.rs, bq, dv, w.g2r.data(), dv);
      pairs_across_rows(kr, qi, cx.q.rs, bq, dk, w.q2r.data(), dk);
      GemmBf16 gv;
      gv.rows = n, gv.cols = dv, gv.depth = bq2;
      gv.a = w.p2.data(), gv.a_rs = 1, gv.a_ks = ld;
      gv.b = w.g2r.data(), gv.b_ks = dv;
      gv.c = w.dva.data(), gv.c_rs = dv;
      gv.accumulate = true;
      kr.gemm_bf16(gv);
      GemmBf16 gk = gv;
      gk.cols = dk;
      gk.a = w.ds2.data();
      gk.b = w.q2r.data(), gk.b_ks = dk;
      gk.c = w.dka.data(), gk.c_rs = dk;
      kr.gemm_bf16(gk);
      pairs_along_rows(kr, w.dp.data(), ld, bq, n, w.ds2.data(), n2);
      GemmBf16 gq;
      gq.rows = bq, gq.cols = dk, gq.depth = n2;
      gq.a = w.ds2.data(), gq.a_rs = n2, gq.a_ks = 1;
      gq.b = w.k2.data(), gq.b_ks = dk;
      gq.c = dq + i0 * dk, gq.c_rs = dk;
      gq.accumulate = true;
      kr.gemm_bf16(gq);
      continue;
    }
    if (cx.bf16_grads) {  // P and dS as the bf16 operands of the three products below
      bf16_round(w.s.data(), w.s.data(), bq * ld);
      bf16_round(w.dp.data(), w.dp.data(), bq * ld);
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

}  // namespace qkv::kernels::flash
