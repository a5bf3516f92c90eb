// Rng: reproducible bits per seed, and the distributions' moments and ranges within statistical bounds.
// Bounds are 6 standard errors, so a correct generator fails with probability ~1e-9 per check.
#include "qkv/core/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops_testing.h"

namespace qkv {
namespace {

using testing::ThrowsArg;

constexpr int64_t kSamples = 100000;
// 6 standard errors of a mean of n draws with standard deviation sd.
double mean_bound(double sd, int64_t n) { return 6.0 * sd / std::sqrt(static_cast<double>(n)); }

struct Moments {
  double mean = 0, sd = 0;
};
Moments moments(const std::vector<float>& v) {
  Moments m;
  for (float x : v) m.mean += x;
  m.mean /= static_cast<double>(v.size());
  for (float x : v) m.sd += (x - m.mean) * (x - m.mean);
  m.sd = std::sqrt(m.sd / static_cast<double>(v.size() - 1));
  return m;
}

TEST(Rng, SameSeedSameBits) {
  Rng a(123), b(123);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(a.next_u32(), b.next_u32()) << i;
  Rng c(5), d(5);
  EXPECT_EQ(c.normal({7, 3}).to_vector(), d.normal({7, 3}).to_vector());
  EXPECT_EQ(c.uniform({9}).to_vector(), d.uniform({9}).to_vector());
}

TEST(Rng, KnownFirstOutputsPinTheStream) {
  // PCG32 XSH-RR with state 0, inc = 2 seed + 1, one step, state += 0x853c49e6748fea9b ^ seed, one step;
  // values from an independent Python model of that recipe. Pins the bits across compilers and platforms.
  Rng r(42);
  const std::vector<uint32_t> want{0xcb738720u, 0xd1221c21u, 0xd30a4869u, 0x9025c65eu};
  for (uint32_t w : want) EXPECT_EQ(r.next_u32(), w);
}

TEST(Rng, DifferentSeedsDiffer) {
  Rng a(1), b(2), c(1ULL << 63);
  int same_ab = 0, same_ac = 0;
  for (int i = 0; i < 100; ++i) {
    const uint32_t x = a.next_u32(), y = b.next_u32(), z = c.next_u32();
    same_ab += x == y;
    same_ac += x == z;
  }
  EXPECT_LT(same_ab, 3);
  EXPECT_LT(same_ac, 3);
}

TEST(Rng, StateRoundTrips) {
  Rng a(9);
  a.next_u32();
  const uint64_t s = a.state();
  const float first = a.uniform();
  a.set_state(s);
  EXPECT_EQ(a.uniform(), first);
}

TEST(Rng, NormalMeanAndStdWithinBounds) {
  Rng rng(2024);
  const Moments m = moments(rng.normal({kSamples}, 1.5f, 2.0f).to_vector());
  EXPECT_NEAR(m.mean, 1.5, mean_bound(2.0, kSamples));
  // sd of the sample sd is about sd / sqrt(2n).
  EXPECT_NEAR(m.sd, 2.0, 6.0 * 2.0 / std::sqrt(2.0 * kSamples));
  // Scalar path, including the cached Box-Muller spare.
  std::vector<float> v(kSamples);
  for (float& x : v) x = rng.normal();
  const Moments s = moments(v);
  EXPECT_NEAR(s.mean, 0.0, mean_bound(1.0, kSamples));
  EXPECT_NEAR(s.sd, 1.0, 6.0 / std::sqrt(2.0 * kSamples));
  for (float x : v) ASSERT_TRUE(std::isfinite(x));
}

TEST(Rng, UniformStaysInHalfOpenRange) {
  Rng rng(7);
  const std::vector<float> v = rng.uniform({kSamples}, -2.0f, 3.0f).to_vector();
  for (float x : v) ASSERT_TRUE(x >= -2.0f && x < 3.0f) << x;
  const Moments m = moments(v);
  EXPECT_NEAR(m.mean, 0.5, mean_bound(5.0 / std::sqrt(12.0), kSamples));
  EXPECT_NEAR(m.sd, 5.0 / std::sqrt(12.0), 6.0 * 5.0 / std::sqrt(12.0) / std::sqrt(2.0 * kSamples));
  for (int i = 0; i < kSamples; ++i) {
    const float u = rng.uniform();
    ASSERT_TRUE(u >= 0.0f && u < 1.0f) << u;
  }
}

TEST(Rng, UniformNeverReturnsHiEvenWhenRoundingWould) {
  // 1 + (2 - 1) * (1 - 2^-24) rounds to 2.0f. Find a state whose next draw is the largest unit value
  // (about 2^24 tries), replay it, and check uniform(1, 2) still lands below hi.
  Rng rng(0);
  uint64_t before = 0;
  bool found = false;
  for (int64_t i = 0; i < (int64_t{1} << 27) && !found; ++i) {
    before = rng.state();
    found = (rng.next_u32() >> 8) == 0xFFFFFFu;
  }
  ASSERT_TRUE(found);
  rng.set_state(before);
  const float top = rng.uniform();
  EXPECT_EQ(top, 1.0f - 1.0f / 16777216.0f);
  rng.set_state(before);
  EXPECT_LT(rng.uniform(1.0f, 2.0f), 2.0f);
  rng.set_state(before);
  EXPECT_LT(rng.uniform({1}, 1.0f, 2.0f).item(), 2.0f);
}

TEST(Rng, BernoulliFraction) {
  Rng rng(11);
  for (float p : {0.0f, 0.2f, 0.5f, 1.0f}) {
    const std::vector<float> v = rng.bernoulli({kSamples}, p).to_vector();
    double ones = 0;
    for (float x : v) {
      ASSERT_TRUE(x == 0.0f || x == 1.0f);
      ones += x;
    }
    EXPECT_NEAR(ones / kSamples, p, mean_bound(std::sqrt(p * (1.0 - p)), kSamples)) << p;
  }
  int hits = 0;
  for (int i = 0; i < kSamples; ++i) hits += rng.bernoulli(0.25f);
  EXPECT_NEAR(static_cast<double>(hits) / kSamples, 0.25, mean_bound(std::sqrt(0.25 * 0.75), kSamples));
}

TEST(Rng, BelowIsUniformOverRange) {
  Rng rng(13);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < kSamples; ++i) {
    const uint64_t k = rng.below(7);
    ASSERT_LT(k, 7u);
    ++counts[k];
  }
  const double p = 1.0 / 7.0;
  for (int c : counts) EXPECT_NEAR(static_cast<double>(c) / kSamples, p, mean_bound(std::sqrt(p * (1 - p)), kSamples));
}

TEST(Rng, RejectsBadParameters) {
  Rng rng(1);
  EXPECT_TRUE(ThrowsArg([&] { rng.uniform(1.0f, 1.0f); }, "[rng.uniform]"));
  EXPECT_TRUE(ThrowsArg([&] { rng.uniform({2}, 3.0f, 1.0f); }, "[rng.uniform]"));
  EXPECT_TRUE(ThrowsArg([&] { rng.normal(0.0f, -1.0f); }, "[rng.normal]"));
  EXPECT_TRUE(ThrowsArg([&] { rng.bernoulli(1.5f); }, "[rng.bernoulli]"));
  EXPECT_TRUE(ThrowsArg([&] { rng.bernoulli({2}, -0.1f); }, "[rng.bernoulli]"));
  EXPECT_TRUE(ThrowsArg([&] { rng.below(0); }, "[rng.below]"));
}

}  // namespace
}  // namespace qkv
