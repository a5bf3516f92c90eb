// safetensors reader and writer: header validation (every rule, own message each), dtype conversion to float32,
// mmap loading with zero-copy aligned F32 views, and atomic writing (temporary file, fsync, rename).
#include "qkv/core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include "qkv/core/json.h"
#include "qkv/core/error.h"

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace qkv {
namespace {

constexpr uint64_t kMaxHeaderSize = 100'000'000;  // the reference implementation's limit
constexpr const char* kOp = "[safetensors] ";

struct DtypeInfo {
  SafeTensorsDtype dtype;
  const char* name;
  int bits;
  bool converts;
};

constexpr std::array<DtypeInfo, 22> kDtypes = {{
    {SafeTensorsDtype::BOOL, "BOOL", 8, true},
    {SafeTensorsDtype::F4, "F4", 4, false},
    {SafeTensorsDtype::F6_E2M3, "F6_E2M3", 6, false},
    {SafeTensorsDtype::F6_E3M2, "F6_E3M2", 6, false},
    {SafeTensorsDtype::U8, "U8", 8, true},
    {SafeTensorsDtype::I8, "I8", 8, true},
    {SafeTensorsDtype::F8_E5M2, "F8_E5M2", 8, true},
    {SafeTensorsDtype::F8_E4M3, "F8_E4M3", 8, true},
    {SafeTensorsDtype::F8_E8M0, "F8_E8M0", 8, true},
    {SafeTensorsDtype::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8, true},
    {SafeTensorsDtype::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8, true},
    {SafeTensorsDtype::I16, "I16", 16, true},
    {SafeTensorsDtype::U16, "U16", 16, true},
    {SafeTensorsDtype::F16, "F16", 16, true},
    {SafeTensorsDtype::BF16, "BF16", 16, true},
    {SafeTensorsDtype::I32, "I32", 32, true},
    {SafeTensorsDtype::U32, "U32", 32, true},
    {SafeTensorsDtype::F32, "F32", 32, true},
    {SafeTensorsDtype::C64, "C64", 64, false},
    {SafeTensorsDtype::F64, "F64", 64, true},
    {SafeTensorsDtype::I64, "I64", 64, true},
    {SafeTensorsDtype::U64, "U64", 64, true},
}};

const DtypeInfo& info(SafeTensorsDtype dtype) {
  const auto i = static_cast<size_t>(dtype);
  QKV_ASSERT(i < kDtypes.size() && kDtypes[i].dtype == dtype);
  return kDtypes[i];
}

bool lookup_dtype(std::string_view name, SafeTensorsDtype* out) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) {
      *out = d.dtype;
      return true;
    }
  }
  return false;
}

std::string json_quote(std::string_view s) {
  std::string out;
  json::append_quoted(out, s);
  return out;
}

std::string describe_byte(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x21 && u < 0x7F) return std::string("'") + c + "'";
  static const char* hex = "0123456789abcdef";
  return std::string("byte 0x") + hex[u >> 4] + hex[u & 15];
}

std::string offsets_str(const SafeTensorsEntry& e) {
  return detail::concat("[", e.begin, ", ", e.end, "]");
}

[[noreturn]] void malformed(const std::string& what) { throw std::invalid_argument(kOp + what); }

[[noreturn]] void io_error(int err, const std::string& what) {
  throw std::system_error(err, std::generic_category(), kOp + what);
}

// --- header parsing -----------------------------------------------------------------------------------------

void parse_metadata(json::Reader& r, std::map<std::string, std::string>& metadata) {
  const json::Kind kind = r.peek_kind();
  if (kind != json::Kind::Object)
    r.fail(detail::concat("__metadata__ must be an object of string -> string, got ", json::kind_name(kind)));
  r.begin_object();
  std::string key;
  while (r.next_key(key)) {
    const json::Kind vk = r.peek_kind();
    if (vk != json::Kind::String)
      r.fail(detail::concat("__metadata__ value of key ", json_quote(key), " must be a string, got ",
                            json::kind_name(vk)));
    std::string value = r.read_string();
    if (!metadata.emplace(key, std::move(value)).second)
      r.fail(detail::concat("duplicate __metadata__ key ", json_quote(key)));
  }
}

