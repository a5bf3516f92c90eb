// Tests of the public entry points over the fused attention kernel against the float64 oracle: packed
// variable-length batches, the paged KV cache, attention() dispatch, attention_fused, attention_backward, and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "attention_flash_testing.h"
#include "ops_testing.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/attention_varlen.h"
#include "qkv/ops/lowp.h"

namespace qkv {
namespace {

using namespace testing::flash;
using testing::randn;
using testing::ThrowsArg;

// ---------------------------------------------------------------------------------------------------------------
// Packed variable-length batches (attention_varlen): each sequence against the float64 oracle on its own

// Rows [a, b) of a packed (total, H, D) tensor as a contiguous (H, b - a, D) copy: the oracle's input.
Tensor unpack(const Tensor& t, int64_t a, int64_t b) { return t.slice(0, a, b).transpose(0, 1).contiguous(); }

// The oracle's (H, T, D) results written back into packed (total, H, D) rows.
void pack_into(std::vector<double>& dst, const std::vector<double>& src, int64_t a, int64_t heads, int64_t t,
               int64_t d) {
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < t; ++i)
      for (int64_t c = 0; c < d; ++c)
        dst[static_cast<size_t>(((a + i) * heads + h) * d + c)] = src[static_cast<size_t>((h * t + i) * d + c)];
}

struct VarlenCase {
  std::vector<int32_t> lq, lk;  // lengths per sequence
  int64_t hq, hkv, dk, dv;
  AttentionOptions o;
};

void CheckVarlen(const VarlenCase& c, uint64_t seed) {
  std::vector<int32_t> cq{0}, ck{0};
  for (size_t b = 0; b < c.lq.size(); ++b) {
    cq.push_back(cq.back() + c.lq[b]);
    ck.push_back(ck.back() + c.lk[b]);
  }
  const int64_t tq = cq.back(), tk = ck.back();
  const int32_t mq = *std::max_element(c.lq.begin(), c.lq.end()), mk = *std::max_element(c.lk.begin(), c.lk.end());
  const Tensor q = randn({tq, c.hq, c.dk}, seed), k = randn({tk, c.hkv, c.dk}, seed + 1);
  const Tensor v = randn({tk, c.hkv, c.dv}, seed + 2), g = randn({tq, c.hq, c.dv}, seed + 3);
  AttentionOptions o = c.o;
  o.return_lse = true;
  const AttentionResult r = attention_varlen(q, k, v, cq, ck, mq, mk, o);
  const AttentionGrads gr = attention_varlen_backward(q, k, v, r.out, r.lse, g, cq, ck, mq, mk, c.o);
  std::vector<double> out(static_cast<size_t>(tq * c.hq * c.dv)), dq(static_cast<size_t>(tq * c.hq * c.dk));
  std::vector<double> dk(static_cast<size_t>(tk * c.hkv * c.dk)), dv(static_cast<size_t>(tk * c.hkv * c.dv));
  std::vector<double> lse(static_cast<size_t>(c.hq * tq), -kInf);
  double dq_mag = 0.0, dk_mag = 0.0;
  for (size_t b = 0; b + 1 < cq.size(); ++b) {
    const int64_t qa = cq[b], qb = cq[b + 1], ka = ck[b], kb = ck[b + 1];
    if (qb == qa || kb == ka) continue;  // no query, or no key: zeros (and lse -inf) expected
    AttentionOptions so = c.o;
    so.enable_gqa = c.hq != c.hkv;
    const Oracle s = oracle(unpack(q, qa, qb), unpack(k, ka, kb), unpack(v, ka, kb), so, unpack(g, qa, qb));
    pack_into(out, s.out, qa, c.hq, qb - qa, c.dv);
    pack_into(dq, s.dq, qa, c.hq, qb - qa, c.dk);
    pack_into(dk, s.dk, ka, c.hkv, kb - ka, c.dk);
    pack_into(dv, s.dv, ka, c.hkv, kb - ka, c.dv);
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < qb - qa; ++i)
        lse[static_cast<size_t>(h * tq + qa + i)] = s.lse[static_cast<size_t>(h * (qb - qa) + i)];
    dq_mag = std::max(dq_mag, s.dq_mag);
    dk_mag = std::max(dk_mag, s.dk_mag);
  }
  EXPECT_TRUE(NormClose(r.out, out, kForwardRtol, "out"));
  EXPECT_TRUE(LseClose(r.lse, lse));
  EXPECT_TRUE(NormClose(gr.dq, dq, kBackwardRtol, "dq", dq_mag));
  EXPECT_TRUE(NormClose(gr.dk, dk, kBackwardRtol, "dk", dk_mag));
  EXPECT_TRUE(NormClose(gr.dv, dv, kBackwardRtol, "dv"));
}

