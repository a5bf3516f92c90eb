// Private (not installed): fast float32 activation kernels for the tape (GELU forward/backward in erf and tanh
// forms, tanh, sigmoid),
// dispatched at run time to an AVX2+FMA build when the CPU has both. Contiguous arrays; OpenMP over chunks.
#pragma once

#include <cstdint>

namespace qkv::train::detail {

void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx);
// y = tanh(x) / sigmoid(x), ~2 ulp, no libm.
void tanh_forward(const float* x, float* y, int64_t n);
void sigmoid_forward(const float* x, float* y, int64_t n);

// The per-ISA kernels (act_kernels.cpp baseline, act_kernels_avx2.cpp).
namespace portable {
void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx);
void tanh_forward(const float* x, float* y, int64_t n);
void sigmoid_forward(const float* x, float* y, int64_t n);
}  // namespace portable
namespace avx2 {
void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx);
void tanh_forward(const float* x, float* y, int64_t n);
void sigmoid_forward(const float* x, float* y, int64_t n);
}  // namespace avx2

}  // namespace qkv::train::detail
