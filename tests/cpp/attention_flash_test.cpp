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

#include "ops_testing.h"
#include "qkv/core/rng.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/kernels/cpu.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/attention_varlen.h"

namespace qkv {
namespace {

using kernels::FlashConfig;
using kernels::FlashIsa;
using testing::ThrowsArg;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Normwise relative errors: max |a - ref| <= rtol * max |ref| (+ a tiny floor for all-zero references).
constexpr double kForwardRtol = 1e-5;
constexpr double kBackwardRtol = 1e-4;
constexpr double kZeroFloor = 1e-30;
// Plus this fraction of the largest sum of |terms| behind one element: where a gradient cancels to ~0 (a row that
// sees one key has dS = p·(dP - dP) = 0), float rounding of the terms is all that is left.
constexpr double kCancellationRtol = 1e-6;

// ---------------------------------------------------------------------------------------------------------------
// float64 oracle on the broadcast batch, forward and backward, written the obvious way.

struct Dense {  // row-major double copy of a tensor expanded to (batch..., R, C); GQA: `head` maps batch -> matrix
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  int64_t group = 1, hq = 1;  // group > 1: batch index b reads matrix (b / hq) * (hq / group) + (b % hq) / group
  double at(int64_t b, int64_t r, int64_t c) const {
    const int64_t m = group == 1 ? b : (b / hq) * (hq / group) + (b % hq) / group;
    return v[static_cast<size_t>((m * rows + r) * cols + c)];
  }
};

Dense dense(const Tensor& t, const Shape& batch, int64_t rows, int64_t cols, int64_t group = 1) {
  Shape full = batch;
  if (group > 1) full.back() /= group;
  full.push_back(rows);
  full.push_back(cols);
  const std::vector<float> x = t.expand(full).contiguous().to_vector();
  return {rows, cols, std::vector<double>(x.begin(), x.end()), group, batch.empty() ? 1 : batch.back()};
}

// Sums a (batch..., R, C) double array into the shape it was broadcast from.
std::vector<double> sum_to(const std::vector<double>& full, const Shape& full_shape, const Shape& shape) {
  std::vector<double> r(static_cast<size_t>(shape_numel(shape)), 0.0);
  const Tensor proto = Tensor::zeros(shape).expand(full_shape);
  for_each_offset(full_shape, proto.strides(),
                  [&](int64_t i, int64_t off) { r[static_cast<size_t>(off)] += full[static_cast<size_t>(i)]; });
  return r;
}

struct Oracle {
  std::vector<double> out, lse, dq, dk, dv;  // dq, dk, dv with the shapes of q, k, v
  double dq_mag = 0.0, dk_mag = 0.0;          // largest sum of |terms| of one element of dq, dk
};

Oracle oracle(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, const Tensor& d_out) {
  const Shape batch = attention_check(q, k, v, o, "oracle");
  const int64_t nb = shape_numel(batch), tq = q.size(-2), tk = k.size(-2), dk = q.size(-1), dv = v.size(-1);
  const double scale = o.scale ? double{*o.scale} : 1.0 / std::sqrt(static_cast<double>(dk));
  const int64_t group = o.enable_gqa ? batch.back() / k.size(-3) : 1;
  const Dense Q = dense(q, batch, tq, dk), K = dense(k, batch, tk, dk, group), V = dense(v, batch, tk, dv, group);
  const double cap = o.softcap;
  const bool has_mask = o.mask_kind != MaskKind::kNone;
  const Dense M = has_mask ? dense(o.mask, batch, tq, tk) : Dense{};
  const Dense G = d_out.defined() ? dense(d_out, batch, tq, dv) : Dense{};
  Oracle r;
  r.out.assign(static_cast<size_t>(nb * tq * dv), 0.0);
  r.lse.assign(static_cast<size_t>(nb * tq), -kInf);
  std::vector<double> dq(static_cast<size_t>(nb * tq * dk)), dkf(static_cast<size_t>(nb * tk * dk)),
      dvf(static_cast<size_t>(nb * tk * dv));
  std::vector<double> dq_abs(dq.size()), dk_abs(dkf.size());  // sums of |terms|
  std::vector<double> s(static_cast<size_t>(tk)), w(static_cast<size_t>(tk)), dw(static_cast<size_t>(tk)),
      dcap(static_cast<size_t>(tk), 1.0);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t i = 0; i < tq; ++i) {
      double mx = -kInf;
      for (int64_t j = 0; j < tk; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < dk; ++c) dot += Q.at(b, i, c) * K.at(b, j, c);
        double x = scale * dot;
        if (cap > 0.0) {  // soft cap, before the masks
          const double t = std::tanh(x / cap);
          x = cap * t;
          dcap[j] = 1.0 - t * t;
        }
        if (o.causal == Causal::kTopLeft && j > i) x = -kInf;
        if (o.causal == Causal::kBottomRight && j > i + tk - tq) x = -kInf;
        if (o.window_left >= 0 && j < i + tk - tq - o.window_left) x = -kInf;
        if (o.window_right >= 0 && j > i + tk - tq + o.window_right) x = -kInf;
        if (has_mask) {
          const double m = M.at(b, i, j);
          if (o.mask_kind == MaskKind::kKeep && m == 0.0) x = -kInf;
          if (o.mask_kind == MaskKind::kBlock && m != 0.0) x = -kInf;
          if (o.mask_kind == MaskKind::kAdditive) x += m;
        }
        s[j] = x;
        mx = std::max(mx, x);
      }
      if (mx == -kInf) continue;  // fully masked row: out 0, lse -inf, no gradient
      double sum = 0.0;
      for (int64_t j = 0; j < tk; ++j) sum += std::exp(s[j] - mx);
      const size_t row = static_cast<size_t>(b * tq + i);
      r.lse[row] = mx + std::log(sum);
      for (int64_t j = 0; j < tk; ++j) {
        w[j] = std::exp(s[j] - mx) / sum;
        for (int64_t c = 0; c < dv; ++c) r.out[row * dv + c] += w[j] * V.at(b, j, c);
      }
      if (!d_out.defined()) continue;
      double wdw = 0.0, wdw_abs = 0.0;
      for (int64_t j = 0; j < tk; ++j) {
        double x = 0.0;
        for (int64_t c = 0; c < dv; ++c) x += G.at(b, i, c) * V.at(b, j, c);
        dw[j] = x;
        wdw += w[j] * x;
        wdw_abs += w[j] * std::fabs(x);
      }
      for (int64_t j = 0; j < tk; ++j) {
        const double ds = w[j] * (dw[j] - wdw) * scale * dcap[j];
        const double ds_abs = w[j] * (std::fabs(dw[j]) + wdw_abs) * std::fabs(scale) * dcap[j];
        for (int64_t c = 0; c < dk; ++c) {
          dq[row * dk + c] += ds * K.at(b, j, c);
          dkf[static_cast<size_t>((b * tk + j) * dk + c)] += ds * Q.at(b, i, c);
          dq_abs[row * dk + c] += ds_abs * std::fabs(K.at(b, j, c));
          dk_abs[static_cast<size_t>((b * tk + j) * dk + c)] += ds_abs * std::fabs(Q.at(b, i, c));
        }
        for (int64_t c = 0; c < dv; ++c) dvf[static_cast<size_t>((b * tk + j) * dv + c)] += w[j] * G.at(b, i, c);
      }
    }
  if (d_out.defined()) {
    Shape qf = batch, kf = batch, vf = batch;
    qf.insert(qf.end(), {tq, dk});
    kf.insert(kf.end(), {tk, dk});
    vf.insert(vf.end(), {tk, dv});
    for (double x : dq_abs) r.dq_mag = std::max(r.dq_mag, x);
    for (double x : dk_abs) r.dk_mag = std::max(r.dk_mag, x);
    r.dq = sum_to(dq, qf, q.shape());
    Shape kt = k.shape(), vt = v.shape();
    if (group > 1) {  // (..., Hq, T, D) seen as (..., Hkv, group, T, D), summed over the group
      for (Shape* f : {&kf, &vf}) {
        const size_t h = f->size() - 3;
        (*f)[h] /= group;
        f->insert(f->begin() + static_cast<int64_t>(h) + 1, group);
      }
      kt.insert(kt.end() - 2, 1);
      vt.insert(vt.end() - 2, 1);
    }
    r.dk = sum_to(dkf, kf, kt);
    r.dv = sum_to(dvf, vf, vt);
  }
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// Comparisons

::testing::AssertionResult NormClose(const Tensor& actual, const std::vector<double>& ref, double rtol,
                                     const char* what, double mag = 0.0) {
  const std::vector<float> a = actual.to_vector();
  if (a.size() != ref.size()) return ::testing::AssertionFailure() << what << ": size " << a.size() << " vs " << ref.size();
  double ref_max = 0.0, err_max = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return ::testing::AssertionFailure() << what << ": NaN at " << i;
    ref_max = std::max(ref_max, std::fabs(ref[i]));
    const double e = std::fabs(double{a[i]} - ref[i]);
    if (e > err_max) err_max = e, worst = i;
  }
  if (err_max <= rtol * ref_max + kCancellationRtol * mag + kZeroFloor) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": relative error " << err_max / std::max(ref_max, kZeroFloor)
                                       << " > " << rtol << " (worst at " << worst << ": " << a[worst] << " vs "
                                       << ref[worst] << ")";
}