TEST(AttentionVarlen, EachSequenceMatchesFloat64Oracle) {
  AttentionOptions plain, causal, variants;
  causal.causal = Causal::kBottomRight;
  variants.causal = Causal::kBottomRight;
  variants.window_left = 6;
  variants.softcap = 2.5f;
  // Lengths 1..40 with Tq != Tk, an empty query sequence and an empty key sequence; GQA 4/2 and MQA 3/1.
  CheckVarlen({{5, 1, 17, 0, 33, 9}, {5, 8, 17, 4, 40, 0}, 4, 2, 16, 16, plain}, 100);
  CheckVarlen({{7, 12, 1, 30}, {7, 20, 3, 30}, 3, 1, 64, 24, causal}, 200);
  CheckVarlen({{9, 25, 2}, {14, 25, 2}, 4, 4, 80, 80, variants}, 300);
}

TEST(AttentionVarlen, ManySequencesShareTheThreads) {  // more sequences than threads: the outer parallel loop
  std::vector<int32_t> lens;
  for (int32_t i = 0; i < 24; ++i) lens.push_back(1 + (i * 7) % 19);
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  CheckVarlen({lens, lens, 2, 1, 8, 8, o}, 400);
}

TEST(AttentionVarlenErrors, BadOffsetsNameTheOpAndTheOffsets) {
  const Tensor q = randn({6, 2, 4}, 1), k = randn({6, 2, 4}, 2);
  const std::vector<int32_t> good{0, 2, 6};
  EXPECT_TRUE(ThrowsArg([&] { attention_varlen(q, k, k, std::vector<int32_t>{0, 4, 2}, good, 6, 6); },
                        "[attention_varlen] cu_seqlens_q [0, 4, 2] must be non-decreasing"));
  EXPECT_TRUE(ThrowsArg([&] { attention_varlen(q, k, k, good, std::vector<int32_t>{0, 2, 5}, 6, 6); },
                        "[attention_varlen] the last entry of cu_seqlens_k (5) must equal the packed length 6"));
  EXPECT_TRUE(ThrowsArg([&] { attention_varlen(q, k, k, std::vector<int32_t>{1, 2, 6}, good, 6, 6); },
                        "must start at 0"));
  EXPECT_TRUE(ThrowsArg([&] { attention_varlen(q, k, k, good, good, 3, 6); }, "has length 4 > max_seqlen 3"));
  EXPECT_TRUE(ThrowsArg([&] { attention_varlen(q, k, k, good, std::vector<int32_t>{0, 6}, 6, 6); },
                        "must have the same length B + 1"));
  EXPECT_TRUE(ThrowsArg([&] { attention_varlen(randn({6, 3, 4}, 3), k, k, good, good, 6, 6); },
                        "must be a multiple of the kv heads"));
  const Tensor out = randn({6, 2, 4}, 4);
  EXPECT_TRUE(ThrowsArg([&] { attention_varlen_backward(q, k, k, out, randn({6, 2}, 5), out, good, good, 6, 6); },
                        "[attention_varlen_backward] lse (6, 2) must be (Hq, total_q) = (2, 6)"));
}

// ---------------------------------------------------------------------------------------------------------------
// The paged KV cache (attention_with_kvcache): appends land in their blocks; the result is the oracle's on the
// whole cache

