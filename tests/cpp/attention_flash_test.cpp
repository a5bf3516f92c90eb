// Tests of the fused attention kernel (forward and backward) against a float64 oracle: a random sweep over sizes,
// layouts, masks and causal alignments, the edge cases one by one, bit-identical reruns, and the error paths.
//
// Sanitizers: passes under -fsanitize=address,undefined (make test-asan) and ThreadSanitizer (make test-tsan:
// clang-14, libomp and Archer). TSan does not see 256-bit AVX stores, so ThreadedWorkSplitsOnPortableKernels runs
// every work split on the portable kernels, where a race in the split is reported.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention_flash_testing.h"
#include "ops_testing.h"
#include "qkv/core/rng.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/kernels/cpu.h"
#include "qkv/ops/attention.h"

namespace qkv {
namespace {

using namespace testing::flash;
using kernels::FlashConfig;
using kernels::FlashIsa;
using testing::randn;
using testing::ThrowsArg;

// (..., T, D) tensor laid out as a view: kind 0 contiguous; 1 a (B, T, H, D) buffer seen as (B, H, T, D) (needs
// rank 4); 2 a slice of a wider last dim (row stride > D); 3 last dim not contiguous (the kernel copies it).
Tensor make_input(Shape shape, int layout, uint64_t seed) {
  const size_t r = shape.size();
  if (layout == 1 && r == 4) return randn({shape[0], shape[2], shape[1], shape[3]}, seed).transpose(1, 2);
  if (layout == 2) {
    Shape wide = shape;
    wide[r - 1] += 3;
    return randn(wide, seed).slice(static_cast<int64_t>(r) - 1, 1, 1 + shape[r - 1]);
  }
  if (layout == 3) {
    std::swap(shape[r - 1], shape[r - 2]);
    return randn(shape, seed).transpose(-1, -2);
  }
  return randn(shape, seed);
}

struct Config {
  AttentionOptions o;
  Tensor q, k, v, d_out;
  std::string desc;
};

// A random configuration: odd sizes, T = 1, Tq != Tk, D in {1, 3, 16, 64, 80, 128}, every mask kind and shape,
// both causal alignments, broadcast and strided inputs, fully masked rows.
Config random_config(uint64_t seed) {
  Rng rng(seed);
  const int64_t ts[] = {1, 2, 3, 5, 7, 8, 9, 16, 17, 33, 48, 95, 96, 97, 130, 193};
  const int64_t ds[] = {1, 3, 16, 64, 80, 128};
  auto pick_t = [&] { return ts[rng.below(std::size(ts))]; };
  const int64_t tq = pick_t(), tk = rng.bernoulli(0.3f) ? tq : pick_t();
  const int64_t dk = ds[rng.below(std::size(ds))], dv = rng.bernoulli(0.6f) ? dk : ds[rng.below(std::size(ds))];
  const int64_t B = 1 + static_cast<int64_t>(rng.below(2)), H = 1 + static_cast<int64_t>(rng.below(3));
  const int lead_kind = static_cast<int>(rng.below(4));  // 0: (T, D); 1: (B, T, D); 2: (B, H, T, D); 3: broadcast
  Shape lq, lk, lv, batch;
  switch (lead_kind) {
    case 0: break;
    case 1: lq = lk = lv = batch = {B}; break;
    case 2: lq = lk = lv = batch = {B, H}; break;
    default:
      lq = {B, H}, lk = {1, H}, lv = {H};
      batch = {B, H};
      break;
  }
  auto with = [](Shape s, int64_t a, int64_t b) {
    s.push_back(a);
    s.push_back(b);
    return s;
  };
  const int layout = static_cast<int>(rng.below(4));
  Config c;
  c.q = make_input(with(lq, tq, dk), layout, seed * 7 + 1);
  c.k = make_input(with(lk, tk, dk), layout, seed * 7 + 2);
  c.v = make_input(with(lv, tk, dv), layout, seed * 7 + 3);
  c.d_out = randn(with(batch, tq, dv), seed * 7 + 4);
  c.o.causal = static_cast<Causal>(rng.below(3));
  if (rng.bernoulli(0.3f)) c.o.scale = rng.uniform(0.2f, 2.0f) / std::sqrt(static_cast<float>(dk));
  const int mk = static_cast<int>(rng.below(4));
  if (mk != 0) {
    c.o.mask_kind = static_cast<MaskKind>(mk);
    const int ms = static_cast<int>(rng.below(4));  // (Tq, Tk), (1, Tk), (Tq, 1), (batch..., Tq, Tk)
    Shape mshape = ms == 0 ? Shape{tq, tk} : ms == 1 ? Shape{1, tk} : ms == 2 ? Shape{tq, 1} : with(batch, tq, tk);
    Tensor m = c.o.mask_kind == MaskKind::kAdditive ? randn(mshape, seed * 7 + 5) : rng.bernoulli(mshape, 0.7f);
    std::vector<float> mv = m.to_vector();
    const int64_t cols = mshape.back(), rows = static_cast<int64_t>(mv.size()) / cols;
    for (int64_t r = 0; r < rows; ++r) {
      const bool full_block = rng.bernoulli(0.15f);  // some rows fully masked
      for (int64_t j = 0; j < cols; ++j) {
        float& x = mv[static_cast<size_t>(r * cols + j)];
        if (c.o.mask_kind == MaskKind::kAdditive && (full_block || rng.bernoulli(0.2f)))
          x = -std::numeric_limits<float>::infinity();
        if (c.o.mask_kind == MaskKind::kKeep && full_block) x = 0.0f;
        if (c.o.mask_kind == MaskKind::kBlock && full_block) x = 1.0f;
      }
    }
    c.o.mask = Tensor::from_vector(mshape, mv);
  }
  c.desc = "seed " + std::to_string(seed) + ": q " + str(c.q.shape()) + " k " + str(c.k.shape()) + " v " +
           str(c.v.shape()) + " layout " + std::to_string(layout) + " causal " +
           std::to_string(static_cast<int>(c.o.causal)) + " mask " + std::to_string(mk) +
           (c.o.mask.defined() ? str(c.o.mask.shape()) : "") + (c.o.scale ? " custom scale" : "");
  return c;
}

// ---------------------------------------------------------------------------------------------------------------
// The sweep

// Tile sizes (fwd queries, fwd keys, bwd queries, bwd keys): the defaults, and small ones so that small shapes
// cross many tile edges (partial tiles, causal diagonals at every offset, split keys, dQ chunks).
constexpr int64_t kTileChoices[][4] = {{0, 0, 0, 0}, {16, 24, 16, 24}, {8, 8, 8, 8}, {24, 16, 32, 8}, {48, 40, 24, 40}};

void Sweep(int n, uint64_t first_seed, const FlashConfig& base) {
  for (int i = 0; i < n; ++i) {
    const Config c = random_config(first_seed + static_cast<uint64_t>(i));
    FlashConfig cfg = base;
    const auto& t = kTileChoices[static_cast<size_t>(i) % std::size(kTileChoices)];
    cfg.fwd_q_tile = t[0], cfg.fwd_k_tile = t[1], cfg.bwd_q_tile = t[2], cfg.bwd_k_tile = t[3];
    EXPECT_TRUE(MatchesOracle(c.q, c.k, c.v, c.o, c.d_out, cfg))
        << c.desc << " isa " << kernels::flash_isa_name(cfg.isa) << " tiles " << t[0] << "," << t[1] << ","
        << t[2] << "," << t[3];
  }
}

TEST(AttentionFlash, RandomConfigsMatchFloat64Oracle) { Sweep(220, 1000, {}); }

TEST(AttentionFlash, PortableKernelsMatchFloat64Oracle) { Sweep(60, 5000, {FlashIsa::kPortable, 0}); }

TEST(AttentionFlash, OddThreadCountsMatchFloat64Oracle) {
  Sweep(30, 7000, {FlashIsa::kAuto, 3, 0});
  Sweep(20, 8000, {FlashIsa::kAuto, 1, 0});
}

// ---------------------------------------------------------------------------------------------------------------
// The attention variants (GQA/MQA, sliding window, soft cap) over the same random configurations

// random_config(seed) with, at random: q's heads multiplied by a GQA group (k and v keep theirs; never copied), a
// sliding window on either side (often narrow, so whole key tiles fall outside and rows see no key), a soft cap.
Config random_variant_config(uint64_t seed) {
  Config c = random_config(seed);
  Rng rng(seed * 31 + 7);
  const int64_t sides[] = {-1, -1, 0, 1, 2, 5, 13, 40};
  c.o.window_left = sides[rng.below(std::size(sides))];
  c.o.window_right = sides[rng.below(std::size(sides))];
  if (rng.bernoulli(0.6f)) c.o.softcap = rng.uniform(0.3f, 6.0f);
  const bool gqa = c.q.dim() == 4 && (!c.o.mask.defined() || c.o.mask.dim() < 4) && rng.bernoulli(0.7f);
  if (gqa) {
    const int64_t group = 2 + static_cast<int64_t>(rng.below(2));
    Shape qs = c.q.shape(), gs = c.d_out.shape();
    qs[1] *= group;
    gs[1] *= group;
    c.q = make_input(qs, static_cast<int>(rng.below(3)), seed * 7 + 11);
    c.d_out = randn(gs, seed * 7 + 12);
    c.o.enable_gqa = true;
  }
  c.desc += " window (" + std::to_string(c.o.window_left) + ", " + std::to_string(c.o.window_right) + ") softcap " +
            std::to_string(c.o.softcap) + (gqa ? " gqa q " + str(c.q.shape()) : "");
  return c;
}

void VariantSweep(int n, uint64_t first_seed, FlashIsa isa) {
  for (int i = 0; i < n; ++i) {
    const Config c = random_variant_config(first_seed + static_cast<uint64_t>(i));
    FlashConfig cfg{isa, 0, 0};
    const auto& t = kTileChoices[static_cast<size_t>(i) % std::size(kTileChoices)];
    cfg.fwd_q_tile = t[0], cfg.fwd_k_tile = t[1], cfg.bwd_q_tile = t[2], cfg.bwd_k_tile = t[3];
    EXPECT_TRUE(MatchesOracle(c.q, c.k, c.v, c.o, c.d_out, cfg))
        << c.desc << " isa " << kernels::flash_isa_name(cfg.isa) << " tiles " << t[0] << "," << t[1] << ","
        << t[2] << "," << t[3];
  }
}

TEST(AttentionFlashVariants, PortableKernelsMatchFloat64Oracle) { VariantSweep(30, 20000, FlashIsa::kPortable); }

TEST(AttentionFlashVariants, Avx2KernelsMatchFloat64Oracle) {
  if (!kernels::cpu_supports(kernels::Isa::kAvx2)) {  // nothing to run: a named AVX2 request must then throw
    EXPECT_THROW(run_fused(randn({4, 8}, 1), randn({4, 8}, 2), randn({4, 8}, 3), {}, Tensor(), {FlashIsa::kAvx2, 0}),
                 std::runtime_error);
    return;
  }
  VariantSweep(40, 21000, FlashIsa::kAvx2);
}

// This CPU may lack AVX-512 (then the avx512 set is only compiled, sharing every line of the driver above).
TEST(AttentionFlashVariants, Avx512KernelsMatchFloat64Oracle) {
  if (!kernels::cpu_supports(kernels::Isa::kAvx512)) {
    EXPECT_THROW(run_fused(randn({4, 8}, 1), randn({4, 8}, 2), randn({4, 8}, 3), {}, Tensor(), {FlashIsa::kAvx512, 0}),
                 std::runtime_error);
    return;
  }
  VariantSweep(40, 22000, FlashIsa::kAvx512);
}

// The instruction sets this CPU runs, by name (AVX-512 is only compiled where the CPU lacks it).
std::vector<FlashIsa> runnable_isas() {
  std::vector<FlashIsa> isas{FlashIsa::kPortable};
  if (kernels::cpu_supports(kernels::Isa::kAvx2)) isas.push_back(FlashIsa::kAvx2);
  if (kernels::cpu_supports(kernels::Isa::kAvx512)) isas.push_back(FlashIsa::kAvx512);
  return isas;
}

// GQA decoding (one query per head, no mask) stacks each group's heads as the rows of one tile: against the oracle
// with causal, a window and a soft cap, forward and backward, on one and two threads, on every instruction set.
// Tk = 300 and 777 end the key tiles and the P·V key blocks of the stacked rows off their multiples; Dv = 48 and 80
// end the column blocks off theirs.
TEST(AttentionFlashVariants, GqaDecodingStacksTheGroupHeads) {
  for (FlashIsa isa : runnable_isas()) {
    SCOPED_TRACE(kernels::flash_isa_name(isa));
    const Tensor q = randn({2, 8, 1, 64}, 1), k = randn({2, 2, 300, 64}, 2), v = randn({2, 2, 300, 48}, 3);
    AttentionOptions o;
    o.enable_gqa = true;
    EXPECT_TRUE(MatchesOracle(q, k, v, o, randn({2, 8, 1, 48}, 4), {isa, 0, 0}));
    const Tensor lq = randn({1, 6, 1, 128}, 9), lk = randn({1, 2, 777, 128}, 10), lv = randn({1, 2, 777, 80}, 11);
    EXPECT_TRUE(MatchesOracle(lq, lk, lv, o, randn({1, 6, 1, 80}, 12), {isa, 0, 0}));
    o.causal = Causal::kBottomRight;
    o.window_left = 50;
    o.softcap = 4.0f;
    for (int threads : {1, 2}) EXPECT_TRUE(MatchesOracle(q, k, v, o, randn({2, 8, 1, 48}, 5), {isa, threads, 0}));
    const Tensor mq = randn({1, 16, 1, 8}, 6), mk = randn({1, 1, 40, 8}, 7);  // MQA, 16 heads in one tile
    EXPECT_TRUE(MatchesOracle(mq, mk, mk, o, randn({1, 16, 1, 8}, 8), {isa, 0, 0}));
  }
}

// GQA prefill (Tq > 1, no mask) stacks the group's heads too (row t·group + g): causal top-left and bottom-right,
// Tq < Tk and Tq > Tk, windows, a soft cap, odd head sizes, and a q broadcast over the batch (its dQ summed back),
// forward and backward against the oracle on every instruction set.
TEST(AttentionFlashVariants, GqaPrefillStacksTheGroupHeads) {
  for (FlashIsa isa : runnable_isas()) {
    SCOPED_TRACE(kernels::flash_isa_name(isa));
    const Tensor q = randn({2, 6, 37, 24}, 21), k = randn({2, 2, 53, 24}, 22), v = randn({2, 2, 53, 17}, 23);
    AttentionOptions o;
    o.enable_gqa = true;
    EXPECT_TRUE(MatchesOracle(q, k, v, o, randn({2, 6, 37, 17}, 24), {isa, 0, 0}));
    o.causal = Causal::kBottomRight;
    EXPECT_TRUE(MatchesOracle(q, k, v, o, randn({2, 6, 37, 17}, 25), {isa, 2, 0}));
    o.causal = Causal::kTopLeft;
    o.window_left = 9;
    o.window_right = 3;
    o.softcap = 3.0f;
    const Tensor lq = randn({1, 4, 61, 24}, 26);  // Tq > Tk, q broadcast over the batch of 2
    EXPECT_TRUE(MatchesOracle(lq, k, v, o, randn({2, 4, 61, 17}, 27), {isa, 1, 0}));
    const Tensor mq = randn({1, 8, 300, 16}, 28), mk = randn({1, 1, 300, 16}, 29);  // MQA, the default long tiles
    AttentionOptions c;
    c.enable_gqa = true;
    c.causal = Causal::kTopLeft;
    EXPECT_TRUE(MatchesOracle(mq, mk, mk, c, randn({1, 8, 300, 16}, 30), {isa, 2, 0}));
  }
}

// The reference kernels (the weights path) on the same variants, against the same float64 oracle.
TEST(AttentionReferenceVariants, MatchFloat64Oracle) {
  for (uint64_t seed = 23000; seed < 23025; ++seed) {
    const Config c = random_variant_config(seed);
    const Oracle r = oracle(c.q, c.k, c.v, c.o, c.d_out);
    AttentionOptions o = c.o;
    o.return_lse = true;
    const AttentionResult f = attention_reference(c.q, c.k, c.v, o);
    EXPECT_TRUE(NormClose(f.out, r.out, kForwardRtol, "out")) << c.desc;
    EXPECT_TRUE(LseClose(f.lse, r.lse)) << c.desc;
    const AttentionGrads g = attention_backward_reference(c.q, c.k, c.v, f.out, f.lse, c.d_out, c.o);
    EXPECT_TRUE(NormClose(g.dq, r.dq, kBackwardRtol, "dq", r.dq_mag)) << c.desc;
    EXPECT_TRUE(NormClose(g.dk, r.dk, kBackwardRtol, "dk", r.dk_mag)) << c.desc;
    EXPECT_TRUE(NormClose(g.dv, r.dv, kBackwardRtol, "dv")) << c.desc;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Edges, one by one (each shape large enough to span several tiles)

Tensor ones_like_out(const Tensor& q, const Tensor& v) {
  Shape s(q.shape().begin(), q.shape().end() - 1);
  s.push_back(v.size(-1));
  return randn(s, 99);
}

TEST(AttentionFlash, LongSequencesSpanManyTiles) {
  const Tensor q = randn({1, 2, 300, 64}, 1), k = randn({1, 2, 410, 64}, 2), v = randn({1, 2, 410, 64}, 3);
  EXPECT_TRUE(MatchesOracle(q, k, v, {}, ones_like_out(q, v)));
}

TEST(AttentionFlash, CausalTopLeftSkipsBlocksAboveDiagonal) {
  const Tensor q = randn({2, 300, 64}, 4), k = randn({2, 300, 64}, 5), v = randn({2, 300, 32}, 6);
  AttentionOptions o;
  o.causal = Causal::kTopLeft;
  EXPECT_TRUE(MatchesOracle(q, k, v, o, ones_like_out(q, v)));
}

TEST(AttentionFlash, CausalBottomRightWhenTqLessThanTk) {
  const Tensor q = randn({2, 100, 16}, 7), k = randn({2, 333, 16}, 8), v = randn({2, 333, 16}, 9);
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  EXPECT_TRUE(MatchesOracle(q, k, v, o, ones_like_out(q, v)));
}

TEST(AttentionFlash, CausalBottomRightTqGreaterThanTkTopRowsAreZeroNotNaN) {
  const Tensor q = randn({250, 16}, 10), k = randn({100, 16}, 11), v = randn({100, 8}, 12);
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  const Fused f = run_fused(q, k, v, o, ones_like_out(q, v), {});
  for (int64_t i = 0; i < 150; ++i) {
    EXPECT_EQ(f.fwd.lse.at({i}), -std::numeric_limits<float>::infinity()) << i;
    for (int64_t c = 0; c < 8; ++c) ASSERT_EQ(f.fwd.out.at({i, c}), 0.0f) << i;
    for (int64_t c = 0; c < 16; ++c) ASSERT_EQ(f.grads.dq.at({i, c}), 0.0f) << i;
  }
  EXPECT_TRUE(MatchesOracle(q, k, v, o, ones_like_out(q, v)));
}

TEST(AttentionFlash, FullyMaskedRowIsZeroNotNaN) {
  const Tensor q = randn({2, 200, 16}, 13), k = randn({2, 150, 16}, 14), v = randn({2, 150, 16}, 15);
  std::vector<float> keep(200 * 150, 1.0f);
  for (int64_t j = 0; j < 150; ++j) keep[static_cast<size_t>(7 * 150 + j)] = 0.0f;  // row 7 sees nothing
  AttentionOptions o;
  o.mask = Tensor::from_vector({200, 150}, keep);
  o.mask_kind = MaskKind::kKeep;
  const Fused f = run_fused(q, k, v, o, ones_like_out(q, v), {});
  for (int64_t b = 0; b < 2; ++b) {
    EXPECT_EQ(f.fwd.lse.at({b, 7}), -std::numeric_limits<float>::infinity());
    for (int64_t c = 0; c < 16; ++c) {
      EXPECT_EQ(f.fwd.out.at({b, 7, c}), 0.0f);
      EXPECT_EQ(f.grads.dq.at({b, 7, c}), 0.0f);
    }
  }
  EXPECT_TRUE(MatchesOracle(q, k, v, o, ones_like_out(q, v)));
}

TEST(AttentionFlash, EverythingMaskedGivesZerosEverywhere) {
  const Tensor q = randn({3, 120, 8}, 16), k = randn({3, 130, 8}, 17), v = randn({3, 130, 8}, 18);
  AttentionOptions o;
  o.mask = Tensor::full({1, 130}, -std::numeric_limits<float>::infinity());
  o.mask_kind = MaskKind::kAdditive;
  const Fused f = run_fused(q, k, v, o, ones_like_out(q, v), {});
  for (const Tensor* t : {&f.fwd.out, &f.grads.dq, &f.grads.dk, &f.grads.dv})
    for (float x : t->to_vector()) ASSERT_EQ(x, 0.0f);
  for (float x : f.fwd.lse.to_vector()) ASSERT_EQ(x, -std::numeric_limits<float>::infinity());
}

TEST(AttentionFlash, AdditiveMaskBroadcastOverBatchAndHeads) {
  const Tensor q = randn({2, 3, 100, 32}, 19), k = randn({2, 3, 140, 32}, 20), v = randn({2, 3, 140, 24}, 21);
  AttentionOptions o;
  o.mask = randn({100, 140}, 22);
  o.mask_kind = MaskKind::kAdditive;
  EXPECT_TRUE(MatchesOracle(q, k, v, o, ones_like_out(q, v)));
  o.mask = randn({2, 1, 1, 140}, 23);  // key padding per batch
  EXPECT_TRUE(MatchesOracle(q, k, v, o, ones_like_out(q, v)));
}

TEST(AttentionFlash, CausalCombinesWithMask) {
  const Tensor q = randn({2, 2, 150, 16}, 24), k = randn({2, 2, 150, 16}, 25), v = randn({2, 2, 150, 16}, 26);
  Rng rng(27);
  AttentionOptions o;
  o.mask = rng.bernoulli({2, 1, 150, 150}, 0.6f);
  o.mask_kind = MaskKind::kBlock;
  o.causal = Causal::kTopLeft;
  EXPECT_TRUE(MatchesOracle(q, k, v, o, ones_like_out(q, v)));
}

TEST(AttentionFlash, BTHDViewNeedsNoCopy) {
  // Projections laid out (B, T, H, D) and seen as (B, H, T, D).
  const Tensor q = randn({2, 130, 4, 64}, 28).transpose(1, 2), k = randn({2, 150, 4, 64}, 29).transpose(1, 2);
  const Tensor v = randn({2, 150, 4, 48}, 30).transpose(1, 2);
  ASSERT_FALSE(q.is_contiguous());
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  EXPECT_TRUE(MatchesOracle(q, k, v, o, ones_like_out(q, v)));
}

TEST(AttentionFlash, DkDiffersFromDvAndCustomScale) {
  const Tensor q = randn({3, 99, 80}, 31), k = randn({3, 101, 80}, 32), v = randn({3, 101, 3}, 33);
  AttentionOptions o;
  o.scale = 0.05f;
  EXPECT_TRUE(MatchesOracle(q, k, v, o, ones_like_out(q, v)));
}

TEST(AttentionFlash, NegativeScaleKeepsCausalBlocksBlocked) {
  // Blocked scores must stay blocked whatever the sign of the scale (a -inf times a negative scale is +inf).
  const Tensor q = randn({2, 130, 16}, 88), k = randn({2, 130, 16}, 89), v = randn({2, 130, 16}, 90);
  AttentionOptions o;
  o.scale = -0.3f;
  o.causal = Causal::kTopLeft;
  EXPECT_TRUE(MatchesOracle(q, k, v, o, ones_like_out(q, v)));
  o.mask = Tensor::full({130, 130}, 1.0f);
  o.mask_kind = MaskKind::kKeep;
  EXPECT_TRUE(MatchesOracle(q, k, v, o, ones_like_out(q, v)));
}

TEST(AttentionFlash, SeqLenOne) {
  EXPECT_TRUE(MatchesOracle(randn({2, 1, 16}, 34), randn({2, 1, 16}, 35), randn({2, 1, 16}, 36), {},
                            randn({2, 1, 16}, 37)));
}

TEST(AttentionFlash, DecodeOneQueryLongCacheSplitsKeys) {
  // B·H = 1 < threads: the keys are split across threads and the partial softmaxes merged.
  const Tensor q = randn({1, 1, 1, 128}, 38), k = randn({1, 1, 3000, 128}, 39), v = randn({1, 1, 3000, 128}, 40);
  EXPECT_TRUE(MatchesOracle(q, k, v, {}, randn({1, 1, 1, 128}, 41), {FlashIsa::kAuto, 2}));
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  EXPECT_TRUE(MatchesOracle(q, k, v, o, randn({1, 1, 1, 128}, 41), {FlashIsa::kAuto, 4}));
}

TEST(AttentionFlash, FewQueriesManyHeads) {
  const Tensor q = randn({1, 5, 3, 64}, 42), k = randn({1, 5, 700, 64}, 43), v = randn({1, 5, 700, 64}, 44);
  EXPECT_TRUE(MatchesOracle(q, k, v, {}, randn({1, 5, 3, 64}, 45)));
}

TEST(AttentionFlash, EmptyBatchGivesEmptyResults) {
  const Tensor q = randn({0, 4, 8}, 46), k = randn({0, 5, 8}, 47), v = randn({0, 5, 8}, 48);
  const Fused f = run_fused(q, k, v, {}, randn({0, 4, 8}, 49), {});
  EXPECT_EQ(f.fwd.out.shape(), (Shape{0, 4, 8}));
  EXPECT_EQ(f.grads.dq.shape(), q.shape());
}

// ---------------------------------------------------------------------------------------------------------------
// Determinism

void ExpectBitIdenticalReruns(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                              const FlashConfig& cfg) {
  const Tensor g = ones_like_out(q, v);
  const Fused a = run_fused(q, k, v, o, g, cfg), b = run_fused(q, k, v, o, g, cfg);
  EXPECT_TRUE(bit_equal(a.fwd.out, b.fwd.out));
  EXPECT_TRUE(bit_equal(a.fwd.lse, b.fwd.lse));
  EXPECT_TRUE(bit_equal(a.grads.dq, b.grads.dq));
  EXPECT_TRUE(bit_equal(a.grads.dk, b.grads.dk));
  EXPECT_TRUE(bit_equal(a.grads.dv, b.grads.dv));
}

TEST(AttentionFlash, BitIdenticalAcrossRunsWithSameThreadCount) {
  AttentionOptions causal;
  causal.causal = Causal::kTopLeft;
  for (int threads : {2, 3}) {
    const FlashConfig cfg{FlashIsa::kAuto, threads, 0};
    // many heads, one head (keys split / dQ partials), decode
    ExpectBitIdenticalReruns(randn({2, 3, 200, 64}, 50), randn({2, 3, 200, 64}, 51), randn({2, 3, 200, 64}, 52),
                             causal, cfg);
    ExpectBitIdenticalReruns(randn({1, 1, 400, 32}, 53), randn({1, 1, 500, 32}, 54), randn({1, 1, 500, 32}, 55),
                             {}, cfg);
    ExpectBitIdenticalReruns(randn({1, 1, 1, 64}, 56), randn({1, 1, 2000, 64}, 57), randn({1, 1, 2000, 64}, 58),
                             {}, cfg);
  }
}

// Every way the threads split the work (query tiles, paired causal tiles, split keys with a merge, dQ partials per
// key chunk), on the portable kernels: under ThreadSanitizer their scalar stores are all instrumented (256-bit AVX
// stores are not), so this is the test that makes a race in the work split visible.
TEST(AttentionFlash, ThreadedWorkSplitsOnPortableKernels) {
  AttentionOptions causal;
  causal.causal = Causal::kTopLeft;
  for (int threads : {2, 3}) {
    const FlashConfig cfg{FlashIsa::kPortable, threads, /*min_work_per_thread=*/0};  // start every thread
    EXPECT_TRUE(MatchesOracle(randn({1, 3, 200, 16}, 62), randn({1, 3, 210, 16}, 63), randn({1, 3, 210, 16}, 64),
                              causal, randn({1, 3, 200, 16}, 65), cfg));
    EXPECT_TRUE(MatchesOracle(randn({1, 1, 1, 32}, 66), randn({1, 1, 1500, 32}, 67), randn({1, 1, 1500, 32}, 68), {},
                              randn({1, 1, 1, 32}, 69), cfg));
  }
}

TEST(AttentionFlash, BitIdenticalAcrossRunsWithSmallTiles) {
  AttentionOptions causal;
  causal.causal = Causal::kBottomRight;
  FlashConfig cfg{FlashIsa::kAuto, 2, 0};
  cfg.fwd_q_tile = 16, cfg.fwd_k_tile = 24, cfg.bwd_q_tile = 16, cfg.bwd_k_tile = 24;
  ExpectBitIdenticalReruns(randn({1, 1, 150, 32}, 91), randn({1, 1, 170, 32}, 92), randn({1, 1, 170, 32}, 93), causal,
                           cfg);
}

TEST(AttentionFlashErrors, TileSizesMustBeMultiplesOfEight) {
  FlashConfig cfg;
  cfg.fwd_q_tile = 12;
  const Tensor q = randn({4, 8}, 94);
  EXPECT_TRUE(ThrowsArg([&] { kernels::attention_flash_forward(q, q, q, {}, Shape{}, 0.5f, cfg); }, "[attention]"));
}

// AVX2 and AVX-512 against the portable kernels and the oracle: attention_flash_isa_test.cpp. Varlen, KV cache and
// the public entry points: attention_flash_entry_test.cpp.

// Head h of q reads kv head h / group: the same numbers as K and V repeated per query head, and the gradient of a
// kv head is the sum over its group's copies.
TEST(AttentionFlashVariants, GqaEqualsRepeatedKvHeads) {
  const Tensor q = randn({2, 6, 37, 16}, 1), k = randn({2, 2, 41, 16}, 2), v = randn({2, 2, 41, 24}, 3);
  const Tensor g = randn({2, 6, 37, 24}, 4);
  const auto repeat = [](const Tensor& t) {  // (B, 2, T, D) -> (B, 6, T, D): heads 0 0 0 1 1 1
    return t.unsqueeze(2).expand({t.size(0), 2, 3, t.size(2), t.size(3)}).contiguous().view(
        {t.size(0), 6, t.size(2), t.size(3)});
  };
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  o.return_lse = true;
  AttentionOptions og = o;
  og.enable_gqa = true;
  const AttentionResult a = attention(q, k, v, og), b = attention(q, repeat(k), repeat(v), o);
  EXPECT_TRUE(NormClose(a.out, testing::to_double(b.out), kForwardRtol, "out"));
  const AttentionGrads ga = attention_backward(q, k, v, a.out, a.lse, g, og);
  const AttentionGrads gb = attention_backward(q, repeat(k), repeat(v), b.out, b.lse, g, o);
  EXPECT_EQ(ga.dk.shape(), k.shape());
  const auto group_sum = [](const Tensor& t) {  // (B, 6, T, D) -> (B, 2, T, D)
    const std::vector<float> x = t.contiguous().to_vector();
    const int64_t B = t.size(0), T = t.size(2), D = t.size(3);
    std::vector<double> r(static_cast<size_t>(B * 2 * T * D), 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < 6; ++h)
        for (int64_t i = 0; i < T * D; ++i) r[static_cast<size_t>((b * 2 + h / 3) * T * D + i)] += x[static_cast<size_t>((b * 6 + h) * T * D + i)];
    return r;
  };
  EXPECT_TRUE(NormClose(ga.dq, testing::to_double(gb.dq), kBackwardRtol, "dq"));
  EXPECT_TRUE(NormClose(ga.dk, group_sum(gb.dk), kBackwardRtol, "dk"));
  EXPECT_TRUE(NormClose(ga.dv, group_sum(gb.dv), kBackwardRtol, "dv"));
}

}  // namespace
}  // namespace qkv
