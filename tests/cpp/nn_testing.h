// Helpers for the nn module tests: a float64 per-head MultiheadAttention oracle written with plain loops,
// parameter randomisation (biases non-zero), bit-identity checks and the tolerances these tests share.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "ops_testing.h"
#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/context.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/module.h"
#include "qkv/nn/multihead_attention.h"
#include "qkv/ops/functional.h"
#include "qkv/train/optim.h"

namespace qkv::testing {

// A float32 module pipeline (projections, softmax, out_proj) against the float64 loop oracle.
inline constexpr Tol kModuleVsDouble{2e-5, 2e-4};
// Two float32 paths that compute the same math in a different order (packed vs sliced projections, ...).
inline constexpr Tol kFloatReorder{1e-5, 1e-4};
// f(Px) = P f(x) for a whole layer (LayerNorm and FF included).
inline constexpr Tol kEquivariance{1e-5, 1e-5};

// Replaces every parameter with N(0, stddev) draws so that biases and norms are not at their trivial init.
inline void randomize_parameters(nn::Module& m, uint64_t seed, float stddev = 0.3f) {
  Rng rng(seed);
  for (auto& [name, p] : m.named_parameters()) p->copy_from(rng.normal(p->shape(), 0.0f, stddev));
}

// Bit-for-bit equality of two tensors' values (NaN never equal).
// `steps` SGD steps (lr 0.5) of `lin` on the loss Σ y² of y = lin(x): each forward records a tape, as training does.
inline void sgd_steps(nn::Linear& lin, const Tensor& x, int steps) {
  ad::ParameterSet ps(lin);
  train::SgdOptions so;
  so.lr = 0.5;
  train::SGD opt(ps, so);
  for (int step = 0; step < steps; ++step) {
    ps.zero_grad();
    ad::Tape tape;
    nn::Context c(tape, ps);
    const ad::Var y = lin.forward(c, ad::Var(x));
    tape.backward(ad::sum(ad::mul(y, y)));
    opt.step();
  }
}

inline ::testing::AssertionResult BitIdentical(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << "shape " << str(a.shape()) << " vs " << str(b.shape());
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  for (size_t i = 0; i < x.size(); ++i)
    if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0 || std::isnan(x[i]))
      return ::testing::AssertionFailure() << "differ at flat " << i << ": " << x[i] << " vs " << y[i];
  return ::testing::AssertionSuccess();
}

inline bool AnyNaN(const Tensor& t) {
  for (float v : t.to_vector())
    if (std::isnan(v)) return true;
  return false;
}

// Additive score mask for the oracle: (b, h, i, j) -> 0 allowed, -inf blocked, or any finite bias.
using RefMask = std::function<double(int64_t b, int64_t h, int64_t i, int64_t j)>;

struct MhaRef {
  std::vector<double> out;      // (B, Tq, E)
  std::vector<double> weights;  // (B, H, Tq, Tk)
};

// The MHA weights as separate matrices: wq (E, E), wk (Ekv, kdim), wv (Ekv, vdim); biases (E), (Ekv) or empty
// (Ekv = num_kv_heads · head_dim; mha_reference below reads Ekv == E only).
struct MhaParams {
  std::vector<double> wq, wk, wv, bq, bk, bv, wo, bo;
  int64_t E = 0, H = 0, kdim = 0, vdim = 0;
};

inline MhaParams params_of(const nn::MultiheadAttention& m) {
  MhaParams p;
  p.E = m.embed_dim();
  p.H = m.num_heads();
  p.kdim = m.kdim();
  p.vdim = m.vdim();
  const int64_t E = p.E, Ekv = m.num_kv_heads() * m.head_dim();
  if (m.packed()) {
    p.wq = to_double(m.in_proj_weight.slice(0, 0, E));
    p.wk = to_double(m.in_proj_weight.slice(0, E, E + Ekv));
    p.wv = to_double(m.in_proj_weight.slice(0, E + Ekv, E + 2 * Ekv));
  } else {
    p.wq = to_double(m.q_proj_weight);
    p.wk = to_double(m.k_proj_weight);
    p.wv = to_double(m.v_proj_weight);
  }
  if (m.in_proj_bias.defined()) {
    p.bq = to_double(m.in_proj_bias.slice(0, 0, E));
    p.bk = to_double(m.in_proj_bias.slice(0, E, E + Ekv));
    p.bv = to_double(m.in_proj_bias.slice(0, E + Ekv, E + 2 * Ekv));
  }
  p.wo = to_double(m.out_proj.weight);
  if (m.out_proj.bias.defined()) p.bo = to_double(m.out_proj.bias);
  return p;
}

// Rows [r0, r0 + n) of a row-major (rows, cols) matrix times x (cols) plus bias rows: the per-head projection.
inline std::vector<double> project_rows(const std::vector<double>& w, const std::vector<double>& b, int64_t cols,
                                        int64_t r0, int64_t n, const double* x) {
  std::vector<double> y(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    double s = b.empty() ? 0.0 : b[static_cast<size_t>(r0 + r)];
    for (int64_t c = 0; c < cols; ++c) s += w[static_cast<size_t>((r0 + r) * cols + c)] * x[c];
    y[static_cast<size_t>(r)] = s;
  }
  return y;
}

// The oracle's options beyond PyTorch's MHA (see MhaForwardOptions): rotary positions (half-split pairs, query i
// and key j at q_offset + i and j), Shaw relative tables (rows 2·clip+1, query i at q_offset + i), a score scale
// (0: 1/sqrt(D)) and per-head output gates.
struct MhaRefExtras {
  bool rotary = false;
  double rotary_base = 10000.0;
  std::vector<double> rel_k, rel_v;  // (2·clip+1, D) each, or empty
  int64_t clip = 0;
  int64_t q_offset = 0;
  double scale = 0.0;
  std::vector<double> head_gate;  // (H) or empty
};