TEST(AttentionKvCache, PagedAndContiguousMatchFloat64OracleAndAppendInPlace) {
  const int64_t B = 2, hq = 6, hkv = 2, d = 16, bs = 8, tnew = 3, max_blocks = 4;
  const std::vector<int32_t> cached{13, 1};
  const std::vector<int32_t> table{5, 2, 7, 0, 1, 6, 3, 4};  // scattered physical blocks
  for (bool paged : {true, false}) {
    for (int variant = 0; variant < 2; ++variant) {
      SCOPED_TRACE(std::string(paged ? "paged" : "contiguous") + " variant " + std::to_string(variant));
      Tensor kc = paged ? randn({8, bs, hkv, d}, 1) : randn({B, max_blocks * bs, hkv, d}, 1);
      Tensor vc = paged ? randn({8, bs, hkv, d}, 2) : randn({B, max_blocks * bs, hkv, d}, 2);
      const Tensor q = randn({B, tnew, hq, d}, 3), kn = randn({B, tnew, hkv, d}, 4), vn = randn({B, tnew, hkv, d}, 5);
      AttentionOptions o;
      o.causal = Causal::kBottomRight;
      if (variant == 1) o.window_left = 4, o.softcap = 3.0f;
      const Tensor kc0 = kc.clone(), vc0 = vc.clone();
      const AttentionResult r = attention_with_kvcache(q, kc, vc, kn, vn, cached,
                                                       paged ? std::span<const int32_t>(table)
                                                             : std::span<const int32_t>(),
                                                       paged ? max_blocks : 0, o);
      EXPECT_EQ(r.out.shape(), (Shape{B, tnew, hq, d}));
      for (int64_t b = 0; b < B; ++b) {
        const int64_t tk = cached[static_cast<size_t>(b)] + tnew;
        // The sequence's keys in order, gathered from the (updated) cache: (Hkv, tk, D).
        auto gather = [&](const Tensor& cache) {
          std::vector<float> x(static_cast<size_t>(hkv * tk * d));
          const Tensor c = cache.contiguous();
          for (int64_t p = 0; p < tk; ++p) {
            const int64_t blk = paged ? table[static_cast<size_t>(b * max_blocks + p / bs)] : b;
            const int64_t row = paged ? blk * bs + p % bs : blk * max_blocks * bs + p;
            for (int64_t h = 0; h < hkv; ++h)
              for (int64_t c2 = 0; c2 < d; ++c2)
                x[static_cast<size_t>((h * tk + p) * d + c2)] = c.data()[(row * hkv + h) * d + c2];
          }
          return Tensor::from_vector({hkv, tk, d}, x);
        };
        const Tensor kseq = gather(kc), vseq = gather(vc);
        // The appended rows are k_new's, the rows before them untouched.
        const Tensor knb = kn.select(0, b).transpose(0, 1).contiguous();  // (Hkv, tnew, D)
        EXPECT_TRUE(NormClose(kseq.slice(1, tk - tnew, tk).contiguous(), testing::to_double(knb), 0.0, "appended"));
        AttentionOptions so = o;
        so.enable_gqa = true;
        const Oracle ref = oracle(q.select(0, b).transpose(0, 1).contiguous(), kseq, vseq, so, Tensor());
        EXPECT_TRUE(NormClose(r.out.select(0, b).transpose(0, 1).contiguous(), ref.out, kForwardRtol, "out"));
      }
      // Blocks no sequence owns stay as they were.
      if (paged) EXPECT_TRUE(NormClose(kc.select(0, 7).slice(0, 0, bs), testing::to_double(kc0.select(0, 7)), 0.0, "unowned"));
    }
  }
}

