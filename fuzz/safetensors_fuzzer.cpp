// libFuzzer target for the safetensors reader: any input either loads or throws the documented exception types,
// and whatever loads survives a save/load round trip bit for bit. ASan/UBSan catch every out-of-bounds read.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "fuzz_check.h"
#include "qkv/core/safetensors.h"

namespace {

bool same_bits(const qkv::Tensor& a, const qkv::Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qkv::SafeTensorsFile file;
  try {
    file = qkv::load_safetensors_from_memory(data, size);
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "I/O error from a memory buffer: %s\n", e.what());
    std::abort();
  } catch (const std::invalid_argument& e) {
    FUZZ_CHECK(std::strncmp(e.what(), "[safetensors] ", 14) == 0);
    return 0;  // malformed input, the common case
  } catch (const std::runtime_error& e) {
    // A valid layout holding a dtype with no float32 conversion: the header must still validate.
    FUZZ_CHECK(std::strncmp(e.what(), "[safetensors] ", 14) == 0);
    const qkv::SafeTensorsHeader h = qkv::parse_safetensors_header(data, size);
    bool unconvertible = false;
    for (const auto& e2 : h.entries) unconvertible |= !qkv::dtype_converts_to_float32(e2.dtype);
    FUZZ_CHECK(unconvertible);
    return 0;
  }
  // Loaded: the header agrees, every element is readable, and a round trip reproduces the file's content.
  const qkv::SafeTensorsHeader h = qkv::parse_safetensors_header(data, size);
  FUZZ_CHECK(h.entries.size() == file.tensors.size());
  FUZZ_CHECK(h.metadata == file.metadata);
  for (const auto& e : h.entries) {
    const auto it = file.tensors.find(e.name);
    FUZZ_CHECK(it != file.tensors.end());
    FUZZ_CHECK(it->second.shape() == e.shape);
  }
  const std::string bytes = qkv::serialize_safetensors(file.tensors, file.metadata);
  const qkv::SafeTensorsFile again = qkv::load_safetensors_from_memory(bytes.data(), bytes.size());
  FUZZ_CHECK(again.metadata == file.metadata);
  FUZZ_CHECK(again.tensors.size() == file.tensors.size());
  for (const auto& [name, t] : file.tensors) {
    const auto it = again.tensors.find(name);
    FUZZ_CHECK(it != again.tensors.end());
    FUZZ_CHECK(same_bits(t, it->second));
  }
  return 0;
}
