// Shaw et al. relative attention: scores and values each get a learned vector for the clipped distance j - i.
// Plain loops, one query row at a time (row-parallel with OpenMP); masks follow qkv::attention's rules.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/ops/positional/relative.h"

namespace qkv {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct RelCheck {
  Shape lead;  // leading (batch) dims shared by q, k, v
  int64_t Tq, Tk, D, Dv;
};

RelCheck check_relative(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& rel_k,
                        const Tensor& rel_v, int64_t clip, const AttentionOptions& o) {
  constexpr const char* op = "[relative_attention] ";
  QKV_CHECK_ARG(q.defined() && k.defined() && v.defined(), op, "q, k and v must all be defined");
  QKV_CHECK_ARG(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, op, "q ", str(q.shape()), ", k ", str(k.shape()),
                ", v ", str(v.shape()), " must have rank >= 2");
  Shape lead(q.shape().begin(), q.shape().end() - 2);
  QKV_CHECK_ARG(Shape(k.shape().begin(), k.shape().end() - 2) == lead &&
                    Shape(v.shape().begin(), v.shape().end() - 2) == lead,
                op, "q ", str(q.shape()), ", k ", str(k.shape()), ", v ", str(v.shape()),
                " must share the same leading dims");
  RelCheck c{lead, q.size(-2), k.size(-2), q.size(-1), v.size(-1)};
  QKV_CHECK_ARG(k.size(-1) == c.D, op, "q ", str(q.shape()), " and k ", str(k.shape()),
                " must have the same last dimension");
  QKV_CHECK_ARG(c.D >= 1 && c.Dv >= 1, op, "q ", str(q.shape()), " and v ", str(v.shape()),
                " must have a last dimension >= 1");
  QKV_CHECK_ARG(v.size(-2) == c.Tk, op, "k ", str(k.shape()), " and v ", str(v.shape()),
                " must have the same number of keys");
  QKV_CHECK_ARG(clip >= 0, op, "clip must be >= 0, got ", clip);
  const Shape table_k{2 * clip + 1, c.D};
  QKV_CHECK_ARG(rel_k.defined() && rel_k.shape() == table_k, op, "rel_k ",
                rel_k.defined() ? str(rel_k.shape()) : std::string("(undefined)"), " must be ", str(table_k),
                " for clip ", clip, " and q ", str(q.shape()));
  const Shape table_v{2 * clip + 1, c.Dv};
  QKV_CHECK_ARG(!rel_v.defined() || rel_v.shape() == table_v, op, "rel_v ",
                rel_v.defined() ? str(rel_v.shape()) : std::string("(undefined)"), " must be ", str(table_v),
                " (or undefined) for clip ", clip, " and v ", str(v.shape()));
  const bool has_kind = o.mask_kind != MaskKind::kNone;
  QKV_CHECK_ARG(has_kind == o.mask.defined(), op, "mask_kind and mask disagree: ",
                has_kind ? "a mask kind is set but the mask is undefined"
                         : "a mask is given but mask_kind is kNone");
  if (o.mask.defined()) {
    Shape full = lead;
    full.push_back(c.Tq);
    full.push_back(c.Tk);
    QKV_CHECK_ARG(broadcastable_to(o.mask.shape(), full), op, "mask ", str(o.mask.shape()),
                  " does not broadcast to ", str(full));
  }
  QKV_CHECK_ARG(!o.scale || std::isfinite(*o.scale), op, "scale must be finite, got ", o.scale.value_or(0.0f));
  return c;
}

}  // namespace

int64_t shaw_relative_index(int64_t j_minus_p, int64_t clip) {
  QKV_CHECK_ARG(clip >= 0, "[shaw_relative_index] clip must be >= 0, got ", clip);
  return std::clamp<int64_t>(j_minus_p, -clip, clip) + clip;
}