// bf16 with enough new queries for the paired path (a group's 4 x 131 stacked query rows make two query tiles, so K
// and V are paired once per head, read through the block table): pages of an odd and an even size, so that page
// boundaries cut key tiles at odd keys, with and without a window; each sequence against the float64 oracle on its
// bf16-rounded q, k, v (the rounded P is the only difference).
TEST(AttentionKvCache, Bf16PagedPrefillMatchesTheOracleOnRoundedInputs) {
  const int64_t B = 2, hq = 8, hkv = 2, d = 24, tnew = 131;
  const std::vector<int32_t> cached{11, 0};
  for (int64_t bs : {5, 8}) {
    const int64_t max_blocks = (cached[0] + tnew + bs - 1) / bs, blocks = B * max_blocks;
    std::vector<int32_t> table;
    for (int64_t i = 0; i < blocks; ++i) table.push_back(static_cast<int32_t>((i * 7 + 3) % blocks));
    for (int64_t window : {-1, 6}) {
      SCOPED_TRACE("page " + std::to_string(bs) + " window " + std::to_string(window));
      Tensor kc = randn({blocks, bs, hkv, d}, 21), vc = randn({blocks, bs, hkv, d}, 22);
      const Tensor q = randn({B, tnew, hq, d}, 23);
      const Tensor kn = randn({B, tnew, hkv, d}, 24), vn = randn({B, tnew, hkv, d}, 25);
      AttentionOptions o;
      o.causal = Causal::kBottomRight;
      o.window_left = window;
      o.precision = Precision::kBFloat16;
      const AttentionResult r = attention_with_kvcache(q, kc, vc, kn, vn, cached, table, max_blocks, o);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t tk = cached[static_cast<size_t>(b)] + tnew;
        auto gather = [&](const Tensor& cache) {  // (Hkv, tk, D), rounded to bf16
          std::vector<float> x(static_cast<size_t>(hkv * tk * d));
          for (int64_t p = 0; p < tk; ++p) {
            const int64_t row = table[static_cast<size_t>(b * max_blocks + p / bs)] * bs + p % bs;
            for (int64_t h = 0; h < hkv; ++h)
              for (int64_t c = 0; c < d; ++c)
                x[static_cast<size_t>((h * tk + p) * d + c)] = cache.data()[(row * hkv + h) * d + c];
          }
          return round_to_bf16(Tensor::from_vector({hkv, tk, d}, x));
        };
        AttentionOptions so = o;
        so.enable_gqa = true;
        so.precision = Precision::kFloat32;
        const Oracle ref = oracle(round_to_bf16(q.select(0, b).transpose(0, 1).contiguous()), gather(kc), gather(vc),
                                  so, Tensor());
        EXPECT_TRUE(NormClose(r.out.select(0, b).transpose(0, 1).contiguous(), ref.out, 1e-2, "out")) << "b " << b;
      }
    }
  }
}

TEST(AttentionKvCache, GqaDecodingMatchesTheOracle) {  // one query per sequence: the stacked-heads path
  const int64_t B = 3, hq = 8, hkv = 2, d = 64, bs = 16;
  const std::vector<int32_t> cached{40, 1, 16};
  std::vector<int32_t> table;
  for (int32_t i = 0; i < 9; ++i) table.push_back((i * 5) % 9);
  Tensor kc = randn({9, bs, hkv, d}, 11), vc = randn({9, bs, hkv, d}, 12);
  const Tensor q = randn({B, 1, hq, d}, 13), kn = randn({B, 1, hkv, d}, 14), vn = randn({B, 1, hkv, d}, 15);
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  const AttentionResult r = attention_with_kvcache(q, kc, vc, kn, vn, cached, table, 3, o);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t tk = cached[static_cast<size_t>(b)] + 1;
    std::vector<float> kx(static_cast<size_t>(hkv * tk * d)), vx(kx.size());
    for (int64_t p = 0; p < tk; ++p) {
      const int64_t row = table[static_cast<size_t>(b * 3 + p / bs)] * bs + p % bs;
      for (int64_t h = 0; h < hkv; ++h)
        for (int64_t c = 0; c < d; ++c) {
          kx[static_cast<size_t>((h * tk + p) * d + c)] = kc.data()[(row * hkv + h) * d + c];
          vx[static_cast<size_t>((h * tk + p) * d + c)] = vc.data()[(row * hkv + h) * d + c];
        }
    }
    AttentionOptions so = o;
    so.enable_gqa = true;
    const Oracle ref = oracle(q.select(0, b).transpose(0, 1).contiguous(), Tensor::from_vector({hkv, tk, d}, kx),
                              Tensor::from_vector({hkv, tk, d}, vx), so, Tensor());
    EXPECT_TRUE(NormClose(r.out.select(0, b).transpose(0, 1).contiguous(), ref.out, kForwardRtol, "out"));
  }
}

