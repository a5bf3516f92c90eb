// GRU: the fused single-step cell (gates r, z, n as torch.nn.GRU) and the multi-layer layer that runs it,
// with the input projection of every time step done as one GEMM per layer.
#include "qkv/core/error.h"
#include "qkv/kernels/rnn_cells.h"
#include "qkv/nn/rnn.h"
#include "qkv/ops/matmul.h"
#include "rnn_common.h"

namespace qkv::nn {

GruCellResult gru_cell_step(const Tensor& gi_in, const Tensor& h_in, const Tensor& w_hh, const Tensor& b_hh) {
  detail::check_cell("gru_cell", 3, gi_in, h_in, w_hh, b_hh);
  const int64_t nb = h_in.size(0), hs = h_in.size(1);
  const Tensor h = h_in.contiguous();
  const Tensor gh = linear(h, w_hh, b_hh).contiguous();  // (B, 3H): W_hh h + b_hh, packed r, z, n
  const Tensor gi = detail::unit_last_stride(gi_in);
  const int64_t gi_rs = detail::row_stride(gi);

  GruCellResult res;
  res.h = Tensor::empty({nb, hs});
  res.r = Tensor::empty({nb, hs});
  res.z = Tensor::empty({nb, hs});
  res.n = Tensor::empty({nb, hs});
  res.hn = Tensor::empty({nb, hs});
  kernels::gru_cell_rows(nb, hs, gi.data(), gi_rs, gh.data(), h.data(), res.r.data(), res.z.data(), res.n.data(),
                         res.hn.data(), res.h.data());
  return res;
}

GruCellResult gru_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh,
                       const Tensor& b_ih, const Tensor& b_hh) {
  detail::check_cell_input("gru_cell", 3, x, h, w_ih, b_ih);
  return gru_cell_step(linear(x, w_ih, b_ih), h, w_hh, b_hh);
}

GRU::GRU(int64_t input_size, int64_t hidden_size, Rng& rng, const RnnOptions& options)
    : RnnBase("GRU", 3, input_size, hidden_size, rng, options) {}

RnnOutput GRU::forward(const Tensor& x, const Tensor& h0, const std::vector<int64_t>& lengths) const {
  const auto [nb, nt] = check_input(x, lengths);
  check_state(h0, "h0", nb);
  const bool bf = options_.batch_first;
  const int64_t time_axis = bf ? 1 : 0;
  const int64_t hs = hidden_size_;

  RnnOutput res;
  res.h_n = Tensor::empty({num_layers(), nb, hs});
  Tensor in = x;
  for (int64_t l = 0; l < num_layers(); ++l) {
    const Layer& p = layers_[static_cast<size_t>(l)];
    const Tensor gi = linear(in, p.w_ih, p.b_ih);  // every step's x·W_ihᵀ + b_ih in one GEMM
    Tensor out = bf ? Tensor::zeros({nb, nt, hs}) : Tensor::zeros({nt, nb, hs});
    Tensor h = h0.defined() ? h0.select(0, l).contiguous() : Tensor::zeros({nb, hs});
    for (int64_t t = 0; t < nt; ++t) {
      GruCellResult step = gru_cell_step(gi.select(time_axis, t), h, p.w_hh, p.b_hh);
      detail::freeze_finished_rows(step.h, h, lengths, t);
      detail::write_output_step(out, bf, t, step.h, lengths);
      h = step.h;
    }
    res.h_n.select(0, l).copy_from(h);
    in = out;
  }
  res.output = in;
  return res;
}

Tensor GRU::step(const Tensor& x, const Tensor& h) const {
  QKV_CHECK_ARG(x.defined() && x.dim() == 2 && x.size(0) > 0 && x.size(1) == input_size_, "[GRU] step x ",
                str(x.shape()), " must be a non-empty (B, E) with E = input_size ", input_size_);
  const int64_t nb = x.size(0);
  QKV_CHECK_ARG(h.defined(), "[GRU] step h is undefined");
  check_state(h, "h", nb);
  Tensor next = Tensor::empty({num_layers(), nb, hidden_size_});
  Tensor in = x;
  for (int64_t l = 0; l < num_layers(); ++l) {
    const Layer& p = layers_[static_cast<size_t>(l)];
    GruCellResult r = gru_cell_step(linear(in, p.w_ih, p.b_ih), h.select(0, l), p.w_hh, p.b_hh);
    next.select(0, l).copy_from(r.h);
    in = r.h;
  }
  return next;
}

}  // namespace qkv::nn
