// The tensor storage pool: size classes, reuse of freed buffers, the byte limit and its eviction order, the
// small-buffer bypass, concurrent use from many threads, and the overflow check.
#include "qkv/core/storage_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ops_testing.h"
#include "qkv/core/tensor.h"

namespace qkv {
namespace {

using testing::ThrowsArg;
namespace pool = storage_pool;

constexpr int64_t kPooledFloats = int64_t{1} << 16;  // 256 KiB: pooled

// Each test starts from an empty pool with a known limit and leaves the default behind.
class StoragePool : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = pool::limit();
    pool::release();
    pool::set_limit(size_t{64} << 20);
  }
  void TearDown() override {
    pool::release();
    pool::set_limit(saved_);
  }
  size_t saved_ = 0;
};

TEST(StoragePoolSizeClass, RoundsUpByAtMostAnEighthAndKeepsAlignment) {
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{64}, size_t{1000}, pool::kMinPooledBytes - 1,
                       pool::kMinPooledBytes, pool::kMinPooledBytes + 1, size_t{100000}, size_t{1} << 20,
                       (size_t{1} << 20) + 1, size_t{3} << 27, (size_t{5} << 30) + 12345}) {
    const size_t c = pool::size_class(bytes);
    EXPECT_GE(c, bytes) << bytes;
    EXPECT_EQ(c % 64, 0u) << bytes;
    if (bytes >= pool::kMinPooledBytes) EXPECT_LE(c, bytes + bytes / 8) << bytes;
  }
  EXPECT_EQ(pool::size_class(size_t{1} << 20), size_t{1} << 20);  // a power of two is its own class
}

// The VmFlags of the mapping that holds p (/proc/self/smaps), or "" when none is found.
std::string vm_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// From 2 MiB on a block starts on a 2 MiB boundary and its whole pages are advised as huge pages (the "hg" flag of
// its mapping, where the kernel has THP); below, 64-byte alignment; every byte writable; impossible sizes fail.
// Under QKV_HUGE_PAGES=0 (ctest runs this test both ways) no block is advised.
TEST(StoragePoolSystemAlloc, HugePagesFromTwoMegabytesOn) {
  const char* env = std::getenv("QKV_HUGE_PAGES");
  const bool off = env != nullptr && std::string(env) == "0";
  constexpr size_t kHuge = size_t{2} << 20;
  const bool thp = std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{100}, kHuge - 1, kHuge, kHuge + 4, size_t{5} << 20}) {
    void* p = pool::system_alloc(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    const auto at = reinterpret_cast<uintptr_t>(p);
    EXPECT_EQ(at % (bytes >= kHuge && !off ? kHuge : 64), 0u) << bytes;
    std::fill_n(static_cast<unsigned char*>(p), bytes, 0xab);
    if (bytes >= kHuge && thp && !off) EXPECT_NE(vm_flags(p).find(" hg"), std::string::npos) << bytes << ": " << vm_flags(p);
    if (off) EXPECT_EQ(vm_flags(p).find(" hg"), std::string::npos) << bytes << ": " << vm_flags(p);
    std::free(p);
  }
  EXPECT_EQ(pool::system_alloc(SIZE_MAX - 5), nullptr);
  EXPECT_THROW(pool::SystemAllocator<uint32_t>().allocate(SIZE_MAX / 2), std::bad_alloc);
  // Tensors of 2 MiB and more (through the pool) get such blocks.
  const Tensor big = Tensor::empty({3 << 18});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % (off ? 64 : kHuge), 0u);
}

TEST_F(StoragePool, FreedBufferServesTheNextAllocationOfItsClass) {
  const pool::Stats s0 = pool::stats();
  const float* first = nullptr;
  {
    std::shared_ptr<float> a = pool::allocate(kPooledFloats);
    first = a.get();
    a.get()[kPooledFloats - 1] = 1.0f;  // writable to the end
  }
  EXPECT_EQ(pool::stats().cached_blocks, 1u);
  EXPECT_EQ(pool::stats().cached_bytes, pool::size_class(kPooledFloats * sizeof(float)));
  std::shared_ptr<float> b = pool::allocate(kPooledFloats - 100);  // same class
  EXPECT_EQ(b.get(), first);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % 64, 0u);
  const pool::Stats s1 = pool::stats();
  EXPECT_EQ(s1.hits, s0.hits + 1);
  EXPECT_EQ(s1.misses, s0.misses + 1);
  EXPECT_EQ(s1.cached_blocks, 0u);
}

TEST_F(StoragePool, TensorEmptyAllocatesThroughThePool) {
  const uint64_t hits = pool::stats().hits;
  const float* p = Tensor::empty({4, kPooledFloats / 4}).data();
  const Tensor t = Tensor::zeros({kPooledFloats});  // same class: the buffer just freed, zero-filled
  EXPECT_EQ(t.data(), p);
  EXPECT_EQ(pool::stats().hits, hits + 1);
  for (int64_t i = 0; i < t.numel(); i += 997) EXPECT_EQ(t.data()[i], 0.0f);
}

