// safetensors reader: every validation rule has its own test and message check, plus known parser bugs as
// regressions, and the dtype conversions. Files on disk, raw dtypes and writing: safetensors_io_test.cpp.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "qkv/core/safetensors.h"
#include "safetensors_testing.h"

namespace qkv {
namespace {

using namespace testing::safetensors;

// --- valid files --------------------------------------------------------------------------------------------------

TEST(SafeTensors, EmptyFileWithSpacePaddingLoads) {
  const SafeTensorsFile f = load_bytes(file_bytes("{}      "));
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_TRUE(f.metadata.empty());
}

TEST(SafeTensors, ReferenceSerializationBytesLoad) {
  // The reference implementation's own test vector (attn.0, F32, shape [1, 2, 3]).
  const std::string bytes = file_bytes("{" + entry("attn.0", "F32", "[1,2,3]", "[0,24]") + "}", f32_bytes({0, 1, 2, 3, 4, 5}));
  const SafeTensorsFile f = load_bytes(bytes);
  ASSERT_EQ(f.tensors.count("attn.0"), 1u);
  const Tensor& t = f.tensors.at("attn.0");
  EXPECT_EQ(t.shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(t.to_vector(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

TEST(SafeTensors, MetadataAndEscapedNamesAreKept) {
  const std::string h = "{\"__metadata__\":{\"format\":\"pt\",\"k\\u00e9\\n\":\"\\ud83d\\ude00\"}," +
                        entry("a\\\"b", "F32", "[1]", "[0,4]") + "}";
  const SafeTensorsFile f = load_bytes(file_bytes(h, f32_bytes({7})));
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.metadata.at("k\xc3\xa9\n"), "\xf0\x9f\x98\x80");
  EXPECT_EQ(f.tensors.at("a\"b").item(), 7.0f);
}

TEST(SafeTensors, ScalarAndZeroSizeTensors) {
  const std::string h = "{" + entry("s", "F32", "[]", "[0,4]") + "," + entry("z", "F32", "[0,3]", "[4,4]") + "," +
                        entry("z2", "F16", "[2,0]", "[4,4]") + "," + entry("w", "F32", "[1]", "[4,8]") + "}";
  const SafeTensorsFile f = load_bytes(file_bytes(h, f32_bytes({1.5f, 2.5f})));
  EXPECT_EQ(f.tensors.at("s").shape(), Shape{});
  EXPECT_EQ(f.tensors.at("s").item(), 1.5f);
  EXPECT_EQ(f.tensors.at("z").shape(), (Shape{0, 3}));
  EXPECT_EQ(f.tensors.at("z2").shape(), (Shape{2, 0}));
  EXPECT_EQ(f.tensors.at("w").item(), 2.5f);
}

TEST(SafeTensors, TensorsListedOutOfOffsetOrderLoad) {
  const std::string h = "{" + entry("b", "F32", "[1]", "[4,8]") + "," + entry("a", "F32", "[1]", "[0,4]") + "}";
  const SafeTensorsFile f = load_bytes(file_bytes(h, f32_bytes({1, 2})));
  EXPECT_EQ(f.tensors.at("a").item(), 1.0f);
  EXPECT_EQ(f.tensors.at("b").item(), 2.0f);
}

TEST(SafeTensors, JsonWhitespaceInsideTheObjectIsAllowed) {
  const std::string h = "{ \"a\" :\t{\"dtype\" : \"F32\",\n\"shape\":[ 1 ],\r\"data_offsets\":[0 , 4]} }  ";
  EXPECT_EQ(load_bytes(file_bytes(h, f32_bytes({3}))).tensors.at("a").item(), 3.0f);
}

TEST(SafeTensors, HeaderListsTensorsWithTheirOffsets) {
  const std::string h = "{" + entry("b", "U8", "[3]", "[4,7]") + "," + entry("a", "F32", "[1]", "[0,4]") + "}";
  const std::string bytes = file_bytes(h, zeros(7));
  const SafeTensorsHeader hd = parse_safetensors_header(bytes.data(), bytes.size());
  EXPECT_EQ(hd.header_size, h.size());
  EXPECT_EQ(hd.data_size, 7u);
  ASSERT_EQ(hd.entries.size(), 2u);
  EXPECT_EQ(hd.entries[0].name, "a");  // sorted by offset
  EXPECT_EQ(hd.entries[1].dtype, SafeTensorsDtype::U8);
  EXPECT_EQ(hd.entries[1].begin, 4u);
  EXPECT_EQ(hd.entries[1].end, 7u);
}

// --- dtype conversion ---------------------------------------------------------------------------------------------

std::vector<float> load_one(const std::string& dtype, size_t n, const std::string& data) {
  const std::string h = "{" + entry("x", dtype, "[" + std::to_string(n) + "]", "[0," + std::to_string(data.size()) + "]") + "}";
  return load_bytes(file_bytes(h, data)).tensors.at("x").to_vector();
}

TEST(SafeTensorsDtype, F16IncludingSubnormalInfNaNAndNegativeZero) {
  const std::vector<uint16_t> h = {0x3C00, 0xC000, 0x0001, 0x03FF, 0x7BFF, 0x7C00, 0xFC00, 0x8000, 0x7E00};
  const std::vector<float> v = load_one("F16", h.size(), raw(h));
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -2.0f);
  EXPECT_EQ(v[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(v[3], std::ldexp(1023.0f, -24));
  EXPECT_EQ(v[4], 65504.0f);
  EXPECT_EQ(v[5], std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[6], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(same_bits(v[7], -0.0f));
  EXPECT_TRUE(std::isnan(v[8]));
}

TEST(SafeTensorsDtype, BF16IsTheHighHalfOfF32) {
  const std::vector<uint16_t> h = {0x3F80, 0xC049, 0x7F80, 0x0001};
  const std::vector<float> v = load_one("BF16", h.size(), raw(h));
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_TRUE(same_bits(v[1], std::bit_cast<float>(0xC0490000u)));
  EXPECT_EQ(v[2], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(same_bits(v[3], std::bit_cast<float>(0x00010000u)));
}

TEST(SafeTensorsDtype, F64RoundsToNearestFloat) {
  const std::vector<double> d = {0.1, -1e300, 1.0 + 1e-12};
  const std::vector<float> v = load_one("F64", d.size(), raw(d));
  EXPECT_EQ(v[0], 0.1f);
  EXPECT_EQ(v[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[2], 1.0f);
}

TEST(SafeTensorsDtype, IntegersAndBool) {
  EXPECT_EQ(load_one("I8", 2, raw(std::vector<int8_t>{-128, 127})), (std::vector<float>{-128, 127}));
  EXPECT_EQ(load_one("U8", 2, raw(std::vector<uint8_t>{0, 255})), (std::vector<float>{0, 255}));
  EXPECT_EQ(load_one("I16", 1, raw(std::vector<int16_t>{-32768})), (std::vector<float>{-32768}));
  EXPECT_EQ(load_one("U16", 1, raw(std::vector<uint16_t>{65535})), (std::vector<float>{65535}));
  EXPECT_EQ(load_one("I32", 1, raw(std::vector<int32_t>{-7})), (std::vector<float>{-7}));
  EXPECT_EQ(load_one("U32", 1, raw(std::vector<uint32_t>{4000000000u})), (std::vector<float>{4e9f}));
  EXPECT_EQ(load_one("I64", 1, raw(std::vector<int64_t>{INT64_MIN})), (std::vector<float>{-9.223372036854775808e18f}));
  EXPECT_EQ(load_one("U64", 1, raw(std::vector<uint64_t>{UINT64_MAX})), (std::vector<float>{1.8446744073709552e19f}));
  EXPECT_EQ(load_one("BOOL", 3, std::string("\x01\x00\x01", 3)), (std::vector<float>{1, 0, 1}));
}

TEST(SafeTensorsDtype, Float8Variants) {
  // F8_E4M3 (fn): 0x38 = 1, 0x7E = 448 (max), 0x7F NaN, 0x01 = 2^-9 (subnormal).
  auto e4m3 = load_one("F8_E4M3", 4, "\x38\x7e\x7f\x01");
  EXPECT_EQ(e4m3[0], 1.0f);
  EXPECT_EQ(e4m3[1], 448.0f);
  EXPECT_TRUE(std::isnan(e4m3[2]));
  EXPECT_EQ(e4m3[3], std::ldexp(1.0f, -9));
  // F8_E5M2: 0x3C = 1, 0x7B = 57344, 0x7C = inf, 0xFC = -inf, 0x7D NaN.
  auto e5m2 = load_one("F8_E5M2", 5, "\x3c\x7b\x7c\xfc\x7d");
  EXPECT_EQ(e5m2[0], 1.0f);
  EXPECT_EQ(e5m2[1], 57344.0f);
  EXPECT_EQ(e5m2[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(e5m2[3], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(e5m2[4]));
  // fnuz: bias one higher, 0x80 is the only NaN, 0x7F is finite.
  auto e4fnuz = load_one("F8_E4M3FNUZ", 3, std::string("\x40\x80\x7f", 3));
  EXPECT_EQ(e4fnuz[0], 1.0f);
  EXPECT_TRUE(std::isnan(e4fnuz[1]));
  EXPECT_EQ(e4fnuz[2], 240.0f);
  auto e5fnuz = load_one("F8_E5M2FNUZ", 2, std::string("\x40\x80", 2));
  EXPECT_EQ(e5fnuz[0], 1.0f);
  EXPECT_TRUE(std::isnan(e5fnuz[1]));
  // F8_E8M0: 2^(b - 127), 0xFF NaN.
  auto e8m0 = load_one("F8_E8M0", 3, std::string("\x7f\x80\xff", 3));
  EXPECT_EQ(e8m0[0], 1.0f);
  EXPECT_EQ(e8m0[1], 2.0f);
  EXPECT_TRUE(std::isnan(e8m0[2]));
}

TEST(SafeTensorsDtype, NamesAndBitWidths) {
  EXPECT_STREQ(dtype_name(SafeTensorsDtype::BF16), "BF16");
  EXPECT_EQ(dtype_bits(SafeTensorsDtype::F4), 4);
  EXPECT_EQ(dtype_bits(SafeTensorsDtype::F6_E3M2), 6);
  EXPECT_EQ(dtype_bits(SafeTensorsDtype::C64), 64);
  EXPECT_FALSE(dtype_converts_to_float32(SafeTensorsDtype::C64));
  EXPECT_TRUE(dtype_converts_to_float32(SafeTensorsDtype::F8_E8M0));
}

TEST(SafeTensorsDtype, ValidButUnconvertibleDtypeIsRuntimeErrorAfterValidation) {
  struct Case {
    const char* dtype;
    size_t bytes;  // of 4 elements
  };
  for (const Case c : {Case{"C64", 32}, Case{"F4", 2}, Case{"F6_E2M3", 3}, Case{"F6_E3M2", 3}}) {
    const std::string offsets = std::string("[0,") + std::to_string(c.bytes) + "]";
    const std::string bytes = file_bytes(std::string("{") + entry("c", c.dtype, "[4]", offsets) + "}", zeros(c.bytes));
    EXPECT_NO_THROW(parse_safetensors_header(bytes.data(), bytes.size())) << c.dtype;
    try {
      load_bytes(bytes);
      ADD_FAILURE() << c.dtype << " loaded";
    } catch (const std::invalid_argument& e) {
      ADD_FAILURE() << c.dtype << " valid file reported malformed: " << e.what();
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("[safetensors] tensor \"c\" has dtype"), std::string::npos) << e.what();
    }
  }
}

// --- rule: file size and header size ---------------------------------------------------------------------------

TEST(SafeTensorsRules, FileShorterThan8Bytes) {
  EXPECT_MALFORMED(std::string(), "file is 0 bytes, shorter than the 8-byte header size field");
  EXPECT_MALFORMED(std::string(7, '\0'), "file is 7 bytes");
}

TEST(SafeTensorsRules, HeaderSizeAbove100MB) {
  EXPECT_MALFORMED(raw_size(100'000'001) + "{}", "header size 100000001 exceeds the limit of 100000000 bytes");
  EXPECT_MALFORMED(raw_size(UINT64_MAX) + "{}", "exceeds the limit");
}

TEST(SafeTensorsRules, HeaderSizeOfExactly100MBIsNotTooLargeButPastEnd) {
  EXPECT_MALFORMED(raw_size(100'000'000) + "{}", "header size 100000000 runs past the end of the file");
}

TEST(SafeTensorsRules, HeaderSizePastEndOfFile) {
  EXPECT_MALFORMED(raw_size(3) + "{}", "header size 3 runs past the end of the file (2 bytes follow");
}

// --- rule: header is UTF-8 JSON object --------------------------------------------------------------------------

TEST(SafeTensorsRules, HeaderNotUtf8) {
  EXPECT_MALFORMED(file_bytes("{\"\xff\":1}"), "header: not valid UTF-8 (at byte 2)");
  EXPECT_MALFORMED(file_bytes("{\"\xc0\xaf\":1}"), "not valid UTF-8");      // overlong '/'
  EXPECT_MALFORMED(file_bytes("{\"\xed\xa0\x80\":1}"), "not valid UTF-8");  // encoded surrogate
  EXPECT_MALFORMED(file_bytes("{\"\xf4\x90\x80\x80\":1}"), "not valid UTF-8");  // above U+10FFFF
  EXPECT_MALFORMED(file_bytes("{\"\xe2\x82\":1}"), "not valid UTF-8");      // truncated sequence
}

TEST(SafeTensorsRules, HeaderNotJson) {
  EXPECT_MALFORMED(file_bytes("{abc"), "invalid JSON: expected a string key");
  EXPECT_MALFORMED(file_bytes("{\"a\""), "invalid JSON: unexpected end, expected ':'");
  EXPECT_MALFORMED(file_bytes("{\"a"), "invalid JSON: unterminated string");
  EXPECT_MALFORMED(file_bytes("xyz"), "header is not JSON: it starts with 'x'");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1,]", "[0,4]") + "}", zeros(4)), "trailing comma");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[0,4]") + ",}", zeros(4)), "trailing comma");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[01]", "[0,4]") + "}", zeros(4)), "leading zero");
  EXPECT_MALFORMED(file_bytes("{\"a\x01\":{}}"), "control character in a string");
  EXPECT_MALFORMED(file_bytes("{\"a\\x\":{}}"), "invalid escape sequence");
  EXPECT_MALFORMED(file_bytes("{\"\\ud800\":{}}"), "lone high surrogate");
  EXPECT_MALFORMED(file_bytes("{\"\\ude00\":{}}"), "lone low surrogate");
  EXPECT_MALFORMED(file_bytes("{\"\\u12G4\":{}}"), "bad hex digit");
}

TEST(SafeTensorsRules, HeaderNotAnObject) {
  EXPECT_MALFORMED(file_bytes("[]"), "header is not a JSON object: it starts with an array");
  EXPECT_MALFORMED(file_bytes("\"x\""), "header is not a JSON object: it starts with a string");
  EXPECT_MALFORMED(file_bytes("1"), "header is not a JSON object: it starts with a number");
  EXPECT_MALFORMED(file_bytes(""), "header is empty");
}

TEST(SafeTensorsRules, LeadingWhitespaceRejectedThoughReferenceAcceptsIt) {
  EXPECT_MALFORMED(file_bytes("  {}"), "header must start with '{', found leading whitespace");
  EXPECT_MALFORMED(file_bytes("\n{}"), "leading whitespace (byte 0x0a)");
}

TEST(SafeTensorsRules, PaddingMustBeSpaces) {
  EXPECT_MALFORMED(file_bytes("{}\n"), "padding after the JSON object must be spaces (0x20), found byte 0x0a");
  EXPECT_MALFORMED(file_bytes(std::string("{}\0\0", 4)), "unexpected byte 0x00 after the JSON object");
  EXPECT_MALFORMED(file_bytes("{}{}"), "unexpected '{' after the JSON object");
}

TEST(SafeTensorsRules, DeepNestingIsRejectedWithoutRecursion) {
  const std::string deep(200000, '[');
  EXPECT_MALFORMED(file_bytes("{\"__metadata__\":{\"k\":" + deep + "}}"), "must be a string, got an array");
  EXPECT_MALFORMED(file_bytes("{\"a\":{\"shape\":" + deep + "}}"), "shape dimension of tensor \"a\" must be a non-negative integer, got an array");
}

// --- rule: dtype ---------------------------------------------------------------------------------------------------

TEST(SafeTensorsRules, UnknownDtype) {
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F128", "[1]", "[0,16]") + "}", zeros(16)),
                   "unknown dtype \"F128\" for tensor \"a\"");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "f32", "[1]", "[0,4]") + "}", zeros(4)), "unknown dtype \"f32\"");
  EXPECT_MALFORMED(file_bytes("{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", zeros(4)),
                   "dtype of tensor \"a\" must be a string, got a number");
}