SafeTensorsEntry parse_entry(json::Reader& r, std::string name) {
  SafeTensorsEntry e;
  e.name = std::move(name);
  const std::string q = json_quote(e.name);
  const json::Kind kind = r.peek_kind();
  if (kind != json::Kind::Object)
    r.fail(detail::concat("tensor ", q, " must be an object with dtype, shape and data_offsets, got ",
                          json::kind_name(kind)));
  r.begin_object();
  bool has_dtype = false, has_shape = false, has_offsets = false;
  std::string field;
  while (r.next_key(field)) {
    if (field == "dtype") {
      if (has_dtype) r.fail(detail::concat("duplicate field \"dtype\" in tensor ", q));
      has_dtype = true;
      const json::Kind k = r.peek_kind();
      if (k != json::Kind::String)
        r.fail(detail::concat("dtype of tensor ", q, " must be a string, got ", json::kind_name(k)));
      const size_t at = r.pos();
      const std::string dtype = r.read_string();
      if (!lookup_dtype(dtype, &e.dtype))
        r.fail_at(at, detail::concat("unknown dtype ", json_quote(dtype), " for tensor ", q));
    } else if (field == "shape") {
      if (has_shape) r.fail(detail::concat("duplicate field \"shape\" in tensor ", q));
      has_shape = true;
      const json::Kind k = r.peek_kind();
      if (k != json::Kind::Array)
        r.fail(detail::concat("shape of tensor ", q, " must be an array of integers, got ", json::kind_name(k)));
      r.begin_array();
      while (r.next_element()) {
        const size_t at = r.pos();
        const uint64_t d = r.read_uint64(detail::concat("shape dimension of tensor ", q));
        if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          r.fail_at(at, detail::concat("shape dimension ", d, " of tensor ", q, " exceeds int64"));
        e.shape.push_back(static_cast<int64_t>(d));
      }
    } else if (field == "data_offsets") {
      if (has_offsets) r.fail(detail::concat("duplicate field \"data_offsets\" in tensor ", q));
      has_offsets = true;
      const json::Kind k = r.peek_kind();
      if (k != json::Kind::Array)
        r.fail(detail::concat("data_offsets of tensor ", q, " must be [begin, end], got ", json::kind_name(k)));
      const size_t at = r.pos();
      r.begin_array();
      uint64_t v[2] = {0, 0};
      size_t count = 0;
      while (r.next_element()) {
        if (count == 2)
          r.fail_at(at, detail::concat("data_offsets of tensor ", q, " must be [begin, end], got more than 2 values"));
        v[count++] = r.read_uint64(detail::concat("data_offsets of tensor ", q));
      }
      if (count != 2)
        r.fail_at(at, detail::concat("data_offsets of tensor ", q, " must be [begin, end], got ", count,
                                     count == 1 ? " value" : " values"));
      if (v[0] > v[1])
        r.fail_at(at, detail::concat("data_offsets of tensor ", q, " are [", v[0], ", ", v[1],
                                     "]: begin must not exceed end"));
      e.begin = v[0];
      e.end = v[1];
    } else {
      r.fail(detail::concat("unknown field ", json_quote(field), " in tensor ", q,
                            " (expected dtype, shape, data_offsets)"));
    }
  }
  if (!has_dtype) r.fail(detail::concat("tensor ", q, " has no dtype"));
  if (!has_shape) r.fail(detail::concat("tensor ", q, " has no shape"));
  if (!has_offsets) r.fail(detail::concat("tensor ", q, " has no data_offsets"));
  return e;
}

// Element count, bit size and byte size of one entry, with every product checked.
void check_entry_size(const SafeTensorsEntry& e) {
  const std::string q = json_quote(e.name);
  const char* dt = dtype_name(e.dtype);
  uint64_t numel = 1, nonzero = 1;
  for (int64_t d : e.shape) {
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel))
      malformed(detail::concat("element count of tensor ", q, " with shape ", str(e.shape), " overflows 64 bits"));
  }
  // qkv (and NumPy) need every stride of the float32 result in bytes to fit int64, even for an empty tensor.
  constexpr uint64_t kMaxStride = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / sizeof(float);
  for (int64_t d : e.shape) {
    if (d == 0) continue;
    if (__builtin_mul_overflow(nonzero, static_cast<uint64_t>(d), &nonzero) || nonzero > kMaxStride)
      malformed(detail::concat("shape ", str(e.shape), " of tensor ", q,
                               " is too large: its non-zero dimensions times 4 bytes pass int64"));
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_bits(e.dtype)), &bits))
    malformed(detail::concat("byte size of ", dt, " tensor ", q, " with shape ", str(e.shape), " overflows 64 bits"));
  if (bits % 8 != 0)
    malformed(detail::concat(dt, " tensor ", q, " with shape ", str(e.shape), " holds ", bits,
                             " bits, which do not end on a byte boundary"));
  if (bits / 8 != e.end - e.begin)
    malformed(detail::concat(dt, " tensor ", q, " with shape ", str(e.shape), " needs ", bits / 8,
                             " bytes but data_offsets ", offsets_str(e), " span ", e.end - e.begin));
}

