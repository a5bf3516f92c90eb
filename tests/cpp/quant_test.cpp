// The reference dequantizers (qkv/kernels/quant.h) on hand-made blocks whose values are worked out here from the
// block layout, the argument errors, and whole GGUF tensors to row-major float32. tests/python/test_gguf.py
// compares every type gguf-py can decode against it bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf_testing.h"
#include "qkv/core/half.h"
#include "qkv/kernels/quant.h"

namespace qkv {
namespace {

using namespace testing::gguf_files;
using gguf::Type;
using kernels::dequantize_row;

std::vector<float> run(Type t, const std::string& blocks, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), -999.0f);
  dequantize_row(t, blocks.data(), out.data(), n);
  return out;
}

TEST(Fp16, ExactIncludingSubnormalsInfAndNaN) {
  EXPECT_EQ(fp16_to_float(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_float(0xC000), -2.0f);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(fp16_to_float(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(fp16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_float(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(fp16_to_float(0x8000)));
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7E00)));
  EXPECT_EQ(bf16_bits_to_float(0x3F80), 1.0f);
}

TEST(Dequantize, FloatTypes) {
  EXPECT_EQ(run(Type::F32, f32_bytes({1.5f, -2.0f}), 2), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(run(Type::F16, le<uint16_t>(0x3C00) + le<uint16_t>(0x0001), 2),
            (std::vector<float>{1.0f, std::ldexp(1.0f, -24)}));
  EXPECT_EQ(run(Type::BF16, le<uint16_t>(0xBF80) + le<uint16_t>(0x4049), 2),
            (std::vector<float>{-1.0f, 3.140625f}));
}

TEST(Dequantize, Q4_0LowNibblesFirst) {
  std::string b = le<uint16_t>(0x4000);  // d = 2
  for (int j = 0; j < 16; ++j) b += static_cast<char>((j & 0x0F) | ((15 - j) << 4));
  const std::vector<float> y = run(Type::Q4_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * static_cast<float>(j - 8));
    EXPECT_EQ(y[j + 16], 2.0f * static_cast<float>(7 - j));
  }
}

TEST(Dequantize, Q5_1HighBitsFromQh) {
  std::string b = le<uint16_t>(0x3800) + le<uint16_t>(0xBC00);  // d = 0.5, m = -1
  b += le<uint32_t>(0x80000001u);                                // element 0 and element 31 get bit 4
  for (int j = 0; j < 16; ++j) b += static_cast<char>(0x21);     // low nibble 1, high nibble 2
  const std::vector<float> y = run(Type::Q5_1, b, 32);
  EXPECT_EQ(y[0], 0.5f * 17.0f - 1.0f);
  EXPECT_EQ(y[1], 0.5f * 1.0f - 1.0f);
  EXPECT_EQ(y[16], 0.5f * 2.0f - 1.0f);
  EXPECT_EQ(y[31], 0.5f * 18.0f - 1.0f);
}

TEST(Dequantize, Q8_1IgnoresTheSum) {
  std::string b = le<uint16_t>(0x3400) + le<uint16_t>(0x7BFF);  // d = 0.25, s unused
  for (int j = 0; j < 32; ++j) b += static_cast<char>(static_cast<int8_t>(j * 8 - 128));
  const std::vector<float> y = run(Type::Q8_1, b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.25f * static_cast<float>(j * 8 - 128));
}

TEST(Dequantize, Q8_KFloat32Scale) {
  std::string b = le<float>(0.1f);
  for (int k = 0; k < 256; ++k) b += static_cast<char>(static_cast<int8_t>(k - 128));
  b += std::string(32, '\x55');  // bsums: not read
  const std::vector<float> y = run(Type::Q8_K, b + b, 512);
  for (int k = 0; k < 512; ++k) EXPECT_EQ(y[k], 0.1f * static_cast<float>(k % 256 - 128));
}

TEST(Dequantize, Q4_KSixBitScalesAndMins) {
  // Scales j < 4 in the low 6 bits of bytes 0..3 (mins 4..7); j >= 4 from the nibbles of bytes 8..11 plus the top
  // two bits of bytes 0..7. Sub-block 5: scale = (b[9] & 15) | (b[1] >> 6) << 4, min = (b[9] >> 4) | (b[5] >> 6) << 4.
  std::string b = le<uint16_t>(0x3C00) + le<uint16_t>(0x3800);  // d = 1, dmin = 0.5
  uint8_t sc[12] = {};
  sc[1] = 0xC3;  // scale 1 = 3; top bits 3 -> scale 5 high bits
  sc[5] = 0x82;  // min 1 = 2; top bits 2 -> min 5 high bits
  sc[9] = 0x7A;  // scale 5 low = 10, min 5 low = 7
  b.append(reinterpret_cast<const char*>(sc), 12);
  for (int i = 0; i < 128; ++i) b += static_cast<char>(0x9 | (0x4 << 4));  // low nibble 9, high nibble 4
  const std::vector<float> y = run(Type::Q4_K, b, 256);
  EXPECT_EQ(y[0], 0.0f);                           // sub-block 0: scale 0, min 0
  EXPECT_EQ(y[32], 1.0f * 3.0f * 4.0f - 0.5f * 2.0f);  // sub-block 1: high nibbles of bytes 0..31
  const float s5 = static_cast<float>(10 | (3 << 4)), m5 = static_cast<float>(7 | (2 << 4));
  EXPECT_EQ(y[5 * 32], s5 * 4.0f - 0.5f * m5);     // sub-block 5: high nibbles of bytes 64..95
}

TEST(Dequantize, Q6_KLayout) {
  std::string b(210, '\0');
  // Element 200: half 1, group 2 (high nibble of ql[64 + 8]), l = 8; high bits at shift 4 of qh[32 + 8]; scale 12.
  b[64 + 8] = static_cast<char>(0x50);
  b[128 + 32 + 8] = static_cast<char>(0x30);
  b[192 + 12] = static_cast<char>(-3);
  b.replace(208, 2, le<uint16_t>(0x3800));  // d = 0.5
  const std::vector<float> y = run(Type::Q6_K, b, 256);
  EXPECT_EQ(y[200], 0.5f * -3.0f * static_cast<float>((5 | (3 << 4)) - 32));
  EXPECT_EQ(y[192], 0.5f * -3.0f * -32.0f);
  EXPECT_EQ(y[0], 0.0f);  // scale 0
}

TEST(Dequantize, RefusesPartialBlocksAndUnknownTypes) {
  std::vector<float> out(64);
  const std::string b(36, '\0');
  try {
    dequantize_row(Type::Q8_0, b.data(), out.data(), 40);
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "[dequantize] 40 elements of Q8_0 are not a whole number of 32-element blocks");
  }
  EXPECT_THROW(dequantize_row(Type::Q8_0, b.data(), out.data(), -32), std::invalid_argument);
  try {
    dequantize_row(Type::IQ2_XXS, b.data(), out.data(), 256);
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "[dequantize] no dequantizer for IQ2_XXS");
  }
  EXPECT_THROW(dequantize_row(static_cast<Type>(4), b.data(), out.data(), 32), std::runtime_error);
  EXPECT_FALSE(kernels::can_dequantize(Type::MXFP4));
  EXPECT_TRUE(kernels::can_dequantize(Type::Q6_K));
  dequantize_row(Type::Q8_0, nullptr, nullptr, 0);  // nothing to do
}

