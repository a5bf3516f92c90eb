// GGUF (llama.cpp's model file format): a strict reader. Metadata is copied into Values; tensor data stays in the
// read-only private mapping (or the caller's buffer) and is read in place, in its stored type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace qkv::gguf {

// File layout (little-endian, GGUF v2 and v3):
//   "GGUF" | u32 version | i64 n_tensors | i64 n_kv
//   n_kv x (string key | u32 value type | value)                 string = u64 length + bytes (no NUL)
//                                                                array  = u32 element type + u64 count + elements
//   n_tensors x (string name | u32 n_dims | n_dims x i64 ne | u32 ggml type | u64 offset)
//   padding to `alignment` | data: each tensor at its offset, padded to `alignment`
//
// Rules (as ggml's gguf_init_from_file_impl, and stricter where marked *):
//   magic "GGUF"; version 2 or 3 (1 refused; a version whose low 16 bits are 0 is read as a big-endian file and
//   refused); n_tensors and n_kv >= 0 and no larger than the remaining bytes could hold *; keys and tensor names
//   unique; key strings non-empty *; every string no longer than the bytes left; value types 0..12 and no arrays of
//   arrays; bool bytes 0 or 1 * (ggml takes any non-zero byte as true); `general.alignment`, when present, a u32
//   power of two (default 32); tensor names shorter than 64 bytes (ggml's GGML_MAX_NAME); n_dims <= 4; every
//   ne >= 0 and their product representable in int64; tensor types known to ggml (removed numbers 4, 5, 31-33,
//   36-38 refused); ne[0] a multiple of the type's block size; byte size representable; tensor offsets equal to
//   the running sum of sizes each padded to the alignment (so tensors are in file order, aligned, no gaps); the
//   data section starting at the header's end padded to the alignment; every tensor's bytes inside the file *
//   (ggml also requires the last tensor's padding to be present; qkv does not, as llama.cpp's mmap loader).
//   Bytes after the last tensor are ignored.
// Every refusal throws one std::runtime_error line:
//   "[gguf] <file>: <what> (key 'k' | tensor 't') at byte <offset>"
// A malformed file never reads outside its bytes, and nothing is allocated from a count before the count has been
// checked against the bytes that remain.

// ggml tensor types, with ggml's numbers.
enum class Type : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
  NVFP4 = 40, Q1_0 = 41,
};

// True for the numbers above (the types ggml defines); false for removed or unknown numbers.
bool type_known(uint32_t type);
// "Q4_K", ...; "type <n>" for an unknown number.
std::string type_name(Type type);
// Elements per block (1 for F32/F16/BF16/ints, 32 for Q4_0..Q8_1, IQ4_NL, MXFP4, 64 for NVFP4, 128 for Q1_0,
// 256 for the K, IQ and TQ types);
// 0 for an unknown number.
int64_t block_size(Type type);
// Bytes per block; 0 for an unknown number.
int64_t type_size(Type type);
// Bytes of a row of n elements (n a multiple of block_size); throws std::invalid_argument otherwise.
int64_t row_bytes(Type type, int64_t n);

// Metadata value types, with GGUF's numbers.
enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7, STRING = 8,
  ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
// "UINT8", ..., "FLOAT64".
const char* value_type_name(ValueType type);
// Bytes of one element of a fixed-size type (1 for UINT8/INT8/BOOL ... 8 for UINT64/INT64/FLOAT64); 0 for STRING
// and ARRAY.
size_t value_type_size(ValueType type);

// One metadata value: a scalar or an array of scalars or strings. Accessors throw one std::runtime_error line
// naming the key when the value's type does not fit: "[gguf] key 'k' is ARRAY of STRING, not an integer".
class Value {
 public:
  const std::string& key() const { return key_; }
  ValueType type() const { return type_; }           // ARRAY for arrays
  bool is_array() const { return type_ == ValueType::ARRAY; }
  ValueType array_type() const;                      // element type; throws if not an array
  size_t size() const;                               // element count; throws if not an array

