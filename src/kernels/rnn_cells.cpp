// The plain libm reference of the GRU/LSTM gate math (the vectorised build is in activations.cpp, beside the
// activation loops whose polynomials it shares).
#include "qkv/kernels/rnn_cells.h"

#include <cmath>

namespace qkv::kernels::reference {
namespace {
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

void gru_cell_rows(int64_t nb, int64_t hs, const float* xi, int64_t xi_rs, const float* hh, const float* hp,
                   float* r, float* z, float* n, float* hn, float* h_out) {
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = xi + b * xi_rs;
    const float* h = hh + b * 3 * hs;
    for (int64_t j = 0; j < hs; ++j) {
      const int64_t k = b * hs + j;
      r[k] = sigmoid(x[j] + h[j]);
      z[k] = sigmoid(x[hs + j] + h[hs + j]);
      hn[k] = h[2 * hs + j];
      n[k] = std::tanh(x[2 * hs + j] + r[k] * hn[k]);
      h_out[k] = (1.0f - z[k]) * n[k] + z[k] * hp[k];
    }
  }
}

void lstm_cell_rows(int64_t nb, int64_t hs, const float* xi, int64_t xi_rs, const float* hh, const float* cp,
                    float* i, float* f, float* g, float* o, float* c_out, float* h_out) {
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = xi + b * xi_rs;
    const float* h = hh + b * 4 * hs;
    for (int64_t j = 0; j < hs; ++j) {
      const int64_t k = b * hs + j;
      i[k] = sigmoid(x[j] + h[j]);
      f[k] = sigmoid(x[hs + j] + h[hs + j]);
      g[k] = std::tanh(x[2 * hs + j] + h[2 * hs + j]);
      o[k] = sigmoid(x[3 * hs + j] + h[3 * hs + j]);
      c_out[k] = f[k] * cp[k] + i[k] * g[k];
      h_out[k] = o[k] * std::tanh(c_out[k]);
    }
  }
}

}  // namespace qkv::kernels::reference