// The lse per row: -inf exactly where the oracle has -inf, else within rtol of max(1, |lse|).
::testing::AssertionResult LseClose(const Tensor& actual, const std::vector<double>& ref) {
  const std::vector<float> a = actual.to_vector();
  if (a.size() != ref.size()) return ::testing::AssertionFailure() << "lse size " << a.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (ref[i] == -kInf) {
      if (a[i] != -std::numeric_limits<float>::infinity())
        return ::testing::AssertionFailure() << "lse row " << i << " should be -inf, got " << a[i];
      continue;
    }
    if (!(std::fabs(double{a[i]} - ref[i]) <= kForwardRtol * std::max(1.0, std::fabs(ref[i]))))
      return ::testing::AssertionFailure() << "lse row " << i << ": " << a[i] << " vs " << ref[i];
  }
  return ::testing::AssertionSuccess();
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

struct Fused {
  AttentionResult fwd;
  AttentionGrads grads;
};

Fused run_fused(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, const Tensor& d_out,
                const FlashConfig& cfg) {
  const Shape batch = attention_check(q, k, v, o, "attention");
  const float scale = attention_scale(o, q.size(-1));
  Fused f;
  f.fwd = kernels::attention_flash_forward(q, k, v, o, batch, scale, cfg);
  if (d_out.defined())
    f.grads = kernels::attention_flash_backward(q, k, v, f.fwd.out, f.fwd.lse, d_out, o, batch, scale, cfg);
  return f;
}