TEST(Dequantize, GgufTensorBecomesRowMajor) {
  Builder bld;
  bld.tensor("w", {3, 2}, 0, f32_bytes({1, 2, 3, 4, 5, 6}));
  std::string q;
  for (int r = 0; r < 3; ++r) {  // three rows of one Q8_0 block, d = r + 1
    q += le<uint16_t>(r == 0 ? 0x3C00 : r == 1 ? 0x4000 : 0x4200);
    for (int j = 0; j < 32; ++j) q += static_cast<char>(j);
  }
  bld.tensor("q", {32, 3}, 8, q);
  bld.tensor("iq", {256}, 16, std::string(66, '\0'));
  const gguf::File f = gguf::File::parse(std::make_shared<const std::string>(bld.build()), "m.gguf");
  const Tensor w = kernels::dequantize(*f.tensor("w"));
  EXPECT_EQ(w.shape(), (Shape{2, 3}));
  EXPECT_EQ(w.to_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  const Tensor t = kernels::dequantize(*f.tensor("q"));
  EXPECT_EQ(t.shape(), (Shape{3, 32}));
  EXPECT_EQ(t.at({2, 5}), 15.0f);
  EXPECT_EQ(t.at({1, 31}), 62.0f);
  try {
    kernels::dequantize(*f.tensor("iq"));
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "[dequantize] tensor 'iq': no dequantizer for IQ2_XXS");
  }
}

}  // namespace
}  // namespace qkv
