// Text and number labels of the plots: UTF-8 text drawn with the 5x7 font of font.cpp (ASCII) or FreeType glyphs
// (every other script), its measured size, and compact number formatting for tick labels.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "draw.h"
#include "font.h"
#include "qkv/plot/plot.h"

namespace qkv::plot {
using draw::put;

namespace {

// The next code point of UTF-8 text at `i` and its byte length; an invalid or truncated sequence is one byte, cp 0.
std::pair<char32_t, size_t> next_code_point(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return {0, 1};
  if (n == 1) return {b, 1};
  char32_t cp = b & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c >> 6) != 0x2) return {0, 1};
    cp = (cp << 6) | (c & 0x3F);
  }
  static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0, 1};
  return {cp, n};
}

// One drawable unit of text: an ASCII bitmap glyph ('?' for what cannot be drawn) or a FreeType glyph.
struct TextUnit {
  char ascii = '?';
  bool raster = false;
  font::RasterGlyph glyph;
  int advance = 0;
};

std::vector<TextUnit> text_units(std::string_view text, int scale) {
  std::vector<TextUnit> units;
  for (size_t i = 0; i < text.size();) {
    const auto [cp, n] = next_code_point(text, i);
    i += n;
    TextUnit u;
    u.advance = font::kAdvance * scale;
    if (cp >= 0x20 && cp < 0x7F) {
      u.ascii = static_cast<char>(cp);
    } else if (cp >= 0x80 && font::raster_glyph(cp, (font::kGlyphHeight + 1) * scale, u.glyph)) {
      u.raster = true;  // CJK and other scripts: the system font, on the ASCII glyphs' baseline
      u.advance = std::max(u.glyph.advance, scale);
    }
    units.push_back(std::move(u));
  }
  return units;
}

}  // namespace

void draw_text(Image& img, int x, int y, std::string_view text, int scale, Rgb color, bool vertical) {
  scale = std::max(1, scale);
  int pen = 0;
  auto plot = [&](int u, int v) {  // u along the baseline, v down from the top of the line
    if (!vertical)
      put(img, x + u, y + v, color);
    else  // rotated 90 degrees counter-clockwise: baseline goes up, glyph tops face left
      put(img, x + v, y - u, color);
  };
  const int baseline = font::kGlyphHeight * scale;
  for (const TextUnit& t : text_units(text, scale)) {
    if (t.raster) {
      const font::RasterGlyph& g = t.glyph;
      for (int r = 0; r < g.height; ++r)
        for (int c = 0; c < g.width; ++c)
          if (g.coverage[static_cast<size_t>(r) * g.width + c] >= 128) plot(pen + g.left + c, baseline - g.top + r);
    } else {
      const uint8_t* g = font::glyph(t.ascii);
      for (int col = 0; col < font::kGlyphWidth; ++col)
        for (int row = 0; row < font::kGlyphHeight; ++row) {
          if (!((g[col] >> row) & 1)) continue;
          for (int a = 0; a < scale; ++a)
            for (int b = 0; b < scale; ++b) plot(pen + col * scale + a, row * scale + b);
        }
    }
    pen += t.advance;
  }
}

int text_width(std::string_view text, int scale) {
  scale = std::max(1, scale);
  const std::vector<TextUnit> units = text_units(text, scale);
  if (units.empty()) return 0;
  int w = 0;
  for (const TextUnit& t : units) w += t.advance;
  return units.back().raster ? w : w - scale;  // no blank column after the last ASCII glyph
}

int text_height(int scale) { return font::kGlyphHeight * std::max(1, scale); }

std::string format_number(double v, int digits) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  if (v == 0) return "0";
  char buf[64];
  const double a = std::abs(v);
  if (a >= 1e-3 && a < 1e6) {
    // Fixed notation with enough decimals for `digits` significant digits, trailing zeros removed.
    const int mag = static_cast<int>(std::floor(std::log10(a)));
    const int decimals = std::max(0, digits - 1 - mag);
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    std::string s = buf;
    if (s.find('.') != std::string::npos) {
      while (s.back() == '0') s.pop_back();
      if (s.back() == '.') s.pop_back();
    }
    return s;
  }
  std::snprintf(buf, sizeof buf, "%.*e", std::max(0, digits - 1), v);
  std::string s = buf;  // 1.50e-05 -> 1.5e-5
  const size_t e = s.find('e');
  std::string mant = s.substr(0, e), ex = s.substr(e + 1);
  if (mant.find('.') != std::string::npos) {
    while (mant.back() == '0') mant.pop_back();
    if (mant.back() == '.') mant.pop_back();
  }
  const bool neg = ex[0] == '-';
  size_t k = (ex[0] == '-' || ex[0] == '+') ? 1 : 0;
  while (k + 1 < ex.size() && ex[k] == '0') ++k;
  return mant + "e" + (neg ? "-" : "") + ex.substr(k);
}

}  // namespace qkv::plot
