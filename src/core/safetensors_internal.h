// Private to the safetensors sources (safetensors.cpp parses headers, safetensors_read.cpp converts and loads,
// safetensors_write.cpp writes): the "[safetensors] " error prefix, the helpers raising its errors, raw I/O bits.
#pragma once

#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "qkv/core/json.h"

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace qkv::safetensors_internal {

inline constexpr const char* kOp = "[safetensors] ";

inline std::string json_quote(std::string_view s) {
  std::string out;
  json::append_quoted(out, s);
  return out;
}

[[noreturn]] inline void malformed(const std::string& what) { throw std::invalid_argument(kOp + what); }

[[noreturn]] inline void io_error(int err, const std::string& what) {
  throw std::system_error(err, std::generic_category(), kOp + what);
}

template <typename T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// A file descriptor closed when it goes out of scope (-1: none).
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace qkv::safetensors_internal