TEST(AttentionKvCacheErrors, BadArgumentsNameTheOp) {
  Tensor kc = randn({2, 4, 1, 8}, 1), vc = randn({2, 4, 1, 8}, 2);
  const Tensor q = randn({2, 1, 2, 8}, 3), kn = randn({2, 1, 1, 8}, 4);
  const std::vector<int32_t> full{1, 4};
  EXPECT_TRUE(ThrowsArg([&] { attention_with_kvcache(q, kc, vc, kn, kn, full, {}, 0); },
                        "[attention_with_kvcache] sequence 1: 4 cached keys + 1 new ones exceed the capacity 4"));
  const std::vector<int32_t> bad_table{7, 0};
  EXPECT_TRUE(ThrowsArg([&] { attention_with_kvcache(q, kc, vc, Tensor(), Tensor(), full, bad_table, 1); },
                        "block_table entry 7 is outside [0, 2)"));
  EXPECT_TRUE(ThrowsArg([&] { attention_with_kvcache(q, kc, vc, kn, Tensor(), full, {}, 0); },
                        "must both be (B, Tnew, Hkv, D)"));
}



// ---------------------------------------------------------------------------------------------------------------
// The public entry points: attention() dispatch, attention_fused, attention_backward, and their error paths

TEST(AttentionFused, AttentionDispatchesToFusedWithoutWeights) {
  const Tensor q = randn({2, 2, 130, 32}, 70), k = randn({2, 2, 140, 32}, 71), v = randn({2, 2, 140, 32}, 72);
  AttentionOptions o;
  o.causal = Causal::kTopLeft;
  EXPECT_TRUE(bit_equal(attention(q, k, v, o).out, attention_fused(q, k, v, o).out));
  o.return_weights = true;  // the reference path: weights come back
  EXPECT_TRUE(attention(q, k, v, o).weights.defined());
}

TEST(AttentionFused, LseOnlyWhenAsked) {
  const Tensor q = randn({4, 8}, 73), k = randn({5, 8}, 74), v = randn({5, 8}, 75);
  EXPECT_FALSE(attention_fused(q, k, v).lse.defined());
  AttentionOptions o;
  o.return_lse = true;
  EXPECT_EQ(attention_fused(q, k, v, o).lse.shape(), (Shape{4}));
}

TEST(AttentionFused, BackwardMatchesOracleAndReference) {
  const Tensor q = randn({2, 3, 70, 16}, 76), k = randn({2, 3, 90, 16}, 77), v = randn({2, 3, 90, 24}, 78);
  const Tensor g = randn({2, 3, 70, 24}, 79);
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  o.return_lse = true;
  const AttentionResult f = attention_fused(q, k, v, o);
  const AttentionGrads a = attention_backward(q, k, v, f.out, f.lse, g, o);
  const Oracle r = oracle(q, k, v, o, g);
  EXPECT_TRUE(NormClose(a.dq, r.dq, kBackwardRtol, "dq", r.dq_mag));
  EXPECT_TRUE(NormClose(a.dk, r.dk, kBackwardRtol, "dk", r.dk_mag));
  EXPECT_TRUE(NormClose(a.dv, r.dv, kBackwardRtol, "dv"));
  const AttentionGrads ref = attention_backward_reference(q, k, v, f.out, f.lse, g, o);
  EXPECT_TRUE(NormClose(a.dv, testing::to_double(ref.dv), kBackwardRtol, "dv vs reference"));
}

