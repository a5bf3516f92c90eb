// Rotary position embedding: rotates feature pairs of (..., T, D) by pos·θ_i, interleaved or half-split pairing.
// Angles follow the float32 reference recipe; cos/sin are tabulated once per (position, frequency), in a RopeTable
// that a model shares between the queries and keys of all its layers. HF's frequency scalings (linear, llama3, yarn)
// change the frequencies and, for yarn, the cos and sin's magnitude.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/core/parallel_for.h"
#include "qkv/ops/positional/rope.h"

namespace qkv {
namespace {

void check_x(const Tensor& x) {
  QKV_CHECK_ARG(x.defined(), "[rope_apply] x is undefined");
  QKV_CHECK_ARG(x.dim() >= 2, "[rope_apply] x ", str(x.shape()), " must be (..., T, D) with rank >= 2");
  QKV_CHECK_ARG(x.size(-1) >= 2 && x.size(-1) % 2 == 0, "[rope_apply] x ", str(x.shape()),
                " must have an even, positive last dimension D");
}

void check_dim_base(int64_t dim, float base, const char* op) {
  QKV_CHECK_ARG(dim >= 2 && dim % 2 == 0, "[", op, "] D must be even and positive, got ", dim);
  QKV_CHECK_ARG(std::isfinite(base) && base > 0.0f, "[", op, "] base must be finite and > 0, got ", base);
}

bool positive(float x) { return std::isfinite(x) && x > 0.0f; }
bool non_negative(float x) { return std::isfinite(x) && x >= 0.0f; }

void check_scaling(const RopeScaling& s, int64_t dim, const char* op) {
  using Type = RopeScaling::Type;
  if (s.type != Type::kDefault)
    QKV_CHECK_ARG(positive(s.factor), "[", op, "] factor must be finite and > 0, got ", s.factor);
  if (s.type == Type::kLlama3) {
    QKV_CHECK_ARG(positive(s.low_freq_factor) && positive(s.high_freq_factor) && s.high_freq_factor > s.low_freq_factor,
                  "[", op, "] llama3 needs 0 < low_freq_factor < high_freq_factor, got ", s.low_freq_factor, " and ",
                  s.high_freq_factor);
  }
  if (s.type == Type::kLlama3 || s.type == Type::kYarn)
    QKV_CHECK_ARG(s.original_max_position_embeddings > 0, "[", op,
                  "] original_max_position_embeddings must be > 0, got ", s.original_max_position_embeddings);
  if (s.type == Type::kYarn) {
    QKV_CHECK_ARG(positive(s.beta_fast) && positive(s.beta_slow), "[", op,
                  "] yarn's beta_fast and beta_slow must be finite and > 0, got ", s.beta_fast, " and ", s.beta_slow);
    QKV_CHECK_ARG(non_negative(s.attention_factor) && non_negative(s.mscale) && non_negative(s.mscale_all_dim), "[",
                  op, "] yarn's attention_factor, mscale and mscale_all_dim must be finite and >= 0, got ",
                  s.attention_factor, ", ", s.mscale, " and ", s.mscale_all_dim);
  }
  if (!s.freq_factors.empty()) {
    QKV_CHECK_ARG(static_cast<int64_t>(s.freq_factors.size()) == dim / 2, "[", op, "] ", s.freq_factors.size(),
                  " freq_factors for D = ", dim, " (need D/2 = ", dim / 2, ")");
    for (size_t i = 0; i < s.freq_factors.size(); ++i)
      QKV_CHECK_ARG(positive(s.freq_factors[i]), "[", op, "] freq_factors[", i, "] must be finite and > 0, got ",
                    s.freq_factors[i]);
  }
}

// HF's recipes, one float32 operation per torch operation in the same order (a python number meeting a float32
// tensor is rounded to float32 first; `number / tensor` is torch's reciprocal(tensor) · number). The python-side
// scalars (yarn's correction range, the mscales) are doubles, as in python.
std::vector<float> inv_freq_of(int64_t dim, float base, const RopeScaling& s, const char* op) {
  check_dim_base(dim, base, op);
  check_scaling(s, dim, op);
  using Type = RopeScaling::Type;
  const int64_t half = dim / 2;
  std::vector<float> pos_freq(static_cast<size_t>(half)), inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {  // base^(2i/D) and 1 / base^(2i/D), all float32 like torch
    const float expo = static_cast<float>(2 * i) / static_cast<float>(dim);
    pos_freq[static_cast<size_t>(i)] = std::pow(base, expo);
    inv[static_cast<size_t>(i)] = 1.0f / pos_freq[static_cast<size_t>(i)];
  }
  const float factor = s.factor;
  switch (s.type) {
    case Type::kDefault: break;
    case Type::kLinear:
      for (float& f : inv) f = f / factor;
      break;
    case Type::kLlama3: {
      const double old_len = static_cast<double>(s.original_max_position_embeddings);
      const float low_wavelen = static_cast<float>(old_len / static_cast<double>(s.low_freq_factor));
      const float high_wavelen = static_cast<float>(old_len / static_cast<double>(s.high_freq_factor));
      const float two_pi = static_cast<float>(2.0 * std::numbers::pi), old_len_f = static_cast<float>(old_len);
      const float band = static_cast<float>(static_cast<double>(s.high_freq_factor) - s.low_freq_factor);
      for (float& f : inv) {
        const float wavelen = (1.0f / f) * two_pi;
        const float scaled = wavelen > low_wavelen ? f / factor : f;  // inv_freq_llama
        if (wavelen < high_wavelen || wavelen > low_wavelen) {
          f = scaled;
          continue;
        }
        const float smooth = (old_len_f * (1.0f / wavelen) - s.low_freq_factor) / band;
        const float a = (1.0f - smooth) * scaled / factor, b = smooth * scaled;
        f = a + b;
      }
      break;
    }
    case Type::kYarn: {
      const double d = static_cast<double>(dim), log_base = std::log(static_cast<double>(base));
      const double len = static_cast<double>(s.original_max_position_embeddings);
      const auto correction_dim = [&](double rotations) {
        return (d * std::log(len / (rotations * 2 * std::numbers::pi))) / (2 * log_base);
      };
      double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
      if (s.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, d - 1);
      if (low == high) high += 0.001;  // HF's guard against a zero-width ramp
      const float low_f = static_cast<float>(low), width = static_cast<float>(high - low);
      for (int64_t i = 0; i < half; ++i) {
        const float pf = pos_freq[static_cast<size_t>(i)];
        const float extrapolation = 1.0f / pf, interpolation = 1.0f / (factor * pf);
        const float ramp = std::clamp((static_cast<float>(i) - low_f) / width, 0.0f, 1.0f);
        const float keep = 1.0f - ramp;  // inv_freq_extrapolation_factor
        const float a = interpolation * (1.0f - keep), b = extrapolation * keep;
        inv[static_cast<size_t>(i)] = a + b;
      }
      break;
    }
  }
  for (size_t i = 0; i < s.freq_factors.size(); ++i) inv[i] = inv[i] / s.freq_factors[i];
  return inv;
}

// The table, its arguments' errors named `op` (rope_table called directly, or rope_apply making its own).
RopeTable make_table(const std::vector<int64_t>& positions, int64_t dim, float base, const RopeScaling& scaling,
                     const char* op) {
  const std::vector<float> inv_freq = inv_freq_of(dim, base, scaling, op);
  const float gain = rope_attention_factor(scaling);
  for (int64_t p : positions) QKV_CHECK_ARG(p >= 0, "[", op, "] positions must be >= 0, got ", p);
  const int64_t T = static_cast<int64_t>(positions.size()), half = dim / 2;
  RopeTable tb{T, dim, std::vector<float>(static_cast<size_t>(T * half)),
               std::vector<float>(static_cast<size_t>(T * half))};
  // angle = pos * inv_freq in float32 like torch; cos/sin in double, rounded, then times the attention factor
  // (float32, as HF multiplies its float32 cos and sin). Threaded from a few thousand angles on (a prefill); each
  // value is computed alike either way.
#pragma omp parallel for schedule(static) if (T * half >= 2048)
  for (int64_t i = 0; i < half; ++i) {
    const float f = inv_freq[static_cast<size_t>(i)];
    for (int64_t t = 0; t < T; ++t) {
      const float angle = static_cast<float>(positions[static_cast<size_t>(t)]) * f;
      float c = static_cast<float>(std::cos(static_cast<double>(angle)));
      float s = static_cast<float>(std::sin(static_cast<double>(angle)));
      if (gain != 1.0f) {
        c *= gain;
        s *= gain;
      }
      tb.cos[static_cast<size_t>(t * half + i)] = c;
      tb.sin[static_cast<size_t>(t * half + i)] = s;
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

std::vector<float> rope_inv_freq(int64_t dim, float base, const RopeScaling& scaling) {
  return inv_freq_of(dim, base, scaling, "rope_inv_freq");
}

float rope_attention_factor(const RopeScaling& s) {
  if (s.type != RopeScaling::Type::kYarn) return 1.0f;
  if (s.attention_factor > 0.0f) return s.attention_factor;
  // HF's get_mscale, in python's doubles, rounded to float32 where it meets the float32 cos and sin.
  const double factor = s.factor;
  const auto mscale = [factor](double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  if (s.mscale != 0.0f && s.mscale_all_dim != 0.0f)
    return static_cast<float>(mscale(s.mscale) / mscale(s.mscale_all_dim));
  return static_cast<float>(mscale(1.0));
}

RopeTable rope_table(const std::vector<int64_t>& positions, int64_t dim, float base) {
  return make_table(positions, dim, base, RopeScaling{}, "rope_table");
}

RopeTable rope_table(int64_t offset, int64_t rows, int64_t dim, float base) {
  return make_table(consecutive(offset, rows, "rope_table"), dim, base, RopeScaling{}, "rope_table");
}

RopeTable rope_table(const std::vector<int64_t>& positions, int64_t dim, float base, const RopeScaling& scaling) {
  return make_table(positions, dim, base, scaling, "rope_table");
}

RopeTable rope_table(int64_t offset, int64_t rows, int64_t dim, float base, const RopeScaling& scaling) {
  return make_table(consecutive(offset, rows, "rope_table"), dim, base, scaling, "rope_table");
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
  parallel_for(rows * D >= (int64_t{1} << 15), rows, [&](int64_t r) {
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
  });
  return out;
}

RopeTable rope_table_for(const Tensor& x, int64_t offset, float base) {
  check_x(x);
  return make_table(consecutive(offset, x.size(-2), "rope_apply"), x.size(-1), base, RopeScaling{}, "rope_apply");
}

RopeTable rope_table_for(const Tensor& x, const std::vector<int64_t>& positions, float base) {
  check_x(x);
  QKV_CHECK_ARG(static_cast<int64_t>(positions.size()) == x.size(-2), "[rope_apply] got ", positions.size(),
                " positions for x ", str(x.shape()), " (need one per row T = ", x.size(-2), ")");
  return make_table(positions, x.size(-1), base, RopeScaling{}, "rope_apply");
}

Tensor rope_apply(const Tensor& x, int64_t offset, float base, RopeVariant variant) {
  return rope_apply(x, rope_table_for(x, offset, base), variant);
}

Tensor rope_apply(const Tensor& x, const std::vector<int64_t>& positions, float base, RopeVariant variant) {
  return rope_apply(x, rope_table_for(x, positions, base), variant);
}

}  // namespace qkv
