// Caching allocator behind Tensor::empty: freed tensor buffers of 64 KiB and more wait in size-class free lists
// and serve the next allocation of their class, so a training step stops re-faulting its big buffers every time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace qkv::storage_pool {

// Buffers of at least this many bytes go through the pool; smaller ones come straight from malloc.
constexpr size_t kMinPooledBytes = size_t{64} << 10;

// Default bound on the bytes the pool keeps cached (not counting buffers in use). The environment variable
// QKV_STORAGE_POOL_MB, read on first use, overrides it; 0 turns caching off.
constexpr size_t kDefaultLimitBytes = size_t{1} << 30;

// A buffer for n floats (n >= 0; 0 still gives a valid pointer), 64-byte aligned, contents unspecified. The
// shared_ptr's deleter hands the buffer back to the pool (or to the system when caching it would pass the limit).
// Thread-safe. Throws std::invalid_argument when the byte count overflows, std::runtime_error when out of memory.
std::shared_ptr<float> allocate(int64_t n);

// The capacity, in bytes, that allocate gives a request of `bytes` (its size class): at most 1/8 more than
// asked for pooled sizes, rounded up to 64 bytes below kMinPooledBytes.
size_t size_class(size_t bytes);

// A block of `bytes` straight from the system, released with std::free (null when out of memory): 64-byte aligned;
// from 2 MiB on, 2 MiB aligned with its whole 2 MiB pages advised as transparent huge pages (Linux's default THP
// mode on Debian is "madvise"), so a kernel streaming a large weight or KV cache from memory walks one page table
// entry per 2 MiB, not per 4 KiB. The pool's big blocks and the packed weights (sgemm's, bf16, int8) come from here.
// The first large allocations of a process can then wait for the kernel to compact memory into 2 MiB pages (THP
// defrag "madvise": a model's first load 1-2 s instead of 0.5 s on a fragmented host, measured on a Zen 4 guest);
// the environment variable QKV_HUGE_PAGES=0, read on first use, gives plain 64-byte-aligned blocks instead.
void* system_alloc(size_t bytes);

// std::vector's allocator over system_alloc (the packed weights' storage).
template <class T>
struct SystemAllocator {
  using value_type = T;
  SystemAllocator() = default;
  template <class U>
  SystemAllocator(const SystemAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = n <= SIZE_MAX / sizeof(T) ? system_alloc(n * sizeof(T)) : nullptr;
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const SystemAllocator<U>&) const { return true; }
};

// Sets the bound on cached bytes, freeing cached buffers (largest first) until the pool fits; 0 disables caching.
void set_limit(size_t bytes);
size_t limit();

// Frees every cached buffer (buffers in use are not affected).
void release();

struct Stats {
  size_t cached_bytes = 0;  // bytes waiting in the free lists
  size_t cached_blocks = 0;
  uint64_t hits = 0;        // pooled allocations served from the cache
  uint64_t misses = 0;      // pooled allocations that went to the system
};
Stats stats();

}  // namespace qkv::storage_pool
