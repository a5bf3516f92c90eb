// Line charts, bar charts, labelled heatmaps and panel composition drawn straight into an RGB Image, with the
// labels of text.cpp and the pixels of draw.h. Layout is computed from the text sizes so that nothing overlaps.
#include "qkv/plot/plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "draw.h"
#include "qkv/core/error.h"

namespace qkv::plot {
namespace {

using namespace draw;

constexpr Rgb kBlack{0, 0, 0};
constexpr Rgb kAxis{60, 60, 60};
constexpr Rgb kGrid{225, 225, 225};
constexpr Rgb kTitle{20, 20, 20};

// Screen mapping of one axis.
struct Axis {
  double lo = 0, hi = 1;  // in data units (log10 units when log)
  bool log = false;
  int p0 = 0, p1 = 1;     // pixel of lo and hi
  bool valid(double v) const { return std::isfinite(v) && (!log || v > 0); }
  double t(double v) const { return log ? std::log10(v) : v; }
  double px(double v) const { return p0 + (t(v) - lo) / (hi - lo) * (p1 - p0); }
};

std::vector<double> log_ticks(double lo, double hi) {  // lo, hi in log10 units
  std::vector<double> out;
  for (int e = static_cast<int>(std::floor(lo)); e <= static_cast<int>(std::ceil(hi)); ++e) {
    const double v = std::pow(10.0, e);
    if (std::log10(v) >= lo - 1e-9 && std::log10(v) <= hi + 1e-9) out.push_back(v);
  }
  if (out.size() < 3) {  // a narrow range: 1, 2, 5 per decade
    out.clear();
    for (int e = static_cast<int>(std::floor(lo)); e <= static_cast<int>(std::ceil(hi)); ++e)
      for (double m : {1.0, 2.0, 5.0}) {
        const double v = m * std::pow(10.0, e);
        if (std::log10(v) >= lo - 1e-9 && std::log10(v) <= hi + 1e-9) out.push_back(v);
      }
  }
  return out;
}

// Expands a degenerate range and returns (lo, hi) in axis units.
void settle_range(double& lo, double& hi, bool log) {
  if (!(hi > lo)) {
    const double pad = log ? 0.5 : (lo == 0 ? 1.0 : std::abs(lo) * 0.1);
    lo -= pad;
    hi += pad;
  }
}

// One step larger than the labels when the title fits, else the label size, else smaller (down to 1).
int title_scale(const std::string& title, int scale, int width) {
  if (text_width(title, scale + 1) <= width - 20) return scale + 1;
  if (text_width(title, scale) <= width - 20 || scale == 1) return scale;
  return std::max(1, scale - 1);
}

// Draws `text` centred on x, shifted to stay inside the image when it would cross an edge.
void text_centered(Image& img, int cx, int y, const std::string& text, int scale, Rgb c) {
  const int w = text_width(text, scale);
  int x = cx - w / 2;
  x = std::min(x, img.width - 4 - w);
  draw_text(img, std::max(4, x), y, text, scale, c);
}

struct Legend {
  std::vector<std::pair<std::string, Rgb>> entries;
  std::vector<bool> dashed;
  int scale = 2;
  int width() const {
    int w = 0;
    for (const auto& e : entries) w = std::max(w, text_width(e.first, scale));
    return w + 30 + 6 * scale;
  }
  int height() const { return static_cast<int>(entries.size()) * (text_height(scale) + 4 * scale) + 4 * scale; }
  void draw(Image& img, int x, int y) const {
    if (entries.empty()) return;
    fill(img, x, y, width(), height(), Rgb{255, 255, 255});
    rect_outline(img, x, y, width(), height(), Rgb{180, 180, 180});
    int yy = y + 3 * scale;
    for (size_t i = 0; i < entries.size(); ++i) {
      const int mid = yy + text_height(scale) / 2;
      int ph = 0;
      line(img, x + 6, mid, x + 26, mid, entries[i].second, 3, dashed[i], &ph);
      draw_text(img, x + 30 + scale, yy, entries[i].first, scale, kBlack);
      yy += text_height(scale) + 4 * scale;
    }
  }
};

// Shared frame: title, axis labels, tick labels, grid. Returns the plot rectangle via the axes.
struct Frame {
  int left, top, right, bottom;  // plot area bounds (inclusive)
};

}  // namespace

Rgb palette(int i) {
  static const Rgb kTab10[10] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44},  {214, 39, 40},  {148, 103, 189},
                                 {140, 86, 75},  {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}};
  return kTab10[((i % 10) + 10) % 10];
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  QKV_CHECK_ARG(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "[plot] nice_ticks needs finite lo <= hi, got ",
                lo, " and ", hi);
  target = std::max(2, target);
  if (hi == lo) return {lo};
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) { step = m * mag; break; }
  std::vector<double> out;
  const double first = std::ceil(lo / step - 1e-9) * step;
  for (double v = first; v <= hi + step * 1e-9; v += step) out.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return out;
}

