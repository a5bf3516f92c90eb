// Elementwise arithmetic with numpy broadcasting, and the activations.
// Contiguous same-shape inputs take a flat loop; everything else walks broadcast strides row by row.
#include "qkv/ops/elementwise.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/core/parallel_for.h"
#include "qkv/kernels/activations.h"

namespace qkv {
namespace {

constexpr int64_t kParallelMin = int64_t{1} << 16;  // below this, threads cost more than they save

// Strides of `t` broadcast to `shape` (0 on expanded dims).
Shape broadcast_strides(const Tensor& t, const Shape& shape) { return t.expand(shape).strides(); }

// Walks `shape` row by row (all dims but the last) for two stride sets: f(row, inner, off_a, step_a, off_b, step_b).
// Rows run in parallel when `parallel`; f must then only write to row-private memory.
template <typename F>
void walk2(const Shape& shape, const Shape& sa, const Shape& sb, bool parallel, F f) {
  const size_t rank = shape.size();
  const int64_t inner = rank ? shape.back() : 1;
  const int64_t ia = rank ? sa.back() : 0, ib = rank ? sb.back() : 0;
  const size_t keep = rank ? rank - 1 : 0;
  const Shape outer(shape.begin(), shape.begin() + keep);
  const int64_t rows = inner ? shape_numel(shape) / inner : 0;
  if (rows == 0) return;
  std::vector<int64_t> off_a(static_cast<size_t>(rows)), off_b(static_cast<size_t>(rows));
  for_each_offset(outer, Shape(sa.begin(), sa.begin() + keep),
                  [&](int64_t i, int64_t off) { off_a[static_cast<size_t>(i)] = off; });
  for_each_offset(outer, Shape(sb.begin(), sb.begin() + keep),
                  [&](int64_t i, int64_t off) { off_b[static_cast<size_t>(i)] = off; });
  parallel_for(parallel, rows,
               [&](int64_t r) { f(r, inner, off_a[static_cast<size_t>(r)], ia, off_b[static_cast<size_t>(r)], ib); });
}

template <typename F>
Tensor binary(const Tensor& a, const Tensor& b, const char* op, F f) {
  QKV_CHECK_ARG(a.defined() && b.defined(), "[", op, "] undefined operand");
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
  Tensor out = Tensor::empty(shape);
  const int64_t n = out.numel();
  if (n == 0) return out;
  float* po = out.data();
  const float* pa = a.data();
  const float* pb = b.data();
  if (a.shape() == b.shape() && a.is_contiguous() && b.is_contiguous()) {
    parallel_for_simd(n >= kParallelMin, n, [&](int64_t i) { po[i] = f(pa[i], pb[i]); });
    return out;
  }
  if (b.numel() == 1 && a.shape() == shape && a.is_contiguous()) {
    const float s = pb[0];
    parallel_for_simd(n >= kParallelMin, n, [&](int64_t i) { po[i] = f(pa[i], s); });
    return out;
  }
  if (a.numel() == 1 && b.shape() == shape && b.is_contiguous()) {
    const float s = pa[0];
    parallel_for_simd(n >= kParallelMin, n, [&](int64_t i) { po[i] = f(s, pb[i]); });
    return out;
  }
  // General case: outer loop over all but the last dim, inner loop with the last-dim strides.
  walk2(shape, broadcast_strides(a, shape), broadcast_strides(b, shape), n >= kParallelMin,
        [&](int64_t r, int64_t inner, const int64_t oa, int64_t ia, const int64_t ob, int64_t ib) {
          const float* ra = pa + oa;
          const float* rb = pb + ob;
          float* ro = po + r * inner;
          for (int64_t j = 0; j < inner; ++j) ro[j] = f(ra[j * ia], rb[j * ib]);
        });
  return out;
}

template <typename F>
Tensor unary(const Tensor& x, const char* op, F f) {
  QKV_CHECK_ARG(x.defined(), "[", op, "] undefined input");
  Tensor out = Tensor::empty(x.shape());
  const int64_t n = out.numel();
  if (n == 0) return out;
  float* po = out.data();
  const float* px = x.data();
  if (x.is_contiguous()) {
    parallel_for_simd(n >= kParallelMin, n, [&](int64_t i) { po[i] = f(px[i]); });
  } else {
    for_each_offset(x.shape(), x.strides(), [&](int64_t i, int64_t off) { po[i] = f(px[off]); });
  }
  return out;
}

// sigmoid with exp of a non-positive argument only: no overflow for large |x|.
float stable_sigmoid(float v) {
  if (v >= 0.0f) return 1.0f / (1.0f + std::exp(-v));
  const float e = std::exp(v);
  return e / (1.0f + e);
}

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kSqrt2OverPi = 0.79788456080286535588f;

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return binary(a, b, "add", [](float x, float y) { return x + y; });
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary(a, b, "sub", [](float x, float y) { return x - y; });
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary(a, b, "mul", [](float x, float y) { return x * y; });
}
Tensor scale(const Tensor& a, float s) {
  return unary(a, "scale", [s](float x) { return x * s; });
}
Tensor add_scalar(const Tensor& a, float s) {
  return unary(a, "add_scalar", [s](float x) { return x + s; });
}

Tensor relu(const Tensor& x) {
  // NaN propagates, as in PyTorch.
  return unary(x, "relu", [](float v) { return v > 0.0f ? v : (v == v ? 0.0f : v); });
}

// Contiguous input runs the vectorised kernel (qkv/kernels/activations.h, |error| <= 2e-7 against float64); the
// scalar libm lambdas below are its reference and handle strided views.
Tensor gelu(const Tensor& x, GeluApprox approx) {
  if (x.defined() && x.is_contiguous()) {
    Tensor y = Tensor::empty(x.shape());
    kernels::gelu_forward(x.data(), y.data(), x.numel(), approx == GeluApprox::kTanh);
    return y;
  }
  return gelu_reference(x, approx);
}

Tensor gelu_reference(const Tensor& x, GeluApprox approx) {
  if (approx == GeluApprox::kTanh)
    return unary(x, "gelu", [](float v) {
      return 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
    });
  return unary(x, "gelu", [](float v) { return 0.5f * v * (1.0f + std::erf(v * kInvSqrt2)); });
}

void add_bias_gelu_(Tensor& x, const Tensor& bias_in, GeluApprox approx) {
  QKV_CHECK_ARG(x.defined() && x.dim() >= 1, "[add_bias_gelu] x must be defined with rank >= 1, got ",
                x.defined() ? str(x.shape()) : std::string("(undefined)"));
  QKV_CHECK_ARG(x.is_contiguous(), "[add_bias_gelu] x ", str(x.shape()), " must be contiguous (written in place)");
  const int64_t f = x.size(-1);
  if (bias_in.defined())
    QKV_CHECK_ARG(bias_in.shape() == Shape{f}, "[add_bias_gelu] bias ", str(bias_in.shape()), " must be (", f,
                  ") for x ", str(x.shape()));
  if (x.numel() == 0) return;
  const int64_t rows = x.numel() / f;
  // The bias may be a view of x's own storage: read it from a private copy.
  const Tensor bias = !bias_in.defined()           ? Tensor()
                      : bias_in.shares_storage(x) ? bias_in.clone()
                                                  : bias_in.contiguous();
  kernels::add_bias_gelu_rows(x.data(), bias.defined() ? bias.data() : nullptr, rows, f, approx == GeluApprox::kTanh);
}

Tensor tanh(const Tensor& x) {
  return unary(x, "tanh", [](float v) { return std::tanh(v); });
}

Tensor sigmoid(const Tensor& x) {
  return unary(x, "sigmoid", stable_sigmoid);
}

Tensor silu(const Tensor& x) {
  if (x.defined() && x.is_contiguous()) {
    Tensor y = Tensor::empty(x.shape());
    // Threaded in chunks of a multiple of every vector width: each element sees the same lanes and tail as in one
    // call, so the same bits.
    const int64_t n = x.numel(), chunk = int64_t{1} << 14;
    const float* px = x.data();
    float* py = y.data();
    parallel_for(n >= kParallelMin, (n + chunk - 1) / chunk, [&](int64_t c) {
      kernels::silu_forward(px + c * chunk, py + c * chunk, std::min(chunk, n - c * chunk));
    });
    return y;
  }
  return silu_reference(x);
}

Tensor silu_reference(const Tensor& x) {
  return unary(x, "silu", [](float v) { return v * stable_sigmoid(v); });
}

// --- backward halves ------------------------------------------------------------------------------------------

Tensor sum_to(const Tensor& g, const Shape& shape) {
  QKV_CHECK_ARG(g.defined(), "[sum_to] undefined gradient");
  QKV_CHECK_ARG(broadcastable_to(shape, g.shape()), "[sum_to] ", str(shape), " does not broadcast to ",
                str(g.shape()));
  if (shape == g.shape()) return g;
  // acc (shape) seen through broadcast strides of g's shape: several g elements land on one acc element.
  std::vector<double> acc(static_cast<size_t>(shape_numel(shape)), 0.0);
  const Shape acc_strides = Tensor::empty(shape).expand(g.shape()).strides();
  const float* pg = g.data();
  walk2(g.shape(), g.strides(), acc_strides, false,
        [&](int64_t, int64_t inner, int64_t og, int64_t ig, int64_t oa, int64_t ia) {
          for (int64_t j = 0; j < inner; ++j) acc[static_cast<size_t>(oa + j * ia)] += pg[og + j * ig];
        });
  Tensor out = Tensor::empty(shape);
  float* po = out.data();
  for (size_t i = 0; i < acc.size(); ++i) po[i] = static_cast<float>(acc[i]);
  return out;
}

namespace {

void check_dy_for(const Shape& a, const Shape& b, const Tensor& dy, const char* op) {
  QKV_CHECK_ARG(dy.defined(), "[", op, "] undefined gradient");
  const Shape s = broadcast_shapes(a, b, op);
  QKV_CHECK_ARG(dy.shape() == s, "[", op, "] dy ", str(dy.shape()), " must have the output shape ", str(s),
                " of ", str(a), " and ", str(b));
}

// dy and the saved tensor must have the same shape.
template <typename F>
Tensor grad_unary(const Tensor& saved, const Tensor& dy, const char* op, F f) {
  QKV_CHECK_ARG(saved.defined() && dy.defined(), "[", op, "] undefined input");
  QKV_CHECK_ARG(saved.shape() == dy.shape(), "[", op, "] dy ", str(dy.shape()), " must match ",
                str(saved.shape()));
  return binary(saved, dy, op, f);
}

}  // namespace

BinaryGrads add_backward(const Shape& a, const Shape& b, const Tensor& dy) {
  check_dy_for(a, b, dy, "add_backward");
  return {sum_to(dy, a), sum_to(dy, b)};
}

BinaryGrads sub_backward(const Shape& a, const Shape& b, const Tensor& dy) {
  check_dy_for(a, b, dy, "sub_backward");
  return {sum_to(dy, a), scale(sum_to(dy, b), -1.0f)};
}

BinaryGrads mul_backward(const Tensor& a, const Tensor& b, const Tensor& dy) {
  QKV_CHECK_ARG(a.defined() && b.defined(), "[mul_backward] undefined operand");
  check_dy_for(a.shape(), b.shape(), dy, "mul_backward");
  return {sum_to(mul(dy, b), a.shape()), sum_to(mul(dy, a), b.shape())};
}

Tensor relu_backward(const Tensor& x, const Tensor& dy) {
  return grad_unary(x, dy, "relu_backward", [](float v, float g) { return v > 0.0f ? g : 0.0f; });
}

Tensor gelu_backward(const Tensor& x, const Tensor& dy, GeluApprox approx) {
  if (x.defined() && dy.defined() && x.is_contiguous() && dy.is_contiguous() && x.shape() == dy.shape()) {
    Tensor dx = Tensor::empty(x.shape());
    kernels::gelu_backward(x.data(), dy.data(), dx.data(), x.numel(), approx == GeluApprox::kTanh);
    return dx;
  }
  return gelu_backward_reference(x, dy, approx);
}

Tensor gelu_backward_reference(const Tensor& x, const Tensor& dy, GeluApprox approx) {
  if (approx == GeluApprox::kTanh)
    return grad_unary(x, dy, "gelu_backward", [](float v, float g) {
      const float inner = kSqrt2OverPi * (v + 0.044715f * v * v * v);
      const float t = std::tanh(inner);
      const float d_inner = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
      return g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * d_inner);
    });
  return grad_unary(x, dy, "gelu_backward", [](float v, float g) {
    constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
    const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
    return g * (cdf + v * pdf);
  });
}

Tensor tanh_backward(const Tensor& y, const Tensor& dy) {
  return grad_unary(y, dy, "tanh_backward", [](float t, float g) { return g * (1.0f - t * t); });
}

Tensor sigmoid_backward(const Tensor& y, const Tensor& dy) {
  return grad_unary(y, dy, "sigmoid_backward", [](float s, float g) { return g * s * (1.0f - s); });
}

Tensor silu_backward(const Tensor& x, const Tensor& dy) {
  return grad_unary(x, dy, "silu_backward", [](float v, float g) {
    const float s = stable_sigmoid(v);
    return g * s * (1.0f + v * (1.0f - s));
  });
}

}  // namespace qkv