TEST_F(StoragePool, SmallBuffersBypassThePool) {
  const pool::Stats s0 = pool::stats();
  { const Tensor t = Tensor::empty({static_cast<int64_t>(pool::kMinPooledBytes / sizeof(float)) - 16}); }
  const pool::Stats s1 = pool::stats();
  EXPECT_EQ(s1.hits + s1.misses, s0.hits + s0.misses);
  EXPECT_EQ(s1.cached_blocks, 0u);
}

TEST_F(StoragePool, ZeroLimitDisablesCaching) {
  pool::set_limit(0);
  { const Tensor t = Tensor::empty({kPooledFloats}); }
  EXPECT_EQ(pool::stats().cached_bytes, 0u);
  EXPECT_EQ(pool::limit(), 0u);
}

TEST_F(StoragePool, BufferLargerThanTheLimitGoesBackToTheSystem) {
  pool::set_limit(pool::size_class(kPooledFloats * sizeof(float)));
  { const Tensor t = Tensor::empty({4 * kPooledFloats}); }
  EXPECT_EQ(pool::stats().cached_bytes, 0u);
  { const Tensor t = Tensor::empty({kPooledFloats}); }
  EXPECT_EQ(pool::stats().cached_blocks, 1u);
}

TEST_F(StoragePool, LimitEvictsLargestBlocksFirst) {
  const size_t small = pool::size_class(kPooledFloats * sizeof(float));
  const size_t big = pool::size_class(4 * kPooledFloats * sizeof(float));
  {
    const Tensor a = Tensor::empty({kPooledFloats}), b = Tensor::empty({4 * kPooledFloats});
  }
  EXPECT_EQ(pool::stats().cached_bytes, small + big);
  pool::set_limit(small);  // the big block goes
  EXPECT_EQ(pool::stats().cached_bytes, small);
  EXPECT_EQ(pool::stats().cached_blocks, 1u);
  // Freeing a block that does not fit evicts cached ones (largest first) until it does: recent frees stay.
  pool::set_limit(big);
  { const Tensor c = Tensor::empty({4 * kPooledFloats}); }  // miss (only a small block is cached), then cached
  EXPECT_EQ(pool::stats().cached_bytes, big);
  EXPECT_LE(pool::stats().cached_bytes, pool::limit());
}

// A class emptied by reuse must not be left behind as an empty list: eviction takes the largest class and would
// read from the empty one (found as a heap overflow in a long training run).
TEST_F(StoragePool, EvictionAfterTheLargestClassWasReusedEmpty) {
  const size_t small = pool::size_class(kPooledFloats * sizeof(float));
  { const Tensor big = Tensor::empty({4 * kPooledFloats}), a = Tensor::empty({kPooledFloats}); }
  const Tensor held = Tensor::empty({4 * kPooledFloats});  // takes the only big block: its class is now empty
  pool::set_limit(0);  // evicts everything cached: must stop after the small block
  EXPECT_EQ(pool::stats().cached_bytes, 0u);
  pool::set_limit(small * 4);
  { const Tensor a = Tensor::empty({kPooledFloats}); }
  EXPECT_EQ(pool::stats().cached_bytes, small);
}

TEST_F(StoragePool, ConcurrentAllocateAndFreeKeepContentsAndBounds) {
  pool::set_limit(size_t{8} << 20);
  constexpr int kThreads = 4, kRounds = 200;
  std::vector<int> bad(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &bad] {
      for (int r = 0; r < kRounds; ++r) {
        const int64_t n = kPooledFloats * (1 + (t + r) % 3);
        Tensor x = Tensor::full({n}, static_cast<float>(t * 1000 + r));
        Tensor y = Tensor::empty({n / 2});
        y.fill(-1.0f);
        for (int64_t i = 0; i < n; i += 4093)
          if (x.data()[i] != static_cast<float>(t * 1000 + r)) ++bad[static_cast<size_t>(t)];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(bad[static_cast<size_t>(t)], 0) << "thread " << t;
  EXPECT_LE(pool::stats().cached_bytes, pool::limit());
  EXPECT_GT(pool::stats().hits, 0u);
}

TEST_F(StoragePool, ReleaseFreesEveryCachedBlock) {
  { const Tensor a = Tensor::empty({kPooledFloats}), b = Tensor::empty({2 * kPooledFloats}); }
  EXPECT_EQ(pool::stats().cached_blocks, 2u);
  pool::release();
  EXPECT_EQ(pool::stats().cached_blocks, 0u);
  EXPECT_EQ(pool::stats().cached_bytes, 0u);
}

TEST(StoragePoolErrors, OverflowingByteCountThrowsNamingTensor) {
  EXPECT_TRUE(ThrowsArg([] { pool::allocate(INT64_MAX / 2); }, "[tensor]"));
  EXPECT_TRUE(ThrowsArg([] { pool::allocate(-1); }, "[tensor]"));
}

}  // namespace
}  // namespace qkv
