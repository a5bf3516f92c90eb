// Reference attention forward and backward: per batch matrix, sgemm for q·kᵀ and p·v, masked softmax between.
// Correctness first (double softmax sums, any strides via contiguous copies); the oracle for the fused kernel.
#include "qkv/kernels/attention_reference.h"

#include <cblas.h>

#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <vector>

#include "qkv/core/error.h"

namespace qkv::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Threading: batches run in parallel (one OpenMP region, single-threaded sgemm inside it: OpenBLAS's OpenMP
// build does not nest). A single batch matrix instead lets sgemm thread and splits its softmax rows when there
// are at least this many scores.
constexpr int64_t kParallelScores = int64_t{1} << 15;

// Per flat batch index, the storage offset of that batch's trailing matrix in `t` broadcast to `batch`
// (stride 0 along broadcast axes; a GQA group of query heads shares its kv head's matrix).
std::vector<int64_t> batch_offsets(const Tensor& t, const Shape& batch, int64_t group = 1) {
  return matrix_offsets(t, batch, group);
}

// A read-only (batch..., R, C) operand as contiguous row-major matrices (ld = C), one offset per batch index.
struct Operand {
  Tensor t;  // contiguous (a copy only when the input was not)
  std::vector<int64_t> offs;
  const float* at(int64_t b) const { return t.data() + offs[static_cast<size_t>(b)]; }
};

Operand operand(const Tensor& t, const Shape& batch, int64_t group = 1) {
  Operand o;
  o.t = t.contiguous();
  o.offs = batch_offsets(o.t, batch, group);
  return o;
}

// The mask broadcast to (batch..., Tq, Tk), read through its strides (no copy).
struct MaskView {
  MaskKind kind = MaskKind::kNone;
  const float* base = nullptr;
  std::vector<int64_t> offs;
  int64_t row_stride = 0, col_stride = 0;
};

MaskView mask_view(const AttentionOptions& options, const Shape& batch, int64_t tq, int64_t tk) {
  MaskView m;
  m.kind = options.mask_kind;
  if (m.kind == MaskKind::kNone) return m;
  Shape full = batch;
  full.push_back(tq);
  full.push_back(tk);
  const Tensor e = options.mask.expand(full);
  m.base = e.data();
  m.offs = batch_offsets(e, batch);
  m.row_stride = e.stride(-2);
  m.col_stride = e.stride(-1);
  return m;
}


// s[0, Tk): scaled scores of query row i of batch b. Applies causal, the window (keys outside `keys`) and the mask
// in place (-inf = blocked).
void mask_row(float* s, int64_t tk, KeyRange keys, const MaskView& m, int64_t b, int64_t i) {
  for (int64_t j = 0; j < keys.begin; ++j) s[j] = kNegInf;
  for (int64_t j = keys.end; j < tk; ++j) s[j] = kNegInf;
  if (m.kind == MaskKind::kNone) return;
  const float* mrow = m.base + m.offs[static_cast<size_t>(b)] + i * m.row_stride;
  for (int64_t j = keys.begin; j < keys.end; ++j) {
    const float mv = mrow[j * m.col_stride];
    switch (m.kind) {
      case MaskKind::kKeep:
        if (mv == 0.0f) s[j] = kNegInf;
        break;
      case MaskKind::kBlock:
        if (mv != 0.0f) s[j] = kNegInf;
        break;
      case MaskKind::kAdditive:
        s[j] += mv;
        break;
      case MaskKind::kNone:
        break;
    }
  }
}

// Masked scores -> probabilities in place. Returns the row's log-sum-exp; -inf (and a zero row) when nothing
// takes part; NaN (and a NaN row, as in PyTorch) when a score that takes part is NaN. Sums in double.
float softmax_row(float* s, int64_t tk) {
  float mx = kNegInf;
  bool nan = false;
  for (int64_t j = 0; j < tk; ++j) {
    nan |= s[j] != s[j];
    if (s[j] > mx) mx = s[j];
  }
  if (nan) {
    for (int64_t j = 0; j < tk; ++j) s[j] = std::numeric_limits<float>::quiet_NaN();
    return std::numeric_limits<float>::quiet_NaN();
  }
  if (mx == kNegInf) {
    for (int64_t j = 0; j < tk; ++j) s[j] = 0.0f;
    return kNegInf;
  }
  double sum = 0.0;
  for (int64_t j = 0; j < tk; ++j) {
    s[j] = s[j] == kNegInf ? 0.0f : static_cast<float>(std::exp(static_cast<double>(s[j]) - mx));
    sum += s[j];
  }
  for (int64_t j = 0; j < tk; ++j) s[j] = static_cast<float>(s[j] / sum);
  return static_cast<float>(mx + std::log(sum));
}

// Masked scores -> probabilities exp(s - lse) in place, given the forward's lse (-inf row -> zeros).
void probs_from_lse(float* s, int64_t tk, float lse) {
  for (int64_t j = 0; j < tk; ++j) {
    const bool off = lse == kNegInf || s[j] == kNegInf;
    s[j] = off ? 0.0f : static_cast<float>(std::exp(static_cast<double>(s[j]) - lse));
  }
}

struct Dims {
  int tq, tk, dk, dv;  // checked to fit BLAS's int
  int64_t nb;
};

Dims dims_of(const Tensor& q, const Tensor& k, const Tensor& v, const Shape& batch) {
  for (int64_t n : {q.size(-2), k.size(-2), q.size(-1), v.size(-1)})
    QKV_CHECK_RUNTIME(n <= INT_MAX, "[attention] size ", n, " of q ", str(q.shape()), ", k ", str(k.shape()),
                      " or v ", str(v.shape()), " exceeds the BLAS int range");
  return {static_cast<int>(q.size(-2)), static_cast<int>(k.size(-2)), static_cast<int>(q.size(-1)),
          static_cast<int>(v.size(-1)), shape_numel(batch)};
}

// S (Tq, Tk) = scale · Q Kᵀ, soft-capped to c·tanh(S / c) when options.softcap > 0 (dcap, when given, receives
// the derivative 1 - tanh² of each capped score), then causal + window + mask, then per row either softmax
// (lse_out, may be null) or, when lse_in is given, exp(S - lse). Rows whose lse is -inf are all zero.
void probabilities(const float* qb, const float* kb, float* s, const Dims& d, float scale,
                   const AttentionOptions& options, const MaskView& mask, int64_t b, float* lse_out,
                   const float* lse_in, bool parallel_rows, float* dcap = nullptr) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d.tq, d.tk, d.dk, scale, qb, d.dk, kb, d.dk, 0.0f, s, d.tk);
  const double cap = options.softcap;