// Regression (parsers that skip validation for dtypes they do not know): an unknown dtype never lets broken
// offsets through, and a known-but-unconvertible dtype is still checked for size and coverage.
TEST(SafeTensorsRegression, UnknownOrUnconvertibleDtypeDoesNotSkipValidation) {
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "Q4", "[1]", "[0,999]") + "}"), "unknown dtype \"Q4\"");
  EXPECT_MALFORMED(file_bytes("{" + entry("c", "C64", "[2]", "[0,8]") + "}", zeros(8)),
                   "C64 tensor \"c\" with shape (2,) needs 16 bytes but data_offsets [0, 8] span 8");
  EXPECT_MALFORMED(file_bytes("{" + entry("c", "F4", "[4]", "[0,2]") + "}", zeros(3)), "1 trailing bytes");
  EXPECT_MALFORMED(file_bytes("{" + entry("c", "F6_E3M2", "[4]", "[2,5]") + "}", zeros(5)), "hole at the start");
}

TEST(SafeTensorsRules, EveryDtypeHasItsSizeChecked) {
  const std::vector<std::pair<std::string, int>> dtypes = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"F8_E4M3FNUZ", 1},
      {"F8_E5M2FNUZ", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2}, {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},
      {"C64", 8}, {"F64", 8}, {"I64", 8}, {"U64", 8}};
  for (const auto& [dt, size] : dtypes) {
    const std::string n = std::to_string(2 * size), n1 = std::to_string(2 * size + 1);
    const std::string good_file = file_bytes(std::string("{") + entry("t", dt, "[2]", "[0," + n + "]") + "}", zeros(2 * size));
    EXPECT_NO_THROW(parse_safetensors_header(good_file.data(), good_file.size())) << dt;
    const std::string bad_file = file_bytes(std::string("{") + entry("t", dt, "[2]", "[0," + n1 + "]") + "}", zeros(2 * size + 1));
    EXPECT_MALFORMED(bad_file, std::string("needs ") + n + " bytes but data_offsets [0, " + n1 + "]");
  }
}