Image render(const LineChart& chart) {
  QKV_CHECK_ARG(chart.width >= 200 && chart.height >= 150, "[plot] chart size ", chart.width, "x", chart.height,
                " is too small (need at least 200x150)");
  Axis ax, ay;
  ax.log = chart.log_x;
  ay.log = chart.log_y;
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  for (size_t s = 0; s < chart.series.size(); ++s) {
    const Series& se = chart.series[s];
    QKV_CHECK_ARG(se.x.size() == se.y.size(), "[plot] series ", s, " ('", se.label, "') has ", se.x.size(),
                  " x values but ", se.y.size(), " y values");
    QKV_CHECK_ARG(se.spread.empty() || se.spread.size() == se.y.size(), "[plot] series ", s, " ('", se.label,
                  "') has ", se.spread.size(), " spread values for ", se.y.size(), " points");
    for (size_t i = 0; i < se.x.size(); ++i) {
      if (!ax.valid(se.x[i]) || !ay.valid(se.y[i])) continue;
      const double sp = se.spread.empty() || !std::isfinite(se.spread[i]) ? 0.0 : std::abs(se.spread[i]);
      xlo = std::min(xlo, ax.t(se.x[i]));
      xhi = std::max(xhi, ax.t(se.x[i]));
      const double y0 = se.y[i] - sp, y1 = se.y[i] + sp;
      if (ay.valid(y0)) ylo = std::min(ylo, ay.t(y0));
      yhi = std::max(yhi, ay.t(y1));
      ylo = std::min(ylo, ay.t(se.y[i]));
    }
  }
  QKV_CHECK_ARG(std::isfinite(xlo) && std::isfinite(ylo), "[plot] line chart '", chart.title,
                "' has no drawable point (", chart.series.size(), " series)");
  if (!chart.y_min && !chart.y_max && !ay.log) {
    const double pad = (yhi - ylo) * 0.05;
    ylo -= pad;
    yhi += pad;
  }
  if (chart.x_min && ax.valid(*chart.x_min)) xlo = ax.t(*chart.x_min);
  if (chart.x_max && ax.valid(*chart.x_max)) xhi = ax.t(*chart.x_max);
  if (chart.y_min && ay.valid(*chart.y_min)) ylo = ay.t(*chart.y_min);
  if (chart.y_max && ay.valid(*chart.y_max)) yhi = ay.t(*chart.y_max);
  settle_range(xlo, xhi, ax.log);
  settle_range(ylo, yhi, ay.log);
  ax.lo = xlo; ax.hi = xhi; ay.lo = ylo; ay.hi = yhi;

  QKV_CHECK_ARG(chart.x_tick_labels.empty() || chart.x_tick_labels.size() == chart.x_ticks.size(), "[plot] ",
                chart.x_tick_labels.size(), " x tick labels for ", chart.x_ticks.size(), " x ticks");
  std::vector<double> xt, yt;
  std::vector<std::string> xt_labels;
  if (!chart.x_ticks.empty()) {
    for (size_t i = 0; i < chart.x_ticks.size(); ++i) {
      const double v = chart.x_ticks[i];
      if (!ax.valid(v) || ax.t(v) < xlo - 1e-9 || ax.t(v) > xhi + 1e-9) continue;
      xt.push_back(v);
      xt_labels.push_back(chart.x_tick_labels.empty() ? format_number(v) : chart.x_tick_labels[i]);
    }
  } else {
    xt = ax.log ? log_ticks(xlo, xhi) : nice_ticks(xlo, xhi, 6);
  }
  if (xt_labels.empty())
    for (double v : xt) xt_labels.push_back(format_number(v));
  yt = ay.log ? log_ticks(ylo, yhi) : nice_ticks(ylo, yhi, 6);

  const int s = std::max(1, chart.text_scale);
  const int ts = title_scale(chart.title, s, chart.width);
  int ytick_w = 0;
  for (double v : yt) ytick_w = std::max(ytick_w, text_width(format_number(v), s));
  Legend legend;
  legend.scale = s;
  for (size_t i = 0; i < chart.series.size(); ++i)
    if (!chart.series[i].label.empty()) {
      legend.entries.push_back({chart.series[i].label, chart.series[i].color.value_or(palette(static_cast<int>(i)))});
      legend.dashed.push_back(chart.series[i].dashed);
    }
  const bool outside = chart.legend == LineChart::Legend::kOutside && !legend.entries.empty();

  Frame f;
  f.left = 8 + (chart.y_label.empty() ? 0 : text_height(s) + 8) + ytick_w + 8;
  f.top = 10 + (chart.title.empty() ? 0 : text_height(ts) + 10);
  // Room on the right for half of the last x tick label (it is centred on its tick).
  const int last_half = xt_labels.empty() ? 0 : text_width(xt_labels.back(), s) / 2;
  f.right = chart.width - std::max(16, last_half + 6) - (outside ? legend.width() + 10 : 0);
  f.bottom = chart.height - 8 - (chart.x_label.empty() ? 0 : text_height(s) + 8) - text_height(s) - 10;
  QKV_CHECK_ARG(f.right - f.left > 40 && f.bottom - f.top > 40, "[plot] chart '", chart.title,
                "' leaves no room to plot at ", chart.width, "x", chart.height);
  ax.p0 = f.left; ax.p1 = f.right;
  ay.p0 = f.bottom; ay.p1 = f.top;

  Image img(chart.width, chart.height, 255);
  // Grid and ticks.
  for (double v : yt) {
    const int py = static_cast<int>(std::lround(ay.px(v)));
    hline(img, f.left, f.right, py, kGrid);
    const std::string lab = format_number(v);
    draw_text(img, f.left - 6 - text_width(lab, s), py - text_height(s) / 2, lab, s, kAxis);
  }
  int last_label_end = -1000;
  for (size_t i = 0; i < xt.size(); ++i) {
    const int px = static_cast<int>(std::lround(ax.px(xt[i])));
    vline(img, px, f.top, f.bottom, kGrid);
    vline(img, px, f.bottom, f.bottom + 4, kAxis);
    const std::string& lab = xt_labels[i];
    const int x0 = px - text_width(lab, s) / 2;
    if (x0 > last_label_end + 6) {  // skip a label that would overlap its neighbour
      draw_text(img, x0, f.bottom + 8, lab, s, kAxis);
      last_label_end = x0 + text_width(lab, s);
    }
  }
  rect_outline(img, f.left, f.top, f.right - f.left + 1, f.bottom - f.top + 1, kAxis);

  // Bands first, then lines and markers, clipped to the plot area.
  Image plot_layer = img;
  for (size_t si = 0; si < chart.series.size(); ++si) {
    const Series& se = chart.series[si];
    const Rgb c = se.color.value_or(palette(static_cast<int>(si)));
    if (se.spread.empty()) continue;
    for (size_t i = 0; i + 1 < se.x.size(); ++i) {
      const double xa = se.x[i], xb = se.x[i + 1];
      if (!ax.valid(xa) || !ax.valid(xb) || !std::isfinite(se.y[i]) || !std::isfinite(se.y[i + 1])) continue;
      const double pa = ax.px(xa), pb = ax.px(xb);
      for (int px = static_cast<int>(std::ceil(std::min(pa, pb))); px <= static_cast<int>(std::floor(std::max(pa, pb)));
           ++px) {
        const double u = pb == pa ? 0.0 : (px - pa) / (pb - pa);
        const double yc = se.y[i] + u * (se.y[i + 1] - se.y[i]);
        const double sp = std::abs(se.spread[i]) + u * (std::abs(se.spread[i + 1]) - std::abs(se.spread[i]));
        double lo = yc - sp, hi = yc + sp;
        if (ay.log && lo <= 0) lo = std::pow(10.0, ay.lo);
        if (!ay.valid(lo) || !ay.valid(hi)) continue;
        const int ya = static_cast<int>(std::lround(ay.px(hi))), yb = static_cast<int>(std::lround(ay.px(lo)));
        for (int py = std::max(ya, f.top + 1); py <= std::min(yb, f.bottom - 1); ++py) blend(plot_layer, px, py, c, 0.18f);
      }
    }
  }
  for (size_t si = 0; si < chart.series.size(); ++si) {
    const Series& se = chart.series[si];
    const Rgb c = se.color.value_or(palette(static_cast<int>(si)));
    int phase = 0;
    bool have_prev = false;
    int prev_x = 0, prev_y = 0;
    for (size_t i = 0; i < se.x.size(); ++i) {
      if (!ax.valid(se.x[i]) || !ay.valid(se.y[i])) { have_prev = false; continue; }
      const int px = static_cast<int>(std::lround(ax.px(se.x[i])));
      const int py = static_cast<int>(std::lround(ay.px(se.y[i])));
      if (have_prev) line(plot_layer, prev_x, prev_y, px, py, c, 2, se.dashed, &phase);
      if (se.markers) fill(plot_layer, px - 3, py - 3, 7, 7, c);
      prev_x = px; prev_y = py; have_prev = true;
    }
  }
  // Copy the plot area back (clipping whatever was drawn outside it).
  for (int y = f.top + 1; y < f.bottom; ++y)
    std::copy_n(&plot_layer.rgb[(static_cast<size_t>(y) * img.width + f.left + 1) * 3], (f.right - f.left - 1) * 3,
                &img.rgb[(static_cast<size_t>(y) * img.width + f.left + 1) * 3]);

  // Labels.
  if (!chart.title.empty()) text_centered(img, (f.left + f.right) / 2, 10, chart.title, ts, kTitle);
  if (!chart.x_label.empty())
    text_centered(img, (f.left + f.right) / 2, chart.height - 8 - text_height(s), chart.x_label, s, kBlack);
  if (!chart.y_label.empty()) {  // one size smaller when it would not fit along the plot's height
    const int ls = text_width(chart.y_label, s) <= f.bottom - f.top ? s : std::max(1, s - 1);
    const int len = text_width(chart.y_label, ls);
    draw_text(img, 8, std::min(chart.height - 4, (f.top + f.bottom) / 2 + len / 2), chart.y_label, ls, kBlack, true);
  }
  if (!legend.entries.empty()) {
    const int lw = legend.width(), lh = legend.height();
    int lx = f.right - lw - 8, ly = f.top + 8;
    LineChart::Legend where = chart.legend;
    if (where == LineChart::Legend::kAuto) {
      // The inside corner whose box covers the fewest drawn points (sampled along each segment).
      const std::pair<int, int> corners[4] = {{f.right - lw - 8, f.top + 8}, {f.left + 8, f.top + 8},
                                              {f.right - lw - 8, f.bottom - lh - 8}, {f.left + 8, f.bottom - lh - 8}};
      const LineChart::Legend names[4] = {LineChart::Legend::kTopRight, LineChart::Legend::kTopLeft,
                                          LineChart::Legend::kBottomRight, LineChart::Legend::kBottomLeft};
      long best = -1;
      for (int k = 0; k < 4; ++k) {
        long hits = 0;
        for (const Series& se : chart.series)
          for (size_t i = 0; i + 1 < se.x.size(); ++i) {
            if (!ax.valid(se.x[i]) || !ay.valid(se.y[i]) || !ax.valid(se.x[i + 1]) || !ay.valid(se.y[i + 1])) continue;
            for (int t = 0; t <= 16; ++t) {
              const double u = t / 16.0;
              const double px = ax.px(se.x[i]) + u * (ax.px(se.x[i + 1]) - ax.px(se.x[i]));
              const double py = ay.px(se.y[i]) + u * (ay.px(se.y[i + 1]) - ay.px(se.y[i]));
              if (px >= corners[k].first - 4 && px <= corners[k].first + lw + 4 && py >= corners[k].second - 4 &&
                  py <= corners[k].second + lh + 4)
                ++hits;
            }
          }
        if (best < 0 || hits < best) { best = hits; where = names[k]; }
      }
    }
    switch (where) {
      case LineChart::Legend::kAuto: break;
      case LineChart::Legend::kTopLeft: lx = f.left + 8; break;
      case LineChart::Legend::kTopRight: break;
      case LineChart::Legend::kBottomLeft: lx = f.left + 8; ly = f.bottom - lh - 8; break;
      case LineChart::Legend::kBottomRight: ly = f.bottom - lh - 8; break;
      case LineChart::Legend::kOutside: lx = f.right + 10; break;
    }
    legend.draw(img, lx, ly);
  }
  return img;
}