#pragma omp parallel for schedule(static) if (parallel_rows && int64_t{d.tq} * d.tk >= kParallelScores)
  for (int64_t i = 0; i < d.tq; ++i) {
    float* row = s + i * d.tk;
    if (cap > 0.0)
      for (int64_t j = 0; j < d.tk; ++j) {
        const double t = std::tanh(static_cast<double>(row[j]) / cap);
        row[j] = static_cast<float>(cap * t);
        if (dcap) dcap[i * d.tk + j] = static_cast<float>(1.0 - t * t);
      }
    mask_row(row, d.tk, visible_keys(options, i, d.tq, d.tk), mask, b, i);
    if (lse_in) {
      probs_from_lse(row, d.tk, lse_in[i]);
    } else {
      const float l = softmax_row(row, d.tk);
      if (lse_out) lse_out[i] = l;
    }
  }
}

Shape with_tail(const Shape& batch, std::initializer_list<int64_t> tail) {
  Shape s = batch;
  s.insert(s.end(), tail.begin(), tail.end());
  return s;
}

// Runs body(b, thread_scratch) for every batch index: in parallel over batches when `parallel` and there is more
// than one, else in order on this thread. Each thread gets its own `scratch_floats` floats.
template <typename Body>
void for_each_batch(int64_t nb, bool parallel, size_t scratch_floats, const Body& body) {
  const bool par = parallel && nb > 1;
  const int threads = par ? std::max(1, omp_get_max_threads()) : 1;
  std::vector<float> scratch(scratch_floats * static_cast<size_t>(threads));
  if (!par) {
    for (int64_t b = 0; b < nb; ++b) body(b, scratch.data(), true);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    float* mine = scratch.data() + scratch_floats * static_cast<size_t>(omp_get_thread_num());
#pragma omp for schedule(dynamic)
    for (int64_t b = 0; b < nb; ++b) body(b, mine, false);
  }
}

