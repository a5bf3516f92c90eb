// Private (not installed): the ISA-free driver of the packed products' tiles (qkv/kernels/lowp.h), shared by the
// AVX-512 builds (lowp_avx512.cpp) and the AVX-VNNI one (lowp_avxvnni.cpp): the per-thread scratch for the packed
// activation rows and the walk over panels and row tiles, with views that start inside a panel. It holds no vector
// code and nothing inline from the standard library (each unit that includes it gets its own internal copy).
#pragma once

#include <cstdint>
#include <cstdlib>

#include "qkv/kernels/lowp.h"

namespace qkv::kernels::detail {
namespace {

// Rows of c per packed activation tile: the activations are packed as [group][kPackedRows] words per tile.
constexpr int64_t kPackedRows = 14;

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max64(int64_t a, int64_t b) { return a < b ? b : a; }

// A per-thread scratch buffer for the packed activation rows, grown with malloc, freed when its thread ends (a
// thread of the caller's, not only OpenMP's, may run the products).
struct Scratch {
  uint32_t* p = nullptr;
  int64_t size = 0;
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(p); }
  uint32_t* get(int64_t words) {
    if (words > size) {
      std::free(p);
      p = static_cast<uint32_t*>(std::malloc(static_cast<size_t>(words) * sizeof(uint32_t)));
      size = p ? words : 0;
      if (!p) std::abort();  // inside a parallel region nothing may throw; a few KB that cannot be had
    }
    return p;
  }
};
thread_local Scratch packed_scratch;

// Rows [m0, m1) of c over the view's columns [n0, n1): pack the activation rows (kPackedRows at a time), then for
// each panel every row tile.
//   pack_a(r0, rows, dst): rows [r0, r0 + rows) as [group][kPackedRows] words at dst;
//   make_out(p, r0, bias): the epilogue of the tile at panel p (counted from the view's first panel) and row r0,
//     with `bias` at the panel's lane 0 or null;
//   tile(rows, groups, a, b, c, ldc, out, lanes): rows × 32 columns of c (row stride ldc) from the packed tile a
//     and the panel b, storing only lanes [0, lanes) of each row (lanes in [1, 32]).
// A view that starts inside a panel runs that panel's tiles into a buffer, all 32 lanes, without bias, and adds
// the bias while copying the lanes out (the same float addition as the tile's epilogue).
template <class Tile, class PackA, class MakeOut>
void run_packed_block(const PackedBView& w, const float* bias, float* c, int64_t ldc, int64_t m0, int64_t m1,
                      int64_t n0, int64_t n1, Tile tile, PackA pack_a, MakeOut make_out) {
  if (m0 >= m1 || n0 >= n1) return;
  constexpr int64_t kMR = kPackedRows;
  const int64_t groups = w.groups, tiles = (m1 - m0 + kMR - 1) / kMR;
  uint32_t* pa = packed_scratch.get(tiles * groups * kMR);
  for (int64_t t = 0; t < tiles; ++t) pack_a(m0 + t * kMR, min64(kMR, m1 - m0 - t * kMR), pa + t * groups * kMR);
  // View column j is lane col0 + j of the panels counted from w.data.
  const int64_t l_begin = w.col0 + n0, l_end = w.col0 + n1;
  alignas(64) float edge[kMR * kPanel];
  for (int64_t p = l_begin / kPanel; p * kPanel < l_end; ++p) {
    const int64_t lo = max64(l_begin, p * kPanel) - p * kPanel, hi = min64(l_end, (p + 1) * kPanel) - p * kPanel;
    const int64_t j0 = p * kPanel - w.col0;  // the view column of the panel's lane 0 (< 0 only when lo > 0)
    const uint32_t* b = w.data + p * groups * kPanel;
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t r0 = m0 + t * kMR, rows = min64(kMR, m1 - r0);
      if (lo == 0) {
        tile(rows, groups, pa + t * groups * kMR, b, c + r0 * ldc + j0, ldc,
             make_out(p, r0, bias ? bias + j0 : nullptr), hi);
      } else {  // a view that starts inside this panel: all 32 lanes into a buffer, then lanes [lo, hi) + bias
        tile(rows, groups, pa + t * groups * kMR, b, edge, kPanel, make_out(p, r0, nullptr), kPanel);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t l = lo; l < hi; ++l) {
            const float v = edge[r * kPanel + l];
            c[(r0 + r) * ldc + j0 + l] = bias ? v + bias[j0 + l] : v;
          }
      }
    }
  }
}

}  // namespace
}  // namespace qkv::kernels::detail
