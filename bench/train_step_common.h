// Shared pieces of the training-step benchmark: process CPU time, medians and the one-line JSON report.
#pragma once

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace qkv::bench {

// CPU time of the whole process (all threads), in milliseconds.
inline double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// {"model": ..., "impl": "qkv", "step_ms": median wall, "min_ms": fastest wall, "cpu_ms": median CPU, "loss": ...}
inline double report(const char* model, const std::vector<double>& wall, const std::vector<double>& cpu, float loss) {
  const double med = median(wall);
  std::printf("{\"model\": \"%s\", \"impl\": \"qkv\", \"step_ms\": %.2f, \"min_ms\": %.2f, \"cpu_ms\": %.2f, "
              "\"loss\": %.4f}\n",
              model, med, wall.empty() ? 0.0 : *std::min_element(wall.begin(), wall.end()), median(cpu), loss);
  std::fflush(stdout);
  return med;
}

}  // namespace qkv::bench
