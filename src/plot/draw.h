// Pixel primitives shared by the plot sources (plot.cpp draws charts, text.cpp draws labels): single pixels, alpha
// blending, filled and outlined rectangles, and thick or dashed lines. Internal to src/plot.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "qkv/plot/plot.h"

namespace qkv::plot::draw {

inline void put(Image& img, int x, int y, Rgb c) { img.set(x, y, c[0], c[1], c[2]); }

inline void blend(Image& img, int x, int y, Rgb c, float alpha) {
  if (x < 0 || y < 0 || x >= img.width || y >= img.height) return;
  uint8_t* p = &img.rgb[(static_cast<size_t>(y) * img.width + x) * 3];
  for (int k = 0; k < 3; ++k) p[k] = static_cast<uint8_t>(std::lround(p[k] * (1.0f - alpha) + c[k] * alpha));
}

inline void fill(Image& img, int x, int y, int w, int h, Rgb c) { img.fill_rect(x, y, w, h, c[0], c[1], c[2]); }

inline void hline(Image& img, int x0, int x1, int y, Rgb c) {
  for (int x = std::min(x0, x1); x <= std::max(x0, x1); ++x) put(img, x, y, c);
}
inline void vline(Image& img, int x, int y0, int y1, Rgb c) {
  for (int y = std::min(y0, y1); y <= std::max(y0, y1); ++y) put(img, x, y, c);
}
inline void rect_outline(Image& img, int x, int y, int w, int h, Rgb c) {
  hline(img, x, x + w - 1, y, c);
  hline(img, x, x + w - 1, y + h - 1, c);
  vline(img, x, y, y + h - 1, c);
  vline(img, x + w - 1, y, y + h - 1, c);
}

// Bresenham with a square pen of side `thick`; with `dashed` every other run of 8 pixels is skipped.
// `phase` carries the dash position across consecutive segments.
inline void line(Image& img, int x0, int y0, int x1, int y1, Rgb c, int thick, bool dashed, int* phase) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  int local = 0;
  int& ph = phase ? *phase : local;
  const int lo = -(thick - 1) / 2, hi = thick / 2;
  for (int guard = 0; guard < 100000; ++guard) {
    if (!dashed || (ph / 8) % 2 == 0)
      for (int a = lo; a <= hi; ++a)
        for (int b = lo; b <= hi; ++b) put(img, x0 + a, y0 + b, c);
    ++ph;
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) { err += dy; x0 += sx; }
    if (e2 <= dx) { err += dx; y0 += sy; }
  }
}

}  // namespace qkv::plot::draw
