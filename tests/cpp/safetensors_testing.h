// Shared by the safetensors tests (safetensors_test.cpp, safetensors_io_test.cpp): file bytes built by hand,
// the "malformed with this reason" check, and a temporary directory removed with its files.
#pragma once

#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "qkv/core/safetensors.h"

namespace qkv::testing::safetensors {

// 8-byte little-endian size + header + data.
inline std::string file_bytes(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

inline std::string raw_size(uint64_t n) {
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out;
}

// One tensor entry of a header: "name":{"dtype":..,"shape":..,"data_offsets":..}
inline std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

inline std::string zeros(size_t n) { return std::string(n, '\0'); }

// Loads from memory and returns the std::invalid_argument message, or "" when it did not throw that.
inline std::string malformed_message(const std::string& bytes) {
  try {
    load_safetensors_from_memory(bytes.data(), bytes.size());
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("WRONG EXCEPTION TYPE: ") + e.what();
  }
  return "";
}

// Malformed input must raise std::invalid_argument naming the op and the reason.
#define EXPECT_MALFORMED(bytes, reason)                                              \
  do {                                                                               \
    const std::string msg_ = malformed_message(bytes);                               \
    EXPECT_EQ(msg_.rfind("[safetensors] ", 0), 0u) << "message: " << msg_;           \
    EXPECT_NE(msg_.find(reason), std::string::npos) << "message: " << msg_;          \
  } while (0)

inline SafeTensorsFile load_bytes(const std::string& bytes) { return load_safetensors_from_memory(bytes.data(), bytes.size()); }

inline bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "qkv_st_XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    if (!p) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    for (const std::string& f : files()) ::unlink((path_ + "/" + f).c_str());
    ::rmdir(path_.c_str());
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") out.push_back(n);
      }
      ::closedir(d);
    }
    return out;
  }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(file(name), std::ios::binary) << bytes;
  }
  std::string read(const std::string& name) const {
    std::ifstream in(file(name), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string path_;
};

inline std::string f32_bytes(const std::vector<float>& v) {
  std::string out(v.size() * 4, '\0');
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <typename T>
std::string raw(const std::vector<T>& v) {
  std::string out(v.size() * sizeof(T), '\0');
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace qkv::testing::safetensors