// x (D) rotated in place as row `pos` of RoPE's half-split pairing (i, i + D/2), θ_i = base^(-2i/D).
inline void rope_rotate(std::vector<double>& x, int64_t pos, double base) {
  const int64_t half = static_cast<int64_t>(x.size()) / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double phi = static_cast<double>(pos) * std::pow(base, -2.0 * static_cast<double>(i) / (2.0 * half));
    const double a = x[i], b = x[i + half];
    x[i] = a * std::cos(phi) - b * std::sin(phi);
    x[i + half] = a * std::sin(phi) + b * std::cos(phi);
  }
}

// Per-head loop: for each batch b and head h, slice the head's rows of Wq/Wk/Wv, project, scaled scores + mask,
// softmax (a fully masked row gives weights 0), weights·v; concatenate heads; out_proj.
inline MhaRef mha_reference(const Tensor& query, const Tensor& key, const Tensor& value, const MhaParams& p,
                            const RefMask& mask = {}, bool causal = false, const MhaRefExtras& x = {}) {
  const int64_t B = query.size(0), Tq = query.size(1), Tk = key.size(1);
  const int64_t E = p.E, H = p.H, D = E / H;
  const std::vector<double> q = to_double(query), k = to_double(key), v = to_double(value);
  MhaRef r;
  r.out.assign(static_cast<size_t>(B * Tq * E), 0.0);
  r.weights.assign(static_cast<size_t>(B * H * Tq * Tk), 0.0);
  const double scale = x.scale != 0.0 ? x.scale : 1.0 / std::sqrt(static_cast<double>(D));
  auto rel_row = [&](int64_t i, int64_t j) {  // Shaw: the table row of key j for query i
    return std::clamp(j - (i + x.q_offset), -x.clip, x.clip) + x.clip;
  };
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> concat(static_cast<size_t>(Tq * E), 0.0);
    for (int64_t h = 0; h < H; ++h) {
      std::vector<std::vector<double>> qh, kh, vh;
      for (int64_t i = 0; i < Tq; ++i) qh.push_back(project_rows(p.wq, p.bq, E, h * D, D, &q[(b * Tq + i) * E]));
      for (int64_t j = 0; j < Tk; ++j) {
        kh.push_back(project_rows(p.wk, p.bk, p.kdim, h * D, D, &k[(b * Tk + j) * p.kdim]));
        vh.push_back(project_rows(p.wv, p.bv, p.vdim, h * D, D, &v[(b * Tk + j) * p.vdim]));
      }
      if (x.rotary) {
        for (int64_t i = 0; i < Tq; ++i) rope_rotate(qh[i], x.q_offset + i, x.rotary_base);
        for (int64_t j = 0; j < Tk; ++j) rope_rotate(kh[j], j, x.rotary_base);
      }
      const double gate = x.head_gate.empty() ? 1.0 : x.head_gate[static_cast<size_t>(h)];
      for (int64_t i = 0; i < Tq; ++i) {
        std::vector<double> s(static_cast<size_t>(Tk));
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < Tk; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) dot += qh[i][d] * kh[j][d];
          if (!x.rel_k.empty())
            for (int64_t d = 0; d < D; ++d) dot += qh[i][d] * x.rel_k[static_cast<size_t>(rel_row(i, j) * D + d)];
          double m = mask ? mask(b, h, i, j) : 0.0;
          if (causal && j > i + x.q_offset) m = -std::numeric_limits<double>::infinity();
          s[j] = dot * scale + m;
          mx = std::max(mx, s[j]);
        }
        if (std::isinf(mx) && mx < 0) continue;  // fully masked: weights 0, head output 0
        double z = 0.0;
        for (int64_t j = 0; j < Tk; ++j) z += (s[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j < Tk; ++j) {
          const double w = s[j] / z;
          r.weights[static_cast<size_t>(((b * H + h) * Tq + i) * Tk + j)] = w;
          for (int64_t d = 0; d < D; ++d) {
            const double rv = x.rel_v.empty() ? 0.0 : x.rel_v[static_cast<size_t>(rel_row(i, j) * D + d)];
            concat[static_cast<size_t>(i * E + h * D + d)] += gate * w * (vh[j][d] + rv);
          }
        }
      }
    }
    for (int64_t i = 0; i < Tq; ++i) {
      const std::vector<double> o = project_rows(p.wo, p.bo, E, 0, E, &concat[static_cast<size_t>(i * E)]);
      for (int64_t e = 0; e < E; ++e) r.out[static_cast<size_t>((b * Tq + i) * E + e)] = o[e];
    }
  }
  return r;
}

// Every parameter's dotted name and shape.
inline std::map<std::string, Shape> names_and_shapes(nn::Module& m) {
  std::map<std::string, Shape> out;
  for (auto& [name, p] : m.named_parameters()) out[name] = p->shape();
  return out;
}

// Mean over heads of (B, H, Tq, Tk) weights -> (B, Tq, Tk).
inline std::vector<double> mean_heads(const std::vector<double>& w, int64_t B, int64_t H, int64_t Tq, int64_t Tk) {
  std::vector<double> out(static_cast<size_t>(B * Tq * Tk), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t x = 0; x < Tq * Tk; ++x) out[b * Tq * Tk + x] += w[(b * H + h) * Tq * Tk + x] / H;
  return out;
}

}  // namespace qkv::testing