::testing::AssertionResult MatchesOracleWith(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& o, const Tensor& d_out, const FlashConfig& cfg,
                                             const Oracle& r) {
  const Fused f = run_fused(q, k, v, o, d_out, cfg);
  if (auto a = NormClose(f.fwd.out, r.out, kForwardRtol, "out"); !a) return a;
  if (auto a = LseClose(f.fwd.lse, r.lse); !a) return a;
  if (!d_out.defined()) return ::testing::AssertionSuccess();
  if (f.grads.dq.shape() != q.shape() || f.grads.dk.shape() != k.shape() || f.grads.dv.shape() != v.shape())
    return ::testing::AssertionFailure() << "gradient shapes " << str(f.grads.dq.shape()) << str(f.grads.dk.shape())
                                         << str(f.grads.dv.shape());
  if (auto a = NormClose(f.grads.dq, r.dq, kBackwardRtol, "dq", r.dq_mag); !a) return a;
  if (auto a = NormClose(f.grads.dk, r.dk, kBackwardRtol, "dk", r.dk_mag); !a) return a;
  if (auto a = NormClose(f.grads.dv, r.dv, kBackwardRtol, "dv"); !a) return a;
  return ::testing::AssertionSuccess();
}

// The fused kernel with `cfg` and, unless cfg sets tiles itself, again with small tiles (16 x 24 forward,
// 16 x 24 backward), so that the edge tests below cross tile boundaries at modest sizes.
::testing::AssertionResult MatchesOracle(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                                         const Tensor& d_out, const FlashConfig& cfg = {}) {
  const Oracle r = oracle(q, k, v, o, d_out);
  if (auto a = MatchesOracleWith(q, k, v, o, d_out, cfg, r); !a) return a << " (default tiles)";
  if (cfg.fwd_q_tile || cfg.fwd_k_tile || cfg.bwd_q_tile || cfg.bwd_k_tile) return ::testing::AssertionSuccess();
  FlashConfig small = cfg;
  small.fwd_q_tile = 16, small.fwd_k_tile = 24, small.bwd_q_tile = 16, small.bwd_k_tile = 24;
  if (auto a = MatchesOracleWith(q, k, v, o, d_out, small, r); !a) return a << " (small tiles)";
  return ::testing::AssertionSuccess();
}

Tensor randn(const Shape& shape, uint64_t seed) { return testing::randn(shape, seed); }

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

// AVX2 and AVX-512 against the portable kernels and the oracle: attention_flash_isa_test.cpp.


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

}  // namespace
}  // namespace qkv