Image render(const BarChart& chart) {
  QKV_CHECK_ARG(chart.width >= 200 && chart.height >= 150, "[plot] chart size ", chart.width, "x", chart.height,
                " is too small (need at least 200x150)");
  QKV_CHECK_ARG(!chart.categories.empty() && !chart.groups.empty(), "[plot] bar chart '", chart.title, "' needs ",
                "categories and groups, got ", chart.categories.size(), " and ", chart.groups.size());
  double vmax = -std::numeric_limits<double>::infinity(), vmin = std::numeric_limits<double>::infinity();
  for (size_t g = 0; g < chart.groups.size(); ++g) {
    const BarGroup& gr = chart.groups[g];
    QKV_CHECK_ARG(gr.values.size() == chart.categories.size(), "[plot] bar group ", g, " ('", gr.label, "') has ",
                  gr.values.size(), " values for ", chart.categories.size(), " categories");
    QKV_CHECK_ARG(gr.errors.empty() || gr.errors.size() == gr.values.size(), "[plot] bar group ", g, " ('",
                  gr.label, "') has ", gr.errors.size(), " errors for ", gr.values.size(), " values");
    for (size_t i = 0; i < gr.values.size(); ++i) {
      const double v = gr.values[i];
      if (!std::isfinite(v) || (chart.log_y && v <= 0)) continue;
      const double e = gr.errors.empty() || !std::isfinite(gr.errors[i]) ? 0.0 : std::abs(gr.errors[i]);
      vmax = std::max(vmax, v + e);
      vmin = std::min(vmin, v);
    }
  }
  if (!std::isfinite(vmax)) { vmax = 1.0; vmin = chart.log_y ? 0.1 : 0.0; }
  Axis ay;
  ay.log = chart.log_y;
  // A log axis starts half a decade under the smallest bar, so that it still shows.
  double lo = chart.log_y ? std::log10(vmin) - 0.5 : std::min(0.0, vmin);
  double hi = chart.log_y ? std::log10(vmax) + 0.3 : vmax + 0.1 * (vmax - std::min(0.0, vmin));
  if (chart.y_min && ay.valid(*chart.y_min)) lo = ay.t(*chart.y_min);
  if (chart.y_max && ay.valid(*chart.y_max)) hi = ay.t(*chart.y_max);
  settle_range(lo, hi, ay.log);
  ay.lo = lo; ay.hi = hi;
  const std::vector<double> yt = ay.log ? log_ticks(lo, hi) : nice_ticks(lo, hi, 6);

  const int s = std::max(1, chart.text_scale);
  const int ts = title_scale(chart.title, s, chart.width);
  int ytick_w = 0;
  for (double v : yt) ytick_w = std::max(ytick_w, text_width(format_number(v), s));
  const int ncat = static_cast<int>(chart.categories.size()), ngr = static_cast<int>(chart.groups.size());
  Legend legend;
  legend.scale = s;
  if (ngr > 1 || !chart.groups[0].label.empty())
    for (int g = 0; g < ngr; ++g) {
      legend.entries.push_back({chart.groups[g].label, palette(g)});
      legend.dashed.push_back(false);
    }
  // The legend goes under the chart, entries side by side, wrapping into rows.
  const int entry_gap = 16;
  std::vector<int> entry_w;
  for (const auto& e : legend.entries) entry_w.push_back(30 + s + text_width(e.first, s));
  int legend_rows = legend.entries.empty() ? 0 : 1;
  for (int x = 0, i = 0; i < static_cast<int>(entry_w.size()); ++i) {
    if (x > 0 && x + entry_w[i] > chart.width - 20) { ++legend_rows; x = 0; }
    x += entry_w[i] + entry_gap;
  }
  const int legend_h = legend_rows * (text_height(s) + 4 * s) + (legend_rows ? 6 : 0);
  Frame f;
  f.left = 8 + (chart.y_label.empty() ? 0 : text_height(s) + 8) + ytick_w + 8;
  f.top = 10 + (chart.title.empty() ? 0 : text_height(ts) + 10);
  f.right = chart.width - 16;
  // Category labels: horizontal if they fit their slot, else vertical.
  const double slot = static_cast<double>(chart.width - f.left - 16) / ncat;
  int label_w = 0;
  for (const auto& c : chart.categories) label_w = std::max(label_w, text_width(c, s));
  const bool vertical_labels = label_w > slot - 6;
  f.bottom = chart.height - 10 - legend_h - (vertical_labels ? std::min(label_w, chart.height / 3) : text_height(s)) - 8;
  QKV_CHECK_ARG(f.right - f.left > 40 && f.bottom - f.top > 40, "[plot] bar chart '", chart.title,
                "' leaves no room to plot at ", chart.width, "x", chart.height);
  ay.p0 = f.bottom; ay.p1 = f.top;

  Image img(chart.width, chart.height, 255);
  for (double v : yt) {
    const int py = static_cast<int>(std::lround(ay.px(v)));
    hline(img, f.left, f.right, py, kGrid);
    const std::string lab = format_number(v);
    draw_text(img, f.left - 6 - text_width(lab, s), py - text_height(s) / 2, lab, s, kAxis);
  }
  const double cw = static_cast<double>(f.right - f.left) / ncat;
  const double bw = cw * 0.8 / ngr;
  // Bars grow from 0 (or from the bottom of a log axis).
  const int base_px = static_cast<int>(std::lround(ay.log ? ay.p0 : ay.px(std::clamp(0.0, lo, hi))));
  for (int c = 0; c < ncat; ++c) {
    for (int g = 0; g < ngr; ++g) {
      const double v = chart.groups[g].values[c];
      if (!ay.valid(v)) continue;
      const int x0 = static_cast<int>(std::lround(f.left + c * cw + cw * 0.1 + g * bw));
      const int x1 = static_cast<int>(std::lround(f.left + c * cw + cw * 0.1 + (g + 1) * bw)) - 1;
      const int py = std::clamp(static_cast<int>(std::lround(ay.px(v))), f.top, f.bottom);
      fill(img, x0, std::min(py, base_px), std::max(1, x1 - x0), std::abs(base_px - py) + 1, palette(g));
      if (!chart.groups[g].errors.empty() && std::isfinite(chart.groups[g].errors[c])) {
        const double e = std::abs(chart.groups[g].errors[c]);
        const double top_v = v + e;
        double bot_v = v - e;
        if (ay.log && bot_v <= 0) bot_v = std::pow(10.0, lo);
        const int pt = std::clamp(static_cast<int>(std::lround(ay.px(top_v))), f.top, f.bottom);
        const int pb = std::clamp(static_cast<int>(std::lround(ay.px(bot_v))), f.top, f.bottom);
        const int xm = (x0 + x1) / 2;
        vline(img, xm, pt, pb, kBlack);
        hline(img, xm - 3, xm + 3, pt, kBlack);
        hline(img, xm - 3, xm + 3, pb, kBlack);
      }
      if (chart.value_labels) {
        const std::string lab = format_number(v);
        const int vs = text_width(lab, s) <= x1 - x0 + 4 ? s : 1;
        text_centered(img, (x0 + x1) / 2, std::max(f.top + 2, py - text_height(vs) - 4), lab, vs, kBlack);
      }
    }
    const std::string& lab = chart.categories[c];
    const int cx = static_cast<int>(std::lround(f.left + (c + 0.5) * cw));
    if (!vertical_labels)
      text_centered(img, cx, f.bottom + 8, lab, s, kBlack);
    else
      draw_text(img, cx - text_height(s) / 2, f.bottom + 8 + std::min(text_width(lab, s), chart.height / 3), lab, s,
                kBlack, true);
  }
  hline(img, f.left, f.right, base_px, kAxis);
  rect_outline(img, f.left, f.top, f.right - f.left + 1, f.bottom - f.top + 1, kAxis);
  if (!chart.title.empty()) text_centered(img, (f.left + f.right) / 2, 10, chart.title, ts, kTitle);
  if (!chart.y_label.empty()) {  // one size smaller when it would not fit along the plot's height
    const int ls = text_width(chart.y_label, s) <= f.bottom - f.top ? s : std::max(1, s - 1);
    const int len = text_width(chart.y_label, ls);
    draw_text(img, 8, std::min(chart.height - 4, (f.top + f.bottom) / 2 + len / 2), chart.y_label, ls, kBlack, true);
  }
  {
    int x = 10, y = chart.height - legend_h;
    for (size_t i = 0; i < legend.entries.size(); ++i) {
      if (x > 10 && x + entry_w[i] > chart.width - 20) { x = 10; y += text_height(s) + 4 * s; }
      const int mid = y + text_height(s) / 2;
      fill(img, x + 4, mid - 4, 20, 9, legend.entries[i].second);
      draw_text(img, x + 30, y, legend.entries[i].first, s, kBlack);
      x += entry_w[i] + entry_gap;
    }
  }
  return img;
}