TEST(SafeTensorsRules, SubByteDtypeMustEndOnAByteBoundary) {
  EXPECT_MALFORMED(file_bytes("{" + entry("f", "F4", "[3]", "[0,2]") + "}", zeros(2)),
                   "F4 tensor \"f\" with shape (3,) holds 12 bits, which do not end on a byte boundary");
  EXPECT_MALFORMED(file_bytes("{" + entry("f", "F6_E2M3", "[3]", "[0,3]") + "}", zeros(3)), "holds 18 bits");
}

// --- rule: __metadata__ --------------------------------------------------------------------------------------------

TEST(SafeTensorsRules, MetadataMustBeStringToString) {
  EXPECT_MALFORMED(file_bytes("{\"__metadata__\":{\"a\":1}}"), "__metadata__ value of key \"a\" must be a string, got a number");
  EXPECT_MALFORMED(file_bytes("{\"__metadata__\":{\"a\":{}}}"), "must be a string, got an object");
  EXPECT_MALFORMED(file_bytes("{\"__metadata__\":{\"a\":true}}"), "must be a string, got a boolean");
  EXPECT_MALFORMED(file_bytes("{\"__metadata__\":[]}"), "__metadata__ must be an object of string -> string, got an array");
  // The reference accepts null here; qkv does not.
  EXPECT_MALFORMED(file_bytes("{\"__metadata__\":null}"), "__metadata__ must be an object of string -> string, got null");
}

