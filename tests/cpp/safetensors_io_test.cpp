// safetensors files on disk: zero-copy mmap loading, I/O errors naming the path, raw dtypes read back bit for bit,
// byte-exact writing and atomic replacement. The header rules and dtype conversions: safetensors_test.cpp.
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

// --- files: mmap, zero copy, I/O errors ----------------------------------------------------------------------------

TEST(SafeTensorsFileIO, AlignedF32IsZeroCopyAndMisalignedIsCopied) {
  TempDir dir;
  // "u" (1 byte) first makes "m" misaligned; "a" and "b" are 4-aligned because the header is padded to 8.
  std::string h = "{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[1]", "[8,12]") + "," +
                  entry("u", "U8", "[1]", "[12,13]") + "," + entry("m", "F32", "[1]", "[13,17]") + "}";
  h.append((8 - h.size() % 8) % 8, ' ');
  dir.write("z.safetensors", file_bytes(h, f32_bytes({1, 2, 3}) + "\x09" + f32_bytes({4})));
  const SafeTensorsFile f = load_safetensors(dir.file("z.safetensors"));
  const float* a = f.tensors.at("a").data();
  const float* b = f.tensors.at("b").data();
  // Zero-copy views sit exactly where the file puts them relative to each other; copies would be separate
  // 64-byte-aligned allocations, never 8 bytes apart.
  EXPECT_EQ(reinterpret_cast<const char*>(b) - reinterpret_cast<const char*>(a), 8);
  EXPECT_EQ(f.tensors.at("a").to_vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ(f.tensors.at("u").item(), 9.0f);
  EXPECT_EQ(f.tensors.at("m").item(), 4.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.tensors.at("m").data()) % 64, 0u);  // a fresh aligned copy
}

TEST(SafeTensorsFileIO, WritingALoadedTensorNeverChangesTheFile) {
  TempDir dir;
  save_safetensors(dir.file("w.safetensors"), {{"x", Tensor::from_vector({2}, {1, 2})}});
  const std::string before = dir.read("w.safetensors");
  {
    SafeTensorsFile f = load_safetensors(dir.file("w.safetensors"));
    f.tensors.at("x").data()[0] = 42.0f;  // copy-on-write page
    EXPECT_EQ(f.tensors.at("x").to_vector(), (std::vector<float>{42, 2}));
  }
  EXPECT_EQ(dir.read("w.safetensors"), before);
}

TEST(SafeTensorsFileIO, TensorsOutliveTheFileStruct) {
  TempDir dir;
  save_safetensors(dir.file("o.safetensors"), {{"x", Tensor::from_vector({3}, {1, 2, 3})}});
  Tensor keep;
  { keep = load_safetensors(dir.file("o.safetensors")).tensors.at("x"); }
  ::unlink(dir.file("o.safetensors").c_str());
  EXPECT_EQ(keep.to_vector(), (std::vector<float>{1, 2, 3}));
}

TEST(SafeTensorsFileIO, MissingFileIsSystemErrorNamingThePath) {
  try {
    load_safetensors("/nonexistent/qkv/x.safetensors");
    FAIL() << "no throw";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory);
    EXPECT_NE(std::string(e.what()).find("[safetensors] cannot open \"/nonexistent/qkv/x.safetensors\""), std::string::npos)
        << e.what();
  }
}

TEST(SafeTensorsFileIO, DirectoryIsSystemError) {
  TempDir dir;
  try {
    load_safetensors(dir.file(""));
    FAIL() << "no throw";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), std::errc::is_a_directory);
    EXPECT_NE(std::string(e.what()).find("[safetensors] "), std::string::npos);
  }
}

TEST(SafeTensorsFileIO, MalformedFileOnDiskIsInvalidArgumentNamingThePath) {
  TempDir dir;
  dir.write("short.safetensors", "abc");
  try {
    load_safetensors(dir.file("short.safetensors"));
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("short.safetensors\" is 3 bytes"), std::string::npos) << e.what();
  }
  dir.write("bad.safetensors", file_bytes("{" + entry("a", "F32", "[2]", "[0,8]") + "}", zeros(4)));
  EXPECT_THROW(load_safetensors(dir.file("bad.safetensors")), std::invalid_argument);
}

TEST(SafeTensorsFileIO, ContentErrorsNameTheFile) {
  TempDir dir;
  dir.write("bad.safetensors", file_bytes("{" + entry("a", "F32", "[2]", "[0,8]") + "}", zeros(4)));
  for (bool map : {false, true}) {
    try {
      read_safetensors_bytes(dir.file("bad.safetensors"), map);
      FAIL() << "no throw";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("[safetensors] \"" + dir.file("bad.safetensors") + "\": ", 0), 0u)
          << e.what();
    }
  }
  try {
    load_safetensors(dir.file("bad.safetensors"));
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bad.safetensors\": "), std::string::npos) << e.what();
  }
}

// --- raw dtypes: written and read back as they are ---------------------------------------------------------------