AttentionResult relative_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& rel_k,
                                   const Tensor& rel_v, int64_t clip, const AttentionOptions& options,
                                   int64_t query_offset) {
  const RelCheck c = check_relative(q, k, v, rel_k, rel_v, clip, options);
  const int64_t Tq = c.Tq, Tk = c.Tk, D = c.D, Dv = c.Dv, R = 2 * clip + 1;
  const int64_t nb = shape_numel(c.lead);
  const float scale = options.scale ? *options.scale : 1.0f / std::sqrt(static_cast<float>(D));

  const Tensor Q = q.contiguous(), K = k.contiguous(), V = v.contiguous();
  const Tensor RK = rel_k.contiguous();
  const Tensor RV = rel_v.defined() ? rel_v.contiguous() : Tensor();
  Shape full = c.lead;
  full.push_back(Tq);
  full.push_back(Tk);
  Tensor M;  // (nb, Tq, Tk) materialised mask
  if (options.mask.defined()) M = options.mask.expand(full).contiguous();

  Shape out_shape = c.lead;
  out_shape.push_back(Tq);
  out_shape.push_back(Dv);
  AttentionResult res;
  res.out = Tensor::zeros(out_shape);
  if (options.return_weights) res.weights = Tensor::zeros(full);
  if (options.return_lse) {
    Shape lse_shape = c.lead;
    lse_shape.push_back(Tq);
    res.lse = Tensor::full(lse_shape, kNegInf);
  }
  const int64_t rows = nb * Tq;
  if (rows == 0) return res;

  const float* qp = Q.data();
  const float* kp = K.data();
  const float* vp = V.data();
  const float* rkp = RK.data();
  const float* rvp = RV.defined() ? RV.data() : nullptr;
  const float* mp = M.defined() ? M.data() : nullptr;
  float* op = res.out.data();
  float* wp = res.weights.defined() ? res.weights.data() : nullptr;
  float* lp = res.lse.defined() ? res.lse.data() : nullptr;
  const MaskKind kind = options.mask_kind;
  const Causal causal = options.causal;
  // Unchecked twin of shaw_relative_index (clip was validated above; nothing may throw inside the parallel region).
  auto rel_index = [clip](int64_t d) { return std::clamp<int64_t>(d, -clip, clip) + clip; };

#pragma omp parallel
  {
    std::vector<float> qrel(static_cast<size_t>(R));
    std::vector<float> scratch(static_cast<size_t>(wp ? 0 : Tk));
    std::vector<double> bucket(static_cast<size_t>(R));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t b = row / Tq, i = row % Tq;
      const float* qi = qp + row * D;
      const float* kb = kp + b * Tk * D;
      const float* vb = vp + b * Tk * Dv;
      float* w = wp ? wp + row * Tk : scratch.data();
      float* oi = op + row * Dv;
      const int64_t pos = i + query_offset;
      // Causal limit in key indices (inclusive).
      int64_t jmax = Tk - 1;
      if (causal == Causal::kTopLeft) jmax = std::min(jmax, i);
      if (causal == Causal::kBottomRight) jmax = std::min(jmax, i + (Tk - Tq));

      for (int64_t r = 0; r < R; ++r) {
        float s = 0.0f;
        for (int64_t d = 0; d < D; ++d) s += qi[d] * rkp[r * D + d];
        qrel[r] = s;
      }
      float mx = kNegInf;
      for (int64_t j = 0; j < Tk; ++j) {
        float s = kNegInf;
        bool keep = j <= jmax;
        float add = 0.0f;
        if (keep && mp) {
          const float m = mp[row * Tk + j];
          if (kind == MaskKind::kKeep) keep = m != 0.0f;
          else if (kind == MaskKind::kBlock) keep = m == 0.0f;
          else add = m;
        }
        if (keep) {
          const float* kj = kb + j * D;
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
          s = scale * (dot + qrel[rel_index(j - pos)]) + add;
        }
        w[j] = s;
        mx = std::max(mx, s);
      }
      if (mx == kNegInf) {  // fully masked row (or Tk == 0): weights 0, out 0, lse -inf
        std::fill(w, w + Tk, 0.0f);
        continue;
      }
      double sum = 0.0;
      for (int64_t j = 0; j < Tk; ++j) {
        const float e = std::exp(w[j] - mx);
        w[j] = e;
        sum += e;
      }
      const float inv = static_cast<float>(1.0 / sum);
      std::fill(bucket.begin(), bucket.end(), 0.0);
      for (int64_t j = 0; j < Tk; ++j) {
        const float a = w[j] * inv;
        w[j] = a;
        if (a == 0.0f) continue;
        const float* vj = vb + j * Dv;
        for (int64_t d = 0; d < Dv; ++d) oi[d] += a * vj[d];
        bucket[rel_index(j - pos)] += a;
      }
      if (rvp) {
        for (int64_t r = 0; r < R; ++r) {
          if (bucket[r] == 0.0) continue;
          const float a = static_cast<float>(bucket[r]);
          for (int64_t d = 0; d < Dv; ++d) oi[d] += a * rvp[r * Dv + d];
        }
      }
      if (lp) lp[row] = mx + static_cast<float>(std::log(sum));
    }
  }
  return res;
}

}  // namespace qkv
