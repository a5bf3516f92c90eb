// Tests of the plotting module: number labels, tick choice, the bitmap font, and the input checks and basic
// drawing of line charts, bar charts, labelled heatmaps and panel composition.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "qkv/plot/plot.h"

namespace qkv::plot {
namespace {

int count_color(const Image& img, Rgb c) {
  int n = 0;
  for (size_t i = 0; i + 2 < img.rgb.size(); i += 3) n += img.rgb[i] == c[0] && img.rgb[i + 1] == c[1] && img.rgb[i + 2] == c[2];
  return n;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(PlotText, FormatNumberTrimsZerosAndSwitchesToExponentForTinyValues) {
  EXPECT_EQ(format_number(0.25), "0.25");
  EXPECT_EQ(format_number(1024), "1024");
  EXPECT_EQ(format_number(-2.5), "-2.5");
  EXPECT_EQ(format_number(0.0), "0");
  EXPECT_EQ(format_number(1e-5), "1e-5");
  EXPECT_EQ(format_number(2.5e7), "2.5e7");
  EXPECT_EQ(format_number(NAN), "nan");
  EXPECT_EQ(format_number(0.1 + 0.2), "0.3");
}

TEST(PlotTicks, NiceTicksUseRoundStepsInsideTheRange) {
  const std::vector<double> t = nice_ticks(0.0, 1.0, 5);
  ASSERT_EQ(t.size(), 6u);
  EXPECT_DOUBLE_EQ(t[1], 0.2);
  for (double v : nice_ticks(0.13, 0.87)) EXPECT_TRUE(v >= 0.13 - 1e-12 && v <= 0.87 + 1e-12) << v;
  EXPECT_EQ(nice_ticks(3.0, 3.0).size(), 1u);
  EXPECT_NE(error_of([] { nice_ticks(1.0, 0.0); }).find("[plot] nice_ticks"), std::string::npos);
}

TEST(PlotText, GlyphPixelsStayInsideTheTextBox) {
  Image img(60, 40, 255);
  draw_text(img, 10, 10, "Ag", 2, {0, 0, 0});
  int dark = 0;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x) {
      if (img.rgb[(y * img.width + x) * 3] != 0) continue;
      ++dark;
      EXPECT_GE(x, 10);
      EXPECT_LT(x, 10 + text_width("Ag", 2));
      EXPECT_GE(y, 10);
      EXPECT_LT(y, 10 + text_height(2));
    }
  EXPECT_GT(dark, 20);
  Image v(40, 60, 255);
  draw_text(v, 5, 50, "Ag", 2, {0, 0, 0}, true);  // vertical: the same pixels, rotated
  EXPECT_EQ(count_color(v, {0, 0, 0}), dark);
}

TEST(PlotText, InvalidUtf8BytesDrawAsQuestionMarks) {
  Image a(40, 20, 255), b(40, 20, 255);
  draw_text(a, 0, 0, "\xff\xc3", 1, {0, 0, 0});  // a stray byte and a truncated sequence
  draw_text(b, 0, 0, "??", 1, {0, 0, 0});
  EXPECT_EQ(a.rgb, b.rgb);
  EXPECT_EQ(text_width("\xff\xc3", 1), text_width("??", 1));
}

TEST(PlotText, ChineseIsDrawnWithARealFontNotAsPlaceholders) {
  // fonts-wqy-microhei and FreeType (scripts/install-deps.sh) draw each ideograph as itself.
  const std::string zh = "\xe4\xb8\xad\xe6\x96\x87";  // 中文
  Image a(80, 40, 255), b(80, 40, 255), c(80, 40, 255);
  draw_text(a, 4, 10, zh, 2, {0, 0, 0});
  draw_text(b, 4, 10, "??", 2, {0, 0, 0});
  draw_text(c, 4, 10, "\xe4\xb8\xad\xe4\xb8\xad", 2, {0, 0, 0});  // 中中
  const int dark = count_color(a, {0, 0, 0});
  EXPECT_GT(dark, 40) << "no glyph pixels: is FreeType or the CJK font missing?";
  EXPECT_NE(a.rgb, b.rgb);
  EXPECT_NE(a.rgb, c.rgb) << "two different ideographs must look different";
  EXPECT_GT(text_width(zh, 2), 2 * 12);  // wider than two ASCII cells: an ideograph is about one em
  for (int y = 0; y < a.height; ++y)
    for (int x = 0; x < a.width; ++x) {
      if (a.rgb[(y * a.width + x) * 3] != 0) continue;
      EXPECT_GE(x, 4);
      EXPECT_LT(x, 4 + text_width(zh, 2) + 2);
      EXPECT_GE(y, 10 - 4);
      EXPECT_LT(y, 10 + text_height(2) + 4);
    }
  Image v(40, 80, 255);
  draw_text(v, 10, 70, zh, 2, {0, 0, 0}, true);  // vertical: the same pixels, rotated
  EXPECT_EQ(count_color(v, {0, 0, 0}), dark);
}

TEST(LineChart, DrawsEachSeriesInItsColourAndSurvivesNonFinitePoints) {
  LineChart c;
  c.title = "t";
  Series s;
  s.label = "a";
  s.x = {1, 2, 3, 4};
  s.y = {1, NAN, 3, 2};
  s.color = Rgb{250, 0, 0};
  c.series = {s};
  const Image img = render(c);
  EXPECT_EQ(img.width, 760);
  EXPECT_GT(count_color(img, {250, 0, 0}), 50);
  c.log_x = c.log_y = true;
  c.series[0].y = {-1, 10, 100, 1000};  // the first point is skipped on a log axis
  EXPECT_GT(count_color(render(c), {250, 0, 0}), 50);
}

TEST(LineChart, MismatchedSeriesAndEmptyChartsThrow) {
  LineChart c;
  Series s;
  s.label = "bad";
  s.x = {1, 2};
  s.y = {1};
  c.series = {s};
  EXPECT_NE(error_of([&] { render(c); }).find("[plot] series 0 ('bad') has 2 x values but 1 y values"),
            std::string::npos);
  c.series[0].y = {1, 2};
  c.series[0].spread = {1};
  EXPECT_NE(error_of([&] { render(c); }).find("spread"), std::string::npos);
  c.series[0].spread = {};
  c.series[0].y = {NAN, NAN};
  EXPECT_NE(error_of([&] { render(c); }).find("no drawable point"), std::string::npos);
  c.series[0].y = {1, 2};
  c.x_ticks = {1, 2};
  c.x_tick_labels = {"one"};
  EXPECT_NE(error_of([&] { render(c); }).find("[plot] 1 x tick labels for 2 x ticks"), std::string::npos);
  c.x_tick_labels = {"one", "two"};
  EXPECT_NO_THROW(render(c));
  c.width = 100;
  EXPECT_NE(error_of([&] { render(c); }).find("too small"), std::string::npos);
}

TEST(BarChart, ChecksValueCountsAndDrawsBars) {
  BarChart b;
  b.categories = {"x", "y", "z"};
  b.groups = {{"g", {1, 2}, {}}};
  EXPECT_NE(error_of([&] { render(b); }).find("[plot] bar group 0 ('g') has 2 values for 3 categories"),
            std::string::npos);
  b.groups[0].values = {1, 2, 3};
  b.groups[0].errors = {0.1};
  EXPECT_NE(error_of([&] { render(b); }).find("errors"), std::string::npos);
  b.groups[0].errors = {0.1, 0.2, 0.3};
  b.log_y = true;
  EXPECT_GT(count_color(render(b), palette(0)), 500);
  b.groups.clear();
  EXPECT_NE(error_of([&] { render(b); }).find("needs categories and groups"), std::string::npos);
}

TEST(Heatmap, ChecksShapeAndLabelsAndFitsTheGrid) {
  Heatmap h;
  h.values = Tensor::from_vector({2, 3}, {0, 0.5f, 1, 1, 0.5f, NAN});
  h.cell_px = 10;
  const Image img = render(h);
  EXPECT_GE(img.width, 30);
  EXPECT_GE(img.height, 20);
  h.row_labels = {"a"};
  EXPECT_NE(error_of([&] { render(h); }).find("has 1 row labels for 2 rows"), std::string::npos);
  h.row_labels = {};
  h.col_labels = {"a", "b"};
  EXPECT_NE(error_of([&] { render(h); }).find("column labels"), std::string::npos);
  h.col_labels = {};
  h.values = Tensor::zeros({4});
  EXPECT_NE(error_of([&] { render(h); }).find("2-D"), std::string::npos);
}

TEST(Compose, PanelsSideBySideWithGaps) {
  const Image a(10, 10, 0), b(20, 5, 0);
  const Image c = compose({a, b}, 2);
  EXPECT_EQ(c.width, 10 + 10 + 10 + 20 + 10);
  EXPECT_EQ(c.height, 10 + 10 + 10);
  EXPECT_EQ(compose({a, b}, 1).height, 10 + 10 + 10 + 5 + 10);
  EXPECT_NE(error_of([] { compose({}, 1); }).find("[plot] compose"), std::string::npos);
}

}  // namespace
}  // namespace qkv::plot
