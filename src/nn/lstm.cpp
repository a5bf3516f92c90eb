// LSTM: the fused single-step cell (gates i, f, g, o as torch.nn.LSTM) and the multi-layer layer that runs it,
// the layer forward through time is RnnBase::forward_any (rnn_common.cpp).
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
  const RnnVars r = forward(Context(), x, h0, c0, lengths);
  return {r.output.value, r.h_n.value, r.c_n.value};
}

LSTM::State LSTM::step(const Tensor& x, const Tensor& h, const Tensor& c) const {
  const RnnVars r = step_any(Context(), x, h, c);
  return {r.h_n.value, r.c_n.value};
}

}  // namespace qkv::nn
