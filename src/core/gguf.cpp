// GGUF reader: every rule of qkv/core/gguf.h checked while reading the header, each refusal one line naming the
// file, the key or tensor, and the byte. Tensor data is never copied; it stays in the mapping or the buffer.
#include "qkv/core/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string_view>
#include <unordered_set>

#include "qkv/core/error.h"

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace qkv::gguf {
namespace {

struct TypeTraits {
  const char* name;
  int64_t block;  // elements per block; 0: not a ggml type
  int64_t bytes;  // bytes per block
};

constexpr uint32_t kTypeCount = 42;
constexpr int64_t QK_K = 256;

// Indexed by ggml's type number (ggml-common.h block structs; gguf-py GGML_QUANT_SIZES).
constexpr TypeTraits kTypes[kTypeCount] = {
    {"F32", 1, 4},
    {"F16", 1, 2},
    {"Q4_0", 32, 2 + 16},
    {"Q4_1", 32, 2 + 2 + 16},
    {nullptr, 0, 0},  // 4: Q4_2, removed
    {nullptr, 0, 0},  // 5: Q4_3, removed
    {"Q5_0", 32, 2 + 4 + 16},
    {"Q5_1", 32, 2 + 2 + 4 + 16},
    {"Q8_0", 32, 2 + 32},
    {"Q8_1", 32, 4 + 4 + 32},
    {"Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4},
    {"Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12},
    {"Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12},
    {"Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12},
    {"Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16},
    {"Q8_K", QK_K, 4 + QK_K + QK_K / 8},
    {"IQ2_XXS", QK_K, 2 + QK_K / 4},
    {"IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32},
    {"IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8},
    {"IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16},
    {"IQ4_NL", 32, 2 + 16},
    {"IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4},
    {"IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16},
    {"IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64},
    {"I8", 1, 1},
    {"I16", 1, 2},
    {"I32", 1, 4},
    {"I64", 1, 8},
    {"F64", 1, 8},
    {"IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32},
    {"BF16", 1, 2},
    {nullptr, 0, 0},  // 31: Q4_0_4_4, removed
    {nullptr, 0, 0},  // 32: Q4_0_4_8, removed
    {nullptr, 0, 0},  // 33: Q4_0_8_8, removed
    {"TQ1_0", QK_K, 2 + 4 * 13},
    {"TQ2_0", QK_K, 2 + 64},
    {nullptr, 0, 0},  // 36: IQ4_NL_4_4, removed
    {nullptr, 0, 0},  // 37: IQ4_NL_4_8, removed
    {nullptr, 0, 0},  // 38: IQ4_NL_8_8, removed
    {"MXFP4", 32, 1 + 16},
    {"NVFP4", 64, 4 + 32},
    {"Q1_0", 128, 2 + 16},
};

constexpr const char* kValueTypeNames[] = {"UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",  "FLOAT32",
                                           "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
constexpr uint32_t kValueTypeCount = 13;

bool is_integer(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::UINT16: case ValueType::INT16:
    case ValueType::UINT32: case ValueType::INT32: case ValueType::UINT64: case ValueType::INT64: return true;
    default: return false;
  }
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// An integer element of a fixed-size type, widened: `negative` set for a negative signed value, `magnitude` its
// absolute value (two's complement safe for INT64_MIN).
struct Wide {
  bool negative;
  uint64_t magnitude;
};

Wide load_int(ValueType t, const uint8_t* p) {
  auto signed_wide = [](int64_t v) {
    return v < 0 ? Wide{true, uint64_t{0} - static_cast<uint64_t>(v)} : Wide{false, static_cast<uint64_t>(v)};
  };
  switch (t) {
    case ValueType::UINT8: return {false, load<uint8_t>(p)};
    case ValueType::INT8: return signed_wide(load<int8_t>(p));
    case ValueType::UINT16: return {false, load<uint16_t>(p)};
    case ValueType::INT16: return signed_wide(load<int16_t>(p));
    case ValueType::UINT32: return {false, load<uint32_t>(p)};
    case ValueType::INT32: return signed_wide(load<int32_t>(p));
    case ValueType::UINT64: return {false, load<uint64_t>(p)};
    case ValueType::INT64: return signed_wide(load<int64_t>(p));
    default: break;
  }
  QKV_ASSERT(false);
}

// A name as it may appear in a one-line message: printable ASCII kept, other bytes as \xNN, long names cut.
std::string printable(std::string_view s) {
  constexpr size_t kMax = 96;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > kMax) out += "...";
  return out;
}

// Reads the header of one file, throwing "[gguf] <file>: <what> (<context>) at byte <offset>".
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& file) : p_(data), size_(size), file_(file) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  void set_context(std::string context) { context_ = std::move(context); }

  [[noreturn]] void fail(const std::string& what, size_t at) const {
    std::string msg = "[gguf] " + file_ + ": " + what;
    if (!context_.empty()) msg += " (" + context_ + ")";
    msg += " at byte " + std::to_string(at);
    throw std::runtime_error(msg);
  }

  void need(size_t n, const char* what) const {
    if (n > remaining())
      fail(detail::concat("file ends inside ", what, " (", n, " bytes needed, ", remaining(), " left)"), pos_);
  }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v = load<T>(p_ + pos_);
    pos_ += sizeof(T);
    return v;
  }

  const uint8_t* bytes(size_t n, const char* what) {
    need(n, what);
    const uint8_t* at = p_ + pos_;
    pos_ += n;
    return at;
  }

  std::string string(const char* what) {
    const size_t at = pos_;
    const uint64_t n = read<uint64_t>(what);
    if (n > remaining())
      fail(detail::concat(what, " length ", n, " is past the end of the file (", remaining(), " bytes left)"), at);
    const auto* s = bytes(static_cast<size_t>(n), what);
    return std::string(reinterpret_cast<const char*>(s), static_cast<size_t>(n));
  }

 private:
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& file_;
  std::string context_;
};

uint64_t pad_to(uint64_t x, uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

// Reads `count` elements of fixed-size type `t` (checked against the bytes left) into raw, checking bools.
void read_fixed(Reader& r, ValueType t, uint64_t count, std::vector<uint8_t>& raw) {
  const size_t width = value_type_size(t);
  const size_t at = r.pos();
  if (count > r.remaining() / width)
    r.fail(detail::concat(count, " elements of ", kValueTypeNames[static_cast<uint32_t>(t)], " need ", "more than the ",
                          r.remaining(), " bytes left"),
           at);
  const size_t n = static_cast<size_t>(count) * width;
  const uint8_t* src = r.bytes(n, "a value");
  if (t == ValueType::BOOL) {
    for (size_t i = 0; i < n; ++i)
      if (src[i] > 1) r.fail(detail::concat("bool byte ", static_cast<int>(src[i]), " is not 0 or 1"), at + i);
  }
  raw.assign(src, src + n);
}

}  // namespace

// --- types ------------------------------------------------------------------------------------------------------

bool type_known(uint32_t type) { return type < kTypeCount && kTypes[type].block != 0; }

std::string type_name(Type type) {
  const auto t = static_cast<uint32_t>(type);
  return type_known(t) ? std::string(kTypes[t].name) : "type " + std::to_string(t);
}

int64_t block_size(Type type) {
  const auto t = static_cast<uint32_t>(type);
  return type_known(t) ? kTypes[t].block : 0;
}

int64_t type_size(Type type) {
  const auto t = static_cast<uint32_t>(type);
  return type_known(t) ? kTypes[t].bytes : 0;
}

int64_t row_bytes(Type type, int64_t n) {
  const int64_t block = block_size(type);
  QKV_CHECK_ARG(block > 0, "[gguf] row_bytes: ", type_name(type), " is not a ggml type");
  QKV_CHECK_ARG(n >= 0 && n % block == 0, "[gguf] row_bytes: ", n, " elements of ", type_name(type),
                " are not a whole number of ", block, "-element blocks");
  return n / block * type_size(type);
}

const char* value_type_name(ValueType type) {
  const auto t = static_cast<uint32_t>(type);
  return t < kValueTypeCount ? kValueTypeNames[t] : "UNKNOWN";
}

size_t value_type_size(ValueType type) {
  switch (type) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    default: return 0;
  }
}

// --- values -----------------------------------------------------------------------------------------------------

void Value::wrong_type(const char* wanted) const {
  std::string have = value_type_name(type_);
  if (is_array()) have += std::string(" of ") + value_type_name(array_type_);
  throw std::runtime_error("[gguf] key '" + printable(key_) + "' is " + have + ", not " + wanted);
}

ValueType Value::array_type() const {
  if (!is_array()) wrong_type("an array");
  return array_type_;
}

size_t Value::size() const {
  if (!is_array()) wrong_type("an array");
  return static_cast<size_t>(count_);
}

int64_t Value::as_int() const {
  if (!is_integer(type_)) wrong_type("an integer");
  const Wide w = load_int(type_, raw_.data());
  if (!w.negative && w.magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw std::runtime_error(detail::concat("[gguf] key '", printable(key_), "' value ", w.magnitude,
                                            " does not fit int64"));
  return w.negative ? static_cast<int64_t>(uint64_t{0} - w.magnitude) : static_cast<int64_t>(w.magnitude);
}

uint64_t Value::as_uint() const {
  if (!is_integer(type_)) wrong_type("an integer");
  const Wide w = load_int(type_, raw_.data());
  if (w.negative && w.magnitude != 0)
    throw std::runtime_error(detail::concat("[gguf] key '", printable(key_), "' value -", w.magnitude,
                                            " is negative, not an unsigned integer"));
  return w.magnitude;
}

double Value::as_float() const {
  if (type_ == ValueType::FLOAT32) return load<float>(raw_.data());
  if (type_ == ValueType::FLOAT64) return load<double>(raw_.data());
  wrong_type("a float");
}

bool Value::as_bool() const {
  if (type_ != ValueType::BOOL) wrong_type("a bool");
  return raw_[0] != 0;
}

const std::string& Value::as_string() const {
  if (type_ != ValueType::STRING) wrong_type("a string");
  return strings_[0];
}

const std::vector<std::string>& Value::as_strings() const {
  if (!is_array() || array_type_ != ValueType::STRING) wrong_type("an array of strings");
  return strings_;
}

std::vector<int64_t> Value::as_ints() const {
  if (!is_array() || !is_integer(array_type_)) wrong_type("an array of integers");
  const size_t width = value_type_size(array_type_);
  std::vector<int64_t> out(static_cast<size_t>(count_));
  for (size_t i = 0; i < out.size(); ++i) {
    const Wide w = load_int(array_type_, raw_.data() + i * width);
    if (!w.negative && w.magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw std::runtime_error(detail::concat("[gguf] key '", printable(key_), "' element ", i, " value ",
                                              w.magnitude, " does not fit int64"));
    out[i] = w.negative ? static_cast<int64_t>(uint64_t{0} - w.magnitude) : static_cast<int64_t>(w.magnitude);
  }
  return out;
}

std::vector<double> Value::as_doubles() const {
  if (!is_array() || (array_type_ != ValueType::FLOAT32 && array_type_ != ValueType::FLOAT64))
    wrong_type("an array of floats");
  std::vector<double> out(static_cast<size_t>(count_));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = array_type_ == ValueType::FLOAT32 ? load<float>(raw_.data() + 4 * i) : load<double>(raw_.data() + 8 * i);
  return out;
}

std::vector<float> Value::as_floats() const {
  if (!is_array() || (array_type_ != ValueType::FLOAT32 && array_type_ != ValueType::FLOAT64))
    wrong_type("an array of floats");
  std::vector<float> out(static_cast<size_t>(count_));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = array_type_ == ValueType::FLOAT32 ? load<float>(raw_.data() + 4 * i)
                                               : static_cast<float>(load<double>(raw_.data() + 8 * i));
  return out;
}

std::vector<bool> Value::as_bools() const {
  if (!is_array() || array_type_ != ValueType::BOOL) wrong_type("an array of bools");
  std::vector<bool> out(static_cast<size_t>(count_));
  for (size_t i = 0; i < out.size(); ++i) out[i] = raw_[i] != 0;
  return out;
}

// --- tensors ----------------------------------------------------------------------------------------------------

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // representable: checked when the file was read
  return n;
}

std::vector<int64_t> TensorInfo::shape() const { return std::vector<int64_t>(ne.rbegin(), ne.rend()); }

// --- the file ---------------------------------------------------------------------------------------------------

File File::parse(std::shared_ptr<const std::string> bytes, const std::string& name) {
  QKV_CHECK_ARG(bytes != nullptr, "[gguf] parse: null buffer for ", name);
  const auto* data = reinterpret_cast<const uint8_t*>(bytes->data());
  const size_t size = bytes->size();
  return parse(data, size, name, std::move(bytes));
}

File File::parse(const uint8_t* data, size_t size, const std::string& name, std::shared_ptr<const void> owner) {
  File f;
  f.path_ = name;
  f.size_ = size;
  f.owner_ = std::move(owner);
  Reader r(data, size, f.path_);

  // Header.
  const uint8_t* magic = r.bytes(4, "the magic");
  if (std::memcmp(magic, "GGUF", 4) != 0)
    r.fail("bad magic '" + printable(std::string_view(reinterpret_cast<const char*>(magic), 4)) + "', expected 'GGUF'",
           0);
  f.version_ = r.read<uint32_t>("the version");
  if ((f.version_ & 0xFFFFu) == 0 && f.version_ != 0)
    r.fail(detail::concat("version ", f.version_, " (0x", std::hex, f.version_, std::dec,
                          ") looks like a big-endian file; only little-endian GGUF is read"),
           4);
  if (f.version_ == 1) r.fail("GGUF version 1 is no longer supported (only 2 and 3)", 4);
  if (f.version_ != 2 && f.version_ != 3) r.fail(detail::concat("unsupported GGUF version ", f.version_, " (only 2 and 3)"), 4);
  const auto n_tensors = r.read<int64_t>("the tensor count");
  const auto n_kv = r.read<int64_t>("the key count");
  // Each tensor info takes at least 24 bytes (name length, n_dims, type, offset); each key-value pair 13.
  const uint64_t left = r.remaining();
  if (n_tensors < 0 || static_cast<uint64_t>(n_tensors) > left / 24)
    r.fail(detail::concat("tensor count ", n_tensors, " is negative or more than the ", left, " bytes left could hold"), 8);
  if (n_kv < 0 || static_cast<uint64_t>(n_kv) > left / 13)
    r.fail(detail::concat("key count ", n_kv, " is negative or more than the ", left, " bytes left could hold"), 16);

  // Key-value pairs.
  std::unordered_set<std::string> seen;
  size_t alignment_at = 0;
  f.values_.reserve(static_cast<size_t>(n_kv));
  for (int64_t i = 0; i < n_kv; ++i) {
    const size_t key_at = r.pos();
    r.set_context(detail::concat("key ", i));
    Value v;
    v.key_ = r.string("a key");
    r.set_context("key '" + printable(v.key_) + "'");
    if (v.key_.empty()) r.fail("empty key", key_at);
    if (!seen.insert(v.key_).second) r.fail("duplicate key", key_at);
    const size_t type_at = r.pos();
    const auto type = r.read<uint32_t>("a value type");
    if (type >= kValueTypeCount) r.fail(detail::concat("unknown value type ", type), type_at);
    v.type_ = static_cast<ValueType>(type);
    if (v.type_ == ValueType::ARRAY) {
      const size_t elem_at = r.pos();
      const auto elem = r.read<uint32_t>("an array type");
      if (elem >= kValueTypeCount) r.fail(detail::concat("unknown array element type ", elem), elem_at);
      if (static_cast<ValueType>(elem) == ValueType::ARRAY) r.fail("array of arrays", elem_at);
      v.array_type_ = static_cast<ValueType>(elem);
      const size_t count_at = r.pos();
      v.count_ = r.read<uint64_t>("an array length");
      if (v.array_type_ == ValueType::STRING) {
        // Each string takes at least its 8-byte length.
        if (v.count_ > r.remaining() / 8)
          r.fail(detail::concat(v.count_, " strings need more than the ", r.remaining(), " bytes left"), count_at);
        v.strings_.reserve(static_cast<size_t>(v.count_));
        for (uint64_t j = 0; j < v.count_; ++j) v.strings_.push_back(r.string("a string"));
      } else {
        read_fixed(r, v.array_type_, v.count_, v.raw_);
      }
    } else if (v.type_ == ValueType::STRING) {
      v.strings_.push_back(r.string("a string"));
    } else {
      read_fixed(r, v.type_, 1, v.raw_);
    }
    if (v.key_ == "general.alignment") {
      alignment_at = type_at;
      if (v.type_ != ValueType::UINT32)
        r.fail(std::string("general.alignment is ") + value_type_name(v.type_) + ", not UINT32", type_at);
      const uint32_t a = load<uint32_t>(v.raw_.data());
      if (a == 0 || (a & (a - 1)) != 0) r.fail(detail::concat("alignment ", a, " is not a power of two"), type_at + 4);
      f.alignment_ = a;
    }
    f.values_.push_back(std::move(v));
  }
  (void)alignment_at;
  r.set_context("");

  // Tensor infos.
  std::unordered_set<std::string> names;
  std::vector<size_t> offset_at(static_cast<size_t>(n_tensors));
  f.tensors_.reserve(static_cast<size_t>(n_tensors));
  for (int64_t i = 0; i < n_tensors; ++i) {
    const size_t name_at = r.pos();
    r.set_context(detail::concat("tensor ", i));
    TensorInfo t;
    t.name = r.string("a tensor name");
    r.set_context("tensor '" + printable(t.name) + "'");
    if (t.name.size() >= 64) r.fail(detail::concat("tensor name of ", t.name.size(), " bytes (at most 63)"), name_at);
    if (!names.insert(t.name).second) r.fail("duplicate tensor name", name_at);
    const size_t dims_at = r.pos();
    const auto n_dims = r.read<uint32_t>("a dimension count");
    if (n_dims > 4) r.fail(detail::concat(n_dims, " dimensions (at most 4)"), dims_at);
    int64_t numel = 1;
    bool empty = false;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const size_t ne_at = r.pos();
      const auto ne = r.read<int64_t>("a dimension");
      if (ne < 0) r.fail(detail::concat("dimension ", d, " is ", ne), ne_at);
      if (ne == 0) empty = true;
      if (!empty && ne > std::numeric_limits<int64_t>::max() / numel)
        r.fail(detail::concat("element count overflows int64 at dimension ", d), ne_at);
      numel = empty ? 0 : numel * ne;
      t.ne.push_back(ne);
    }
    // A zero dimension makes the product 0; the others must still multiply within int64 (ggml checks them all).
    if (empty) {
      int64_t prod = 1;
      for (int64_t ne : t.ne)
        if (ne != 0) {
          if (ne > std::numeric_limits<int64_t>::max() / prod)
            r.fail("element count overflows int64", dims_at);
          prod *= ne;
        }
    }
    const size_t type_at = r.pos();
    const auto type = r.read<uint32_t>("a tensor type");
    if (!type_known(type)) r.fail(detail::concat("unknown ggml type ", type), type_at);
    t.type = static_cast<Type>(type);
    const int64_t ne0 = t.ne.empty() ? 1 : t.ne[0];
    if (ne0 % block_size(t.type) != 0)
      r.fail(detail::concat("ne[0] = ", ne0, " is not a multiple of ", type_name(t.type), "'s block of ",
                            block_size(t.type)),
             type_at);
    // Bytes: blocks per row x block bytes x the other dimensions, each product checked.
    uint64_t bytes = static_cast<uint64_t>(ne0 / block_size(t.type));
    const auto mul = [&](uint64_t m) {
      if (m != 0 && bytes > std::numeric_limits<uint64_t>::max() / m) r.fail("byte size overflows", dims_at);
      bytes *= m;
    };
    mul(static_cast<uint64_t>(type_size(t.type)));
    for (size_t d = 1; d < t.ne.size(); ++d) mul(static_cast<uint64_t>(t.ne[d]));
    t.bytes = bytes;
    offset_at[static_cast<size_t>(i)] = r.pos();
    t.offset = r.read<uint64_t>("a tensor offset");
    f.tensors_.push_back(std::move(t));
  }

  // Data section: starts at the header's end padded to the alignment; tensors follow one another, each padded.
  f.data_offset_ = pad_to(r.pos(), f.alignment_);
  uint64_t expected = 0;
  for (size_t i = 0; i < f.tensors_.size(); ++i) {
    TensorInfo& t = f.tensors_[i];
    r.set_context("tensor '" + printable(t.name) + "'");
    if (t.offset != expected)
      r.fail(detail::concat("offset ", t.offset, ", expected ", expected,
                            " (the previous tensors' sizes padded to the alignment of ", f.alignment_, ")"),
             offset_at[i]);
    const uint64_t start = f.data_offset_ + t.offset;
    if (start < f.data_offset_ || start > size || t.bytes > size - start)
      r.fail(detail::concat("data [", start, ", ", start + t.bytes, ") is past the end of the file (", size,
                            " bytes)"),
             offset_at[i]);
    t.data = data + start;
    const uint64_t padded = pad_to(t.bytes, f.alignment_);  // t.bytes <= size: no overflow
    expected += padded;
  }
  return f;
}

File File::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("[gguf] " + path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error("[gguf] " + path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error("[gguf] " + path + ": cannot open: not a regular file");
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    static const uint8_t nothing = 0;
    return parse(&nothing, 0, path, nullptr);
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (map == MAP_FAILED) throw std::runtime_error("[gguf] " + path + ": cannot map: " + std::strerror(err));
  std::shared_ptr<const void> owner(map, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  File f = parse(static_cast<const uint8_t*>(map), size, path, std::move(owner));
  f.map_ = map;
  f.map_size_ = size;
  return f;
}

void File::release_pages() const {
  if (map_ != nullptr) ::madvise(const_cast<void*>(map_), map_size_, MADV_DONTNEED);
}

void File::release_pages(const TensorInfo& tensor) const {
  const auto base = reinterpret_cast<uintptr_t>(map_);
  const auto begin = reinterpret_cast<uintptr_t>(tensor.data), end = begin + tensor.bytes;
  if (map_ == nullptr || begin < base || end > base + map_size_) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

const Value* File::find(const std::string& key) const {
  for (const Value& v : values_)
    if (v.key() == key) return &v;
  return nullptr;
}

const Value& File::get(const std::string& key) const {
  const Value* v = find(key);
  if (v == nullptr) throw std::runtime_error("[gguf] " + path_ + ": missing key '" + printable(key) + "'");
  return *v;
}

std::vector<std::string> File::keys() const {
  std::vector<std::string> out;
  out.reserve(values_.size());
  for (const Value& v : values_) out.push_back(v.key());
  return out;
}

const TensorInfo* File::tensor(const std::string& name) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const TensorInfo& File::get_tensor(const std::string& name) const {
  const TensorInfo* t = tensor(name);
  if (t == nullptr) throw std::runtime_error("[gguf] " + path_ + ": no tensor '" + printable(name) + "'");
  return *t;
}

}  // namespace qkv::gguf
