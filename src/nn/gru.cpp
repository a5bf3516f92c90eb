// GRU: the fused single-step cell (gates r, z, n as torch.nn.GRU) and the multi-layer layer that runs it,
// the layer forward through time is RnnBase::forward_any (rnn_common.cpp).
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
  const RnnVars r = forward(Context(), x, h0, lengths);
  return {r.output.value, r.h_n.value, {}};
}

}  // namespace qkv::nn
