// Shared by the fused-attention tests (attention_flash_test.cpp, attention_flash_entry_test.cpp): a float64
// oracle on the broadcast batch, forward and backward, the normwise comparisons against it, and the fused kernel run.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "qkv/core/shape.h"
#include "qkv/core/tensor.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/kernels/lowp.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/attention_plain.h"

namespace qkv::testing::flash {

using kernels::FlashConfig;

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// Normwise relative errors: max |a - ref| <= rtol * max |ref| (+ a tiny floor for all-zero references).
inline constexpr double kForwardRtol = 1e-5;
inline constexpr double kBackwardRtol = 1e-4;
inline constexpr double kZeroFloor = 1e-30;
// Plus this fraction of the largest sum of |terms| behind one element: where a gradient cancels to ~0 (a row that
// sees one key has dS = p·(dP - dP) = 0), float rounding of the terms is all that is left.
inline constexpr double kCancellationRtol = 1e-6;

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

inline Dense dense(const Tensor& t, const Shape& batch, int64_t rows, int64_t cols, int64_t group = 1) {
  Shape full = batch;
  if (group > 1) full.back() /= group;
  full.push_back(rows);
  full.push_back(cols);
  const std::vector<float> x = t.expand(full).contiguous().to_vector();
  return {rows, cols, std::vector<double>(x.begin(), x.end()), group, batch.empty() ? 1 : batch.back()};
}

// Sums a (batch..., R, C) double array into the shape it was broadcast from.
inline std::vector<double> sum_to(const std::vector<double>& full, const Shape& full_shape, const Shape& shape) {
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

// bf16_grads: the bf16 backward's scheme in float64: P and dS rounded to bfloat16 before they multiply d_out, K and
// Q (pass bf16-rounded q, k, v and d_out for the whole bf16 backward). fwd_out, when defined: the forward output
// the backward is given, whose rows give delta = Σ d_out·out (as the kernel computes it), instead of Σ P·dP.
inline Oracle oracle(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, const Tensor& d_out,
                     bool bf16_grads = false, const Tensor& fwd_out = {}) {
  const auto rounded = [bf16_grads](double x) {
    return bf16_grads ? double{kernels::bf16_round(static_cast<float>(x))} : x;
  };
  const Shape batch = attention_check(q, k, v, o, "oracle");
  const int64_t nb = shape_numel(batch), tq = q.size(-2), tk = k.size(-2), dk = q.size(-1), dv = v.size(-1);
  const double scale = o.scale ? double{*o.scale} : 1.0 / std::sqrt(static_cast<double>(dk));
  const int64_t group = o.enable_gqa ? batch.back() / k.size(-3) : 1;
  const Dense Q = dense(q, batch, tq, dk), K = dense(k, batch, tk, dk, group), V = dense(v, batch, tk, dv, group);
  const double cap = o.softcap;
  const Dense G = d_out.defined() ? dense(d_out, batch, tq, dv) : Dense{};
  const Dense O = fwd_out.defined() ? dense(fwd_out, batch, tq, dv) : Dense{};
  const PlainAttention plain = attention_plain(q, k, v, o);  // the forward: attention in 40 lines
  Oracle r;
  r.out = plain.out;
  r.lse = plain.lse;
  std::vector<double> dq(static_cast<size_t>(nb * tq * dk)), dkf(static_cast<size_t>(nb * tk * dk)),
      dvf(static_cast<size_t>(nb * tk * dv));
  std::vector<double> dq_abs(dq.size()), dk_abs(dkf.size());  // sums of |terms|
  std::vector<double> w(static_cast<size_t>(tk)), dw(static_cast<size_t>(tk)), dcap(static_cast<size_t>(tk), 1.0);
  for (int64_t b = 0; b < nb && d_out.defined(); ++b)
    for (int64_t i = 0; i < tq; ++i) {
      const size_t row = static_cast<size_t>(b * tq + i);
      if (r.lse[row] == -kInf) continue;  // fully masked row: no gradient
      for (int64_t j = 0; j < tk; ++j) {
        w[j] = plain.weights[row * tk + j];
        if (cap > 0.0) {  // the soft cap's derivative, 1 - tanh², at the scaled score
          double dot = 0.0;
          for (int64_t c = 0; c < dk; ++c) dot += Q.at(b, i, c) * K.at(b, j, c);
          const double t = std::tanh(scale * dot / cap);
          dcap[j] = 1.0 - t * t;
        }
      }
      double wdw = 0.0, wdw_abs = 0.0;
      for (int64_t j = 0; j < tk; ++j) {
        double x = 0.0;
        for (int64_t c = 0; c < dv; ++c) x += G.at(b, i, c) * V.at(b, j, c);
        dw[j] = x;
        wdw += w[j] * x;
        wdw_abs += w[j] * std::fabs(x);
      }
      if (fwd_out.defined()) {
        wdw = 0.0;
        for (int64_t c = 0; c < dv; ++c) wdw += G.at(b, i, c) * O.at(b, i, c);
      }
      for (int64_t j = 0; j < tk; ++j) {
        const double ds = rounded(w[j] * (dw[j] - wdw) * scale * dcap[j]), wj = rounded(w[j]);
        const double ds_abs = w[j] * (std::fabs(dw[j]) + wdw_abs) * std::fabs(scale) * dcap[j];
        for (int64_t c = 0; c < dk; ++c) {
          dq[row * dk + c] += ds * K.at(b, j, c);
          dkf[static_cast<size_t>((b * tk + j) * dk + c)] += ds * Q.at(b, i, c);
          dq_abs[row * dk + c] += ds_abs * std::fabs(K.at(b, j, c));
          dk_abs[static_cast<size_t>((b * tk + j) * dk + c)] += ds_abs * std::fabs(Q.at(b, i, c));
        }
        for (int64_t c = 0; c < dv; ++c) dvf[static_cast<size_t>((b * tk + j) * dv + c)] += wj * G.at(b, i, c);
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

inline ::testing::AssertionResult NormClose(const Tensor& actual, const std::vector<double>& ref, double rtol,
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
inline ::testing::AssertionResult LseClose(const Tensor& actual, const std::vector<double>& ref) {
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

inline bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Whether this CPU runs the flash set `isa` (a set it lacks throws std::runtime_error naming attention).
inline bool available(kernels::FlashIsa isa) {
  try {
    const Tensor q = Tensor::zeros({1, 8});
    FlashConfig cfg;
    cfg.isa = isa;
    kernels::attention_flash_forward(q, q, q, {}, Shape{}, 1.0f, cfg);
    return true;
  } catch (const std::runtime_error&) {
    return false;
  }
}

struct Fused {
  AttentionResult fwd;
  AttentionGrads grads;
};

inline Fused run_fused(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, const Tensor& d_out,
                const FlashConfig& cfg) {
  const Shape batch = attention_check(q, k, v, o, "attention");
  const float scale = attention_scale(o, q.size(-1));
  Fused f;
  f.fwd = kernels::attention_flash_forward(q, k, v, o, batch, scale, cfg);
  if (d_out.defined())
    f.grads = kernels::attention_flash_backward(q, k, v, f.fwd.out, f.fwd.lse, d_out, o, batch, scale, cfg);
  return f;
}

inline ::testing::AssertionResult MatchesOracleWith(const Tensor& q, const Tensor& k, const Tensor& v,
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
inline ::testing::AssertionResult MatchesOracle(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                                         const Tensor& d_out, const FlashConfig& cfg = {}) {
  const Oracle r = oracle(q, k, v, o, d_out);
  if (auto a = MatchesOracleWith(q, k, v, o, d_out, cfg, r); !a) return a << " (default tiles)";
  if (cfg.fwd_q_tile || cfg.fwd_k_tile || cfg.bwd_q_tile || cfg.bwd_k_tile) return ::testing::AssertionSuccess();
  FlashConfig small = cfg;
  small.fwd_q_tile = 16, small.fwd_k_tile = 24, small.bwd_q_tile = 16, small.bwd_k_tile = 24;
  if (auto a = MatchesOracleWith(q, k, v, o, d_out, small, r); !a) return a << " (small tiles)";
  return ::testing::AssertionSuccess();
}

}  // namespace qkv::testing::flash
