// RGB images, PNG encoding and attention heatmaps, so that demos and experiments can show what they measured.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/core/tensor.h"

namespace qkv {

struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes a pixel

  Image() = default;
  Image(int w, int h, uint8_t gray = 255);
  void set(int x, int y, uint8_t r, uint8_t g, uint8_t b);  // ignores pixels outside the image
  void fill_rect(int x, int y, int w, int h, uint8_t r, uint8_t g, uint8_t b);
};

// Maps t in [0, 1] to a perceptually ordered colour (viridis control points, linear in between).
void viridis(float t, uint8_t* rgb);

// Lays out 2-D maps (each (R, C), values in [0, vmax]) side by side, `columns` per row, each cell `cell_px` wide.
// vmax <= 0 means "the largest value over all maps". Throws std::invalid_argument on a map that is not 2-D or empty.
Image heatmap_grid(const std::vector<Tensor>& maps, int cell_px, int columns, float vmax = 0.0f);

// PNG bytes (8-bit RGB, zlib-compressed).
std::string encode_png(const Image& image);
// Writes a PNG atomically. Throws std::runtime_error "[png] ..." on I/O failure.
void write_png(const std::string& path, const Image& image);

}  // namespace qkv
