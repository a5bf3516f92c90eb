// File output that is never left half-written: write a temporary file beside the target, fsync, then rename.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace qkv {

// Atomically replaces `path` with `bytes`. Throws std::runtime_error "[io] ..." on failure; the old file survives.
void write_file_atomic(const std::string& path, std::string_view bytes);

// The whole file's bytes. Throws std::runtime_error "[op] cannot open 'PATH'" when it cannot be read.
std::string read_file_text(const std::string& path, const char* op);

}  // namespace qkv