TEST(AttentionFused, BackwardRecomputesForwardWhenOutOrLseUndefined) {
  const Tensor q = randn({3, 50, 8}, 80), k = randn({3, 60, 8}, 81), v = randn({3, 60, 8}, 82);
  const Tensor g = randn({3, 50, 8}, 83);
  AttentionOptions o;
  o.return_lse = true;
  const AttentionResult f = attention_fused(q, k, v, o);
  const AttentionGrads a = attention_backward(q, k, v, f.out, f.lse, g, o);
  const AttentionGrads b = attention_backward(q, k, v, Tensor(), Tensor(), g, o);
  EXPECT_TRUE(bit_equal(a.dq, b.dq));
  EXPECT_TRUE(bit_equal(a.dk, b.dk));
  EXPECT_TRUE(bit_equal(a.dv, b.dv));
}

TEST(AttentionFused, BroadcastInputsGetSummedGradients) {
  // k, v shared by every head (broadcast): their gradients sum over heads.
  const Tensor q = randn({2, 4, 40, 16}, 84), k = randn({2, 1, 50, 16}, 85), v = randn({50, 16}, 86);
  EXPECT_TRUE(MatchesOracle(q, k, v, {}, randn({2, 4, 40, 16}, 87)));
}

TEST(AttentionFusedErrors, WeightsRequestedFromFusedPath) {
  AttentionOptions o;
  o.return_weights = true;
  EXPECT_TRUE(ThrowsArg([&] { attention_fused(randn({3, 4}, 1), randn({3, 4}, 2), randn({3, 4}, 3), o); },
                        "[attention]"));
}

TEST(AttentionFusedErrors, BadInputsNameTheOp) {
  EXPECT_TRUE(ThrowsArg([&] { attention_fused(randn({4}, 1), randn({3, 4}, 2), randn({3, 4}, 3)); }, "[attention]"));
  EXPECT_TRUE(ThrowsArg([&] { attention_fused(randn({3, 4}, 1), randn({3, 5}, 2), randn({3, 4}, 3)); }, "[attention]"));
  AttentionOptions o;
  o.mask = randn({3, 3}, 4);  // kind left at kNone
  EXPECT_TRUE(ThrowsArg([&] { attention_fused(randn({3, 4}, 1), randn({3, 4}, 2), randn({3, 4}, 3), o); },
                        "[attention]"));
}

TEST(AttentionFusedErrors, BadVariantOptionsNameTheOpAndShapes) {
  const Tensor q = randn({1, 6, 3, 4}, 1), k = randn({1, 4, 5, 4}, 2), v = randn({1, 4, 5, 4}, 3);
  AttentionOptions gqa;
  gqa.enable_gqa = true;  // 6 query heads over 4 kv heads
  EXPECT_TRUE(ThrowsArg([&] { attention(q, k, v, gqa); }, "[attention] enable_gqa: the query heads of q (1, 6, 3, 4)"));
  EXPECT_TRUE(ThrowsArg([&] { attention(q, k, randn({1, 2, 5, 4}, 4), gqa); }, "must have the same number of heads"));
  EXPECT_TRUE(ThrowsArg([&] { attention(randn({3, 4}, 5), randn({5, 4}, 6), randn({5, 4}, 7), gqa); },
                        "enable_gqa needs q (3, 4)"));
  EXPECT_TRUE(ThrowsArg([&] { attention(q, k, v); }, "do not broadcast"));  // GQA shapes without enable_gqa
  AttentionOptions w;
  w.window_left = -2;
  EXPECT_TRUE(ThrowsArg([&] { attention(k, k, v, w); }, "[attention] window_size (-2, -1) must be >= -1"));
  AttentionOptions c;
  c.softcap = -1.0f;
  EXPECT_TRUE(ThrowsArg([&] { attention(k, k, v, c); }, "[attention] softcap -1 must be finite and >= 0"));
  c.softcap = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(ThrowsArg([&] { attention_backward(k, k, v, Tensor(), Tensor(), randn({1, 4, 5, 4}, 8), c); },
                        "[attention_backward] softcap"));
}

