// PNG encoder (zlib for IDAT, CRC per chunk) and the heatmap layout used by `qkv demo` and the experiments.
#include "qkv/plot/image.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>

#include "qkv/core/error.h"
#include "qkv/core/io.h"

namespace qkv {

Image::Image(int w, int h, uint8_t gray) : width(w), height(h) {
  QKV_CHECK_ARG(w > 0 && h > 0 && static_cast<int64_t>(w) * h <= (int64_t{1} << 28),
                "[image] invalid size ", w, "x", h);
  rgb.assign(static_cast<size_t>(w) * h * 3, gray);
}

void Image::set(int x, int y, uint8_t r, uint8_t g, uint8_t b) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  uint8_t* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
  p[0] = r;
  p[1] = g;
  p[2] = b;
}

void Image::fill_rect(int x, int y, int w, int h, uint8_t r, uint8_t g, uint8_t b) {
  for (int yy = std::max(0, y); yy < std::min(height, y + h); ++yy)
    for (int xx = std::max(0, x); xx < std::min(width, x + w); ++xx) set(xx, yy, r, g, b);
}

void viridis(float t, uint8_t* out) {
  static const float kStops[9][3] = {
      {68, 1, 84},    {71, 44, 122},  {59, 81, 139},   {44, 113, 142}, {33, 144, 141},
      {39, 173, 129}, {92, 200, 99},  {170, 220, 50},  {253, 231, 37}};
  if (!(t >= 0.0f)) t = 0.0f;  // NaN maps to the bottom colour
  t = std::min(t, 1.0f) * 8.0f;
  const int i = std::min(static_cast<int>(t), 7);
  const float f = t - static_cast<float>(i);
  for (int c = 0; c < 3; ++c)
    out[c] = static_cast<uint8_t>(std::lround(kStops[i][c] + f * (kStops[i + 1][c] - kStops[i][c])));
}

Image heatmap_grid(const std::vector<Tensor>& maps, int cell_px, int columns, float vmax) {
  QKV_CHECK_ARG(!maps.empty(), "[heatmap] no maps given");
  QKV_CHECK_ARG(cell_px > 0 && columns > 0, "[heatmap] cell_px and columns must be positive, got ",
                cell_px, " and ", columns);
  int64_t rows_max = 0, cols_max = 0;
  float top = 0.0f;
  for (const Tensor& m : maps) {
    QKV_CHECK_ARG(m.defined() && m.dim() == 2 && m.numel() > 0, "[heatmap] each map must be 2-D and non-empty, got ",
                  m.defined() ? str(m.shape()) : std::string("undefined"));
    rows_max = std::max(rows_max, m.size(0));
    cols_max = std::max(cols_max, m.size(1));
    for (float x : m.to_vector()) top = std::max(top, x);
  }
  if (vmax <= 0.0f) vmax = top > 0.0f ? top : 1.0f;
  const int n = static_cast<int>(maps.size());
  const int grid_cols = std::min(columns, n);
  const int grid_rows = (n + grid_cols - 1) / grid_cols;
  const int gap = std::max(4, cell_px);
  const int panel_w = static_cast<int>(cols_max) * cell_px, panel_h = static_cast<int>(rows_max) * cell_px;
  Image img(gap + grid_cols * (panel_w + gap), gap + grid_rows * (panel_h + gap), 255);
  for (int k = 0; k < n; ++k) {
    const Tensor& m = maps[k];
    const int x0 = gap + (k % grid_cols) * (panel_w + gap);
    const int y0 = gap + (k / grid_cols) * (panel_h + gap);
    for (int64_t r = 0; r < m.size(0); ++r)
      for (int64_t c = 0; c < m.size(1); ++c) {
        uint8_t col[3];
        viridis(m.at({r, c}) / vmax, col);
        img.fill_rect(x0 + static_cast<int>(c) * cell_px, y0 + static_cast<int>(r) * cell_px, cell_px,
                      cell_px, col[0], col[1], col[2]);
      }
  }
  return img;
}

namespace {

void put_u32(std::string& s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_chunk(std::string& out, const char* type, const std::string& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  std::string body(type, 4);
  body += data;
  out += body;
  put_u32(out, static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(body.data()),
                                           static_cast<uInt>(body.size()))));
}

}  // namespace

std::string encode_png(const Image& image) {
  QKV_CHECK_ARG(image.width > 0 && image.height > 0 &&
                    image.rgb.size() == static_cast<size_t>(image.width) * image.height * 3,
                "[png] image of ", image.width, "x", image.height, " has ", image.rgb.size(), " bytes");
  std::string raw;
  raw.reserve(static_cast<size_t>(image.height) * (image.width * 3 + 1));
  for (int y = 0; y < image.height; ++y) {
    raw.push_back(0);  // filter: none
    raw.append(reinterpret_cast<const char*>(&image.rgb[static_cast<size_t>(y) * image.width * 3]),
               static_cast<size_t>(image.width) * 3);
  }
  uLongf zlen = compressBound(static_cast<uLong>(raw.size()));
  std::string z(zlen, '\0');
  QKV_CHECK_RUNTIME(compress2(reinterpret_cast<Bytef*>(z.data()), &zlen,
                              reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()),
                              6) == Z_OK,
                    "[png] zlib compression failed");
  z.resize(zlen);
  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_u32(ihdr, static_cast<uint32_t>(image.width));
  put_u32(ihdr, static_cast<uint32_t>(image.height));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit, RGB, deflate, no filter, no interlace
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", z);
  put_chunk(out, "IEND", "");
  return out;
}

void write_png(const std::string& path, const Image& image) { write_file_atomic(path, encode_png(image)); }

}  // namespace qkv
