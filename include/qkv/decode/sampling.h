// Sampling the next token from logits: temperature, top-k, top-p, seeded. Continuing a prompt with a model is
// decode/generate.h's.
#pragma once

#include <cstdint>

#include "qkv/core/rng.h"

namespace qkv::decode {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties); > 0: sample softmax(logits / temperature)
  int64_t top_k = 0;         // > 0: only the k most likely tokens (ties at the k-th broken by lower id); 0: all
  float top_p = 1.0f;        // in (0, 1]: the smallest most-likely set whose probability reaches top_p (nucleus)
  uint64_t seed = 0;         // the one random stream of a generate() call
};

// Throws std::invalid_argument "[sampling] ..." for a negative or non-finite temperature, top_k < 0 or top_p
// outside (0, 1].
void check_sampling(const SamplingOptions& options);

// One token from logits (V), V >= 1, as options says; draws one uniform number from rng when temperature > 0.
// Filters apply in HF's order: temperature, then top-k, then top-p.
int64_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options, Rng& rng);

}  // namespace qkv::decode
