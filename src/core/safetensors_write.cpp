// safetensors writing: argument validation before any byte is written, the padded JSON header, in-memory
// serialization, and atomic saving (temporary file, fsync, rename) of float32 tensors or raw bytes of any dtype.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string_view>

#include "qkv/core/error.h"
#include "qkv/core/json.h"
#include "qkv/core/safetensors.h"
#include "safetensors_internal.h"

namespace qkv {
using namespace safetensors_internal;
namespace {

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

// --- public API -------------------------------------------------------------------------------------------------

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

}  // namespace qkv
