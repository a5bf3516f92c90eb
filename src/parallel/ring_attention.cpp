// Ring attention forward and backward over the fused kernels (ops/attention.h: attention_fused returns out + lse,
// attention_backward takes the merged out + lse). See qkv/parallel/ring_attention.h for the layout and the contract.
#include "qkv/parallel/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <utility>

#include "qkv/core/error.h"
#include "qkv/ops/attention.h"

namespace qkv::parallel {
namespace {

// Message tags: K/V blocks of step s use kKvTag + s, the dK/dV accumulated for the block of step s use kGradTag + s.
constexpr int kKvTag = 0;
constexpr int kGradTag = 16384;
constexpr int kMaxRanks = 16000;

// One travelling block: K, V and (when given) the additive per-key mask, packed in one buffer so that a step is one
// message. The views share the buffer.
struct Block {
  Tensor buffer, k, v, mask;
};

Block make_block(const Shape& k_shape, const Shape& v_shape, const Shape& mask_shape, bool has_mask) {
  const int64_t nk = shape_numel(k_shape), nv = shape_numel(v_shape), nm = has_mask ? shape_numel(mask_shape) : 0;
  Block b;
  b.buffer = Tensor::empty({nk + nv + nm});
  b.k = b.buffer.slice(0, 0, nk).view(k_shape);
  b.v = b.buffer.slice(0, nk, nk + nv).view(v_shape);
  if (has_mask) b.mask = b.buffer.slice(0, nk + nv, nk + nv + nm).view(mask_shape);
  return b;
}

// dst (a view, any strides) += src (same shape).
void add_into(Tensor dst, const Tensor& src) {
  QKV_ASSERT(dst.shape() == src.shape());
  const Tensor s = src.contiguous();
  const float* sp = s.data();
  float* dp = dst.data();
  for_each_offset(dst.shape(), dst.strides(), [&](int64_t i, int64_t off) { dp[off] += sp[i]; });
}

// What every call checks and derives once.
struct Plan {
  int n = 1, rank = 0;
  bool causal = false;
  int64_t tq = 0, tk = 0, half = 0;  // half: the zigzag chunk (causal)
  AttentionOptions base;             // scale fixed, additive mask slot, return_lse
  Tensor mask;                       // this rank's additive per-key mask, or undefined
  Shape batch;
};

Plan make_plan(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& comm,
               const AttentionOptions& options, const char* op) {
  Plan p;
  p.n = comm.size();
  p.rank = comm.rank();
  QKV_CHECK_ARG(p.n <= kMaxRanks, "[", op, "] at most ", kMaxRanks, " ranks, got ", p.n);
  QKV_CHECK_ARG(!options.return_weights, "[", op, "] the ring never forms the weights; q ", str(q.shape()),
                " k ", str(k.shape()), ": return_weights must be false");
  QKV_CHECK_ARG(q.defined() && k.defined() && v.defined() && q.dim() >= 2 && k.dim() >= 2,
                "[", op, "] q, k and v must be defined tensors of rank >= 2");
  p.tq = q.size(-2);
  p.tk = k.size(-2);
  p.causal = options.causal != Causal::kNone;
  if (p.causal) {
    QKV_CHECK_ARG(p.tq == p.tk, "[", op, "] causal ring attention needs equal shards of one sequence: q ",
                  str(q.shape()), " k ", str(k.shape()));
    QKV_CHECK_ARG(p.n == 1 || p.tq % 2 == 0, "[", op, "] causal: the local length ", p.tq,
                  " must be even (two zigzag chunks per rank), q ", str(q.shape()));
    p.half = p.tq / 2;
  }
  QKV_CHECK_ARG(options.window_left < 0 && options.window_right < 0, "[", op, "] q ", str(q.shape()), " k ",
                str(k.shape()), ": a sliding window (window_size (", options.window_left, ", ", options.window_right,
                ")) does not run around the ring (the kernels' window is on local positions); use no window");
  p.base.scale = attention_scale(options, q.size(-1));
  p.base.return_lse = true;
  // Per-score and per-head options pass through: every block's scores are capped alike (the merge and the
  // backward see the capped scores' lse), and a query head reads kv head h / (Hq / Hkv) of every block.
  p.base.softcap = options.softcap;
  p.base.enable_gqa = options.enable_gqa;
  if (options.mask_kind != MaskKind::kNone) {
    const Tensor& m = options.mask;
    QKV_CHECK_ARG(m.defined() && m.dim() >= 1 && m.size(-1) == p.tk && (m.dim() < 2 || m.size(-2) == 1), "[", op,
                  "] the mask must be per key, broadcastable to (batch..., 1, Tk) with Tk = ", p.tk, " (k ",
                  str(k.shape()), "); got ", m.defined() ? str(m.shape()) : "(undefined)",
                  ": a (Tq, Tk) mask does not shard across the ring");
    p.mask = mask_to_additive(m, options.mask_kind).contiguous();
    p.base.mask_kind = MaskKind::kAdditive;
    p.base.mask = p.mask;
  }
  AttentionOptions check = p.base;
  check.causal = p.causal ? Causal::kTopLeft : Causal::kNone;
  p.batch = attention_check(q, k, v, check, op);
  return p;
}

// The part of the step whose block came from rank `src`: which query rows and which keys of the block take part
// (zigzag: the diagonal step is causal over both local chunks; an earlier rank's block is seen, whole, through its
// first chunk; a later rank's block, whole, by the second local chunk only).
struct StepPart {
  int64_t row0, rows;   // query rows [row0, row0 + rows)
  int64_t key0, keys;   // block keys [key0, key0 + keys)
  bool causal;          // top-left causal over the part (the diagonal step)
};

StepPart step_part(const Plan& p, int src) {
  if (!p.causal) return {0, p.tq, 0, p.tk, false};
  if (src == p.rank) return {0, p.tq, 0, p.tk, true};
  if (src < p.rank) return {0, p.tq, 0, p.half, false};
  return {p.half, p.half, 0, p.tk, false};
}

AttentionOptions part_options(const Plan& p, const StepPart& s, const Block& b) {
  AttentionOptions o = p.base;
  o.causal = s.causal ? Causal::kTopLeft : Causal::kNone;
  if (b.mask.defined()) o.mask = b.mask.slice(-1, s.key0, s.key0 + s.keys);
  return o;
}

// Merges a partial (out, lse) over rows [row0, row0 + rows) into the running one, exactly:
// lse = log(e^a + e^b), out = (e^a·out_a + e^b·out_b) / (e^a + e^b). Rows that no key reached stay (0, -inf).
void merge(Tensor& acc_out, Tensor& acc_lse, const AttentionResult& part, int64_t row0, int64_t tq) {
  const Tensor po = part.out.contiguous(), pl = part.lse.contiguous();
  const int64_t rows = pl.size(-1), dv = po.size(-1), nb = acc_lse.numel() / tq;
  float* ao = acc_out.data();
  float* al = acc_lse.data();
  const float* bo = po.data();
  const float* bl = pl.data();
  const double ninf = -std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t i = 0; i < rows; ++i) {
      float* a_lse = al + b * tq + row0 + i;
      const double la = *a_lse, lb = bl[b * rows + i];
      const double m = std::max(la, lb);
      if (m == ninf) continue;
      const double wa = std::exp(la - m), wb = std::exp(lb - m), sum = wa + wb;
      float* a_row = ao + (b * tq + row0 + i) * dv;
      const float* b_row = bo + (b * rows + i) * dv;
      for (int64_t d = 0; d < dv; ++d) a_row[d] = static_cast<float>((wa * a_row[d] + wb * b_row[d]) / sum);
      *a_lse = static_cast<float>(m + std::log(sum));
    }
  }
}

