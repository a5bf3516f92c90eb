// Private (not installed): a per-thread, grow-only buffer of 32-bit words for the kernels' packed operands (the
// low-precision products' activation rows, the bf16 attention's paired K and V). Internal linkage, and nothing
// inline from the standard library (only the global operator new and delete), so that units built for different
// ISAs may each include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

namespace qkv::kernels::detail {
namespace {

// Grown with operator new, kept for the next call (a fresh allocation of megabytes would fault in and zero every page
// again), freed when its thread ends (a thread of the caller's, not only OpenMP's, may use it). Inside a parallel
// region a failed allocation ends the process, as any exception escaping the region does.
struct Scratch {
  uint32_t* p = nullptr;
  int64_t size = 0;
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { ::operator delete(p); }
  uint32_t* get(int64_t words) {
    if (words > size) {
      ::operator delete(p);
      p = nullptr;
      size = 0;
      p = static_cast<uint32_t*>(::operator new(static_cast<size_t>(words) * sizeof(uint32_t)));  // or bad_alloc
      size = words;
    }
    return p;
  }
};

}  // namespace
}  // namespace qkv::kernels::detail