// The sorted entries must tile [0, data_size) exactly.
void check_coverage(const std::vector<SafeTensorsEntry>& entries, uint64_t data_size) {
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafeTensorsEntry& e = entries[i];
    if (e.begin > covered) {
      if (i == 0)
        malformed(detail::concat("hole at the start of the data buffer: the first tensor ", json_quote(e.name),
                                 " begins at byte ", e.begin, ", not 0"));
      malformed(detail::concat("hole in the data buffer: bytes [", covered, ", ", e.begin, ") between tensor ",
                               json_quote(entries[i - 1].name), " and tensor ", json_quote(e.name), " belong to no tensor"));
    }
    if (e.begin < covered)
      malformed(detail::concat("tensor ", json_quote(entries[i - 1].name), " ", offsets_str(entries[i - 1]),
                               " and tensor ", json_quote(e.name), " ", offsets_str(e), " overlap"));
    covered = e.end;
  }
  if (covered > data_size)
    malformed(detail::concat("tensor ", json_quote(entries.back().name), " ends at byte ", covered,
                             " of the data buffer, past its end (", data_size, " bytes; is the file truncated?)"));
  if (covered < data_size)
    malformed(detail::concat(data_size - covered, " trailing bytes after the last tensor's data (",
                             data_size, "-byte data buffer, tensors cover ", covered, ")"));
}

// --- conversion to float32 ------------------------------------------------------------------------------------

template <typename T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal, exact
    bits = std::bit_cast<uint32_t>(v) | sign;
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf or NaN (payload kept, as numpy does)
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

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
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_le<uint16_t>(src + 2 * i));
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

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// --- writing ------------------------------------------------------------------------------------------------

using Sink = std::function<void(const void*, size_t)>;

void check_utf8(std::string_view s, const char* what) {
  const size_t bad = json::first_invalid_utf8(s);
  if (bad != std::string_view::npos)
    throw std::invalid_argument(detail::concat(kOp, what, " ", json_quote(s.substr(0, bad)), "... is not valid UTF-8 (byte ",
                                               bad, ")"));
}

// One tensor to write: its bytes in C order, already in the file's dtype (little-endian).
struct OutEntry {
  const std::string* name;
  SafeTensorsDtype dtype;
  Shape shape;
  const void* data;
};

// The file's byte count for `numel` elements of `dtype` (sub-byte dtypes must end on a byte boundary).
uint64_t entry_bytes(const std::string& name, SafeTensorsDtype dtype, const Shape& shape) {
  uint64_t numel = 1;
  for (int64_t d : shape) {
    QKV_CHECK_ARG(d >= 0, kOp, "tensor ", json_quote(name), " has a negative dimension in ", str(shape));
    QKV_CHECK_ARG(!__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel), kOp, "tensor ",
                  json_quote(name), " with shape ", str(shape), " makes the file too large");
  }
  uint64_t bits = 0;
  QKV_CHECK_ARG(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_bits(dtype)), &bits), kOp, "tensor ",
                json_quote(name), " with shape ", str(shape), " makes the file too large");
  QKV_CHECK_ARG(bits % 8 == 0, kOp, "tensor ", json_quote(name), " of dtype ", dtype_name(dtype), " and shape ",
                str(shape), " does not end on a byte boundary");
  return bits / 8;
}

