// The tensor storage pool: size-class free lists under one mutex, bounded by a byte limit (largest blocks evicted
// first). Under AddressSanitizer cached blocks are poisoned, so a use after free is still reported.
#include "qkv/core/storage_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <vector>

#include "qkv/core/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define QKV_POOL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QKV_POOL_ASAN 1
#endif
#endif
#ifdef QKV_POOL_ASAN
#include <sanitizer/asan_interface.h>
#define QKV_POOL_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define QKV_POOL_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define QKV_POOL_POISON(p, n) ((void)(p), (void)(n))
#define QKV_POOL_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace qkv::storage_pool {
namespace {

size_t limit_from_env() {
  const char* s = std::getenv("QKV_STORAGE_POOL_MB");
  if (!s || !*s) return kDefaultLimitBytes;
  char* end = nullptr;
  const unsigned long long mb = std::strtoull(s, &end, 10);
  if (end == s || *end != '\0' || mb > (SIZE_MAX >> 20)) return kDefaultLimitBytes;  // malformed: the default
  return static_cast<size_t>(mb) << 20;
}

class Pool {
 public:
  Pool() : limit_(limit_from_env()) {}

  void* take(size_t cls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        if (it->second.empty()) free_.erase(it);  // evict_locked relies on there being no empty lists
        cached_ -= cls;
        --blocks_;
        ++hits_;
        QKV_POOL_UNPOISON(p, cls);
        return p;
      }
      ++misses_;
    }
    return system_alloc(cls);
  }

  void give(void* p, size_t cls) {
    std::vector<std::pair<void*, size_t>> evicted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cls > limit_) {
        evicted.emplace_back(p, cls);
      } else {
        evict_locked(limit_ - cls, evicted);
        QKV_POOL_POISON(p, cls);
        free_[cls].push_back(p);
        cached_ += cls;
        ++blocks_;
      }
    }
    free_blocks(evicted);
  }

  void set_limit(size_t bytes) {
    std::vector<std::pair<void*, size_t>> evicted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      limit_ = bytes;
      evict_locked(bytes, evicted);
    }
    free_blocks(evicted);
  }

  size_t limit() {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_;
  }

  void release() {
    std::vector<std::pair<void*, size_t>> evicted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      evict_locked(0, evicted);
    }
    free_blocks(evicted);
  }

  Stats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return Stats{cached_, blocks_, hits_, misses_};
  }

 private:
  // Moves cached blocks, largest first, to `out` until at most `keep` bytes stay cached.
  void evict_locked(size_t keep, std::vector<std::pair<void*, size_t>>& out) {
    while (cached_ > keep) {
      auto it = std::prev(free_.end());  // cached_ > 0: some list is non-empty, and empty lists are erased
      out.emplace_back(it->second.back(), it->first);
      it->second.pop_back();
      cached_ -= it->first;
      --blocks_;
      if (it->second.empty()) free_.erase(it);
    }
  }

  static void free_blocks(const std::vector<std::pair<void*, size_t>>& blocks) {
    for (const auto& [p, cls] : blocks) {
      QKV_POOL_UNPOISON(p, cls);
      std::free(p);
    }
  }

  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> cached blocks; no empty lists (see evict_locked)
  size_t limit_;
  size_t cached_ = 0, blocks_ = 0;
  uint64_t hits_ = 0, misses_ = 0;
};

// Never destroyed: tensors in static storage may be freed after every other static object is gone.
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

}  // namespace

void* system_alloc(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  static const bool huge = [] {
    const char* v = std::getenv("QKV_HUGE_PAGES");
    return v == nullptr || std::string_view(v) != "0";
  }();
  if (bytes > SIZE_MAX - kHuge) return nullptr;
  if (bytes < kHuge || !huge) return std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  void* p = std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
  if (p != nullptr) madvise(p, bytes / kHuge * kHuge, MADV_HUGEPAGE);  // advice: a refusal changes nothing
  return p;
}

size_t size_class(size_t bytes) {
  if (bytes < kMinPooledBytes) return (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  // Eight classes per power of two: 2^e·(1 + i/8).
  int e = 63 - __builtin_clzll(static_cast<unsigned long long>(bytes));
  const size_t step = size_t{1} << (e - 3);
  return (bytes + step - 1) / step * step;
}

std::shared_ptr<float> allocate(int64_t n) {
  QKV_CHECK_ARG(n >= 0 && n <= static_cast<int64_t>(SIZE_MAX / sizeof(float) / 2), "[tensor] cannot allocate ",
                n, " floats: the byte count overflows");
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float);
  const size_t cls = size_class(bytes);
  if (cls < kMinPooledBytes) {
    void* p = system_alloc(cls);  // below 2 MiB: 64-byte aligned
    QKV_CHECK_RUNTIME(p != nullptr, "[tensor] out of memory allocating ", bytes, " bytes");
    return std::shared_ptr<float>(static_cast<float*>(p), [](float* q) { std::free(q); });
  }
  void* p = pool().take(cls);
  QKV_CHECK_RUNTIME(p != nullptr, "[tensor] out of memory allocating ", bytes, " bytes");
  return std::shared_ptr<float>(static_cast<float*>(p), [cls](float* q) { pool().give(q, cls); });
}

void set_limit(size_t bytes) { pool().set_limit(bytes); }
size_t limit() { return pool().limit(); }
void release() { pool().release(); }
Stats stats() { return pool().stats(); }

}  // namespace qkv::storage_pool
