// Rows over the OpenMP team, or on the calling thread without a parallel region.
#pragma once

#include <cstdint>

namespace qkv {

// body(i) for i in [0, n): over the OpenMP team with a static schedule when `parallel`, else on the calling thread
// without entering a parallel region. `#pragma omp parallel for if (false)` still sets up a team of one, which a
// decoding step's one-row norms, rotations, adds and copies would pay about eight times a layer.
template <typename F>
void parallel_for(bool parallel, int64_t n, F&& body) {
  if (!parallel) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

// The same over elements, each loop an `omp simd` one (elementwise ops).
template <typename F>
void parallel_for_simd(bool parallel, int64_t n, F&& body) {
  if (!parallel) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace qkv