// True when every batch index owns a distinct matrix of `t` (no broadcast leading dim), so that batches may
// accumulate into its gradient concurrently.
bool owns_every_batch(const Tensor& t, int64_t nb) {
  return shape_numel(Shape(t.shape().begin(), t.shape().end() - 2)) == nb;
}

}  // namespace

AttentionResult attention_reference_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const AttentionOptions& options, const Shape& batch,
                                            float scale) {
  const Dims d = dims_of(q, k, v, batch);
  const int64_t group = gqa_group(options, k, batch);
  const Operand qo = operand(q, batch), ko = operand(k, batch, group), vo = operand(v, batch, group);
  const MaskView mask = mask_view(options, batch, d.tq, d.tk);

  AttentionResult r;
  r.out = Tensor::empty(with_tail(batch, {d.tq, d.dv}));
  if (options.return_weights) r.weights = Tensor::empty(with_tail(batch, {d.tq, d.tk}));
  Tensor lse = Tensor::empty(with_tail(batch, {d.tq}));
  const int64_t tqk = int64_t{d.tq} * d.tk;
  float* weights = options.return_weights ? r.weights.data() : nullptr;
  float* out = r.out.data();
  float* lse_all = lse.data();

  for_each_batch(d.nb, true, weights ? 0 : static_cast<size_t>(tqk), [&](int64_t b, float* scratch, bool rows) {
    float* w = weights ? weights + b * tqk : scratch;
    float* lb = lse_all + b * d.tq;
    probabilities(qo.at(b), ko.at(b), w, d, scale, options, mask, b, lb, nullptr, rows);
    float* ob = out + b * d.tq * d.dv;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d.tq, d.dv, d.tk, 1.0f, w, d.tk, vo.at(b), d.dv, 0.0f,
                ob, d.dv);
    // A fully masked row is 0 even when v holds inf (0·inf would be NaN).
    for (int64_t i = 0; i < d.tq; ++i)
      if (lb[i] == kNegInf)
        for (int64_t c = 0; c < d.dv; ++c) ob[i * d.dv + c] = 0.0f;
  });
  if (options.return_lse) r.lse = lse;
  return r;
}