TEST(SafeTensorsRaw, BoolI64F64F16Bf16AreWrittenAsTheyAreAndReadBackBitForBit) {
  TempDir dir;
  const uint8_t mask[4] = {1, 0, 0, 1};
  const int64_t big[2] = {(int64_t{1} << 40) + 1, -(int64_t{1} << 62) - 3};  // not representable in float32
  const double huge[2] = {1e300, -5e-324};                                    // float32 overflow / underflow
  const uint16_t half[3] = {0x3c00, 0x7bff, 0x0001};                          // 1, 65504, smallest subnormal
  const uint16_t bf16[2] = {0x3f80, 0xff80};                                  // 1, -inf
  const std::map<std::string, SafeTensorsRaw> tensors = {
      {"mask", {SafeTensorsDtype::BOOL, {2, 2}, mask}},   {"big", {SafeTensorsDtype::I64, {2}, big}},
      {"huge", {SafeTensorsDtype::F64, {2}, huge}},       {"half", {SafeTensorsDtype::F16, {3}, half}},
      {"bf16", {SafeTensorsDtype::BF16, {1, 2}, bf16}},   {"empty", {SafeTensorsDtype::I64, {0, 3}, nullptr}}};
  save_safetensors_raw(dir.file("raw.safetensors"), tensors, {{"k", "v"}});
  for (bool map : {false, true}) {
    const SafeTensorsBytes f = read_safetensors_bytes(dir.file("raw.safetensors"), map);
    ASSERT_EQ(f.header.entries.size(), tensors.size());
    EXPECT_EQ(f.header.metadata.at("k"), "v");
    for (const SafeTensorsEntry& e : f.header.entries) {
      const SafeTensorsRaw& want = tensors.at(e.name);
      EXPECT_EQ(e.dtype, want.dtype) << e.name;
      EXPECT_EQ(e.shape, want.shape) << e.name;
      const size_t n = static_cast<size_t>(e.end - e.begin);
      if (n > 0) EXPECT_EQ(std::memcmp(f.data() + e.begin, want.data, n), 0) << e.name;
    }
  }
  // The converting loader still gives float32 values (exact where float32 can hold them).
  const SafeTensorsFile conv = load_safetensors(dir.file("raw.safetensors"));
  EXPECT_EQ(conv.tensors.at("mask").to_vector(), (std::vector<float>{1, 0, 0, 1}));
  EXPECT_EQ(conv.tensors.at("half").to_vector()[1], 65504.0f);
  EXPECT_TRUE(std::isinf(conv.tensors.at("huge").to_vector()[0]));
}

TEST(SafeTensorsRaw, F32RawBytesMatchTheTensorWriterByteForByte) {
  const std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  const Tensor t = Tensor::from_vector({2, 3}, v);
  EXPECT_EQ(serialize_safetensors_raw({{"w", {SafeTensorsDtype::F32, {2, 3}, v.data()}}}, {{"a", "b"}}),
            serialize_safetensors({{"w", t}}, {{"a", "b"}}));
}

TEST(SafeTensorsRaw, SubByteDtypeNotEndingOnAByteIsRefused) {
  const uint8_t b = 0;
  EXPECT_THROW(serialize_safetensors_raw({{"f4", {SafeTensorsDtype::F4, {3}, &b}}}), std::invalid_argument);
}

