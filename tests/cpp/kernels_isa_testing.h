// Helpers of the kernel-path tests (kernels_isa_test.cpp, norm_activation_kernels_test.cpp): random inputs, the
// float64-oracle closeness check with the tolerances those tests share, the paths this CPU runs, odd row widths.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "ops_testing.h"
#include "qkv/kernels/cpu.h"

namespace qkv::testing {

using kernels::Isa;


inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// max |a - ref| <= atol + rtol · max |ref| over all entries (NaN anywhere fails); Tol is ops_testing.h's.
// float output of double-accumulated statistics: a few float roundings
inline constexpr Tol kDoubleStats{1e-6, 1e-6};
// statistics accumulated in float over rows of up to ~300
inline constexpr Tol kFloatStats{1e-6, 2e-5};
// the no-libm exp/tanh/erf polynomials, ~2 ulp, plus float arithmetic
inline constexpr Tol kPolynomial{1e-6, 1e-6};

inline ::testing::AssertionResult Close(const std::vector<float>& a, const std::vector<double>& ref, Tol tol,
                                        const std::string& what) {
  if (a.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << a.size() << " vs " << ref.size();
  double mag = 0.0, err = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return ::testing::AssertionFailure() << what << "[" << i << "] is NaN";
    mag = std::max(mag, std::abs(ref[i]));
    const double e = std::abs(static_cast<double>(a[i]) - ref[i]);
    if (e > err) err = e, worst = i;
  }
  if (err <= tol.atol + tol.rtol * mag) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max error " << err << " at " << worst << " (" << a[worst]
                                       << " vs " << ref[worst] << ") > " << tol.atol << " + " << tol.rtol << " * "
                                       << mag;
}

// The paths of a kernel family that this CPU runs, by name; the rest are reported as not run.
inline std::vector<Isa> runnable(std::initializer_list<Isa> paths, const char* family) {
  std::vector<Isa> out;
  std::string ran, not_run;
  for (Isa p : paths) {
    if (kernels::cpu_supports(p)) {
      out.push_back(p);
      ran += std::string(ran.empty() ? "" : ",") + kernels::isa_name(p);
    } else {
      not_run += std::string(not_run.empty() ? "" : ",") + kernels::isa_name(p);
    }
  }
  std::cout << "[ paths    ] " << family << ": ran " << ran << (not_run.empty() ? "" : "; not on this CPU: ")
            << not_run << "\n";
  ::testing::Test::RecordProperty(std::string(family) + "_paths_run", ran);
  return out;
}

// Odd row lengths around the vector widths (4, 8, 16 lanes), and 1.
inline const std::vector<int64_t> kWidths{1, 3, 7, 8, 9, 17, 33, 257};

}  // namespace qkv::testing