AttentionGrads attention_reference_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& out, const Tensor& lse, const Tensor& d_out,
                                            const AttentionOptions& options, const Shape& batch,
                                            float scale) {
  const Dims d = dims_of(q, k, v, batch);
  const int64_t group = gqa_group(options, k, batch);
  const Operand qo = operand(q, batch), ko = operand(k, batch, group), vo = operand(v, batch, group);
  const Operand dOo = operand(d_out, batch);
  const MaskView mask = mask_view(options, batch, d.tq, d.tk);

  // out and lse of the forward, recomputed when not given.
  Tensor out_c = out, lse_c = lse;
  if (!out_c.defined() || !lse_c.defined()) {
    AttentionOptions o = options;
    o.return_weights = false;
    o.return_lse = true;
    AttentionResult f = attention_reference_forward(q, k, v, o, batch, scale);
    if (!out_c.defined()) out_c = f.out;
    if (!lse_c.defined()) lse_c = f.lse;
  }
  const Operand oo = operand(out_c, batch);
  const Tensor lse_cc = lse_c.contiguous();  // (batch..., Tq)
  const float* lse_all = lse_cc.data();

  AttentionGrads g;
  g.dq = Tensor::zeros(q.shape());
  g.dk = Tensor::zeros(k.shape());
  g.dv = Tensor::zeros(v.shape());
  const std::vector<int64_t> dq_offs = batch_offsets(g.dq, batch);
  const std::vector<int64_t> dk_offs = batch_offsets(g.dk, batch, group);
  const std::vector<int64_t> dv_offs = batch_offsets(g.dv, batch, group);
  float* dq_all = g.dq.data();
  float* dk_all = g.dk.data();
  float* dv_all = g.dv.data();

  // Broadcast inputs share a gradient matrix between batches: accumulate those in order, on one thread.
  const bool parallel = owns_every_batch(q, d.nb) && owns_every_batch(k, d.nb) && owns_every_batch(v, d.nb);
  const int64_t tqk = int64_t{d.tq} * d.tk;

  const bool capped = options.softcap > 0.0f;
  for_each_batch(d.nb, parallel, static_cast<size_t>((capped ? 3 : 2) * tqk), [&](int64_t b, float* scratch,
                                                                                  bool rows) {
    float* p = scratch;
    float* ds = scratch + tqk;
    float* dcap = capped ? scratch + 2 * tqk : nullptr;
    const size_t bi = static_cast<size_t>(b);
    const float* qb = qo.at(b);
    const float* kb = ko.at(b);
    const float* dob = dOo.at(b);
    const float* ob = oo.at(b);
    probabilities(qb, kb, p, d, scale, options, mask, b, nullptr, lse_all + b * d.tq, rows, dcap);

    // in the forward pass this was:  out = P V
    // so now:                        dV += Pᵀ dO,   dP = dO Vᵀ   (dP stored in ds)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d.tk, d.dv, d.tq, 1.0f, p, d.tk, dob, d.dv, 1.0f,
                dv_all + dv_offs[bi], d.dv);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d.tq, d.tk, d.dv, 1.0f, dob, d.dv, vo.at(b), d.dv, 0.0f,
                ds, d.tk);

    // in the forward pass this was:  P = softmax(S)
    // so now:                        dS = P ∘ (dP − D),  D_i = Σ_c dO_ic O_ic
#pragma omp parallel for schedule(static) if (rows && tqk >= kParallelScores)
    for (int64_t i = 0; i < d.tq; ++i) {
      double delta = 0.0;
      for (int64_t c = 0; c < d.dv; ++c)
        delta += static_cast<double>(dob[i * d.dv + c]) * static_cast<double>(ob[i * d.dv + c]);
      const float* pr = p + i * d.tk;
      float* dsr = ds + i * d.tk;
      for (int64_t j = 0; j < d.tk; ++j)
        dsr[j] = pr[j] == 0.0f ? 0.0f : static_cast<float>(pr[j] * (static_cast<double>(dsr[j]) - delta));
      // soft-capped:                 dS_raw = dS ∘ (1 − tanh²)
      if (dcap)
        for (int64_t j = 0; j < d.tk; ++j) dsr[j] *= dcap[i * d.tk + j];
    }

    // in the forward pass this was:  S = scale · Q Kᵀ
    // so now:                        dQ += scale · dS K,   dK += scale · dSᵀ Q
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d.tq, d.dk, d.tk, scale, ds, d.tk, kb, d.dk, 1.0f,
                dq_all + dq_offs[bi], d.dk);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d.tk, d.dk, d.tq, scale, ds, d.tk, qb, d.dk, 1.0f,
                dk_all + dk_offs[bi], d.dk);
  });
  return g;
}

}  // namespace qkv::kernels