// Validates the arguments and returns the padded header; `data_size` receives the buffer size.
std::string make_header(const std::vector<OutEntry>& entries, const std::map<std::string, std::string>& metadata,
                        uint64_t* data_size) {
  for (const auto& [k, v] : metadata) {
    check_utf8(k, "metadata key");
    check_utf8(v, "metadata value");
  }
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) h += ',';
      first = false;
      json::append_quoted(h, k);
      h += ':';
      json::append_quoted(h, v);
    }
    h += '}';
  }
  uint64_t offset = 0;
  for (const OutEntry& e : entries) {
    const std::string& name = *e.name;
    QKV_CHECK_ARG(name != "__metadata__", kOp, "the tensor name \"__metadata__\" is reserved for metadata");
    check_utf8(name, "tensor name");
    uint64_t end = 0;
    QKV_CHECK_ARG(!__builtin_add_overflow(offset, entry_bytes(name, e.dtype, e.shape), &end), kOp, "tensor ",
                  json_quote(name), " with shape ", str(e.shape), " makes the file too large");
    if (h.size() > 1) h += ',';
    json::append_quoted(h, name);
    h += ":{\"dtype\":\"";
    h += dtype_name(e.dtype);
    h += "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i) h += ',';
      h += std::to_string(e.shape[i]);
    }
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');
  *data_size = offset;
  return h;
}

void write_file_contents(const std::vector<OutEntry>& entries, const std::string& header, const Sink& sink) {
  const uint64_t n = header.size();
  uint8_t size_field[8];
  std::memcpy(size_field, &n, 8);
  sink(size_field, 8);
  sink(header.data(), header.size());
  for (const OutEntry& e : entries) {
    const uint64_t bytes = entry_bytes(*e.name, e.dtype, e.shape);
    if (bytes > 0) sink(e.data, static_cast<size_t>(bytes));
  }
}

// float32 tensors as F32 entries; `keep` holds the contiguous copies the entries point into.
std::vector<OutEntry> f32_entries(const std::map<std::string, Tensor>& tensors, std::vector<Tensor>& keep) {
  std::vector<OutEntry> out;
  keep.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    QKV_CHECK_ARG(t.defined(), kOp, "tensor ", json_quote(name), " is undefined");
    keep.push_back(t.contiguous());
    out.push_back({&name, SafeTensorsDtype::F32, t.shape(), keep.back().numel() > 0 ? keep.back().data() : nullptr});
  }
  return out;
}

std::vector<OutEntry> raw_entries(const std::map<std::string, SafeTensorsRaw>& tensors) {
  std::vector<OutEntry> out;
  for (const auto& [name, t] : tensors) {
    QKV_CHECK_ARG(t.data != nullptr || entry_bytes(name, t.dtype, t.shape) == 0, kOp, "tensor ", json_quote(name),
                  " has no data");
    out.push_back({&name, t.dtype, t.shape, t.data});
  }
  return out;
}

std::string serialize_entries(const std::vector<OutEntry>& entries, const std::map<std::string, std::string>& metadata) {
  uint64_t data_size = 0;
  const std::string header = make_header(entries, metadata, &data_size);
  std::string out;
  out.reserve(8 + header.size() + data_size);
  write_file_contents(entries, header, [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); });
  return out;
}

void save_entries(const std::string& path, const std::vector<OutEntry>& entries,
                  const std::map<std::string, std::string>& metadata);

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

}  // namespace

// --- public API -------------------------------------------------------------------------------------------------

const char* dtype_name(SafeTensorsDtype dtype) { return info(dtype).name; }
int dtype_bits(SafeTensorsDtype dtype) { return info(dtype).bits; }
bool dtype_converts_to_float32(SafeTensorsDtype dtype) { return info(dtype).converts; }