Image render(const Heatmap& hm) {
  const Tensor& m = hm.values;
  QKV_CHECK_ARG(m.defined() && m.dim() == 2 && m.numel() > 0, "[plot] heatmap '", hm.title,
                "' needs 2-D non-empty values, got ", m.defined() ? str(m.shape()) : std::string("undefined"));
  const int R = static_cast<int>(m.size(0)), C = static_cast<int>(m.size(1));
  QKV_CHECK_ARG(hm.row_labels.empty() || static_cast<int>(hm.row_labels.size()) == R, "[plot] heatmap '", hm.title,
                "' has ", hm.row_labels.size(), " row labels for ", R, " rows");
  QKV_CHECK_ARG(hm.col_labels.empty() || static_cast<int>(hm.col_labels.size()) == C, "[plot] heatmap '", hm.title,
                "' has ", hm.col_labels.size(), " column labels for ", C, " columns");
  QKV_CHECK_ARG(hm.cell_px >= 1, "[plot] heatmap cell_px must be >= 1, got ", hm.cell_px);
  const std::vector<float> v = m.contiguous().to_vector();
  float lo = hm.vmin, hi = hm.vmax;
  if (!(hi > lo)) {
    lo = std::numeric_limits<float>::infinity();
    hi = -lo;
    for (float x : v)
      if (std::isfinite(x)) { lo = std::min(lo, x); hi = std::max(hi, x); }
    if (!std::isfinite(lo)) { lo = 0; hi = 1; }
    if (!(hi > lo)) hi = lo + 1;
  }
  const int s = std::max(1, hm.text_scale);
  const int cell = hm.cell_px;
  int row_w = 0, col_h = 0;
  for (const auto& l : hm.row_labels) row_w = std::max(row_w, text_width(l, s));
  for (const auto& l : hm.col_labels) col_h = std::max(col_h, text_width(l, s));
  const int ts = s + 1;
  const int grid_w = C * cell, grid_h = R * cell;
  const int bar_w =
      hm.colorbar ? 14 + 8 + std::max(text_width(format_number(lo), s), text_width(format_number(hi), s)) + 10 : 0;
  const int left = 6 + (hm.y_label.empty() ? 0 : text_height(s) + 6) + (row_w ? row_w + 6 : 0);
  const int top = 6 + (hm.title.empty() ? 0 : text_height(ts) + 8) + (hm.x_label.empty() ? 0 : text_height(s) + 6) +
                  (col_h ? col_h + 6 : 0);
  const int width = std::max(left + grid_w + 10 + bar_w, hm.title.empty() ? 0 : text_width(hm.title, ts) + 12);
  const int height = top + std::max(grid_h, 60) + 10;
  Image img(width, height, 255);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      uint8_t col[3];
      const float x = v[static_cast<size_t>(r) * C + c];
      viridis(std::isfinite(x) ? (x - lo) / (hi - lo) : 0.0f, col);
      img.fill_rect(left + c * cell, top + r * cell, cell, cell, col[0], col[1], col[2]);
    }
  int y = 6;
  if (!hm.title.empty()) { draw_text(img, 6, y, hm.title, ts, kTitle); y += text_height(ts) + 8; }
  if (!hm.x_label.empty()) {
    text_centered(img, left + grid_w / 2, y, hm.x_label, s, kBlack);
  }
  for (int r = 0; r < static_cast<int>(hm.row_labels.size()); ++r)
    draw_text(img, left - 6 - text_width(hm.row_labels[r], s), top + r * cell + (cell - text_height(s)) / 2,
              hm.row_labels[r], s, kBlack);
  for (int c = 0; c < static_cast<int>(hm.col_labels.size()); ++c)
    draw_text(img, left + c * cell + (cell - text_height(s)) / 2, top - 6, hm.col_labels[c], s, kBlack, true);
  if (!hm.y_label.empty()) {
    const int len = text_width(hm.y_label, s);
    draw_text(img, 6, top + grid_h / 2 + len / 2, hm.y_label, s, kBlack, true);
  }
  if (hm.colorbar) {
    const int bx = left + grid_w + 10, bh = std::max(grid_h, 60);
    for (int k = 0; k < bh; ++k) {
      uint8_t col[3];
      viridis(1.0f - static_cast<float>(k) / std::max(1, bh - 1), col);
      img.fill_rect(bx, top + k, 14, 1, col[0], col[1], col[2]);
    }
    draw_text(img, bx + 20, top, format_number(hi), s, kAxis);
    draw_text(img, bx + 20, top + bh - text_height(s), format_number(lo), s, kAxis);
  }
  return img;
}

