// safetensors loading: dtype conversion to float32 (integers, BOOL, F16, BF16, the F8 variants), mmap loading with
// zero-copy aligned F32 views, and raw reads of a file's bytes. The header rules live in safetensors.cpp.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>

#include "qkv/core/error.h"
#include "qkv/core/half.h"
#include "qkv/core/safetensors.h"
#include "safetensors_internal.h"

namespace qkv {
using namespace safetensors_internal;
namespace {

// --- conversion to float32 ------------------------------------------------------------------------------------

// Decodes one 8-bit float with `ebits` exponent and `mbits` mantissa bits; `dtype` picks the inf/NaN rules.
float f8_to_f32(uint8_t b, int ebits, int mbits, int bias, SafeTensorsDtype dtype) {
  const bool negative = (b & 0x80) != 0;
  const uint32_t exp = (b >> mbits) & ((1u << ebits) - 1);
  const uint32_t mant = b & ((1u << mbits) - 1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  switch (dtype) {
    case SafeTensorsDtype::F8_E5M2:  // IEEE-like: inf and NaN at exponent 31
      if (exp == 31) {
        const float v = mant == 0 ? std::numeric_limits<float>::infinity() : nan;
        return negative ? -v : v;
      }
      break;
    case SafeTensorsDtype::F8_E4M3:  // "fn": no inf, NaN only at S.1111.111
      if ((b & 0x7F) == 0x7F) return negative ? -nan : nan;
      break;
    case SafeTensorsDtype::F8_E4M3FNUZ:  // "fnuz": no inf, no -0, 0x80 is the only NaN
    case SafeTensorsDtype::F8_E5M2FNUZ:
      if (b == 0x80) return nan;
      break;
    default: break;
  }
  float v = exp == 0 ? std::ldexp(static_cast<float>(mant), 1 - bias - mbits)
                     : std::ldexp(static_cast<float>((1u << mbits) | mant), static_cast<int>(exp) - bias - mbits);
  return negative ? -v : v;
}

const std::array<float, 256>& f8_table(SafeTensorsDtype dtype) {
  auto build = [](SafeTensorsDtype dt, int ebits, int mbits, int bias) {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) {
      const auto b = static_cast<uint8_t>(i);
      if (dt == SafeTensorsDtype::F8_E8M0)  // exponent only, unsigned: 2^(b-127), 0xFF is NaN
        t[i] = b == 0xFF ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, i - 127);
      else
        t[i] = f8_to_f32(b, ebits, mbits, bias, dt);
    }
    return t;
  };
  static const std::array<float, 256> e5m2 = build(SafeTensorsDtype::F8_E5M2, 5, 2, 15);
  static const std::array<float, 256> e4m3 = build(SafeTensorsDtype::F8_E4M3, 4, 3, 7);
  static const std::array<float, 256> e4m3fnuz = build(SafeTensorsDtype::F8_E4M3FNUZ, 4, 3, 8);
  static const std::array<float, 256> e5m2fnuz = build(SafeTensorsDtype::F8_E5M2FNUZ, 5, 2, 16);
  static const std::array<float, 256> e8m0 = build(SafeTensorsDtype::F8_E8M0, 8, 0, 127);
  switch (dtype) {
    case SafeTensorsDtype::F8_E5M2: return e5m2;
    case SafeTensorsDtype::F8_E4M3: return e4m3;
    case SafeTensorsDtype::F8_E4M3FNUZ: return e4m3fnuz;
    case SafeTensorsDtype::F8_E5M2FNUZ: return e5m2fnuz;
    case SafeTensorsDtype::F8_E8M0: return e8m0;
    default: break;
  }
  throw std::logic_error("[safetensors] internal: f8_table called for a non-F8 dtype");
}

template <typename T>
void convert_int(const uint8_t* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load_le<T>(src + i * sizeof(T)));
}

