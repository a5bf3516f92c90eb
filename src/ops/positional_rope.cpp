// Rotary position embedding: rotates feature pairs of (..., T, D) by pos·θ_i, interleaved or half-split pairing.
// Angles follow the float32 reference recipe; cos/sin are tabulated once per (position, frequency), in a RopeTable
// that a model shares between the queries and keys of all its layers.
#include <algorithm>
#include <cmath>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/ops/positional/rope.h"

namespace qkv {
namespace {

void check_x(const Tensor& x) {
  QKV_CHECK_ARG(x.defined(), "[rope_apply] x is undefined");
  QKV_CHECK_ARG(x.dim() >= 2, "[rope_apply] x ", str(x.shape()), " must be (..., T, D) with rank >= 2");
  QKV_CHECK_ARG(x.size(-1) >= 2 && x.size(-1) % 2 == 0, "[rope_apply] x ", str(x.shape()),
                " must have an even, positive last dimension D");
}

// The table, its arguments' errors named `op` (rope_table called directly, or rope_apply making its own).
RopeTable make_table(const std::vector<int64_t>& positions, int64_t dim, float base, const char* op) {
  QKV_CHECK_ARG(dim >= 2 && dim % 2 == 0, "[", op, "] D must be even and positive, got ", dim);
  QKV_CHECK_ARG(std::isfinite(base) && base > 0.0f, "[", op, "] base must be finite and > 0, got ", base);
  for (int64_t p : positions) QKV_CHECK_ARG(p >= 0, "[", op, "] positions must be >= 0, got ", p);
  const int64_t T = static_cast<int64_t>(positions.size()), half = dim / 2;
  RopeTable tb{T, dim, std::vector<float>(static_cast<size_t>(T * half)),
               std::vector<float>(static_cast<size_t>(T * half))};
  // inv_freq = 1 / base^(2i/D), angle = pos * inv_freq, all float32 like torch; cos/sin in double, rounded.
  // Threaded from a few thousand angles on (a prefill); each value is computed alike either way.
#pragma omp parallel for schedule(static) if (T * half >= 2048)
  for (int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float inv_freq = 1.0f / std::pow(base, expo);
    for (int64_t t = 0; t < T; ++t) {
      const float angle = static_cast<float>(positions[static_cast<size_t>(t)]) * inv_freq;
      tb.cos[static_cast<size_t>(t * half + i)] = static_cast<float>(std::cos(static_cast<double>(angle)));
      tb.sin[static_cast<size_t>(t * half + i)] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return tb;
}

std::vector<int64_t> consecutive(int64_t offset, int64_t rows, const char* op) {
  QKV_CHECK_ARG(offset >= 0, "[", op, "] offset must be >= 0, got ", offset);
  QKV_CHECK_ARG(rows >= 0, "[", op, "] T must be >= 0, got ", rows);
  std::vector<int64_t> positions(static_cast<size_t>(rows));
  for (int64_t t = 0; t < rows; ++t) positions[static_cast<size_t>(t)] = offset + t;
  return positions;
}

}  // namespace

RopeTable rope_table(const std::vector<int64_t>& positions, int64_t dim, float base) {
  return make_table(positions, dim, base, "rope_table");
}

RopeTable rope_table(int64_t offset, int64_t rows, int64_t dim, float base) {
  return make_table(consecutive(offset, rows, "rope_table"), dim, base, "rope_table");
}

RopeTable rope_table_rows(const RopeTable& tb, int64_t first, int64_t rows) {
  const int64_t half = tb.dim / 2;
  QKV_CHECK_ARG(first >= 0 && rows >= 0 && first + rows <= tb.rows, "[rope_table_rows] rows ", first, " .. ",
                first + rows, " of a table of ", tb.rows, " positions");
  const int64_t from = first * half, to = (first + rows) * half;
  return RopeTable{rows, tb.dim, std::vector<float>(tb.cos.begin() + from, tb.cos.begin() + to),
                   std::vector<float>(tb.sin.begin() + from, tb.sin.begin() + to)};
}

Tensor rope_apply(const Tensor& x, const RopeTable& tb, RopeVariant variant) {
  check_x(x);
  const int64_t T = x.size(-2), D = x.size(-1), half = D / 2;
  QKV_CHECK_ARG(T == tb.rows && D == tb.dim && static_cast<int64_t>(tb.cos.size()) == T * half &&
                    tb.sin.size() == tb.cos.size(),
                "[rope_apply] x ", str(x.shape()), " does not match the table of ", tb.rows, " positions x D ", tb.dim);
  // Rows are read where they lie (a permuted (B, T, H, D) view of a projection is not copied first); a strided last
  // dimension is made contiguous.
  const Tensor xs = x.stride(-1) == 1 ? x : x.contiguous();
  const int64_t rows = x.numel() / D;
  std::vector<int64_t> at(static_cast<size_t>(rows));
  const Shape lead(xs.shape().begin(), xs.shape().end() - 1);
  const Shape lead_strides(xs.strides().begin(), xs.strides().end() - 1);
  for_each_offset(lead, lead_strides, [&](int64_t r, int64_t off) { at[static_cast<size_t>(r)] = off; });
  Tensor out = Tensor::empty(x.shape());
  const float* src = xs.data();
  float* dst = out.data();
#pragma omp parallel for schedule(static) if (rows * D >= (int64_t{1} << 15))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % T;
    const float* c = tb.cos.data() + t * half;
    const float* s = tb.sin.data() + t * half;
    const float* a = src + at[static_cast<size_t>(r)];
    float* o = dst + r * D;
    if (variant == RopeVariant::kInterleaved) {
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = a[2 * i], x1 = a[2 * i + 1];
        o[2 * i] = x0 * c[i] - x1 * s[i];
        o[2 * i + 1] = x0 * s[i] + x1 * c[i];
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = a[i], x1 = a[i + half];
        o[i] = x0 * c[i] - x1 * s[i];
        o[i + half] = x0 * s[i] + x1 * c[i];
      }
    }
  }
  return out;
}

RopeTable rope_table_for(const Tensor& x, int64_t offset, float base) {
  check_x(x);
  return make_table(consecutive(offset, x.size(-2), "rope_apply"), x.size(-1), base, "rope_apply");
}

RopeTable rope_table_for(const Tensor& x, const std::vector<int64_t>& positions, float base) {
  check_x(x);
  QKV_CHECK_ARG(static_cast<int64_t>(positions.size()) == x.size(-2), "[rope_apply] got ", positions.size(),
                " positions for x ", str(x.shape()), " (need one per row T = ", x.size(-2), ")");
  return make_table(positions, x.size(-1), base, "rope_apply");
}

Tensor rope_apply(const Tensor& x, int64_t offset, float base, RopeVariant variant) {
  return rope_apply(x, rope_table_for(x, offset, base), variant);
}

Tensor rope_apply(const Tensor& x, const std::vector<int64_t>& positions, float base, RopeVariant variant) {
  return rope_apply(x, rope_table_for(x, positions, base), variant);
}

}  // namespace qkv