// --- rule: duplicates ------------------------------------------------------------------------------------------------

TEST(SafeTensorsRules, DuplicateTensorNameRejectedNotCollapsed) {
  const std::string h = "{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("a", "F32", "[1]", "[4,8]") + "}";
  EXPECT_MALFORMED(file_bytes(h, zeros(8)), "duplicate tensor name \"a\"");
}

TEST(SafeTensorsRules, DuplicateMetadataKeyAndSection) {
  EXPECT_MALFORMED(file_bytes("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}"), "duplicate __metadata__ key \"k\"");
  EXPECT_MALFORMED(file_bytes("{\"__metadata__\":{},\"__metadata__\":{}}"), "duplicate __metadata__ section");
}

TEST(SafeTensorsRules, DuplicateOrUnknownOrMissingField) {
  EXPECT_MALFORMED(file_bytes("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", zeros(4)),
                   "duplicate field \"dtype\" in tensor \"a\"");
  EXPECT_MALFORMED(file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"shape\":[1],\"data_offsets\":[0,4]}}", zeros(4)),
                   "duplicate field \"shape\"");
  EXPECT_MALFORMED(file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"data_offsets\":[0,4]}}", zeros(4)),
                   "duplicate field \"data_offsets\"");
  EXPECT_MALFORMED(file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", zeros(4)),
                   "unknown field \"x\" in tensor \"a\"");
  EXPECT_MALFORMED(file_bytes("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", zeros(4)), "tensor \"a\" has no dtype");
  EXPECT_MALFORMED(file_bytes("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", zeros(4)), "tensor \"a\" has no shape");
  EXPECT_MALFORMED(file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", zeros(4)), "tensor \"a\" has no data_offsets");
  EXPECT_MALFORMED(file_bytes("{\"a\":1}"), "tensor \"a\" must be an object");
}

