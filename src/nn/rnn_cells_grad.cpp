// Fused GRU and LSTM cell steps as single tape nodes: the forward is nn::gru_cell_step / lstm_cell_step (the
// modules' own numerics); the backward restates the gate math and does two GEMMs (dh and dW_hh) per step.
#include <cmath>
#include <span>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/kernels/grad.h"
#include "qkv/ops/autograd.h"
#include "qkv/nn/rnn.h"
#include "qkv/ops/functional.h"

namespace qkv::ad {

using Douts = std::span<const Tensor>;

namespace {

void check_active(const std::vector<uint8_t>& active, int64_t nb, const char* op) {
  QKV_CHECK_ARG(active.empty() || static_cast<int64_t>(active.size()) == nb, "[", op, "] active has ",
                active.size(), " flags for a batch of ", nb);
}

// Rows with active[b] == 0 take src's row (their state does not advance). dst, src: contiguous (B, H).
void keep_inactive_rows(Tensor& dst, const Tensor& src, const std::vector<uint8_t>& active) {
  if (active.empty()) return;
  const int64_t hs = dst.size(1);
  const Tensor s = src.contiguous();
  for (size_t b = 0; b < active.size(); ++b)
    if (!active[b]) std::copy(s.data() + b * hs, s.data() + (b + 1) * hs, dst.data() + b * hs);
}

// The recurrent half of a cell's backward, given dgh = d(h·W_hhᵀ + b_hh) (B, G·H) and the direct part dh_direct
// (B, H) of d(h):  dh += dh_direct + dgh·W_hh,  dW_hh += dghᵀ·h,  db_hh += Σ_b dgh.
void recurrent_backward(Tape& t, const Var& h, const Tensor& hval, const Var& w_hh, const Var& b_hh,
                        const Tensor& dgh, const Tensor& dh_direct) {
  const int64_t nb = hval.size(0), hs = hval.size(1), gh = dgh.size(1);
  if (t.needs(h)) {
    bool fresh = false;
    Tensor acc = t.accumulator(h, fresh);
    kernels::add_into(acc, dh_direct, fresh);
    int64_t wr = 0, ldw = 0;
    const Tensor W = kernels::as_rows(w_hh.value, wr, ldw);
    kernels::gemm(false, false, nb, hs, gh, dgh.data(), gh, W.data(), ldw, 1.0f, acc.data(), hs);
  }
  if (t.needs(w_hh)) {
    bool fresh = false;
    Tensor acc = t.accumulator(w_hh, fresh);
    kernels::gemm(true, false, gh, hs, nb, dgh.data(), gh, hval.data(), hs, fresh ? 0.0f : 1.0f, acc.data(), hs);
  }
  if (t.needs(b_hh)) {
    bool fresh = false;
    Tensor acc = t.accumulator(b_hh, fresh);
    kernels::column_sums(dgh.data(), nb, gh, acc.data(), fresh);
  }
}

}  // namespace

Var gru_cell_step(const Var& gi, const Var& h, const Var& w_hh, const Var& b_hh,
                  const std::vector<uint8_t>& active) {
  detail::check_defined(gi, "gru_cell", "gi");
  detail::check_defined(h, "gru_cell", "h");
  detail::check_defined(w_hh, "gru_cell", "w_hh");
  nn::GruCellResult r;
  {
    const kernels::SmallBlasGuard guard(static_cast<double>(h.numel()) * static_cast<double>(w_hh.size(0)));
    r = nn::gru_cell_step(gi.value, h.value, w_hh.value, b_hh.value);
  }
  const int64_t nb = h.size(0), hs = h.size(1);
  check_active(active, nb, "gru_cell");
  const Tensor hval = h.value.contiguous();
  keep_inactive_rows(r.h, hval, active);
  return detail::record(r.h, {&gi, &h, &w_hh, &b_hh},
                        [gi, h, w_hh, b_hh, r, hval, active, nb, hs](Tape& t, Douts d) {
    const Tensor dy = d[0].contiguous();
    Tensor dgi = Tensor::empty({nb, 3 * hs});
    Tensor dgh = Tensor::empty({nb, 3 * hs});
    Tensor dh_direct = Tensor::empty({nb, hs});
    const float *pr = r.r.data(), *pz = r.z.data(), *pn = r.n.data(), *phn = r.hn.data(), *ph = hval.data();
    const float* pdy = dy.data();
#pragma omp parallel for schedule(static) if (nb * hs >= (int64_t{1} << 16))
    for (int64_t b = 0; b < nb; ++b) {
      float* gi_row = dgi.data() + b * 3 * hs;
      float* gh_row = dgh.data() + b * 3 * hs;
      float* dd = dh_direct.data() + b * hs;
      const int64_t o = b * hs;
      if (!active.empty() && !active[static_cast<size_t>(b)]) {
        std::fill(gi_row, gi_row + 3 * hs, 0.0f);
        std::fill(gh_row, gh_row + 3 * hs, 0.0f);
        std::copy(pdy + o, pdy + o + hs, dd);
        continue;
      }
      for (int64_t j = 0; j < hs; ++j) {
        const float g = pdy[o + j], rv = pr[o + j], zv = pz[o + j], nv = pn[o + j];
        const float dn = g * (1.0f - zv) * (1.0f - nv * nv);  // through h' = (1-z)n + zh, n = tanh(.)
        const float dz = g * (ph[o + j] - nv) * zv * (1.0f - zv);
        const float dr = dn * phn[o + j] * rv * (1.0f - rv);
        gi_row[j] = dr;
        gi_row[hs + j] = dz;
        gi_row[2 * hs + j] = dn;
        gh_row[j] = dr;
        gh_row[hs + j] = dz;
        gh_row[2 * hs + j] = dn * rv;
        dd[j] = g * zv;
      }
    }
    t.accumulate_owned(gi, dgi);
    recurrent_backward(t, h, hval, w_hh, b_hh, dgh, dh_direct);
  });
}

LstmVars lstm_cell_step(const Var& gi, const Var& h, const Var& c, const Var& w_hh, const Var& b_hh,
                        const std::vector<uint8_t>& active) {
  detail::check_defined(gi, "lstm_cell", "gi");
  detail::check_defined(h, "lstm_cell", "h");
  detail::check_defined(c, "lstm_cell", "c");
  detail::check_defined(w_hh, "lstm_cell", "w_hh");
  nn::LstmCellResult r;
  {
    const kernels::SmallBlasGuard guard(static_cast<double>(h.numel()) * static_cast<double>(w_hh.size(0)));
    r = nn::lstm_cell_step(gi.value, h.value, c.value, w_hh.value, b_hh.value);
  }
  const int64_t nb = h.size(0), hs = h.size(1);
  check_active(active, nb, "lstm_cell");
  const Tensor hval = h.value.contiguous(), cval = c.value.contiguous();
  keep_inactive_rows(r.h, hval, active);
  keep_inactive_rows(r.c, cval, active);
  Tape* tape = detail::tape_of({&gi, &h, &c, &w_hh, &b_hh});
  if (!tape) return {Var(r.h), Var(r.c)};
  std::vector<Var> out = tape->record(
      {r.h, r.c}, {&gi, &h, &c, &w_hh, &b_hh},
      [gi, h, c, w_hh, b_hh, r, hval, cval, active, nb, hs](Tape& t, Douts d) {
        const Tensor dh = d[0].defined() ? d[0].contiguous() : Tensor();
        const Tensor dc = d[1].defined() ? d[1].contiguous() : Tensor();
        Tensor dgates = Tensor::empty({nb, 4 * hs});
        Tensor dh_direct = Tensor::zeros({nb, hs});
        Tensor dc_prev = Tensor::empty({nb, hs});
        const float *pi = r.i.data(), *pf = r.f.data(), *pg = r.g.data(), *po = r.o.data(), *pc = r.c.data();
        const float* pcp = cval.data();
        const float* pdh = dh.defined() ? dh.data() : nullptr;
        const float* pdc = dc.defined() ? dc.data() : nullptr;
#pragma omp parallel for schedule(static) if (nb * hs >= (int64_t{1} << 16))
        for (int64_t b = 0; b < nb; ++b) {
          float* gr = dgates.data() + b * 4 * hs;
          float* dcp = dc_prev.data() + b * hs;
          const int64_t o = b * hs;
          if (!active.empty() && !active[static_cast<size_t>(b)]) {
            std::fill(gr, gr + 4 * hs, 0.0f);
            for (int64_t j = 0; j < hs; ++j) {
              dh_direct.data()[o + j] = pdh ? pdh[o + j] : 0.0f;
              dcp[j] = pdc ? pdc[o + j] : 0.0f;
            }
            continue;
          }
          for (int64_t j = 0; j < hs; ++j) {
            const float gh = pdh ? pdh[o + j] : 0.0f;
            const float iv = pi[o + j], fv = pf[o + j], gv = pg[o + j], ov = po[o + j];
            const float tc = std::tanh(pc[o + j]);
            const float dcn = (pdc ? pdc[o + j] : 0.0f) + gh * ov * (1.0f - tc * tc);
            gr[j] = dcn * gv * iv * (1.0f - iv);
            gr[hs + j] = dcn * pcp[o + j] * fv * (1.0f - fv);
            gr[2 * hs + j] = dcn * iv * (1.0f - gv * gv);
            gr[3 * hs + j] = gh * tc * ov * (1.0f - ov);
            dcp[j] = dcn * fv;
          }
        }
        t.accumulate_owned(gi, dgates);
        t.accumulate_owned(c, dc_prev);
        recurrent_backward(t, h, hval, w_hh, b_hh, dgates, dh_direct);
      });
  return {out[0], out[1]};
}

}  // namespace qkv::ad
