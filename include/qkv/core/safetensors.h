// safetensors I/O: a strict reader (mmap, zero-copy for aligned F32, every rule of the format checked) and an
// atomic writer whose output is byte-identical to the reference `safetensors` package for F32 tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "qkv/core/shape.h"
#include "qkv/core/tensor.h"

namespace qkv {

// File layout: 8-byte little-endian header size N | N bytes of UTF-8 JSON header | data buffer.
// The header is {"__metadata__": {str: str}?, "<name>": {"dtype": D, "shape": [..], "data_offsets": [b, e]}, ...}
// with offsets relative to the data buffer.
//
// Error convention (every message starts with "[safetensors] "):
//   std::invalid_argument  malformed file content, or bad arguments to save (Python: ValueError);
//   std::system_error      I/O failure: missing file, unreadable, cannot write/rename (Python: OSError);
//   std::runtime_error     a valid file holding a dtype qkv cannot turn into float32 (C64, F4, F6_*).
//
// Rules enforced by the reader, each with its own message (qkv is stricter than the reference where noted *):
//   file shorter than 8 bytes; header size > 100,000,000 or past the end of the file; header not UTF-8, not JSON,
//   not an object; header not starting with '{' *(reference skips leading whitespace); padding after the object
//   other than spaces (0x20) *(reference allows any JSON whitespace); unknown dtype; __metadata__ not a
//   str -> str object *(reference accepts null); duplicate tensor names, metadata keys or fields *(reference
//   keeps the last one); unknown or missing fields in a tensor entry *(reference ignores unknown ones);
//   data_offsets not [begin, end] of non-negative integers with begin <= end; dims not non-negative integers;
//   element count x dtype bits overflowing 64 bits (checked in shape order, like the reference); a dim above
//   int64, or non-zero dims whose product x 4 bytes passes int64 *(reference allows e.g. [0, 2^63] since the
//   tensor is empty; qkv and NumPy need representable strides); sub-byte dtypes
//   (F4, F6_*) not ending on a byte boundary; byte size != end - begin; tensors that overlap or leave holes, so the
//   sorted tensors must tile [0, buffer size) exactly; trailing bytes after the buffer; BOOL bytes other than
//   0 / 1 *(reference does not look at the data).
// A malformed file never reads outside the input and never allocates more than a small multiple of its size.

// Every dtype of the reference implementation (safetensors 0.8), in its alignment order.
enum class SafeTensorsDtype : uint8_t {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64,
};
const char* dtype_name(SafeTensorsDtype dtype);   // "F32", ...
int dtype_bits(SafeTensorsDtype dtype);           // 4 for F4, 6 for F6_*, 64 for C64, ...
bool dtype_converts_to_float32(SafeTensorsDtype dtype);  // false for C64, F4, F6_E2M3, F6_E3M2

struct SafeTensorsEntry {
  std::string name;
  SafeTensorsDtype dtype;
  Shape shape;          // every dim fits int64
  uint64_t begin = 0;   // byte offsets into the data buffer, [begin, end)
  uint64_t end = 0;
};

struct SafeTensorsHeader {
  uint64_t header_size = 0;                     // N: the data buffer starts at byte 8 + N
  uint64_t data_size = 0;                       // bytes in the data buffer (file size - 8 - N)
  std::vector<SafeTensorsEntry> entries;        // sorted by (begin, end), tiling the data buffer
  std::map<std::string, std::string> metadata;  // empty when there is no __metadata__
};

// Validates the layout of a whole file held in memory: every rule above except the BOOL byte check, without
// reading tensor bytes. Throws std::invalid_argument "[safetensors] <reason>".
SafeTensorsHeader parse_safetensors_header(const void* bytes, size_t size);

struct SafeTensorsFile {
  std::map<std::string, Tensor> tensors;        // float32; F16/BF16/F64/F8_*/ints/BOOL converted
  std::map<std::string, std::string> metadata;
};

// Errors about a file's content name it: "[safetensors] \"PATH\": <reason>".
// Maps the file (MAP_PRIVATE, copy-on-write: writing into a loaded tensor never changes the file). F32 tensors
// whose data is 4-byte aligned are zero-copy views that keep the mapping alive; the rest are converted copies.
// Truncating the file while its tensors are alive is undefined (SIGBUS), as with any mmap reader.
SafeTensorsFile load_safetensors(const std::string& path);
// Same rules on a buffer; every tensor is copied, so `bytes` may be freed afterwards.
SafeTensorsFile load_safetensors_from_memory(const void* bytes, size_t size);

// A validated file's bytes, no conversion: any dtype, for callers that keep the file's dtypes (the Python module).
struct SafeTensorsBytes {
  SafeTensorsHeader header;
  std::shared_ptr<const uint8_t> file;  // the whole file (a heap copy or a private mapping), alive with this handle
  size_t size = 0;
  // The data buffer; entry e's bytes are [data() + e.begin, data() + e.end).
  const uint8_t* data() const { return file.get() + 8 + header.header_size; }
};

// Validates a file (every rule, BOOL bytes included) and returns its bytes. map = false reads the file into
// memory, so later changes to the file (truncation, rewriting in place) never reach the result; map = true maps it
// (MAP_PRIVATE): no copy, but truncating the file while the result is alive raises SIGBUS on access, and a rewrite
// in place may show through pages not yet touched. Errors as load_safetensors.
SafeTensorsBytes read_safetensors_bytes(const std::string& path, bool map = false);

// Converts one entry's bytes (src = data() + e.begin) to float32 (dst: numel floats); runtime_error for dtypes
// without a conversion (C64, F4, F6_*).
void safetensors_to_float32(const SafeTensorsEntry& e, const void* src, float* dst);

// A tensor to write in any dtype: `data` points to its bytes in C order, little-endian (borrowed for the call).
struct SafeTensorsRaw {
  SafeTensorsDtype dtype = SafeTensorsDtype::F32;
  Shape shape;
  const void* data = nullptr;  // numel * dtype_bits / 8 bytes; may be null when that is 0
};

// As save_safetensors / serialize_safetensors, with each tensor's bytes written as they are under its dtype
// (BOOL, I64, F64, F16, BF16, ...). Throws invalid_argument for a sub-byte dtype not ending on a byte boundary.
void save_safetensors_raw(const std::string& path, const std::map<std::string, SafeTensorsRaw>& tensors,
                          const std::map<std::string, std::string>& metadata = {});
std::string serialize_safetensors_raw(const std::map<std::string, SafeTensorsRaw>& tensors,
                                      const std::map<std::string, std::string>& metadata = {});

// Writes every tensor as F32 (C-contiguous order, any strides accepted), sorted by name, header padded with
// spaces to a multiple of 8 so every tensor is 8-byte aligned in the file. Names and metadata must be valid
// UTF-8; the name "__metadata__" is reserved. The file is written to a temporary file beside `path`, fsynced and
// renamed over it, so `path` is either the old file or the complete new one.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// The bytes save_safetensors would write.
std::string serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

}  // namespace qkv