// --- rule: data_offsets and shape values ------------------------------------------------------------------------------

TEST(SafeTensorsRules, DataOffsetsMustBeBeginEndPair) {
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[0,4,4]") + "}", zeros(4)), "must be [begin, end], got more than 2 values");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[4]") + "}", zeros(4)), "must be [begin, end], got 1 value");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[]") + "}", zeros(4)), "got 0 values");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "\"0,4\"") + "}", zeros(4)), "must be [begin, end], got a string");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[0]", "[4,0]") + "}", zeros(4)), "are [4, 0]: begin must not exceed end");
}

TEST(SafeTensorsRules, OffsetsAndDimsMustBeNonNegativeIntegers) {
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[0,4.0]") + "}", zeros(4)), "must be an integer, got 4.0");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[0,4e0]") + "}", zeros(4)), "must be an integer, got 4e0");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[-0,4]") + "}", zeros(4)), "must be non-negative, got -0");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[-1]", "[0,4]") + "}", zeros(4)), "must be non-negative, got -1");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1.5]", "[0,4]") + "}", zeros(4)), "must be an integer, got 1.5");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[0,-]") + "}", zeros(4)), "invalid number");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[0,null]") + "}", zeros(4)), "got null");
}

// Regression (negative or huge offsets): offsets beyond 2^64 are rejected while parsing; offsets near 2^64 never
// wrap an end-of-buffer computation.
TEST(SafeTensorsRegression, NegativeOrHugeOffsets) {
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[-4,0]") + "}", zeros(4)), "must be non-negative, got -4");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[0,18446744073709551620]") + "}", zeros(4)),
                   "18446744073709551620 does not fit in 64 bits");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[18446744073709551612,18446744073709551615]") + "}", zeros(4)),
                   "needs 4 bytes but data_offsets [18446744073709551612, 18446744073709551615] span 3");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[18446744073709551611,18446744073709551615]") + "}", zeros(4)),
                   "hole at the start of the data buffer");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[0]", "[18446744073709551615,18446744073709551615]") + "}"),
                   "hole at the start");
}