Image compose(const std::vector<Image>& panels, int columns, const std::string& title, int text_scale) {
  QKV_CHECK_ARG(!panels.empty() && columns >= 1, "[plot] compose needs panels and columns >= 1, got ", panels.size(),
                " panels and ", columns, " columns");
  const int gap = 10;
  const int n = static_cast<int>(panels.size());
  const int cols = std::min(columns, n);
  const int rows = (n + cols - 1) / cols;
  std::vector<int> col_w(cols, 0), row_h(rows, 0);
  for (int i = 0; i < n; ++i) {
    col_w[i % cols] = std::max(col_w[i % cols], panels[i].width);
    row_h[i / cols] = std::max(row_h[i / cols], panels[i].height);
  }
  const int s = std::max(1, text_scale) + 1;
  const int title_h = title.empty() ? 0 : text_height(s) + 2 * gap;
  int W = gap, H = gap + title_h;
  for (int w : col_w) W += w + gap;
  for (int h : row_h) H += h + gap;
  W = std::max(W, title.empty() ? 0 : text_width(title, s) + 2 * gap);
  Image img(W, H, 255);
  if (!title.empty()) draw_text(img, gap, gap, title, s, kTitle);
  int y = gap + title_h;
  for (int r = 0; r < rows; ++r) {
    int x = gap;
    for (int c = 0; c < cols; ++c) {
      const int i = r * cols + c;
      if (i >= n) break;
      const Image& p = panels[i];
      for (int yy = 0; yy < p.height; ++yy)
        std::copy_n(&p.rgb[static_cast<size_t>(yy) * p.width * 3], p.width * 3,
                    &img.rgb[(static_cast<size_t>(y + yy) * W + x) * 3]);
      x += col_w[c] + gap;
    }
    y += row_h[r] + gap;
  }
  return img;
}

}  // namespace qkv::plot
