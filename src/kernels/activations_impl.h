// Private (not installed): branch-free float32 GELU forward/backward, tanh, sigmoid, SiLU and RNN gate loops written
// once over GCC/Clang vector extensions and plain float (the tail), included by activations.cpp (baseline ISA,
// 4 lanes) and activations_avx2.cpp (-mavx2 -mfma, 8 lanes: define QKV_ACT_LANES 8 first; GCC contracts a*b+c
// into FMA there, so the two builds differ in the last bits). Each defines QKV_ACT_BUILD (portable, avx2) first: the
// namespace of its entry points, written once at the end.
// erf is Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), the formula PyTorch's vectorised CPU GELU uses;
// exp is a Cephes-style polynomial (~1 ulp). No libm calls.
#include <cstdint>
#include <cstring>

namespace {

#ifndef QKV_ACT_LANES
#define QKV_ACT_LANES 4
#endif
constexpr int kLanes = QKV_ACT_LANES;
using vfloat = float __attribute__((vector_size(4 * QKV_ACT_LANES)));  // kLanes floats
using vint = int32_t __attribute__((vector_size(4 * QKV_ACT_LANES)));

inline int32_t to_int(float x) { return static_cast<int32_t>(x); }
inline vint to_int(vfloat x) { return __builtin_convertvector(x, vint); }
inline int32_t bits_of(float x) { int32_t b; std::memcpy(&b, &x, sizeof b); return b; }
inline vint bits_of(vfloat x) { vint b; std::memcpy(&b, &x, sizeof b); return b; }
inline float from_bits(int32_t b) { float x; std::memcpy(&x, &b, sizeof x); return x; }
inline vfloat from_bits(vint b) { vfloat x; std::memcpy(&x, &b, sizeof x); return x; }
template <class T> T load(const float* p) { T v; std::memcpy(&v, p, sizeof v); return v; }
template <class T> void store(float* p, T v) { std::memcpy(p, &v, sizeof v); }
template <class T> T splat(float v) { return T{} + v; }

template <class T> T fabs_(T x) { return from_bits(bits_of(x) & 0x7fffffff); }
template <class T> T copysign_(T mag, T sign) { return from_bits(bits_of(mag) | (bits_of(sign) & INT32_MIN)); }

template <class T> T exp_poly(T x) {
  x = x < -87.3f ? splat<T>(-87.3f) : x;
  x = x > 88.3f ? splat<T>(88.3f) : x;
  const float shifter = 12582912.0f;  // 1.5·2^23: rounds to the nearest integer
  const T n = (x * 1.44269504088896341f + shifter) - shifter;
  const T r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  T p = splat<T>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const T n_int = n == n ? n : splat<T>(0.0f);  // NaN x: keep the conversion defined; r carries the NaN
  return (p * r * r + r + 1.0f) * from_bits((to_int(n_int) + 127) << 23);
}

// erf(z) given e = exp(-z²) (shared with the GELU density).
template <class T> T erf_with_exp(T z, T e) {
  const T t = 1.0f / (0.3275911f * fabs_(z) + 1.0f);
  const T r = (((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f;
  return copysign_(1.0f - r * t * e, z);
}

// tanh: Cephes' odd polynomial for |u| < 0.625 (relative accuracy near 0), else sign(u)·(1 - 2/(exp(2|u|) + 1));
// ~2 ulp.
template <class T> T tanh_poly(T u) {
  const T a = fabs_(u);
  const T z = u * u;
  const T small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                    1.33314422036e-1f) * z - 3.33332819422e-1f) * z * u + u;
  const T big = copysign_(1.0f - 2.0f / (exp_poly<T>(2.0f * a) + 1.0f), u);
  return a < 0.625f ? small : big;
}

// σ(u) = 1 / (1 + exp(-u))
template <class T> T sigmoid_poly(T u) { return 1.0f / (1.0f + exp_poly<T>(-u)); }

constexpr float kSqrt1_2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1/sqrt(2π)
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kCoeff = 0.044715f;

// Runs body.template operator()<T>(i) for i = 0, kLanes, 2·kLanes, ... with T = vfloat, then the tail with T = float.
template <class Body> void for_lanes(int64_t n, Body&& body) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) body.template operator()<vfloat>(i);
  for (; i < n; ++i) body.template operator()<float>(i);
}

// y = x·Φ(x), Φ(x) = (1 + erf(x/√2)) / 2
void gelu_erf_fwd(const float* x, float* y, int64_t n) {
  for_lanes(n, [&]<class T>(int64_t i) {
    const T v = load<T>(x + i);
    const T e = exp_poly<T>(-0.5f * v * v);
    store(y + i, 0.5f * v * (1.0f + erf_with_exp<T>(v * kSqrt1_2, e)));
  });
}