TEST(AttentionFusedErrors, BackwardShapesNameTheOp) {
  const Tensor q = randn({2, 5, 4}, 1), k = randn({2, 6, 4}, 2), v = randn({2, 6, 3}, 3);
  const Tensor g = randn({2, 5, 3}, 4), lse = randn({2, 5}, 5), out = randn({2, 5, 3}, 6);
  const std::string op = "[attention_backward]";
  EXPECT_TRUE(ThrowsArg([&] { attention_backward(q, k, v, out, lse, randn({2, 5, 4}, 7)); }, op));  // d_out
  EXPECT_TRUE(ThrowsArg([&] { attention_backward(q, k, v, out, lse, Tensor()); }, op));
  EXPECT_TRUE(ThrowsArg([&] { attention_backward(q, k, v, out, randn({2, 6}, 8), g); }, op));       // lse
  EXPECT_TRUE(ThrowsArg([&] { attention_backward(q, k, v, randn({5, 3}, 9), lse, g); }, op));       // out
  EXPECT_TRUE(ThrowsArg([&] { attention_backward(randn({5}, 10), k, v, out, lse, g); }, op));       // rank
  EXPECT_TRUE(ThrowsArg([&] { attention_backward(q, randn({2, 6, 5}, 11), v, out, lse, g); }, op));  // Dk
}

TEST(AttentionFusedErrors, KernelBackwardNeedsOutAndLse) {
  const Tensor q = randn({5, 4}, 1), k = randn({6, 4}, 2), v = randn({6, 3}, 3), g = randn({5, 3}, 4);
  EXPECT_TRUE(ThrowsArg(
      [&] { kernels::attention_flash_backward(q, k, v, Tensor(), randn({5}, 5), g, {}, Shape{}, 0.5f); },
      "[attention_backward]"));
  EXPECT_TRUE(ThrowsArg(
      [&] { kernels::attention_flash_backward(q, k, v, randn({5, 3}, 6), Tensor(), g, {}, Shape{}, 0.5f); },
      "[attention_backward]"));
}

// Decoding one query row a head against a long cache splits each head's keys into parts made for a fixed team, not
// the threads at hand: the output and LSE are the same bits at 1, 2 and 3 threads (a reply does not change with the
// thread count). GQA (9 query heads over 3), one row, keys past several parts; and a plain multi-head case.
TEST(AttentionFlash, DecodeBitsDoNotDependOnTheThreadCount) {
  for (const auto& [hq, hkv, tk] : {std::tuple<int64_t, int64_t, int64_t>{9, 3, 576}, {4, 4, 1000}, {6, 2, 37}}) {
    const Tensor q = randn({1, hq, 1, 64}, 11), k = randn({1, hkv, tk, 64}, 12), v = randn({1, hkv, tk, 64}, 13);
    AttentionOptions o;
    o.causal = Causal::kBottomRight;
    o.enable_gqa = hq != hkv;
    const Shape batch = attention_check(q, k, v, o, "test");
    std::vector<std::vector<float>> outs, lses;
    for (int threads : {1, 2, 3}) {
      kernels::FlashConfig cfg;
      cfg.threads = threads;
      cfg.min_work_per_thread = 0;  // every thread started
      const AttentionResult r = kernels::attention_flash_forward(q, k, v, o, batch, 0.125f, cfg);
      outs.push_back(r.out.to_vector());
      lses.push_back(r.lse.to_vector());
    }
    for (size_t i = 1; i < outs.size(); ++i) {
      EXPECT_EQ(outs[i], outs[0]) << "Hq " << hq << " Hkv " << hkv << " Tk " << tk << ": threads " << i + 1;
      EXPECT_EQ(lses[i], lses[0]) << "Hq " << hq << " Hkv " << hkv << " Tk " << tk << ": threads " << i + 1;
    }
  }
}

}  // namespace
}  // namespace qkv