int next_rank(const Plan& p) { return (p.rank + 1) % p.n; }
int prev_rank(const Plan& p) { return (p.rank + p.n - 1) % p.n; }

Block first_block(const Plan& p, const Tensor& k, const Tensor& v) {
  Block b = make_block(k.shape(), v.shape(), p.mask.defined() ? p.mask.shape() : Shape{}, p.mask.defined());
  b.k.copy_from(k);
  b.v.copy_from(v);
  if (p.mask.defined()) b.mask.copy_from(p.mask);
  return b;
}

Block empty_like(const Block& b) {
  return make_block(b.k.shape(), b.v.shape(), b.mask.defined() ? b.mask.shape() : Shape{}, b.mask.defined());
}

}  // namespace

std::vector<int64_t> ring_positions(int64_t t, int rank, int size, Causal causal) {
  QKV_CHECK_ARG(size >= 1 && rank >= 0 && rank < size, "[ring_shard] rank ", rank, " of a group of ", size);
  const int64_t n = size;
  std::vector<int64_t> pos;
  if (causal == Causal::kNone) {
    QKV_CHECK_ARG(t >= 0 && t % n == 0, "[ring_shard] length ", t, " must divide by the ", n, " ranks");
    for (int64_t i = rank * (t / n); i < (rank + 1) * (t / n); ++i) pos.push_back(i);
    return pos;
  }
  QKV_CHECK_ARG(t >= 0 && t % (2 * n) == 0, "[ring_shard] causal (zigzag) length ", t, " must divide by 2 x ", n,
                " ranks");
  const int64_t c = t / (2 * n);
  for (int64_t chunk : {static_cast<int64_t>(rank), 2 * n - 1 - rank})
    for (int64_t i = chunk * c; i < (chunk + 1) * c; ++i) pos.push_back(i);
  return pos;
}

