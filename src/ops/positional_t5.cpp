// T5 relative attention bias: HF-exact bucketing of key_pos - query_pos and the (1, H, Tq, Tk) additive bias.
// The log bucket is computed in float32 like the reference (torch float32 ops, then truncation toward zero).
#include <cmath>
#include <cstdlib>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/ops/positional/t5_bias.h"

namespace qkv {
namespace {


// No checks; args validated by the caller.
int64_t bucket_unchecked(int64_t relative_position, bool bidirectional, int64_t num_buckets, int64_t max_distance) {
  int64_t ret = 0;
  int64_t n = num_buckets;
  int64_t rp = relative_position;
  if (bidirectional) {
    n /= 2;
    if (rp > 0) ret += n;
    rp = rp < 0 ? -rp : rp;
  } else {
    rp = rp < 0 ? -rp : 0;  // -min(rp, 0): keys after the query collapse to 0
  }
  const int64_t max_exact = n / 2;
  if (rp < max_exact) return ret + rp;
  // float32 throughout, as torch: log(rp.float() / max_exact) / math.log(max_distance / max_exact) * (n - max_exact)
  const float ratio = static_cast<float>(rp) / static_cast<float>(max_exact);
  const float denom = static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  const float x = std::log(ratio) / denom * static_cast<float>(n - max_exact);
  // .to(long) truncates toward zero (x >= 0 here), then min(., n - 1). Clamp before the cast to stay defined.
  const int64_t limit = n - 1 - max_exact;
  const int64_t large = x >= static_cast<float>(limit) ? limit : static_cast<int64_t>(x);
  return ret + max_exact + large;
}

}  // namespace

void t5_check_bucket_args(bool bidirectional, int64_t num_buckets, int64_t max_distance, const char* op) {
  const int64_t half = bidirectional ? num_buckets / 2 : num_buckets;
  const int64_t max_exact = half / 2;
  QKV_CHECK_ARG(max_exact >= 1, "[", op, "] num_buckets ", num_buckets, " is too small (needs >= ",
                bidirectional ? 4 : 2, (bidirectional ? " when bidirectional" : ""), ")");
  QKV_CHECK_ARG(max_distance > max_exact, "[", op, "] max_distance ", max_distance,
                " must exceed the exact range max_exact = ", max_exact);
}

int64_t t5_relative_bucket(int64_t relative_position, bool bidirectional, int64_t num_buckets,
                           int64_t max_distance) {
  t5_check_bucket_args(bidirectional, num_buckets, max_distance, "t5_relative_bucket");
  return bucket_unchecked(relative_position, bidirectional, num_buckets, max_distance);
}

Tensor t5_relative_bias(const Tensor& table, int64_t Tq, int64_t Tk, bool bidirectional, int64_t max_distance,
                        int64_t query_offset) {
  QKV_CHECK_ARG(table.defined() && table.dim() == 2, "[t5_relative_bias] table ",
                table.defined() ? str(table.shape()) : std::string("(undefined)"), " must be (num_buckets, H)");
  QKV_CHECK_ARG(table.size(1) >= 1, "[t5_relative_bias] table ", str(table.shape()), " must have H >= 1");
  QKV_CHECK_ARG(Tq >= 0 && Tk >= 0, "[t5_relative_bias] Tq (", Tq, ") and Tk (", Tk, ") must be >= 0");
  const int64_t num_buckets = table.size(0), H = table.size(1);
  t5_check_bucket_args(bidirectional, num_buckets, max_distance, "t5_relative_bias");

  Tensor out = Tensor::empty({1, H, Tq, Tk});
  if (out.numel() == 0) return out;
  // Distances j - (i + offset) span [-(Tq - 1) - offset, Tk - 1 - offset]: one bucket per distinct distance.
  const int64_t span = Tq + Tk - 1;
  std::vector<int64_t> bucket(static_cast<size_t>(span));
  for (int64_t s = 0; s < span; ++s)
    bucket[s] = bucket_unchecked(s - (Tq - 1) - query_offset, bidirectional, num_buckets, max_distance);
  const Tensor t = table.contiguous();
  const float* tp = t.data();
  float* o = out.data();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = 0; j < Tk; ++j) o[(h * Tq + i) * Tk + j] = tp[bucket[j - i + Tq - 1] * H + h];
  return out;
}

}  // namespace qkv