  // Scalars.
  int64_t as_int() const;          // any integer type; UINT64 above INT64_MAX throws
  uint64_t as_uint() const;        // any integer type; negative values throw
  double as_float() const;         // FLOAT32 or FLOAT64 (exact)
  bool as_bool() const;
  const std::string& as_string() const;
  // Arrays.
  const std::vector<std::string>& as_strings() const;  // ARRAY of STRING
  std::vector<int64_t> as_ints() const;                // ARRAY of any integer type; UINT64 above INT64_MAX throws
  std::vector<float> as_floats() const;                // ARRAY of FLOAT32 (exact) or FLOAT64 (rounded)
  std::vector<double> as_doubles() const;              // ARRAY of FLOAT32 or FLOAT64 (exact)
  std::vector<bool> as_bools() const;                  // ARRAY of BOOL

  // The raw little-endian bytes of a scalar (value_type_size(type()) bytes) or of a fixed-size array
  // (size() * value_type_size(array_type()) bytes); empty for strings and string arrays.
  const std::vector<uint8_t>& raw() const { return raw_; }

 private:
  friend class File;
  [[noreturn]] void wrong_type(const char* wanted) const;
  std::string key_;
  ValueType type_ = ValueType::UINT8;
  ValueType array_type_ = ValueType::UINT8;  // meaningful when type_ == ARRAY
  uint64_t count_ = 0;                       // array length
  std::vector<uint8_t> raw_;                 // fixed-size scalar or array elements
  std::vector<std::string> strings_;         // STRING (one element) or ARRAY of STRING
};

struct TensorInfo {
  std::string name;
  Type type = Type::F32;
  std::vector<int64_t> ne;  // ggml order: ne[0] varies fastest (a row); n_dims entries (0 to 4)
  uint64_t offset = 0;      // from the start of the data section
  uint64_t bytes = 0;       // row_bytes(type, ne[0]) * ne[1] * ...
  const uint8_t* data = nullptr;  // valid while any copy of the File that made it lives

  int64_t numel() const;               // product of ne (1 for n_dims 0)
  std::vector<int64_t> shape() const;  // row-major: ne reversed, e.g. a (ne0, ne1) matrix is (ne1, ne0)
};

class File {
 public:
  // Maps the file read-only (MAP_PRIVATE) and validates it. I/O failures throw std::runtime_error
  // "[gguf] <path>: cannot open: <reason>".
  static File open(const std::string& path);
  // Validates a file held in memory; `name` stands for the path in messages. Tensors point into *bytes.
  static File parse(std::shared_ptr<const std::string> bytes, const std::string& name = "<memory>");
  // Same over a buffer the caller keeps alive for the File's life (`owner` may hold it).
  static File parse(const uint8_t* bytes, size_t size, const std::string& name, std::shared_ptr<const void> owner);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // byte where the data section starts
  uint64_t file_size() const { return size_; }

  const Value* find(const std::string& key) const;  // nullptr when absent
  // Throws std::runtime_error "[gguf] <path>: missing key 'k'".
  const Value& get(const std::string& key) const;
  const std::vector<Value>& values() const { return values_; }  // file order
  std::vector<std::string> keys() const;                        // file order

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // file order
  const TensorInfo* tensor(const std::string& name) const;             // nullptr when absent
  // Throws std::runtime_error "[gguf] <path>: no tensor 't'".
  const TensorInfo& get_tensor(const std::string& name) const;
  // Lets the kernel drop the mapped file's pages from this process's memory (madvise MADV_DONTNEED on the private,
  // read-only mapping): a page touched later is read again from the file. For a loader that has copied or repacked
  // what it needs, so that the process does not hold the weights twice. No effect on a File parsed from a buffer.
  void release_pages() const;
  // The same for the whole pages inside one tensor's bytes (after it was copied or repacked).
  void release_pages(const TensorInfo& tensor) const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t size_ = 0;
  std::vector<Value> values_;
  std::vector<TensorInfo> tensors_;
  std::shared_ptr<const void> owner_;  // keeps the mapping or buffer alive
  const void* map_ = nullptr;          // open(): the mapping (release_pages)
  size_t map_size_ = 0;
};

}  // namespace qkv::gguf
