// GGUF reader: valid v2 and v3 files, a round trip of every metadata type, and every refusal of qkv/core/gguf.h
// with its message (the file, the key or tensor, the byte). Files are built in memory by gguf_testing.h.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <fstream>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf_testing.h"
#include "qkv/core/gguf.h"

namespace qkv {
namespace {

using namespace testing::gguf_files;
using gguf::File;

constexpr const char* kName = "t.gguf";

File parse(const std::string& bytes) { return File::parse(std::make_shared<const std::string>(bytes), kName); }

// The one-line refusal: "[gguf] t.gguf: <what> (<where>) at byte <at>".
void expect_refusal(const std::string& bytes, const std::string& what, const std::string& where, size_t at) {
  try {
    parse(bytes);
    ADD_FAILURE() << "no refusal; expected: " << what;
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(std::string("[gguf] ") + kName + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    if (!where.empty()) EXPECT_NE(msg.find(" (" + where + ") "), std::string::npos) << msg;
    const std::string tail = " at byte " + std::to_string(at);
    EXPECT_TRUE(msg.size() >= tail.size() && msg.compare(msg.size() - tail.size(), tail.size(), tail) == 0) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

// A small valid file: two keys, an F32 tensor (3 x 2) and a Q8_0 row of 32.
Builder small() {
  Builder b;
  b.kv("general.architecture", string_value("llama"));
  b.kv("llama.block_count", scalar<uint32_t>(ValueType::UINT32, 30));
  b.tensor("a", {3, 2}, 0, f32_bytes({1, 2, 3, 4, 5, 6}));
  std::string q8 = le<uint16_t>(0x3C00);  // d = 1.0
  for (int i = 0; i < 32; ++i) q8 += static_cast<char>(i - 16);
  b.tensor("b", {32}, 8, q8);
  return b;
}

// --- valid files ------------------------------------------------------------------------------------------------

TEST(Gguf, ValidV3) {
  Builder b = small();
  const std::string bytes = b.build();
  const File f = parse(bytes);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.path(), kName);
  EXPECT_EQ(f.data_offset(), b.at["data"]);
  EXPECT_EQ(f.keys(), (std::vector<std::string>{"general.architecture", "llama.block_count"}));
  EXPECT_EQ(f.get("general.architecture").as_string(), "llama");
  EXPECT_EQ(f.get("llama.block_count").as_int(), 30);
  ASSERT_EQ(f.tensors().size(), 2u);
  const gguf::TensorInfo& a = f.tensors()[0];
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.type, gguf::Type::F32);
  EXPECT_EQ(a.ne, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.numel(), 6);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(a.bytes, 24u);
  float x[6];
  std::memcpy(x, a.data, 24);
  EXPECT_EQ(x[5], 6.0f);
  const gguf::TensorInfo* q = f.tensor("b");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, gguf::Type::Q8_0);
  EXPECT_EQ(q->offset, 32u);
  EXPECT_EQ(q->bytes, 34u);
  EXPECT_EQ(q->data, a.data + 32);
  EXPECT_EQ(f.tensor("c"), nullptr);
}

TEST(Gguf, ValidV2) {
  Builder b = small();
  b.version = 2;
  EXPECT_EQ(parse(b.build()).version(), 2u);
}

TEST(Gguf, EmptyFileHeaderOnly) {
  Builder b;
  const File f = parse(b.build());
  EXPECT_TRUE(f.keys().empty());
  EXPECT_TRUE(f.tensors().empty());
}

TEST(Gguf, LastTensorPaddingMayBeAbsent) {
  Builder b = small();
  b.pad_last = false;
  const std::string bytes = b.build();
  EXPECT_EQ(bytes.size(), b.at["data:b"] + 34);
  EXPECT_EQ(parse(bytes).tensors().size(), 2u);
}

TEST(Gguf, TrailingBytesAreIgnored) { EXPECT_EQ(parse(small().build() + "xyz").tensors().size(), 2u); }

TEST(Gguf, CustomAlignmentPadsHeaderAndTensors) {
  Builder b;
  b.alignment = 64;
  b.kv("general.alignment", scalar<uint32_t>(ValueType::UINT32, 64));
  b.tensor("x", {1}, 0, f32_bytes({7}));
  b.tensor("y", {2}, 0, f32_bytes({8, 9}));
  const std::string bytes = b.build();
  const File f = parse(bytes);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.tensors()[1].offset, 64u);
}

TEST(Gguf, ScalarAndEmptyTensors) {
  Builder b;
  b.tensor("scalar", {}, 0, f32_bytes({3}));
  b.tensor("empty", {0, 5}, 2, "");
  b.tensor("after", {2}, 1, le<uint16_t>(0x3C00) + le<uint16_t>(0x4000));
  const File f = parse(b.build());
  EXPECT_EQ(f.tensors()[0].numel(), 1);
  EXPECT_TRUE(f.tensors()[0].shape().empty());
  EXPECT_EQ(f.tensors()[1].numel(), 0);
  EXPECT_EQ(f.tensors()[1].bytes, 0u);
  EXPECT_EQ(f.tensors()[2].offset, 32u);
}

TEST(Gguf, EveryValueTypeRoundTrips) {
  Builder b;
  b.kv("u8", scalar<uint8_t>(ValueType::UINT8, 250));
  b.kv("i8", scalar<int8_t>(ValueType::INT8, -7));
  b.kv("u16", scalar<uint16_t>(ValueType::UINT16, 65535));
  b.kv("i16", scalar<int16_t>(ValueType::INT16, -32768));
  b.kv("u32", scalar<uint32_t>(ValueType::UINT32, 4000000000u));
  b.kv("i32", scalar<int32_t>(ValueType::INT32, -2000000000));
  b.kv("f32", scalar<float>(ValueType::FLOAT32, 0.1f));
  b.kv("bool", scalar<uint8_t>(ValueType::BOOL, 1));
  b.kv("str", string_value("héllo"));
  b.kv("u64", scalar<uint64_t>(ValueType::UINT64, std::numeric_limits<uint64_t>::max()));
  b.kv("i64", scalar<int64_t>(ValueType::INT64, std::numeric_limits<int64_t>::min()));
  b.kv("f64", scalar<double>(ValueType::FLOAT64, 0.1));
  b.kv("empty_str", string_value(""));
  b.kv("a_u8", array<uint8_t>(ValueType::UINT8, {1, 255}));
  b.kv("a_i8", array<int8_t>(ValueType::INT8, {-128, 127}));
  b.kv("a_u16", array<uint16_t>(ValueType::UINT16, {65535}));
  b.kv("a_i16", array<int16_t>(ValueType::INT16, {-5, 5}));
  b.kv("a_u32", array<uint32_t>(ValueType::UINT32, {4000000000u}));
  b.kv("a_i32", array<int32_t>(ValueType::INT32, {-1, 0, 1}));
  b.kv("a_u64", array<uint64_t>(ValueType::UINT64, {12345678901234ull}));
  b.kv("a_i64", array<int64_t>(ValueType::INT64, {-12345678901234ll}));
  b.kv("a_f32", array<float>(ValueType::FLOAT32, {0.5f, -1e30f}));
  b.kv("a_f64", array<double>(ValueType::FLOAT64, {0.1, 1e300}));
  b.kv("a_bool", array<uint8_t>(ValueType::BOOL, {0, 1, 1}));
  b.kv("a_str", string_array({"a", "", "\xe2\x96\x81the"}));
  b.kv("a_empty", array<int32_t>(ValueType::INT32, {}));
  const File f = parse(b.build());
  ASSERT_EQ(f.keys().size(), 26u);
  EXPECT_EQ(f.keys().front(), "u8");
  EXPECT_EQ(f.keys().back(), "a_empty");
  EXPECT_EQ(f.get("u8").as_int(), 250);
  EXPECT_EQ(f.get("u8").type(), ValueType::UINT8);
  EXPECT_EQ(f.get("i8").as_int(), -7);
  EXPECT_EQ(f.get("u16").as_int(), 65535);
  EXPECT_EQ(f.get("i16").as_int(), -32768);
  EXPECT_EQ(f.get("u32").as_int(), 4000000000ll);
  EXPECT_EQ(f.get("i32").as_int(), -2000000000);
  EXPECT_EQ(f.get("f32").as_float(), static_cast<double>(0.1f));
  EXPECT_TRUE(f.get("bool").as_bool());
  EXPECT_EQ(f.get("str").as_string(), "héllo");
  EXPECT_EQ(f.get("u64").as_uint(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f.get("i64").as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get("f64").as_float(), 0.1);
  EXPECT_EQ(f.get("empty_str").as_string(), "");
  EXPECT_EQ(f.get("a_u8").as_ints(), (std::vector<int64_t>{1, 255}));
  EXPECT_EQ(f.get("a_u8").array_type(), ValueType::UINT8);
  EXPECT_EQ(f.get("a_u8").size(), 2u);
  EXPECT_EQ(f.get("a_i8").as_ints(), (std::vector<int64_t>{-128, 127}));
  EXPECT_EQ(f.get("a_u16").as_ints(), (std::vector<int64_t>{65535}));
  EXPECT_EQ(f.get("a_i16").as_ints(), (std::vector<int64_t>{-5, 5}));
  EXPECT_EQ(f.get("a_u32").as_ints(), (std::vector<int64_t>{4000000000ll}));
  EXPECT_EQ(f.get("a_i32").as_ints(), (std::vector<int64_t>{-1, 0, 1}));
  EXPECT_EQ(f.get("a_u64").as_ints(), (std::vector<int64_t>{12345678901234ll}));
  EXPECT_EQ(f.get("a_i64").as_ints(), (std::vector<int64_t>{-12345678901234ll}));
  EXPECT_EQ(f.get("a_f32").as_floats(), (std::vector<float>{0.5f, -1e30f}));
  EXPECT_EQ(f.get("a_f64").as_doubles(), (std::vector<double>{0.1, 1e300}));
  EXPECT_EQ(f.get("a_f64").as_floats(), (std::vector<float>{0.1f, std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(f.get("a_f32").as_doubles(), (std::vector<double>{0.5, static_cast<double>(-1e30f)}));
  EXPECT_EQ(f.get("a_bool").as_bools(), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(f.get("a_str").as_strings(), (std::vector<std::string>{"a", "", "\xe2\x96\x81the"}));
  EXPECT_EQ(f.get("a_str").array_type(), ValueType::STRING);
  EXPECT_EQ(f.get("a_empty").size(), 0u);
  EXPECT_TRUE(f.get("a_empty").as_ints().empty());
  EXPECT_EQ(f.get("a_i16").raw().size(), 4u);
  EXPECT_EQ(f.get("u32").raw().size(), 4u);
}

// --- accessors on the wrong type ----------------------------------------------------------------------------------

void expect_accessor_error(const std::function<void()>& fn, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected: " << what;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("[gguf] ", 0), 0u) << e.what();
  }
}

TEST(Gguf, AccessorsRefuseTheWrongTypeNamingTheKey) {
  Builder b;
  b.kv("s", string_value("x"));
  b.kv("big", scalar<uint64_t>(ValueType::UINT64, std::numeric_limits<uint64_t>::max()));
  b.kv("neg", scalar<int32_t>(ValueType::INT32, -1));
  b.kv("ints", array<int32_t>(ValueType::INT32, {1}));
  b.kv("bigs", array<uint64_t>(ValueType::UINT64, {1, std::numeric_limits<uint64_t>::max()}));
  b.kv("strs", string_array({"a"}));
  b.kv("f", scalar<float>(ValueType::FLOAT32, 1));
  const File f = parse(b.build());
  expect_accessor_error([&] { f.get("s").as_int(); }, "key 's' is STRING, not an integer");
  expect_accessor_error([&] { f.get("s").size(); }, "key 's' is STRING, not an array");
  expect_accessor_error([&] { f.get("s").array_type(); }, "key 's' is STRING, not an array");
  expect_accessor_error([&] { f.get("big").as_int(); }, "key 'big' value 18446744073709551615 does not fit int64");
  expect_accessor_error([&] { f.get("neg").as_uint(); }, "key 'neg' value -1 is negative");
  expect_accessor_error([&] { f.get("ints").as_strings(); }, "key 'ints' is ARRAY of INT32, not an array of strings");
  expect_accessor_error([&] { f.get("ints").as_int(); }, "key 'ints' is ARRAY of INT32, not an integer");
  expect_accessor_error([&] { f.get("ints").as_floats(); }, "key 'ints' is ARRAY of INT32, not an array of floats");
  expect_accessor_error([&] { f.get("bigs").as_ints(); }, "key 'bigs' element 1 value 18446744073709551615");
  expect_accessor_error([&] { f.get("strs").as_ints(); }, "key 'strs' is ARRAY of STRING, not an array of integers");
  expect_accessor_error([&] { f.get("f").as_bool(); }, "key 'f' is FLOAT32, not a bool");
  expect_accessor_error([&] { f.get("f").as_string(); }, "key 'f' is FLOAT32, not a string");
  expect_accessor_error([&] { f.get("f").as_int(); }, "key 'f' is FLOAT32, not an integer");
  expect_accessor_error([&] { f.get("s").as_float(); }, "key 's' is STRING, not a float");
  expect_accessor_error([&] { f.get("ints").as_bools(); }, "not an array of bools");
  expect_accessor_error([&] { f.get("ints").as_doubles(); }, "not an array of floats");
  expect_accessor_error([&] { f.get("nope"); }, "[gguf] t.gguf: missing key 'nope'");
  expect_accessor_error([&] { f.get_tensor("w"); }, "[gguf] t.gguf: no tensor 'w'");
  EXPECT_EQ(f.find("nope"), nullptr);
}

// --- refusals: the header -----------------------------------------------------------------------------------------

TEST(GgufRefuses, BadMagic) {
  std::string bytes = small().build();
  bytes[0] = 'g';
  expect_refusal(bytes, "bad magic 'gGUF', expected 'GGUF'", "", 0);
}

TEST(GgufRefuses, ShorterThanTheMagic) { expect_refusal("GG", "file ends inside the magic", "", 0); }

TEST(GgufRefuses, Version1) {
  Builder b = small();
  b.version = 1;
  const std::string file = b.build();
  expect_refusal(file, "GGUF version 1 is no longer supported", "", 4);
}

TEST(GgufRefuses, VersionZeroAndFuture) {
  Builder b = small();
  b.version = 0;
  const std::string file = b.build();
  expect_refusal(file, "unsupported GGUF version 0", "", 4);
  b.version = 4;
  const std::string file2 = b.build();
  expect_refusal(file2, "unsupported GGUF version 4", "", 4);
}

TEST(GgufRefuses, BigEndianFile) {
  Builder b = small();
  b.version = 0x03000000;  // version 3 written big-endian
  const std::string file = b.build();
  expect_refusal(file, "looks like a big-endian file", "", 4);
}

TEST(GgufRefuses, TruncatedHeader) {
  const std::string bytes = small().build().substr(0, 12);
  expect_refusal(bytes, "file ends inside the tensor count (8 bytes needed, 4 left)", "", 8);
}

TEST(GgufRefuses, NegativeOrHugeCounts) {
  Builder b = small();
  b.n_tensors = -1;
  const std::string file = b.build();
  expect_refusal(file, "tensor count -1 is negative", "", 8);
  b.n_tensors = int64_t{1} << 40;
  const std::string file2 = b.build();
  expect_refusal(file2, "tensor count 1099511627776 is negative or more than the", "", 8);
  b.n_tensors.reset();
  b.n_kv = -3;
  const std::string file3 = b.build();
  expect_refusal(file3, "key count -3 is negative", "", 16);
  b.n_kv = std::numeric_limits<int64_t>::max();
  const std::string file4 = b.build();
  expect_refusal(file4, "key count 9223372036854775807 is negative or more than the", "", 16);
}

TEST(GgufRefuses, CountsLargerThanTheFileHolds) {
  Builder b = small();
  b.n_kv = 3;  // a third pair where the tensor infos are: reads the first tensor's name as a key, then fails
  const std::string bytes = b.build();
  EXPECT_THROW(parse(bytes), std::runtime_error);
}

// --- refusals: metadata -----------------------------------------------------------------------------------------

TEST(GgufRefuses, DuplicateKey) {
  Builder b = small();
  b.kv("llama.block_count", scalar<uint32_t>(ValueType::UINT32, 31));
  const std::string bytes = b.build();
  // at["key:..."] holds the second occurrence (the map keeps the last write).
  expect_refusal(bytes, "duplicate key", "key 'llama.block_count'", b.at["key:llama.block_count"]);
}

TEST(GgufRefuses, EmptyKey) {
  Builder b;
  b.kv("", scalar<uint8_t>(ValueType::UINT8, 1));
  const std::string file = b.build();
  expect_refusal(file, "empty key", "key ''", 24);
}

TEST(GgufRefuses, UnknownValueType) {
  Builder b;
  b.kv("k", value(static_cast<ValueType>(13), le<uint32_t>(0)));
  const std::string file = b.build();
  expect_refusal(file, "unknown value type 13", "key 'k'", b.at["type:k"]);
}

TEST(GgufRefuses, UnknownArrayElementType) {
  Builder b;
  b.kv("k", le<uint32_t>(9) + le<uint32_t>(77) + le<uint64_t>(0));
  const std::string file = b.build();
  expect_refusal(file, "unknown array element type 77", "key 'k'", b.at["type:k"] + 4);
}

TEST(GgufRefuses, ArrayOfArrays) {
  Builder b;
  b.kv("k", le<uint32_t>(9) + le<uint32_t>(9) + le<uint64_t>(1) + array<uint8_t>(ValueType::UINT8, {1}));
  const std::string file = b.build();
  expect_refusal(file, "array of arrays", "key 'k'", b.at["type:k"] + 4);
}

TEST(GgufRefuses, KeyLengthPastTheEnd) {
  std::string bytes = "GGUF" + le<uint32_t>(3) + le<int64_t>(0) + le<int64_t>(1) + le<uint64_t>(1000) + "abc";
  bytes.resize(64, '\0');
  expect_refusal(bytes, "a key length 1000 is past the end of the file", "key 0", 24);
}

TEST(GgufRefuses, StringValueLengthPastTheEnd) {
  Builder b;
  b.kv("k", value(ValueType::STRING, le<uint64_t>(uint64_t{1} << 62)));
  const std::string file = b.build();
  expect_refusal(file, "a string length 4611686018427387904 is past the end", "key 'k'", b.at["type:k"] + 4);
}

TEST(GgufRefuses, ArrayLengthPastTheEnd) {
  Builder b;
  b.kv("k", le<uint32_t>(9) + le<uint32_t>(uint32_t(ValueType::UINT32)) + le<uint64_t>(uint64_t{1} << 61));
  const std::string file = b.build();
  expect_refusal(file, "2305843009213693952 elements of UINT32 need more than the", "key 'k'",
                 b.at["type:k"] + 16);
}

TEST(GgufRefuses, StringArrayLengthPastTheEnd) {
  Builder b;
  b.kv("k", le<uint32_t>(9) + le<uint32_t>(uint32_t(ValueType::STRING)) + le<uint64_t>(1000000));
  const std::string file = b.build();
  expect_refusal(file, "1000000 strings need more than the", "key 'k'", b.at["type:k"] + 8);
}

TEST(GgufRefuses, StringInsideAnArrayPastTheEnd) {
  Builder b;
  b.kv("k", le<uint32_t>(9) + le<uint32_t>(uint32_t(ValueType::STRING)) + le<uint64_t>(2) + str("ok") +
                le<uint64_t>(999));
  const std::string bytes = b.build();
  expect_refusal(bytes, "a string length 999 is past the end", "key 'k'", b.at["type:k"] + 16 + 10);
}

TEST(GgufRefuses, BoolByteOtherThanZeroOrOne) {
  Builder b;
  b.kv("flag", scalar<uint8_t>(ValueType::BOOL, 2));
  const std::string file = b.build();
  expect_refusal(file, "bool byte 2 is not 0 or 1", "key 'flag'", b.at["type:flag"] + 4);
  Builder c;
  c.kv("flags", array<uint8_t>(ValueType::BOOL, {0, 1, 7}));
  const std::string file2 = c.build();
  expect_refusal(file2, "bool byte 7 is not 0 or 1", "key 'flags'", c.at["type:flags"] + 16 + 2);
}

TEST(GgufRefuses, AlignmentNotU32) {
  Builder b;
  b.kv("general.alignment", scalar<uint64_t>(ValueType::UINT64, 32));
  const std::string file = b.build();
  expect_refusal(file, "general.alignment is UINT64, not UINT32", "key 'general.alignment'",
                 b.at["type:general.alignment"]);
}

TEST(GgufRefuses, AlignmentNotAPowerOfTwo) {
  for (uint32_t a : {0u, 48u, 3u}) {
    Builder b;
    b.kv("general.alignment", scalar<uint32_t>(ValueType::UINT32, a));
    const std::string file = b.build();
    expect_refusal(file, "alignment " + std::to_string(a) + " is not a power of two", "key 'general.alignment'",
                   b.at["type:general.alignment"] + 4);
  }
}

TEST(GgufRefuses, UnprintableKeyIsEscapedOnOneLine) {
  Builder b;
  b.kv("a\nb'", value(static_cast<ValueType>(99), ""));
  const std::string file = b.build();
  expect_refusal(file, "unknown value type 99", "key 'a\\x0ab\\x27'", b.at["type:a\nb'"]);
}

// --- refusals: tensor infos -------------------------------------------------------------------------------------

TEST(GgufRefuses, DuplicateTensorName) {
  Builder b = small();
  b.tensor("a", {1}, 0, f32_bytes({1}));
  const std::string bytes = b.build();
  expect_refusal(bytes, "duplicate tensor name", "tensor 'a'", b.at["tensor:a"]);
}

TEST(GgufRefuses, TensorNameOf64Bytes) {
  Builder b;
  const std::string name(64, 'n');
  b.tensor(name, {1}, 0, f32_bytes({1}));
  const std::string file = b.build();
  expect_refusal(file, "tensor name of 64 bytes (at most 63)", "tensor '" + name + "'", b.at["tensor:" + name]);
  Builder ok;
  ok.tensor(std::string(63, 'n'), {1}, 0, f32_bytes({1}));
  EXPECT_EQ(parse(ok.build()).tensors().size(), 1u);
}

TEST(GgufRefuses, MoreThanFourDimensions) {
  Builder b;
  b.tensor("t", {1, 1, 1, 1, 1}, 0, f32_bytes({1}));
  const std::string file = b.build();
  expect_refusal(file, "5 dimensions (at most 4)", "tensor 't'", b.at["dims:t"]);
}

TEST(GgufRefuses, NegativeDimension) {
  Builder b;
  b.tensor("t", {4, -2}, 0, "");
  const std::string file = b.build();
  expect_refusal(file, "dimension 1 is -2", "tensor 't'", b.at["ne:t:1"]);
}

TEST(GgufRefuses, ElementCountOverflow) {
  Builder b;
  b.tensor("t", {int64_t{1} << 32, int64_t{1} << 32}, 0, "");
  const std::string file = b.build();
  expect_refusal(file, "element count overflows int64 at dimension 1", "tensor 't'", b.at["ne:t:1"]);
  Builder z;  // a zero dimension does not hide the overflow of the others
  z.tensor("t", {0, int64_t{1} << 32, int64_t{1} << 32}, 0, "");
  const std::string file2 = z.build();
  expect_refusal(file2, "element count overflows int64", "tensor 't'", z.at["dims:t"]);
}

TEST(GgufRefuses, ByteSizeOverflow) {
  Builder b;  // 2^62 F64 elements: representable as a count, not as bytes
  b.tensor("t", {int64_t{1} << 31, int64_t{1} << 31}, 28, "");
  const std::string file = b.build();
  expect_refusal(file, "byte size overflows", "tensor 't'", b.at["dims:t"]);
}

TEST(GgufRefuses, UnknownOrRemovedGgmlType) {
  for (uint32_t t : {4u, 5u, 31u, 36u, 42u, 1000u}) {
    Builder b;
    b.tensor("t", {32}, t, std::string(64, '\0'));
    const std::string file = b.build();
    expect_refusal(file, "unknown ggml type " + std::to_string(t), "tensor 't'", b.at["ttype:t"]);
  }
}

TEST(GgufRefuses, RowNotAWholeNumberOfBlocks) {
  Builder b;
  b.tensor("t", {48, 2}, 2, std::string(36, '\0'));
  const std::string file = b.build();
  expect_refusal(file, "ne[0] = 48 is not a multiple of Q4_0's block of 32", "tensor 't'", b.at["ttype:t"]);
  Builder k;
  k.tensor("t", {128}, 12, "");
  const std::string file2 = k.build();
  expect_refusal(file2, "ne[0] = 128 is not a multiple of Q4_K's block of 256", "tensor 't'", k.at["ttype:t"]);
}

TEST(GgufRefuses, OffsetOtherThanTheRunningPaddedSum) {
  Builder b = small();
  b.tensors[1].offset = 24;  // right after "a"'s 24 bytes: unpadded
  const std::string bytes = b.build();
  expect_refusal(bytes, "offset 24, expected 32", "tensor 'b'", b.at["offset:b"]);
  Builder c = small();
  c.tensors[0].offset = 32;
  const std::string file = c.build();
  expect_refusal(file, "offset 32, expected 0", "tensor 'a'", c.at["offset:a"]);
}

TEST(GgufRefuses, TensorDataPastTheEnd) {
  Builder b = small();
  const std::string bytes = b.build();
  const size_t end_of_b = b.at["data:b"] + 34;
  const std::string cut = bytes.substr(0, end_of_b - 1);
  expect_refusal(cut, "data [" + std::to_string(b.at["data:b"]) + ", " + std::to_string(end_of_b) +
                          ") is past the end of the file (" + std::to_string(cut.size()) + " bytes)",
                 "tensor 'b'", b.at["offset:b"]);
}

TEST(GgufRefuses, HugeTensorPastTheEnd) {
  Builder b;
  b.tensor("t", {int64_t{1} << 40}, 0, "");
  const std::string file = b.build();
  expect_refusal(file, "is past the end of the file", "tensor 't'", b.at["offset:t"]);
}

TEST(GgufRefuses, TruncatedTensorInfo) {
  Builder b = small();
  const std::string bytes = b.build();
  expect_refusal(bytes.substr(0, b.at["ttype:b"] + 2), "file ends inside a tensor type", "tensor 'b'",
                 b.at["ttype:b"]);
}

TEST(GgufRefuses, EveryTruncationOfAValidFile) {
  Builder b = small();
  b.kv("tokens", string_array({"a", "bc"}));
  b.kv("scores", array<float>(ValueType::FLOAT32, {0.5f, 1.5f}));
  b.pad_last = false;
  const std::string bytes = b.build();
  for (size_t n = 0; n < bytes.size(); ++n) {
    try {
      parse(bytes.substr(0, n));
      ADD_FAILURE() << "a prefix of " << n << " bytes parsed";
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("[gguf] t.gguf: ", 0), 0u) << msg;
      EXPECT_NE(msg.find(" at byte "), std::string::npos) << msg;
    }
  }
  EXPECT_NO_THROW(parse(bytes));
}

// --- files on disk ------------------------------------------------------------------------------------------------

TEST(Gguf, OpenMapsTheFileAndCopiesKeepItAlive) {
  char path[] = "/tmp/qkv_gguf_testXXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    std::ofstream out(path, std::ios::binary);
    const std::string bytes = small().build();
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::unique_ptr<File> copy;
  {
    const File f = File::open(path);
    EXPECT_EQ(f.path(), path);
    copy = std::make_unique<File>(f);
  }
  std::remove(path);
  float x[6];
  std::memcpy(x, copy->tensors()[0].data, 24);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(copy->get("general.architecture").as_string(), "llama");
}

TEST(Gguf, OpenRefusesAMissingFileAndADirectory) {
  try {
    File::open("/nonexistent/x.gguf");
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "[gguf] /nonexistent/x.gguf: cannot open: No such file or directory");
  }
  EXPECT_THROW(File::open("/tmp"), std::runtime_error);
}

TEST(Gguf, OpenRefusesAnEmptyFile) {
  char path[] = "/tmp/qkv_gguf_emptyXXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  try {
    File::open(path);
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("file ends inside the magic"), std::string::npos) << e.what();
  }
  std::remove(path);
}

// --- types ------------------------------------------------------------------------------------------------------

TEST(GgufTypes, NamesAndSizesFollowGgml) {
  using gguf::Type;
  EXPECT_EQ(gguf::type_name(Type::Q4_K), "Q4_K");
  EXPECT_EQ(gguf::type_name(static_cast<Type>(4)), "type 4");
  EXPECT_EQ(gguf::block_size(Type::F32), 1);
  EXPECT_EQ(gguf::type_size(Type::BF16), 2);
  EXPECT_EQ(gguf::type_size(Type::Q4_0), 18);
  EXPECT_EQ(gguf::type_size(Type::Q4_1), 20);
  EXPECT_EQ(gguf::type_size(Type::Q5_0), 22);
  EXPECT_EQ(gguf::type_size(Type::Q5_1), 24);
  EXPECT_EQ(gguf::type_size(Type::Q8_0), 34);
  EXPECT_EQ(gguf::type_size(Type::Q8_1), 40);
  EXPECT_EQ(gguf::type_size(Type::Q2_K), 84);
  EXPECT_EQ(gguf::type_size(Type::Q3_K), 110);
  EXPECT_EQ(gguf::type_size(Type::Q4_K), 144);
  EXPECT_EQ(gguf::type_size(Type::Q5_K), 176);
  EXPECT_EQ(gguf::type_size(Type::Q6_K), 210);
  EXPECT_EQ(gguf::type_size(Type::Q8_K), 292);
  EXPECT_EQ(gguf::block_size(Type::Q6_K), 256);
  EXPECT_EQ(gguf::block_size(Type::MXFP4), 32);
  EXPECT_EQ(gguf::block_size(static_cast<Type>(33)), 0);
  EXPECT_TRUE(gguf::type_known(30));
  EXPECT_FALSE(gguf::type_known(31));
  EXPECT_EQ(gguf::row_bytes(Type::Q4_K, 512), 288);
  EXPECT_THROW(gguf::row_bytes(Type::Q4_K, 100), std::invalid_argument);
  EXPECT_THROW(gguf::row_bytes(static_cast<Type>(5), 32), std::invalid_argument);
  EXPECT_STREQ(gguf::value_type_name(ValueType::FLOAT64), "FLOAT64");
  EXPECT_EQ(gguf::value_type_size(ValueType::INT16), 2u);
  EXPECT_EQ(gguf::value_type_size(ValueType::STRING), 0u);
}

}  // namespace
}  // namespace qkv
