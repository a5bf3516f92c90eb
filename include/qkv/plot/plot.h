// Plots as PNG-ready images with no dependency: line charts (several series, legend, ticks, log axes, spread
// bands), grouped bar charts, labelled heatmaps, text in a 5x7 bitmap font, and panels composed into one figure.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/plot/image.h"
#include "qkv/core/tensor.h"

namespace qkv::plot {

using Rgb = std::array<uint8_t, 3>;

// The i-th colour of a 10-colour qualitative palette (matplotlib's tab10), cycling.
Rgb palette(int i);

// --- text -------------------------------------------------------------------------------------------------------
// Printable ASCII only; any other byte draws as '?'. scale >= 1 multiplies the 5x7 glyphs (advance 6·scale).
// (x, y) is the top-left corner; vertical text runs bottom-to-top with (x, y) its bottom-left corner.
void draw_text(Image& img, int x, int y, std::string_view text, int scale, Rgb color, bool vertical = false);
int text_width(std::string_view text, int scale);  // pixels along the baseline
int text_height(int scale);                         // 7·scale

// A short label for a tick value: up to `digits` significant digits, no trailing zeros, exponent form for very
// small or large magnitudes ("0.25", "1024", "1e-05").
std::string format_number(double v, int digits = 3);

// "Nice" tick values covering [lo, hi] (about `target` of them, steps of 1, 2, 5 x 10^k). lo <= hi, finite.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

// --- line charts ------------------------------------------------------------------------------------------------
struct Series {
  std::string label;              // legend entry; empty = no entry
  std::vector<double> x, y;       // same length; a non-finite y (or x) breaks the line there
  std::vector<double> spread;     // empty, or one half-width per point: a shaded band y ± spread
  std::optional<Rgb> color;       // default palette(index)
  bool markers = true;            // a small square at each point
  bool dashed = false;
};

struct LineChart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool log_x = false, log_y = false;      // base 10 scale; non-positive values are then skipped
  std::optional<double> x_min, x_max, y_min, y_max;  // default: the data range (y padded by 5%)
  std::vector<double> x_ticks;            // explicit tick positions (e.g. the d_k values); default automatic
  std::vector<std::string> x_tick_labels; // empty, or one label per x_ticks entry (categorical axes)
  int width = 760, height = 480;
  int text_scale = 2;                     // every label; the title one step larger when it fits
  // kAuto: the inside corner that hides the fewest points; kOutside: right of the plot area.
  enum class Legend { kAuto, kTopLeft, kTopRight, kBottomLeft, kBottomRight, kOutside } legend = Legend::kAuto;
};

// Throws std::invalid_argument "[plot] ..." when a series has x and y of different lengths, a spread of the wrong
// length, when no series has a drawable point, or the size is under 200 x 150.
Image render(const LineChart& chart);

// --- grouped bar charts -----------------------------------------------------------------------------------------
struct BarGroup {
  std::string label;                 // legend entry of this group (one colour)
  std::vector<double> values;        // one per category
  std::vector<double> errors;        // empty or one half-width per category (an error bar)
};

struct BarChart {
  std::string title, y_label;
  std::vector<std::string> categories;  // x-axis labels
  std::vector<BarGroup> groups;         // bars side by side within each category
  bool log_y = false;
  std::optional<double> y_min, y_max;   // default [0 (or the smallest value when log_y), max]
  bool value_labels = false;            // print each bar's value above it
  int width = 760, height = 480;
  int text_scale = 2;
};

// Throws std::invalid_argument "[plot] ..." on no categories / groups or a group with the wrong number of values.
Image render(const BarChart& chart);

// --- labelled heatmaps ------------------------------------------------------------------------------------------
struct Heatmap {
  Tensor values;                        // (R, C); rows drawn top to bottom
  std::string title, x_label, y_label;
  std::vector<std::string> row_labels;  // empty or R labels (left of each row)
  std::vector<std::string> col_labels;  // empty or C labels (above each column, written vertically)
  float vmin = 0.0f, vmax = 0.0f;       // colour range (viridis); vmax <= vmin means the data's min..max
  int cell_px = 16;                     // >= 1
  bool colorbar = true;
  int text_scale = 1;
};

// Throws std::invalid_argument "[plot] ..." when values is not 2-D and non-empty, or labels have the wrong count.
Image render(const Heatmap& heatmap);

// --- composition ------------------------------------------------------------------------------------------------
// Lays panels out `columns` per row on white with a gap, each row as tall as its tallest panel, under an optional
// title. Throws on no panels or columns < 1.
Image compose(const std::vector<Image>& panels, int columns, const std::string& title = "", int text_scale = 2);

}  // namespace qkv::plot