// dx = dy·(Φ(x) + x·φ(x)), φ(x) = exp(-x²/2)/√(2π)
void gelu_erf_bwd(const float* x, const float* dy, float* dx, int64_t n) {
  for_lanes(n, [&]<class T>(int64_t i) {
    const T v = load<T>(x + i);
    const T e = exp_poly<T>(-0.5f * v * v);
    const T cdf = 0.5f * (1.0f + erf_with_exp<T>(v * kSqrt1_2, e));
    store(dx + i, load<T>(dy + i) * (cdf + v * e * kInvSqrt2Pi));
  });
}

// y = x/2·(1 + tanh(√(2/π)(x + 0.044715x³)))
void gelu_tanh_fwd(const float* x, float* y, int64_t n) {
  for_lanes(n, [&]<class T>(int64_t i) {
    const T v = load<T>(x + i);
    const T t = tanh_poly<T>(kSqrt2OverPi * (v + kCoeff * v * v * v));
    store(y + i, 0.5f * v * (1.0f + t));
  });
}

void gelu_tanh_bwd(const float* x, const float* dy, float* dx, int64_t n) {
  for_lanes(n, [&]<class T>(int64_t i) {
    const T v = load<T>(x + i);
    const T t = tanh_poly<T>(kSqrt2OverPi * (v + kCoeff * v * v * v));
    const T dinner = kSqrt2OverPi * (1.0f + 3.0f * kCoeff * v * v);
    store(dx + i, load<T>(dy + i) * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner));
  });
}

void tanh_fwd(const float* x, float* y, int64_t n) {
  for_lanes(n, [&]<class T>(int64_t i) { store(y + i, tanh_poly<T>(load<T>(x + i))); });
}

void sigmoid_fwd(const float* x, float* y, int64_t n) {
  for_lanes(n, [&]<class T>(int64_t i) { store(y + i, sigmoid_poly<T>(load<T>(x + i))); });
}

// y = x·σ(x). Below -88 σ underflows (the clamped exp would leave ~5e-39): x·0 there, so -inf gives NaN as in the
// reference and in PyTorch.
void silu_fwd(const float* x, float* y, int64_t n) {
  for_lanes(n, [&]<class T>(int64_t i) {
    const T v = load<T>(x + i);
    store(y + i, v < -88.0f ? v * 0.0f : v * sigmoid_poly<T>(v));
  });
}

// GRU gates of one batch row (qkv/kernels/rnn_cells.h; only the 4-lane build uses them):
// r, z, n, hn = hh_n, out = (1 - z)·n + z·hp.
inline void gru_row(int64_t hs, const float* xi, const float* hh, const float* hp, float* r, float* z, float* n,
                    float* hn, float* out) {
  for_lanes(hs, [&]<class T>(int64_t j) {
    const T rv = sigmoid_poly<T>(load<T>(xi + j) + load<T>(hh + j));
    const T zv = sigmoid_poly<T>(load<T>(xi + hs + j) + load<T>(hh + hs + j));
    const T hnv = load<T>(hh + 2 * hs + j);
    const T nv = tanh_poly<T>(load<T>(xi + 2 * hs + j) + rv * hnv);
    store(r + j, rv);
    store(z + j, zv);
    store(hn + j, hnv);
    store(n + j, nv);
    store(out + j, (1.0f - zv) * nv + zv * load<T>(hp + j));
  });
}

// LSTM gates of one batch row: i, f, g, o, c' = f·cp + i·g, h' = o·tanh(c').
inline void lstm_row(int64_t hs, const float* xi, const float* hh, const float* cp, float* ig, float* fg,
                     float* gg, float* og, float* cn, float* hn) {
  for_lanes(hs, [&]<class T>(int64_t j) {
    const T iv = sigmoid_poly<T>(load<T>(xi + j) + load<T>(hh + j));
    const T fv = sigmoid_poly<T>(load<T>(xi + hs + j) + load<T>(hh + hs + j));
    const T gv = tanh_poly<T>(load<T>(xi + 2 * hs + j) + load<T>(hh + 2 * hs + j));
    const T ov = sigmoid_poly<T>(load<T>(xi + 3 * hs + j) + load<T>(hh + 3 * hs + j));
    const T cv = fv * load<T>(cp + j) + iv * gv;
    store(ig + j, iv);
    store(fg + j, fv);
    store(gg + j, gv);
    store(og + j, ov);
    store(cn + j, cv);
    store(hn + j, ov * tanh_poly<T>(cv));
  });
}

}  // namespace

// The entry points of the build that includes this file (qkv/kernels/activations.h), in namespace QKV_ACT_BUILD.
namespace qkv::kernels::QKV_ACT_BUILD {

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

}  // namespace qkv::kernels::QKV_ACT_BUILD
