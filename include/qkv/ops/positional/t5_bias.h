// T5 relative attention bias (Raffel et al. 2020): the distance j - i falls into one of num_buckets buckets (exact
// for small distances, logarithmic up to max_distance); each bucket holds one learned scalar per head.
#pragma once

#include <cstdint>

#include "qkv/core/tensor.h"

namespace qkv {

// Bucket of relative_position = key_pos - query_pos, bit-for-bit as HF transformers' _relative_position_bucket
// (the log term in float32, truncated toward zero). Returns a value in [0, num_buckets).
// bidirectional: half the buckets for keys after the query (j > i), half for keys at or before it.
// Unidirectional: keys after the query all fall in bucket 0.
// Needs num_buckets >= 2 (>= 4 when bidirectional) and max_distance > max_exact, where
// max_exact = num_buckets / 2 (num_buckets / 4 when bidirectional).
// Throws std::invalid_argument naming `op` unless num_buckets and max_distance satisfy the rule above.
void t5_check_bucket_args(bool bidirectional, int64_t num_buckets, int64_t max_distance, const char* op);

int64_t t5_relative_bucket(int64_t relative_position, bool bidirectional, int64_t num_buckets = 32,
                           int64_t max_distance = 128);

// table: (num_buckets, H)  ->  bias (1, H, Tq, Tk) with bias[0, h, i, j] = table[bucket(j - (i + query_offset)), h]
// Pass query_offset = Tk - Tq when decoding against a KV cache (HF slices the last Tq rows; same result).
Tensor t5_relative_bias(const Tensor& table, int64_t Tq, int64_t Tk, bool bidirectional, int64_t max_distance = 128,
                        int64_t query_offset = 0);

}  // namespace qkv
