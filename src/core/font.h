// A compact 5x7 bitmap font for printable ASCII (0x20..0x7E), used to label plots and heatmaps.
// Internal to src/core: the public entry points are the text helpers in qkv/core/plot.h.
#pragma once

#include <cstdint>

namespace qkv::font {

inline constexpr int kGlyphWidth = 5;   // columns of a glyph
inline constexpr int kGlyphHeight = 7;  // rows of a glyph
inline constexpr int kAdvance = 6;      // columns from one glyph to the next (one blank column)

// The 5 column bytes of `c` (bit r = row r, top row = bit 0); '?' for characters outside 0x20..0x7E.
const uint8_t* glyph(char c);

}  // namespace qkv::font
