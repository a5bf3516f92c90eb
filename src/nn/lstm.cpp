// LSTM: the fused single-step cell (gates i, f, g, o as torch.nn.LSTM) and the multi-layer layer that runs it,
// with the input projection of every time step done as one GEMM per layer.
#include <string>

#include "qkv/core/error.h"
#include "qkv/kernels/rnn_cells.h"
#include "qkv/nn/rnn.h"
#include "qkv/ops/matmul.h"
#include "rnn_common.h"

namespace qkv::nn {

LstmCellResult lstm_cell_step(const Tensor& gi_in, const Tensor& h_in, const Tensor& c_in, const Tensor& w_hh,
                              const Tensor& b_hh) {
  detail::check_cell("lstm_cell", 4, gi_in, h_in, w_hh, b_hh);
  QKV_CHECK_ARG(c_in.defined() && c_in.shape() == h_in.shape(), "[lstm_cell] c ",
                c_in.defined() ? str(c_in.shape()) : std::string("(undefined)"), " must match h ",
                str(h_in.shape()));
  const int64_t nb = h_in.size(0), hs = h_in.size(1);
  const Tensor c = c_in.contiguous();
  const Tensor gh = linear(h_in.contiguous(), w_hh, b_hh).contiguous();  // (B, 4H) packed i, f, g, o
  const Tensor gi = detail::unit_last_stride(gi_in);
  const int64_t gi_rs = detail::row_stride(gi);

  LstmCellResult res;
  for (Tensor* t : {&res.h, &res.c, &res.i, &res.f, &res.g, &res.o}) *t = Tensor::empty({nb, hs});
  kernels::lstm_cell_rows(nb, hs, gi.data(), gi_rs, gh.data(), c.data(), res.i.data(), res.f.data(), res.g.data(),
                          res.o.data(), res.c.data(), res.h.data());
  return res;
}

LstmCellResult lstm_cell(const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& w_ih,
                         const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh) {
  detail::check_cell_input("lstm_cell", 4, x, h, w_ih, b_ih);
  return lstm_cell_step(linear(x, w_ih, b_ih), h, c, w_hh, b_hh);
}

LSTM::LSTM(int64_t input_size, int64_t hidden_size, Rng& rng, const RnnOptions& options)
    : RnnBase("LSTM", 4, input_size, hidden_size, rng, options) {}

RnnOutput LSTM::forward(const Tensor& x, const Tensor& h0, const Tensor& c0,
                        const std::vector<int64_t>& lengths) const {
  const auto [nb, nt] = check_input(x, lengths);
  QKV_CHECK_ARG(h0.defined() == c0.defined(), "[LSTM] h0 and c0 must both be given or both be omitted");
  check_state(h0, "h0", nb);
  check_state(c0, "c0", nb);
  const bool bf = options_.batch_first;
  const int64_t time_axis = bf ? 1 : 0;
  const int64_t hs = hidden_size_;

  RnnOutput res;
  res.h_n = Tensor::empty({num_layers(), nb, hs});
  res.c_n = Tensor::empty({num_layers(), nb, hs});
  Tensor in = x;
  for (int64_t l = 0; l < num_layers(); ++l) {
    const Layer& p = layers_[static_cast<size_t>(l)];
    const Tensor gi = linear(in, p.w_ih, p.b_ih);  // every step's x·W_ihᵀ + b_ih in one GEMM
    Tensor out = bf ? Tensor::zeros({nb, nt, hs}) : Tensor::zeros({nt, nb, hs});
    Tensor h = h0.defined() ? h0.select(0, l).contiguous() : Tensor::zeros({nb, hs});
    Tensor c = c0.defined() ? c0.select(0, l).contiguous() : Tensor::zeros({nb, hs});
    for (int64_t t = 0; t < nt; ++t) {
      LstmCellResult step = lstm_cell_step(gi.select(time_axis, t), h, c, p.w_hh, p.b_hh);
      detail::freeze_finished_rows(step.h, h, lengths, t);
      detail::freeze_finished_rows(step.c, c, lengths, t);
      detail::write_output_step(out, bf, t, step.h, lengths);
      h = step.h;
      c = step.c;
    }
    res.h_n.select(0, l).copy_from(h);
    res.c_n.select(0, l).copy_from(c);
    in = out;
  }
  res.output = in;
  return res;
}

LSTM::State LSTM::step(const Tensor& x, const Tensor& h, const Tensor& c) const {
  QKV_CHECK_ARG(x.defined() && x.dim() == 2 && x.size(0) > 0 && x.size(1) == input_size_, "[LSTM] step x ",
                str(x.shape()), " must be a non-empty (B, E) with E = input_size ", input_size_);
  const int64_t nb = x.size(0);
  QKV_CHECK_ARG(h.defined() && c.defined(), "[LSTM] step h and c must be defined");
  check_state(h, "h", nb);
  check_state(c, "c", nb);
  State next{Tensor::empty({num_layers(), nb, hidden_size_}), Tensor::empty({num_layers(), nb, hidden_size_})};
  Tensor in = x;
  for (int64_t l = 0; l < num_layers(); ++l) {
    const Layer& p = layers_[static_cast<size_t>(l)];
    LstmCellResult r = lstm_cell_step(linear(in, p.w_ih, p.b_ih), h.select(0, l), c.select(0, l), p.w_hh, p.b_hh);
    next.h.select(0, l).copy_from(r.h);
    next.c.select(0, l).copy_from(r.c);
    in = r.h;
  }
  return next;
}

}  // namespace qkv::nn