TEST(SafeTensorsRaw, ReadIntoMemoryIsIndependentOfLaterChangesToTheFile) {
  TempDir dir;
  const std::vector<float> v(64, 2.0f);
  save_safetensors(dir.file("c.safetensors"), {{"x", Tensor::from_vector({64}, v)}});
  const SafeTensorsBytes f = read_safetensors_bytes(dir.file("c.safetensors"), false);
  // Rewrite in place, then truncate: a mapping would change or fault (SIGBUS); the copy must not.
  {
    const int fd = ::open(dir.file("c.safetensors").c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const std::string junk(300, '\x7f');
    ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
    ASSERT_EQ(::ftruncate(fd, 10), 0);
    ::close(fd);
  }
  const SafeTensorsEntry& e = f.header.entries.at(0);
  float first = 0;
  std::memcpy(&first, f.data() + e.begin, 4);
  EXPECT_EQ(first, 2.0f);
  std::memcpy(&first, f.data() + e.end - 4, 4);
  EXPECT_EQ(first, 2.0f);
}

TEST(SafeTensorsRaw, ReadBytesRefusesBoolBytesOtherThanZeroOrOne) {
  TempDir dir;
  dir.write("b.safetensors", file_bytes("{" + entry("b", "BOOL", "[2]", "[0,2]") + "}", std::string("\x01\x02", 2)));
  EXPECT_THROW(read_safetensors_bytes(dir.file("b.safetensors")), std::invalid_argument);
}

// --- writing ------------------------------------------------------------------------------------------------------

TEST(SafeTensorsWrite, MatchesTheReferenceSerializationBytes) {
  // Byte vectors from the reference implementation's tests (test_serialization, test_empty).
  const std::string expected_attn = file_bytes("{" + entry("attn.0", "F32", "[1,2,3]", "[0,24]") + "}", f32_bytes({0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(expected_attn.substr(0, 8), raw_size(64));
  EXPECT_EQ(serialize_safetensors({{"attn.0", Tensor::from_vector({1, 2, 3}, {0, 1, 2, 3, 4, 5})}}), expected_attn);
  EXPECT_EQ(serialize_safetensors({}), file_bytes("{}      "));
  EXPECT_EQ(serialize_safetensors({}, {{"framework", "pt"}}), file_bytes("{\"__metadata__\":{\"framework\":\"pt\"}}     "));
  // Forced alignment: "attn0" is one byte shorter, so seven spaces pad the header.
  const std::string padded = serialize_safetensors({{"attn0", Tensor::from_vector({1, 1, 2, 3}, {0, 1, 2, 3, 4, 5})}});
  EXPECT_EQ(padded.substr(0, 8), raw_size(72));
  EXPECT_EQ(padded.substr(8 + 65, 7), "       ");
}

TEST(SafeTensorsWrite, RoundTripKeepsValuesShapesMetadataAndOddNames) {
  TempDir dir;
  std::map<std::string, Tensor> tensors = {
      {"b.weight", Tensor::from_vector({2, 3}, {1, -2, 3.5f, 1e-30f, -0.0f, std::numeric_limits<float>::infinity()})},
      {"a", Tensor::scalar(7)},
      {"empty", Tensor::zeros({0, 4})},
      {"quote\"\\\n\x01\xc3\xa9", Tensor::ones({1})},
      {"", Tensor::ones({2})}};
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "line\nbreak \"q\""}};
  save_safetensors(dir.file("r.safetensors"), tensors, meta);
  const SafeTensorsFile f = load_safetensors(dir.file("r.safetensors"));
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const Tensor& got = f.tensors.at(name);
    EXPECT_EQ(got.shape(), t.shape()) << name;
    const std::vector<float> a = t.to_vector(), b = got.to_vector();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << name << "[" << i << "]";
  }
  EXPECT_EQ(dir.read("r.safetensors").size() % 4, 0u);
}

TEST(SafeTensorsWrite, NonContiguousTensorIsWrittenInRowMajorOrder) {
  const Tensor t = Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6}).transpose(0, 1);  // (3, 2)
  const std::string bytes = serialize_safetensors({{"t", t}});
  const Tensor back = load_bytes(bytes).tensors.at("t");
  EXPECT_EQ(back.shape(), (Shape{3, 2}));
  EXPECT_EQ(back.to_vector(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

TEST(SafeTensorsWrite, InvalidArgumentsAreRejectedBeforeTouchingDisk) {
  TempDir dir;
  const std::string path = dir.file("keep.safetensors");
  save_safetensors(path, {{"x", Tensor::ones({1})}});
  const std::string before = dir.read("keep.safetensors");
  auto expect_arg = [&](const std::map<std::string, Tensor>& t, const std::map<std::string, std::string>& m,
                        const std::string& reason) {
    try {
      save_safetensors(path, t, m);
      ADD_FAILURE() << "no throw for " << reason;
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("[safetensors] ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  };
  expect_arg({{"__metadata__", Tensor::ones({1})}}, {}, "the tensor name \"__metadata__\" is reserved");
  expect_arg({{"x", Tensor()}}, {}, "tensor \"x\" is undefined");
  expect_arg({{"bad\xff", Tensor::ones({1})}}, {}, "tensor name \"bad\"... is not valid UTF-8");
  expect_arg({}, {{"k", "\xc0\x80"}}, "metadata value \"\"... is not valid UTF-8");
  expect_arg({}, {{"\xff", "v"}}, "metadata key");
  EXPECT_THROW(save_safetensors("", {}), std::invalid_argument);
  EXPECT_EQ(dir.read("keep.safetensors"), before);
  EXPECT_EQ(dir.files(), std::vector<std::string>{"keep.safetensors"});
}

TEST(SafeTensorsWrite, ReplacesAtomicallyAndLeavesNoTemporaryFiles) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  save_safetensors(path, {{"x", Tensor::ones({4})}});
  save_safetensors(path, {{"y", Tensor::zeros({2})}});
  EXPECT_EQ(load_safetensors(path).tensors.count("y"), 1u);
  EXPECT_EQ(dir.files(), std::vector<std::string>{"m.safetensors"});
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_NE(st.st_mode & 0444, 0u);  // readable, not a 0600 temp-file mode
}

TEST(SafeTensorsWrite, RenameFailureKeepsNothingHalfWritten) {
  TempDir dir;
  ::mkdir(dir.file("sub").c_str(), 0755);
  // Renaming a file over a directory fails: the error names the path and the temporary file is removed.
  try {
    save_safetensors(dir.file("sub"), {{"x", Tensor::ones({1})}});
    FAIL() << "no throw";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("[safetensors] cannot replace"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dir.files(), std::vector<std::string>{"sub"});
  ::rmdir(dir.file("sub").c_str());
}

TEST(SafeTensorsWrite, MissingDirectoryIsSystemError) {
  try {
    save_safetensors("/nonexistent/qkv/out.safetensors", {{"x", Tensor::ones({1})}});
    FAIL() << "no throw";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory);
    EXPECT_NE(std::string(e.what()).find("[safetensors] cannot create a temporary file"), std::string::npos);
  }
}

}  // namespace
}  // namespace qkv