Tensor ring_shard(const Tensor& x, int64_t axis, int rank, int size, Causal causal) {
  QKV_CHECK_ARG(x.defined() && x.dim() >= 1, "[ring_shard] x must be a defined tensor");
  const int64_t ax = axis < 0 ? axis + x.dim() : axis;
  QKV_CHECK_ARG(ax >= 0 && ax < x.dim(), "[ring_shard] axis ", axis, " out of range for ", str(x.shape()));
  const std::vector<int64_t> pos = ring_positions(x.size(ax), rank, size, causal);
  Shape shape = x.shape();
  shape[static_cast<size_t>(ax)] = static_cast<int64_t>(pos.size());
  Tensor out = Tensor::empty(shape);
  // Runs of consecutive positions are copied as slices.
  size_t i = 0;
  while (i < pos.size()) {
    size_t j = i + 1;
    while (j < pos.size() && pos[j] == pos[j - 1] + 1) ++j;
    out.slice(ax, static_cast<int64_t>(i), static_cast<int64_t>(j)).copy_from(x.slice(ax, pos[i], pos[j - 1] + 1));
    i = j;
  }
  return out;
}

AttentionResult ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& comm,
                               const AttentionOptions& options) {
  const Plan p = make_plan(q, k, v, comm, options, "ring_attention");
  Block cur = first_block(p, k, v);
  Block nxt = p.n > 1 ? empty_like(cur) : Block{};
  AttentionResult acc;
  for (int s = 0; s < p.n; ++s) {
    const int src = (p.rank - s + p.n) % p.n;
    Request send, recv;
    if (s + 1 < p.n) {  // the next block arrives while this one is computed
      recv = comm.irecv(nxt.buffer.data(), nxt.buffer.numel(), prev_rank(p), kKvTag + s);
      send = comm.isend(cur.buffer.data(), cur.buffer.numel(), next_rank(p), kKvTag + s);
    }
    const StepPart part = step_part(p, src);
    const AttentionResult r =
        attention_fused(q.slice(-2, part.row0, part.row0 + part.rows), cur.k.slice(-2, part.key0, part.key0 + part.keys),
                        cur.v.slice(-2, part.key0, part.key0 + part.keys), part_options(p, part, cur));
    if (s == 0) {
      QKV_ASSERT(part.row0 == 0 && part.rows == p.tq);
      acc.out = r.out.contiguous();
      acc.lse = r.lse.contiguous();
    } else {
      merge(acc.out, acc.lse, r, part.row0, p.tq);
    }
    if (s + 1 < p.n) {
      comm.wait(recv);
      comm.wait(send);
      std::swap(cur, nxt);
    }
  }
  return acc;
}

