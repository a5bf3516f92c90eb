// Shared by the positional-encoding tests (positional_test.cpp, positional_rope_alibi_test.cpp): their named
// tolerances and two small helpers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

#include "ops_testing.h"
#include "qkv/core/tensor.h"

namespace qkv::testing::positional {

// float32 tables/rotations against float64 formulas evaluated here.
inline constexpr Tol kTableTol{1e-6, 1e-5};
// float32 attention paths that sum in different orders (ours vs qkv::attention).
inline constexpr Tol kPathTol{2e-6, 2e-5};
// Permutation test: "equal" below this, and "clearly different" means above kClearlyDifferent.
inline constexpr double kEquivTol = 1e-5;
inline constexpr double kClearlyDifferent = 1e-2;

inline constexpr float kInf = std::numeric_limits<float>::infinity();

inline std::vector<double> dvec(std::initializer_list<double> v) { return std::vector<double>(v); }

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  EXPECT_EQ(x.size(), y.size());
  double m = 0.0;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) m = std::max(m, std::fabs(double(x[i]) - double(y[i])));
  return m;
}

}  // namespace qkv::testing::positional