void convert(const SafeTensorsEntry& e, const uint8_t* src, size_t n, float* dst) {
  switch (e.dtype) {
    case SafeTensorsDtype::BOOL:
      for (size_t i = 0; i < n; ++i) {
        if (src[i] > 1)
          malformed(detail::concat("BOOL tensor ", json_quote(e.name), " holds byte ", static_cast<int>(src[i]),
                                   " at element ", i, "; only 0 and 1 are valid"));
        dst[i] = static_cast<float>(src[i]);
      }
      return;
    case SafeTensorsDtype::U8: convert_int<uint8_t>(src, n, dst); return;
    case SafeTensorsDtype::I8: convert_int<int8_t>(src, n, dst); return;
    case SafeTensorsDtype::I16: convert_int<int16_t>(src, n, dst); return;
    case SafeTensorsDtype::U16: convert_int<uint16_t>(src, n, dst); return;
    case SafeTensorsDtype::I32: convert_int<int32_t>(src, n, dst); return;
    case SafeTensorsDtype::U32: convert_int<uint32_t>(src, n, dst); return;
    case SafeTensorsDtype::I64: convert_int<int64_t>(src, n, dst); return;
    case SafeTensorsDtype::U64: convert_int<uint64_t>(src, n, dst); return;
    case SafeTensorsDtype::F64: convert_int<double>(src, n, dst); return;
    case SafeTensorsDtype::F32: std::memcpy(dst, src, n * sizeof(float)); return;
    case SafeTensorsDtype::F16:
      for (size_t i = 0; i < n; ++i) dst[i] = fp16_to_float(load_le<uint16_t>(src + 2 * i));
      return;
    case SafeTensorsDtype::BF16:
      for (size_t i = 0; i < n; ++i)
        dst[i] = std::bit_cast<float>(static_cast<uint32_t>(load_le<uint16_t>(src + 2 * i)) << 16);
      return;
    case SafeTensorsDtype::F8_E5M2:
    case SafeTensorsDtype::F8_E4M3:
    case SafeTensorsDtype::F8_E8M0:
    case SafeTensorsDtype::F8_E4M3FNUZ:
    case SafeTensorsDtype::F8_E5M2FNUZ: {
      const std::array<float, 256>& table = f8_table(e.dtype);
      for (size_t i = 0; i < n; ++i) dst[i] = table[src[i]];
      return;
    }
    case SafeTensorsDtype::F4:
    case SafeTensorsDtype::F6_E2M3:
    case SafeTensorsDtype::F6_E3M2:
    case SafeTensorsDtype::C64: break;
  }
  throw std::logic_error("[safetensors] internal: convert() reached for a dtype without a float32 conversion");
}

// Builds the tensors of a validated file. `owner` non-null: `base` is a mapping it keeps alive, and aligned F32
// tensors view it; null: every tensor is copied.
SafeTensorsFile build_tensors(const uint8_t* base, const SafeTensorsHeader& h, const std::shared_ptr<void>& owner) {
  for (const SafeTensorsEntry& e : h.entries) {
    if (!dtype_converts_to_float32(e.dtype))
      throw std::runtime_error(detail::concat(kOp, "tensor ", json_quote(e.name), " has dtype ", dtype_name(e.dtype),
                                              ", which is valid but has no float32 conversion in qkv"));
  }
  SafeTensorsFile out;
  out.metadata = h.metadata;
  const uint8_t* data = base + 8 + h.header_size;
  for (const SafeTensorsEntry& e : h.entries) {
    const int64_t numel = shape_numel(e.shape);
    const uint8_t* src = data + e.begin;
    Tensor t;
    if (numel > 0 && owner && e.dtype == SafeTensorsDtype::F32 &&
        reinterpret_cast<uintptr_t>(src) % alignof(float) == 0) {
      t = Tensor::from_blob(reinterpret_cast<float*>(const_cast<uint8_t*>(src)), e.shape, {}, owner);
    } else {
      t = Tensor::empty(e.shape);
      if (numel > 0) convert(e, src, static_cast<size_t>(numel), t.data());
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) ::munmap(addr, size);
  }
};

// Checks the one rule the header cannot: BOOL bytes are 0 or 1.
void check_bool_bytes(const uint8_t* data, const SafeTensorsHeader& h) {
  for (const SafeTensorsEntry& e : h.entries) {
    if (e.dtype != SafeTensorsDtype::BOOL) continue;
    const uint8_t* src = data + e.begin;
    for (uint64_t i = 0; i < e.end - e.begin; ++i)
      if (src[i] > 1)
        malformed(detail::concat("BOOL tensor ", json_quote(e.name), " holds byte ", static_cast<int>(src[i]),
                                 " at element ", i, "; only 0 and 1 are valid"));
  }
}

