// Shared helpers for the op tests: seeded random tensors, float64 views of tensors, scaled tolerances,
// "throws invalid_argument naming the op" checks and central finite differences in double precision.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"

namespace qkv::testing {

// |actual - ref| <= atol + rtol * scale, where scale is |ref| or a caller-given magnitude.
struct Tol {
  double atol;
  double rtol;
};
// Float32 math against a float64 oracle.
inline constexpr Tol kFloatVsDouble{1e-6, 1e-5};
// Bit-for-bit copies (views, concat, embedding).
inline constexpr Tol kExact{0.0, 0.0};
// Analytic float32 gradient against central finite differences of a float64 twin; used with grad_scale below.
inline constexpr Tol kGradVsFiniteDiff{1e-6, 1e-5};

inline Tensor randn(const Shape& shape, uint64_t seed, float stddev = 1.0f) {
  Rng rng(seed);
  return rng.normal(shape, 0.0f, stddev);
}

// max |a - b| over the entries.
inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(a[i] - b[i]));
  return e;
}

inline std::vector<double> to_double(const Tensor& t) {
  const std::vector<float> v = t.to_vector();
  return std::vector<double>(v.begin(), v.end());
}

// Compares `actual` (any strides) elementwise with row-major `ref`. `scale` (optional, same length) replaces
// |ref| as the magnitude, e.g. sum |a_ik * b_kj| for a dot product, where cancellation makes |ref| meaningless.
inline ::testing::AssertionResult AllClose(const Tensor& actual, const std::vector<double>& ref, Tol tol,
                                           const std::vector<double>& scale = {}) {
  const std::vector<float> a = actual.to_vector();
  if (a.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << a.size() << " vs reference " << ref.size();
  size_t bad = 0, first = a.size();
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double mag = scale.empty() ? std::fabs(ref[i]) : scale[i];
    const double err = std::fabs(static_cast<double>(a[i]) - ref[i]);
    const bool same_special = (std::isnan(a[i]) && std::isnan(ref[i])) ||
                              (std::isinf(a[i]) && a[i] == ref[i]);
    if (same_special) continue;
    const double allowed = tol.atol + tol.rtol * mag;
    if (!(err <= allowed)) {
      if (first == a.size()) first = i;
      ++bad;
      worst = std::max(worst, std::isnan(err) ? INFINITY : err / std::max(allowed, 1e-300));
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << a.size() << " elements differ; first at flat "
                                       << first << ": " << a[first] << " vs " << ref[first]
                                       << "; worst err/allowed " << worst;
}

inline ::testing::AssertionResult AllClose(const Tensor& actual, const Tensor& ref, Tol tol) {
  if (actual.shape() != ref.shape())
    return ::testing::AssertionFailure() << "shape " << str(actual.shape()) << " vs " << str(ref.shape());
  return AllClose(actual, to_double(ref), tol);
}

// Runs f, expects std::invalid_argument whose message contains `needle` (e.g. "[matmul]").
template <typename F>
::testing::AssertionResult ThrowsArg(F&& f, const std::string& needle) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message \"" << e.what() << "\" lacks \"" << needle << "\"";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw another exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// Magnitudes for comparing gradients: |g_i| plus the mean |g|, because backward formulas subtract sums
// (softmax, layer_norm) and a near-zero entry carries the rounding of the whole row.
inline std::vector<double> grad_scale(const std::vector<double>& g) {
  double mean_abs = 0.0;
  for (double v : g) mean_abs += std::fabs(v);
  mean_abs /= std::max<size_t>(g.size(), 1);
  std::vector<double> s(g.size());
  for (size_t i = 0; i < g.size(); ++i) s[i] = std::fabs(g[i]) + mean_abs;
  return s;
}

// Row-major copy of v (shape `from`) broadcast to `to`, in double.
inline std::vector<double> expand_d(const std::vector<double>& v, const Shape& from, const Shape& to) {
  const Shape strides = Tensor::empty(from).expand(to).strides();
  std::vector<double> out(static_cast<size_t>(shape_numel(to)));
  for_each_offset(to, strides, [&](int64_t i, int64_t off) { out[static_cast<size_t>(i)] = v[off]; });
  return out;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// d(loss)/d(x[i]) by central differences, loss evaluated in double: (L(x+h) - L(x-h)) / 2h.
inline std::vector<double> finite_diff(const std::function<double(const std::vector<double>&)>& loss,
                                       std::vector<double> x, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double lp = loss(x);
    x[i] = keep - h;
    const double lm = loss(x);
    x[i] = keep;
    g[i] = (lp - lm) / (2.0 * h);
  }
  return g;
}

// Checks an analytic gradient `dx` of L(x) = sum(forward(x) * r) against finite differences of the float64
// `forward`, evaluated at x's values.
inline ::testing::AssertionResult GradMatches(
    const Tensor& dx, const std::function<std::vector<double>(const std::vector<double>&)>& forward,
    const Tensor& x, const std::vector<double>& r) {
  const std::vector<double> fd =
      finite_diff([&](const std::vector<double>& xv) { return dot(forward(xv), r); }, to_double(x));
  if (dx.shape() != x.shape())
    return ::testing::AssertionFailure() << "gradient shape " << str(dx.shape()) << " vs " << str(x.shape());
  return AllClose(dx, fd, kGradVsFiniteDiff, grad_scale(fd));
}

}  // namespace qkv::testing
