// AVX2+FMA build of the GELU, tanh and sigmoid loops in activations_impl.h (compiled with -mavx2 -mfma; called
// only when active_isa() allows AVX2, see activations.cpp).
#include "qkv/kernels/activations.h"

#define QKV_ACT_LANES 8
#include "activations_impl.h"

namespace qkv::kernels::avx2 {

void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx) {
  if (tanh_approx) gelu_tanh_fwd(x, y, n);
  else gelu_erf_fwd(x, y, n);
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx) {
  if (tanh_approx) gelu_tanh_bwd(x, dy, dx, n);
  else gelu_erf_bwd(x, dy, dx, n);
}

void tanh_forward(const float* x, float* y, int64_t n) { tanh_fwd(x, y, n); }
void sigmoid_forward(const float* x, float* y, int64_t n) { sigmoid_fwd(x, y, n); }
void silu_forward(const float* x, float* y, int64_t n) { silu_fwd(x, y, n); }

}  // namespace qkv::kernels::avx2
