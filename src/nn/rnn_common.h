// Private helpers shared by gru.cpp and lstm.cpp: vectorised gate activations, row views, length handling.
// Not installed; the public API is include/qkv/nn/rnn.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "qkv/core/tensor.h"

namespace qkv::nn::detail {

// Gate activations, written once as templates over float and a 4-lane vector (GCC/Clang vector extensions,
// plain SSE2 on x86-64, no -mavx2 needed) so the fused gate loops run 4 lanes at a time with no libm calls.
// Both instantiations do the same IEEE operations, so vector lanes and the scalar tail give identical bits.
using f32x4 = float __attribute__((vector_size(16)));
using i32x4 = int32_t __attribute__((vector_size(16)));

inline int32_t to_int(float x) { return static_cast<int32_t>(x); }
inline i32x4 to_int(f32x4 x) { return __builtin_convertvector(x, i32x4); }
inline int32_t bits_of(float x) { int32_t b; std::memcpy(&b, &x, sizeof b); return b; }
inline i32x4 bits_of(f32x4 x) { i32x4 b; std::memcpy(&b, &x, sizeof b); return b; }
inline float from_bits(int32_t b) { float x; std::memcpy(&x, &b, sizeof x); return x; }
inline f32x4 from_bits(i32x4 b) { f32x4 x; std::memcpy(&x, &b, sizeof x); return x; }

template <class T> T load(const float* p) { T v; std::memcpy(&v, p, sizeof v); return v; }
template <class T> void store(float* p, T v) { std::memcpy(p, &v, sizeof v); }
template <class T> T splat(float v) { return T{} + v; }

// Cephes-style exp: x = n·ln2 + r, |r| <= ln2/2, degree-6 polynomial, 2^n through the exponent bits.
// Relative error ~1 ulp (8e-8 measured); x clamped to [-87.3, 88.3] so nothing overflows or goes subnormal;
// ±inf saturate, NaN propagates.
template <class T> T exp_fast(T x) {
  x = x < -87.3f ? splat<T>(-87.3f) : x;
  x = x > 88.3f ? splat<T>(88.3f) : x;
  const float shifter = 12582912.0f;  // 1.5·2^23: adding it rounds to the nearest integer
  const T n = (x * 1.44269504088896341f + shifter) - shifter;
  const T r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  T p = splat<T>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const T n_int = n == n ? n : splat<T>(0.0f);  // NaN x: keep the float->int conversion defined; r carries the NaN
  return (p * r * r + r + 1.0f) * from_bits((to_int(n_int) + 127) << 23);
}

// σ(x) = 1 / (1 + e^−x): no cancellation anywhere; absolute error ~1e-7.
template <class T> T sigmoid_fast(T x) { return 1.0f / (1.0f + exp_fast<T>(-x)); }

// tanh: Cephes odd polynomial for |x| < 0.625 (keeps relative accuracy near 0), else
// sign(x)·(1 − 2/(e^{2|x|} + 1)). Relative error ~2 ulp (1.3e-7 measured).
template <class T> T tanh_fast(T x) {
  const T ax = from_bits(bits_of(x) & 0x7fffffff);
  const T z = x * x;
  const T small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                    1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
  const T mag = 1.0f - 2.0f / (exp_fast<T>(2.0f * ax) + 1.0f);
  const T big = from_bits(bits_of(mag) | (bits_of(x) & INT32_MIN));
  return ax < 0.625f ? small : big;
}

// Runs body.template operator()<T>(j) for j = 0, 4, 8, ... with T = f32x4, then the tail with T = float.
template <class Body> void for_lanes(int64_t n, Body&& body) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) body.template operator()<f32x4>(j);
  for (; j < n; ++j) body.template operator()<float>(j);
}

// A (rows, cols) matrix whose last dim is unit-stride: `t` itself, or a contiguous copy.
inline Tensor unit_last_stride(const Tensor& t) {
  return (t.size(-1) <= 1 || t.stride(-1) == 1) ? t : t.contiguous();
}

// Row stride (in elements) of a rank-2 tensor with unit last stride.
inline int64_t row_stride(const Tensor& t) { return t.size(0) <= 1 ? t.size(1) : t.stride(0); }

// Checks the cell-step operands; `op` names the caller ("[gru_cell]").
void check_cell(const char* op, int64_t gates, const Tensor& gi, const Tensor& h, const Tensor& w_hh,
                const Tensor& b_hh);

// Checks the operands of a full cell (x with its own input projection).
void check_cell_input(const char* op, int64_t gates, const Tensor& x, const Tensor& h, const Tensor& w_ih,
                      const Tensor& b_ih);

// For time step t: which batch rows are still inside their sequence.
inline bool row_active(const std::vector<int64_t>& lengths, int64_t b, int64_t t) {
  return lengths.empty() || t < lengths[static_cast<size_t>(b)];
}

// Rows b past their length at step t keep their old state: next[b] = prev[b]. Both contiguous (B, H).
void freeze_finished_rows(Tensor& next, const Tensor& prev, const std::vector<int64_t>& lengths, int64_t t);

// Copies h (B, H, contiguous) into step t of a zero-initialised contiguous layer output, (B, T, H) when
// batch_first else (T, B, H); rows past their length stay 0.
void write_output_step(Tensor& out, bool batch_first, int64_t t, const Tensor& h,
                       const std::vector<int64_t>& lengths);

}  // namespace qkv::nn::detail
