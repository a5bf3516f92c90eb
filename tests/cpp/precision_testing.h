// The helpers of the low-precision tests (precision_test.cpp, precision_int8_test.cpp): bit views, the bf16
// oracle by arithmetic in double, the paths this CPU runs, and the float64 product.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <vector>

#include "qkv/kernels/cpu.h"

namespace qkv::precision_testing {

using kernels::Isa;
inline uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// bf16 of x by arithmetic in double: the two neighbouring bf16 values, the nearer one, ties to the even mantissa;
// past the largest bf16 (by half an ulp or more) ±inf.
inline float bf16_oracle(float x) {
  if (std::isnan(x) || std::isinf(x)) return x;
  const uint32_t u = bits(x);
  const uint32_t lo_bits = u & 0xffff0000u;
  const double lo = from_bits(lo_bits);  // toward zero
  const int e = static_cast<int>((u >> 23) & 0xff);
  const double ulp = std::ldexp(1.0, (e == 0 ? 1 : e) - 127 - 7);
  const double hi = lo + (std::signbit(x) ? -ulp : ulp);
  const double dlo = std::fabs(double{x} - lo), dhi = std::fabs(hi - double{x});
  const bool take_hi = dhi < dlo || (dhi == dlo && ((lo_bits >> 16) & 1u) == 1u);
  if (!take_hi) return static_cast<float>(lo);
  if (std::fabs(hi) >= std::ldexp(1.0, 128)) return std::signbit(x) ? -INFINITY : INFINITY;
  return static_cast<float>(hi);  // exact: a bf16 value
}

inline std::vector<Isa> runnable_paths() {
  std::vector<Isa> out;
  for (Isa p : {Isa::kPortable, Isa::kAvx2})
    if (kernels::cpu_supports(p)) out.push_back(p);
  std::cout << "[ paths    ] lowp: ran portable" << (out.size() > 1 ? ",avx2" : "; not on this CPU: avx2") << "\n";
  return out;
}

inline bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }

// x (m, k) · w (n, k)ᵀ in float64, and sum |x||w| per row max (the fp32 accumulation slack's scale).
inline std::vector<double> product64(const std::vector<float>& x, const std::vector<float>& w, int64_t m, int64_t n,
                              int64_t k, double* abs_max = nullptr) {
  std::vector<double> c(static_cast<size_t>(m * n));
  double am = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, sa = 0;
      for (int64_t t = 0; t < k; ++t) {
        s += double{x[i * k + t]} * w[j * k + t];
        sa += std::fabs(double{x[i * k + t]} * w[j * k + t]);
      }
      c[i * n + j] = s;
      am = std::max(am, sa);
    }
  if (abs_max) *abs_max = am;
  return c;
}

}  // namespace qkv::precision_testing