// --- rule: size arithmetic ------------------------------------------------------------------------------------------

// Regression: an unchecked product 2^32 * 2^32 wraps to 0 and matches data_offsets [0, 0].
TEST(SafeTensorsRegression, ShapeProductThatWrapsToZero) {
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[4294967296,4294967296]", "[0,0]") + "}"),
                   "element count of tensor \"a\" with shape (4294967296, 4294967296) overflows 64 bits");
  // 2^59 elements x 64 bits = 2^65 bits wraps to 0 too.
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F64", "[576460752303423488]", "[0,0]") + "}"),
                   "byte size of F64 tensor \"a\" with shape (576460752303423488,) overflows 64 bits");
}

TEST(SafeTensorsRules, DimensionAboveInt64AndHugeZeroSizeShapes) {
  // The reference accepts these empty tensors; qkv shapes are int64 with representable strides.
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[0,9223372036854775808]", "[0,0]") + "}"),
                   "shape dimension 9223372036854775808 of tensor \"a\" exceeds int64");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[0,4294967296,4294967296]", "[0,0]") + "}"),
                   "is too large: its non-zero dimensions times 4 bytes pass int64");
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[0,2305843009213693952]", "[0,0]") + "}"), "times 4 bytes");
  const SafeTensorsFile f = load_bytes(file_bytes("{" + entry("a", "F32", "[0,2305843009213693951]", "[0,0]") + "}"));
  EXPECT_EQ(f.tensors.at("a").shape(), (Shape{0, 2305843009213693951}));
}