AttentionGrads ring_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                       const Tensor& lse, const Tensor& d_out, Communicator& comm,
                                       const AttentionOptions& options) {
  const char* op = "ring_attention_backward";
  const Plan p = make_plan(q, k, v, comm, options, op);
  Shape out_shape = p.batch, lse_shape = p.batch;
  out_shape.push_back(p.tq);
  out_shape.push_back(v.size(-1));
  lse_shape.push_back(p.tq);
  QKV_CHECK_ARG(out.defined() && out.shape() == out_shape && d_out.defined() && d_out.shape() == out_shape, "[", op,
                "] out ", out.defined() ? str(out.shape()) : "(undefined)", " and d_out ",
                d_out.defined() ? str(d_out.shape()) : "(undefined)", " must have shape (batch..., Tq, Dv) = ",
                str(out_shape));
  QKV_CHECK_ARG(lse.defined() && lse.shape() == lse_shape, "[", op, "] lse ",
                lse.defined() ? str(lse.shape()) : "(undefined)", " must have shape (batch..., Tq) = ",
                str(lse_shape), " (ring_attention's lse)");

  AttentionGrads g;
  g.dq = Tensor::zeros(q.shape());
  Block cur = first_block(p, k, v);
  Block nxt = p.n > 1 ? empty_like(cur) : Block{};
  // The dK/dV of the block held now (accumulated by the ranks that held it before, plus ours), and the one in flight.
  Block grad = make_block(k.shape(), v.shape(), {}, false), grad_in = make_block(k.shape(), v.shape(), {}, false);
  Block grad_out = make_block(k.shape(), v.shape(), {}, false);
  Request grad_send;
  for (int s = 0; s < p.n; ++s) {
    const int src = (p.rank - s + p.n) % p.n;
    Request send, recv, grad_recv;
    if (s + 1 < p.n) {
      recv = comm.irecv(nxt.buffer.data(), nxt.buffer.numel(), prev_rank(p), kKvTag + s);
      send = comm.isend(cur.buffer.data(), cur.buffer.numel(), next_rank(p), kKvTag + s);
    }
    if (s > 0) grad_recv = comm.irecv(grad_in.buffer.data(), grad_in.buffer.numel(), prev_rank(p), kGradTag + s);
    const StepPart part = step_part(p, src);
    const auto rows = [&](const Tensor& t, int64_t axis) { return t.slice(axis, part.row0, part.row0 + part.rows); };
    const Tensor kp = cur.k.slice(-2, part.key0, part.key0 + part.keys);
    const Tensor vp = cur.v.slice(-2, part.key0, part.key0 + part.keys);
    const AttentionGrads pg = attention_backward(rows(q, -2), kp, vp, rows(out, -2), rows(lse, -1), rows(d_out, -2),
                                                 part_options(p, part, cur));
    add_into(rows(g.dq, -2), pg.dq);
    grad.buffer.fill(0.0f);
    add_into(grad.k.slice(-2, part.key0, part.key0 + part.keys), pg.dk);
    add_into(grad.v.slice(-2, part.key0, part.key0 + part.keys), pg.dv);
    if (s > 0) {
      comm.wait(grad_recv);
      add_into(grad.buffer, grad_in.buffer);
    }
    if (p.n > 1) {  // on to the next holder; after the last step that is the block's owner
      comm.wait(grad_send);
      std::swap(grad, grad_out);
      grad_send = comm.isend(grad_out.buffer.data(), grad_out.buffer.numel(), next_rank(p), kGradTag + s + 1);
    }
    if (s + 1 < p.n) {
      comm.wait(recv);
      comm.wait(send);
      std::swap(cur, nxt);
    }
  }
  if (p.n > 1) {  // our own block's dK/dV, back from its last holder
    Request own = comm.irecv(grad_in.buffer.data(), grad_in.buffer.numel(), prev_rank(p), kGradTag + p.n);
    comm.wait(own);
    comm.wait(grad_send);
    grad = std::move(grad_in);
  }
  g.dk = grad.k.clone();
  g.dv = grad.v.clone();
  return g;
}

ad::Var ring_attention(const ad::Var& q, const ad::Var& k, const ad::Var& v, Communicator& comm,
                       const AttentionOptions& options) {
  const Tensor qc = q.value.contiguous(), kc = k.value.contiguous(), vc = v.value.contiguous();
  const AttentionResult r = ring_attention(qc, kc, vc, comm, options);
  ad::Tape* tape = nullptr;
  for (const ad::Var* x : {&q, &k, &v})
    if (tape == nullptr && x->slot >= 0) tape = x->tape;
  if (tape == nullptr) return ad::Var(r.out);
  const Tensor out = r.out, lse = r.lse;
  Communicator* c = &comm;
  return tape->record(out, {&q, &k, &v}, [q, k, v, qc, kc, vc, out, lse, c, options](ad::Tape& t,
                                                                                     std::span<const Tensor> d) {
    AttentionGrads g = ring_attention_backward(qc, kc, vc, out, lse, d[0], *c, options);
    if (t.needs(q)) t.accumulate_owned(q, g.dq);
    if (t.needs(k)) t.accumulate_owned(k, g.dk);
    if (t.needs(v)) t.accumulate_owned(v, g.dv);
  });
}

}  // namespace qkv::parallel
