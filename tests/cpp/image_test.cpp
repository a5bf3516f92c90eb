// Tests of the PNG encoder, the heatmap layout and atomic file writes.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "qkv/plot/image.h"
#include "qkv/core/io.h"

namespace qkv {
namespace {

uint32_t be32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) |
         (uint32_t(uint8_t(s[at + 2])) << 8) | uint32_t(uint8_t(s[at + 3]));
}

TEST(Png, HeaderChunksAndPixelsRoundTripThroughZlib) {
  Image img(3, 2, 0);
  img.set(0, 0, 255, 0, 0);
  img.set(2, 1, 1, 2, 3);
  const std::string png = encode_png(img);
  ASSERT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  EXPECT_EQ(be32(png, 16), 3u);
  EXPECT_EQ(be32(png, 20), 2u);
  // Every chunk's CRC matches; collect IDAT.
  size_t at = 8;
  std::string idat;
  bool saw_end = false;
  while (at < png.size()) {
    const uint32_t len = be32(png, at);
    const std::string type = png.substr(at + 4, 4);
    const std::string body = png.substr(at + 4, 4 + len);
    const uint32_t crc = be32(png, at + 8 + len);
    EXPECT_EQ(crc, uint32_t(crc32(0, reinterpret_cast<const Bytef*>(body.data()), uInt(body.size())))) << type;
    if (type == "IDAT") idat += png.substr(at + 8, len);
    if (type == "IEND") saw_end = true;
    at += 12 + len;
  }
  EXPECT_TRUE(saw_end);
  std::string raw(2 * (3 * 3 + 1), '\0');
  uLongf n = raw.size();
  ASSERT_EQ(uncompress(reinterpret_cast<Bytef*>(raw.data()), &n, reinterpret_cast<const Bytef*>(idat.data()),
                       uLong(idat.size())),
            Z_OK);
  EXPECT_EQ(uint8_t(raw[1]), 255);             // (0,0) red
  EXPECT_EQ(uint8_t(raw[10 + 1 + 6 + 2]), 3);  // (2,1) blue
}

TEST(Heatmap, RejectsMapsThatAreNotTwoDimensional) {
  try {
    heatmap_grid({Tensor::zeros({2, 2, 2})}, 4, 2);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[heatmap]"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("(2, 2, 2)"), std::string::npos);
  }
  EXPECT_THROW(heatmap_grid({}, 4, 2), std::invalid_argument);
  EXPECT_THROW(heatmap_grid({Tensor::zeros({2, 2})}, 0, 2), std::invalid_argument);
}

TEST(Heatmap, LargestValueGetsTheTopColour) {
  Tensor m = Tensor::from_vector({1, 2}, {0.0f, 1.0f});
  const Image img = heatmap_grid({m}, 2, 1, 1.0f);
  uint8_t lo[3], hi[3];
  viridis(0.0f, lo);
  viridis(1.0f, hi);
  const int gap = 4;
  auto px = [&](int x, int y) { return &img.rgb[(size_t(y) * img.width + x) * 3]; };
  EXPECT_EQ(px(gap, gap)[0], lo[0]);
  EXPECT_EQ(px(gap + 2, gap)[1], hi[1]);
  EXPECT_EQ(img.width, gap + 2 * 2 + gap);
}

TEST(AtomicWrite, ReplacesContentAndLeavesNoTemporaryFiles) {
  const auto dir = std::filesystem::temp_directory_path() / "qkv_io_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "f.bin").string();
  write_file_atomic(path, "first");
  write_file_atomic(path, "second");
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "second");
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) (void)e, ++files;
  EXPECT_EQ(files, 1);
  std::filesystem::remove_all(dir);
}

TEST(AtomicWrite, MissingDirectoryIsARuntimeError) {
  EXPECT_THROW(write_file_atomic("/nonexistent-dir-qkv/x.png", "x"), std::runtime_error);
}

}  // namespace
}  // namespace qkv