// Opens a regular file for reading; `size` receives its length (>= 8, else the file is malformed).
void open_for_reading(const std::string& path, Fd& f, size_t& size) {
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) io_error(errno, detail::concat("cannot open ", json_quote(path)));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) io_error(errno, detail::concat("cannot stat ", json_quote(path)));
  if (S_ISDIR(st.st_mode)) io_error(EISDIR, detail::concat("cannot load ", json_quote(path)));
  if (!S_ISREG(st.st_mode)) io_error(EINVAL, detail::concat(json_quote(path), " is not a regular file"));
  size = static_cast<size_t>(st.st_size);
  if (size < 8)
    malformed(detail::concat(json_quote(path), " is ", size, " bytes, shorter than the 8-byte header size field"));
}

// parse_safetensors_header with the file's name in the error: "[safetensors] \"PATH\": reason".
SafeTensorsHeader parse_file_header(const std::string& path, const uint8_t* base, size_t size) {
  try {
    return parse_safetensors_header(base, size);
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    const std::string reason = what.rfind(kOp, 0) == 0 ? what.substr(std::strlen(kOp)) : what;
    malformed(detail::concat(json_quote(path), ": ", reason));
  }
}

std::shared_ptr<Mapping> map_file(const std::string& path, const Fd& f, size_t size) {
  auto m = std::make_shared<Mapping>();
  // MAP_PRIVATE + PROT_WRITE: copy-on-write, so callers may modify zero-copy tensors without touching the file.
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, f.fd, 0);
  if (addr == MAP_FAILED) io_error(errno, detail::concat("cannot map ", json_quote(path)));
  m->addr = addr;
  m->size = size;
  return m;
}

// The whole file in a heap buffer; a file that shrinks while it is read is an I/O error, never a short buffer.
std::shared_ptr<uint8_t[]> read_all(const std::string& path, const Fd& f, size_t size) {
  std::shared_ptr<uint8_t[]> buf(new uint8_t[size]);
  size_t done = 0;
  while (done < size) {
    const ssize_t r = ::pread(f.fd, buf.get() + done, size - done, static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) io_error(errno, detail::concat("reading ", json_quote(path), " failed"));
    if (r == 0) io_error(EIO, detail::concat(json_quote(path), " shrank to ", done, " bytes while it was read"));
    done += static_cast<size_t>(r);
  }
  return buf;
}

}  // namespace

// --- public API -------------------------------------------------------------------------------------------------

SafeTensorsFile load_safetensors_from_memory(const void* bytes, size_t size) {
  const SafeTensorsHeader h = parse_safetensors_header(bytes, size);
  return build_tensors(static_cast<const uint8_t*>(bytes), h, nullptr);
}

SafeTensorsFile load_safetensors(const std::string& path) {
  Fd f;
  size_t size = 0;
  open_for_reading(path, f, size);
  const std::shared_ptr<Mapping> m = map_file(path, f, size);
  const auto* base = static_cast<const uint8_t*>(m->addr);
  const SafeTensorsHeader h = parse_file_header(path, base, size);
  try {
    return build_tensors(base, h, std::static_pointer_cast<void>(m));
  } catch (const std::invalid_argument& e) {  // a BOOL byte other than 0/1
    malformed(detail::concat(json_quote(path), ": ", std::string(e.what()).substr(std::strlen(kOp))));
  }
}

void safetensors_to_float32(const SafeTensorsEntry& e, const void* src, float* dst) {
  QKV_CHECK_RUNTIME(dtype_converts_to_float32(e.dtype), kOp, "tensor ", json_quote(e.name), " has dtype ",
                    dtype_name(e.dtype), ", which is valid but has no float32 conversion in qkv");
  const int64_t numel = shape_numel(e.shape);
  if (numel > 0) convert(e, static_cast<const uint8_t*>(src), static_cast<size_t>(numel), dst);
}

SafeTensorsBytes read_safetensors_bytes(const std::string& path, bool map) {
  Fd f;
  size_t size = 0;
  open_for_reading(path, f, size);
  SafeTensorsBytes out;
  if (map) {
    const std::shared_ptr<Mapping> m = map_file(path, f, size);
    out.file = std::shared_ptr<const uint8_t>(m, static_cast<const uint8_t*>(m->addr));
  } else {
    const std::shared_ptr<uint8_t[]> buf = read_all(path, f, size);
    out.file = std::shared_ptr<const uint8_t>(buf, buf.get());
  }
  out.size = size;
  out.header = parse_file_header(path, out.file.get(), size);
  try {
    check_bool_bytes(out.data(), out.header);
  } catch (const std::invalid_argument& e) {
    malformed(detail::concat(json_quote(path), ": ", std::string(e.what()).substr(std::strlen(kOp))));
  }
  return out;
}

}  // namespace qkv
