// libFuzzer target for the GGUF reader: any bytes either parse or throw one std::runtime_error line
// "[gguf] fuzz.gguf: ... at byte N"; whatever parses keeps every tensor inside the buffer, aligned and tiled as the
// rules say, every metadata value readable through its accessor, and every dequantizable tensor decodable.
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "qkv/core/gguf.h"
#include "qkv/kernels/quant.h"

namespace {

using qkv::gguf::ValueType;

void read_value(const qkv::gguf::Value& v) {
  if (v.type() == ValueType::STRING) {
    (void)v.as_string();
    return;
  }
  if (!v.is_array()) {
    FUZZ_CHECK(v.raw().size() == qkv::gguf::value_type_size(v.type()));
    return;
  }
  const ValueType t = v.array_type();
  FUZZ_CHECK(t != ValueType::ARRAY);
  if (t == ValueType::STRING) {
    FUZZ_CHECK(v.as_strings().size() == v.size());
    return;
  }
  FUZZ_CHECK(v.raw().size() == v.size() * qkv::gguf::value_type_size(t));
  if (t == ValueType::FLOAT32 || t == ValueType::FLOAT64) FUZZ_CHECK(v.as_floats().size() == v.size());
  if (t == ValueType::BOOL) FUZZ_CHECK(v.as_bools().size() == v.size());
  if (t != ValueType::FLOAT32 && t != ValueType::FLOAT64 && t != ValueType::BOOL && t != ValueType::UINT64)
    FUZZ_CHECK(v.as_ints().size() == v.size());  // UINT64 may hold values past int64: as_ints may refuse them
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes, so that ASan sees any read past the end.
  auto buffer = std::make_shared<std::vector<uint8_t>>(data, data + size);
  const uint8_t* base = buffer->data();
  qkv::gguf::File f;
  try {
    f = qkv::gguf::File::parse(base, size, "fuzz.gguf", buffer);
  } catch (const std::runtime_error& e) {
    FUZZ_CHECK(fuzz_message_starts_with(e.what(), "[gguf] fuzz.gguf: "));
    FUZZ_CHECK(std::strstr(e.what(), " at byte ") != nullptr);
    FUZZ_CHECK(std::strchr(e.what(), '\n') == nullptr);
    return 0;
  }
  FUZZ_CHECK(f.version() == 2 || f.version() == 3);
  FUZZ_CHECK(f.alignment() > 0 && (f.alignment() & (f.alignment() - 1)) == 0);
  FUZZ_CHECK(f.data_offset() % f.alignment() == 0);
  for (const auto& v : f.values()) read_value(v);
  uint64_t expected = 0;
  for (const auto& t : f.tensors()) {
    FUZZ_CHECK(t.ne.size() <= 4 && t.name.size() < 64);
    FUZZ_CHECK(t.offset == expected && t.offset % f.alignment() == 0);
    FUZZ_CHECK(t.data == base + f.data_offset() + t.offset);
    FUZZ_CHECK(f.data_offset() + t.offset + t.bytes <= size);
    const int64_t ne0 = t.ne.empty() ? 1 : t.ne[0];
    FUZZ_CHECK(t.numel() >= 0);
    if (t.numel() > 0)
      FUZZ_CHECK(t.bytes == static_cast<uint64_t>(qkv::gguf::row_bytes(t.type, ne0)) *
                                static_cast<uint64_t>(t.numel() / ne0));
    FUZZ_CHECK(f.tensor(t.name) == &t);
    expected += (t.bytes + f.alignment() - 1) / f.alignment() * f.alignment();
    // Decode what fits in a small budget; the reference reads exactly t.bytes.
    if (qkv::kernels::can_dequantize(t.type) && t.numel() <= (int64_t{1} << 16)) {
      const qkv::Tensor x = qkv::kernels::dequantize(t);
      FUZZ_CHECK(x.numel() == t.numel());
    }
  }
  return 0;
}
