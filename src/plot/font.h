// A compact 5x7 bitmap font for printable ASCII (0x20..0x7E), used to label plots and heatmaps, and every other code
// point (CJK, accented Latin, ...) rasterised by FreeType from a system font when one is installed.
// Internal to src/plot: the public entry points are the text helpers in qkv/plot/plot.h.
#pragma once

#include <cstdint>
#include <vector>

namespace qkv::font {

inline constexpr int kGlyphWidth = 5;   // columns of a glyph
inline constexpr int kGlyphHeight = 7;  // rows of a glyph
inline constexpr int kAdvance = 6;      // columns from one glyph to the next (one blank column)

// The 5 column bytes of `c` (bit r = row r, top row = bit 0); '?' for characters outside 0x20..0x7E.
const uint8_t* glyph(char c);

// A glyph rasterised by FreeType: coverage 0..255, `width` x `height`, its top `top` pixels above the baseline and
// its left edge `left` pixels right of the pen; the pen then moves `advance` pixels.
struct RasterGlyph {
  int width = 0, height = 0, left = 0, top = 0, advance = 0;
  std::vector<uint8_t> coverage;
};

// Code point `cp` at `pixels` pixels per em from the first font found: $QKV_FONT, then Debian's WenQuanYi Micro Hei
// (fonts-wqy-microhei), WenQuanYi Zen Hei and Noto Sans CJK. False without FreeType, without a font, or when the
// font has no glyph for cp. Thread-safe; glyphs are cached.
bool raster_glyph(char32_t cp, int pixels, RasterGlyph& out);

}  // namespace qkv::font