SafeTensorsHeader parse_safetensors_header(const void* bytes, size_t size) {
  QKV_CHECK_ARG(bytes != nullptr || size == 0, kOp, "null buffer of ", size, " bytes");
  const auto* p = static_cast<const uint8_t*>(bytes);
  if (size < 8) malformed(detail::concat("file is ", size, " bytes, shorter than the 8-byte header size field"));
  SafeTensorsHeader h;
  const uint64_t n = load_le<uint64_t>(p);
  if (n > kMaxHeaderSize)
    malformed(detail::concat("header size ", n, " exceeds the limit of ", kMaxHeaderSize, " bytes"));
  if (n > size - 8)
    malformed(detail::concat("header size ", n, " runs past the end of the file (", size - 8,
                             " bytes follow the size field)"));
  h.header_size = n;
  h.data_size = size - 8 - n;
  const std::string_view text(reinterpret_cast<const char*>(p + 8), n);
  json::Reader r(text, "[safetensors] header");  // rejects invalid UTF-8
  if (text.empty()) malformed("header is empty; it must be a JSON object");
  if (text[0] != '{') {
    const char c = text[0];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
      malformed(detail::concat("header must start with '{', found leading whitespace (", describe_byte(c), ")"));
    const json::Kind kind = r.peek_kind();
    if (kind == json::Kind::Invalid)
      malformed(detail::concat("header is not JSON: it starts with ", describe_byte(c)));
    malformed(detail::concat("header is not a JSON object: it starts with ", json::kind_name(kind)));
  }

  r.begin_object();
  bool has_metadata = false;
  std::string key;
  while (r.next_key(key)) {
    if (key == "__metadata__") {
      if (has_metadata) r.fail("duplicate __metadata__ section");
      has_metadata = true;
      parse_metadata(r, h.metadata);
    } else {
      h.entries.push_back(parse_entry(r, std::move(key)));
    }
  }
  const std::string_view rest = r.rest();
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] == ' ') continue;
    const size_t at = r.pos() + i;
    const char c = rest[i];
    if (c == '\t' || c == '\n' || c == '\r')
      r.fail_at(at, detail::concat("padding after the JSON object must be spaces (0x20), found ", describe_byte(c)));
    r.fail_at(at, detail::concat("unexpected ", describe_byte(c), " after the JSON object"));
  }

  // Duplicate names: sort a permutation by name.
  std::vector<size_t> order(h.entries.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return h.entries[a].name < h.entries[b].name; });
  for (size_t i = 1; i < order.size(); ++i) {
    if (h.entries[order[i]].name == h.entries[order[i - 1]].name)
      malformed(detail::concat("duplicate tensor name ", json_quote(h.entries[order[i]].name)));
  }
  for (const SafeTensorsEntry& e : h.entries) check_entry_size(e);
  std::stable_sort(h.entries.begin(), h.entries.end(), [](const SafeTensorsEntry& a, const SafeTensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  check_coverage(h.entries, h.data_size);
  return h;
}

SafeTensorsFile load_safetensors_from_memory(const void* bytes, size_t size) {
  const SafeTensorsHeader h = parse_safetensors_header(bytes, size);
  return build_tensors(static_cast<const uint8_t*>(bytes), h, nullptr);
}

namespace {

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

std::string serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::vector<Tensor> keep;
  return serialize_entries(f32_entries(tensors, keep), metadata);
}

std::string serialize_safetensors_raw(const std::map<std::string, SafeTensorsRaw>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  return serialize_entries(raw_entries(tensors), metadata);
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  QKV_CHECK_ARG(!path.empty(), kOp, "empty output path");
  std::vector<Tensor> keep;
  save_entries(path, f32_entries(tensors, keep), metadata);
}

void save_safetensors_raw(const std::string& path, const std::map<std::string, SafeTensorsRaw>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  QKV_CHECK_ARG(!path.empty(), kOp, "empty output path");
  save_entries(path, raw_entries(tensors), metadata);
}

namespace {

void save_entries(const std::string& path, const std::vector<OutEntry>& entries,
                  const std::map<std::string, std::string>& metadata) {
  uint64_t data_size = 0;
  const std::string header = make_header(entries, metadata, &data_size);  // validates before touching disk

  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path target(path);
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  std::string tmp;
  Fd f;
  for (int attempt = 0; attempt < 100 && f.fd < 0; ++attempt) {  // a stale file from a dead process: next name
    tmp = (dir / detail::concat(".", target.filename().string(), ".tmp.", ::getpid(), ".", counter.fetch_add(1)))
              .string();
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (f.fd < 0 && errno != EEXIST) break;
  }
  if (f.fd < 0) io_error(errno, detail::concat("cannot create a temporary file for ", json_quote(path)));
  try {
    write_file_contents(entries, header, [&](const void* p, size_t n) {
      const auto* c = static_cast<const char*>(p);
      while (n > 0) {
        const ssize_t w = ::write(f.fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) io_error(w < 0 ? errno : EIO, detail::concat("writing ", json_quote(path), " failed"));
        c += w;
        n -= static_cast<size_t>(w);
      }
    });
    if (::fsync(f.fd) != 0) io_error(errno, detail::concat("flushing ", json_quote(path), " failed"));
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) io_error(errno, detail::concat("closing ", json_quote(path), " failed"));
    if (::rename(tmp.c_str(), path.c_str()) != 0) io_error(errno, detail::concat("cannot replace ", json_quote(path)));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // best effort: makes the rename durable
    ::close(dfd);
  }
}

}  // namespace

}  // namespace qkv
