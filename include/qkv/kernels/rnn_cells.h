// The fused gate math of the GRU and LSTM cells (torch.nn.GRU / LSTM gate order), a batch of rows at a time: a
// vectorised build (4 lanes, baseline ISA, no libm: the exp/tanh/sigmoid polynomials of the activation kernels,
// ~2 ulp; the vector lanes and the scalar tail do the same IEEE operations, so give identical bits) and a plain
// libm reference. There is no AVX2 build: GCC would contract its products into FMA and change the RNNs' bits.
#pragma once

#include <cstdint>

namespace qkv::kernels {

// GRU, for batch rows b < nb and j < hs (row b of xi at xi + b*xi_rs; of hh at hh + b*3*hs; of every other
// array at + b*hs):
//   xi: x·W_ihᵀ + b_ih (B, 3H: r, z, n)   hh: h·W_hhᵀ + b_hh (B, 3H)   hp: previous h (B, H)
//   r = σ(xi_r + hh_r)   z = σ(xi_z + hh_z)   n = tanh(xi_n + r·hh_n)   h' = (1 − z)·n + z·hp
// writes r, z, n, hn = hh_n (saved for the backward) and h_out = h'.
void gru_cell_rows(int64_t nb, int64_t hs, const float* xi, int64_t xi_rs, const float* hh, const float* hp,
                   float* r, float* z, float* n, float* hn, float* h_out);

// LSTM, same layout (xi, hh: (B, 4H) packed i, f, g, o; cp: previous c (B, H)):
//   i = σ(.), f = σ(.), g = tanh(.), o = σ(.) of xi + hh   c' = f·cp + i·g   h' = o·tanh(c')
// writes i, f, g, o, c_out = c' and h_out = h'.
void lstm_cell_rows(int64_t nb, int64_t hs, const float* xi, int64_t xi_rs, const float* hh, const float* cp,
                    float* i, float* f, float* g, float* o, float* c_out, float* h_out);

// The readable twin: scalar std::exp / std::tanh.
namespace reference {
void gru_cell_rows(int64_t nb, int64_t hs, const float* xi, int64_t xi_rs, const float* hh, const float* hp,
                   float* r, float* z, float* n, float* hn, float* h_out);
void lstm_cell_rows(int64_t nb, int64_t hs, const float* xi, int64_t xi_rs, const float* hh, const float* cp,
                    float* i, float* f, float* g, float* o, float* c_out, float* h_out);
}  // namespace reference

}  // namespace qkv::kernels
