// safetensors header parsing: validation of every rule with its own message (sizes, UTF-8 JSON object, dtypes,
// shapes, offsets, duplicates, exact coverage of the data buffer) and the dtype table. Loading: safetensors_read.cpp.
#include "qkv/core/safetensors.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string_view>

#include "qkv/core/error.h"
#include "qkv/core/json.h"
#include "safetensors_internal.h"

namespace qkv {
using namespace safetensors_internal;
namespace {

constexpr uint64_t kMaxHeaderSize = 100'000'000;  // the reference implementation's limit

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

std::string describe_byte(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x21 && u < 0x7F) return std::string("'") + c + "'";
  static const char* hex = "0123456789abcdef";
  return std::string("byte 0x") + hex[u >> 4] + hex[u & 15];
}

std::string offsets_str(const SafeTensorsEntry& e) {
  return detail::concat("[", e.begin, ", ", e.end, "]");
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

}  // namespace qkv
