// PCG32 (O'Neill, pcg-random.org) with portable transforms, so seeds reproduce across compilers and libcs.
#include "qkv/core/rng.h"

#include <cmath>

#include "qkv/core/error.h"

namespace qkv {

Rng::Rng(uint64_t seed) : state_(0), inc_((seed << 1u) | 1u) {
  next_u32();
  state_ += 0x853c49e6748fea9bULL ^ seed;
  next_u32();
}

uint32_t Rng::next_u32() {
  const uint64_t old = state_;
  state_ = old * 6364136223846793005ULL + inc_;
  const uint32_t xorshifted = static_cast<uint32_t>(((old >> 18u) ^ old) >> 27u);
  const uint32_t rot = static_cast<uint32_t>(old >> 59u);
  return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
}

uint64_t Rng::next_u64() {
  const uint64_t hi = next_u32();
  return (hi << 32) | next_u32();
}

float Rng::uniform() { return static_cast<float>(next_u32() >> 8) * (1.0f / 16777216.0f); }

namespace {
// lo + (hi - lo) * u can round up to hi in float (e.g. lo = 1, hi = 2); keep the interval half-open.
float scale_unit(float u, float lo, float hi) {
  const float r = lo + (hi - lo) * u;
  return r < hi ? r : std::nextafter(hi, lo);
}
}  // namespace

float Rng::uniform(float lo, float hi) {
  QKV_CHECK_ARG(lo < hi, "[rng.uniform] needs lo < hi, got ", lo, " and ", hi);
  return scale_unit(uniform(), lo, hi);
}

float Rng::normal(float mean, float stddev) {
  QKV_CHECK_ARG(stddev >= 0.0f, "[rng.normal] stddev must be >= 0, got ", stddev);
  if (has_spare_) {
    has_spare_ = false;
    return mean + stddev * spare_;
  }
  // Box-Muller in double for stable bits; u1 in (0, 1] so log is finite.
  const double u1 = (static_cast<double>(next_u32()) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(next_u32()) / 4294967296.0;
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double th = 6.283185307179586 * u2;
  spare_ = static_cast<float>(r * std::sin(th));
  has_spare_ = true;
  return mean + stddev * static_cast<float>(r * std::cos(th));
}

bool Rng::bernoulli(float p) {
  QKV_CHECK_ARG(p >= 0.0f && p <= 1.0f, "[rng.bernoulli] p must be in [0, 1], got ", p);
  return uniform() < p;
}

uint64_t Rng::below(uint64_t n) {
  QKV_CHECK_ARG(n > 0, "[rng.below] n must be positive");
  const uint64_t x = (static_cast<uint64_t>(next_u32()) << 32) | next_u32();
  return x % n;
}

Tensor Rng::normal(const Shape& shape, float mean, float stddev) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = normal(mean, stddev);
  return t;
}

Tensor Rng::uniform(const Shape& shape, float lo, float hi) {
  QKV_CHECK_ARG(lo < hi, "[rng.uniform] needs lo < hi, got ", lo, " and ", hi);
  Tensor t = Tensor::empty(shape);
  float* p = t.data();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale_unit(uniform(), lo, hi);
  return t;
}

Tensor Rng::bernoulli(const Shape& shape, float p) {
  QKV_CHECK_ARG(p >= 0.0f && p <= 1.0f, "[rng.bernoulli] p must be in [0, 1], got ", p);
  Tensor t = Tensor::empty(shape);
  float* d = t.data();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = uniform() < p ? 1.0f : 0.0f;
  return t;
}

}  // namespace qkv