TEST(SafeTensorsRules, SizeDoesNotMatchOffsets) {
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[2,3]", "[0,20]") + "}", zeros(20)),
                   "F32 tensor \"a\" with shape (2, 3) needs 24 bytes but data_offsets [0, 20] span 20");
}

// --- rule: coverage of the data buffer -------------------------------------------------------------------------------

TEST(SafeTensorsRules, OverlappingTensors) {
  const std::string h = "{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[4,12]") + "}";
  EXPECT_MALFORMED(file_bytes(h, zeros(12)), "tensor \"a\" [0, 8] and tensor \"b\" [4, 12] overlap");
  const std::string same = "{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[0,4]") + "}";
  EXPECT_MALFORMED(file_bytes(same, zeros(4)), "overlap");
}

TEST(SafeTensorsRules, HolesInTheBuffer) {
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[4,8]") + "}", zeros(8)),
                   "hole at the start of the data buffer: the first tensor \"a\" begins at byte 4, not 0");
  const std::string h = "{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]") + "}";
  EXPECT_MALFORMED(file_bytes(h, zeros(12)), "hole in the data buffer: bytes [4, 8) between tensor \"a\" and tensor \"b\"");
}

TEST(SafeTensorsRules, TrailingBytesAfterTheBuffer) {
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[1]", "[0,4]") + "}", zeros(5)),
                   "1 trailing bytes after the last tensor's data");
  EXPECT_MALFORMED(file_bytes("{}", zeros(3)), "3 trailing bytes");
}

TEST(SafeTensorsRules, BufferPastEndOfFile) {
  EXPECT_MALFORMED(file_bytes("{" + entry("a", "F32", "[2]", "[0,8]") + "}", zeros(4)),
                   "tensor \"a\" ends at byte 8 of the data buffer, past its end (4 bytes; is the file truncated?)");
}

TEST(SafeTensorsRules, BoolBytesMustBeZeroOrOne) {
  EXPECT_MALFORMED(file_bytes("{" + entry("b", "BOOL", "[2]", "[0,2]") + "}", std::string("\x01\x02", 2)),
                   "BOOL tensor \"b\" holds byte 2 at element 1; only 0 and 1 are valid");
}

TEST(SafeTensorsRules, NullBufferWithNonZeroSize) {
  EXPECT_THROW(parse_safetensors_header(nullptr, 8), std::invalid_argument);
}

}  // namespace
}  // namespace qkv
