// Vectorised float32 activation kernels (GELU forward/backward in erf and tanh forms, the bias + GELU epilogue,
// tanh, sigmoid, SiLU) used by the ops and the tape; dispatched at run time to an AVX2+FMA build when active_isa() allows
// it (qkv/kernels/cpu.h). Contiguous arrays (n elements); OpenMP over chunks. The references are the libm formulas
// in ops (gelu_reference, ...).
#pragma once

#include <cstdint>

namespace qkv::kernels {

void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx);
// The bias + GELU epilogue of a linear layer, in place: x (rows, f) contiguous, bias (f) or null;
//   x = gelu(x + bias). Blocks of rows (~16K elements) over OpenMP threads. Its reference: ops add then gelu.
void add_bias_gelu_rows(float* x, const float* bias, int64_t rows, int64_t f, bool tanh_approx);
// y = tanh(x) / sigmoid(x) / x·sigmoid(x) (SiLU), ~2 ulp, no libm.
void tanh_forward(const float* x, float* y, int64_t n);
void sigmoid_forward(const float* x, float* y, int64_t n);
void silu_forward(const float* x, float* y, int64_t n);

// The per-ISA kernels (activations.cpp baseline, activations_avx2.cpp).
namespace portable {
void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx);
void tanh_forward(const float* x, float* y, int64_t n);
void sigmoid_forward(const float* x, float* y, int64_t n);
void silu_forward(const float* x, float* y, int64_t n);
}  // namespace portable
namespace avx2 {
void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx);
void tanh_forward(const float* x, float* y, int64_t n);
void sigmoid_forward(const float* x, float* y, int64_t n);
void silu_forward(const float* x, float* y, int64_t n);
}  // namespace avx2

}  // namespace qkv::kernels
