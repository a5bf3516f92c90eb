// Rng: the only source of randomness in qkv. Explicit and seeded: the same seed gives the same bits on every machine.
// Uses a PCG32 stream and its own normal/uniform transforms (not <random>'s distributions, whose output varies by stdlib).
#pragma once

#include <cstdint>

#include "qkv/core/tensor.h"

namespace qkv {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0);

  uint32_t next_u32();
  uint64_t next_u64();  // two next_u32 draws, the first the high half (a child module's seed)
  float uniform();                    // [0, 1)
  float uniform(float lo, float hi);  // [lo, hi); lo < hi
  float normal(float mean = 0.0f, float stddev = 1.0f);  // Box-Muller; stddev >= 0
  bool bernoulli(float p);            // true with probability p in [0, 1]
  uint64_t below(uint64_t n);         // uniform integer in [0, n); n > 0

  Tensor normal(const Shape& shape, float mean = 0.0f, float stddev = 1.0f);
  Tensor uniform(const Shape& shape, float lo = 0.0f, float hi = 1.0f);
  Tensor bernoulli(const Shape& shape, float p);  // 1.0 / 0.0 values

  uint64_t state() const { return state_; }
  void set_state(uint64_t state) { state_ = state; has_spare_ = false; }

 private:
  uint64_t state_;
  uint64_t inc_;
  bool has_spare_ = false;
  float spare_ = 0.0f;
};

}  // namespace qkv
