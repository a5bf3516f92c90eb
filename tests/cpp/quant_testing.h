// The quantized products' test helpers: a quantizer by ggml's quantize_row_*_ref rules, random weights with sane
// fp16 scales, every build of gemm_quant by name, error bounds from the block scales (quant_gemm_test,
// quant_gated_mlp_test).
#pragma once

#include <gtest/gtest.h>
#include <omp.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "qkv/core/half.h"
#include "qkv/kernels/activations.h"
#include "qkv/kernels/cpu.h"
#include "qkv/kernels/quant.h"
#include "qkv/kernels/quant_gemm.h"
#include "qkv/ops/lowp.h"

namespace qkv::testing {

using gguf::Type;
using kernels::QuantMatrix;

inline const std::vector<Type> kIntegerTypes{Type::Q4_0, Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::Q8_0};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

inline void put_f16(uint8_t* p, float v) {
  const uint16_t h = kernels::fp16_from_float(v);
  std::memcpy(p, &h, 2);
}

// One block of 32 floats in `type`, by ggml's quantize_row_{q4_0,q4_1,q5_0,q5_1,q8_0}_ref.
inline void quantize_block(Type type, const float* x, uint8_t* out) {
  constexpr int qk = 32;
  if (type == Type::Q8_0) {
    float amax = 0.0f;
    for (int j = 0; j < qk; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(out, d);
    for (int j = 0; j < qk; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
    return;
  }
  const bool with_min = type == Type::Q4_1 || type == Type::Q5_1;
  const bool five = type == Type::Q5_0 || type == Type::Q5_1;
  const int top = five ? 31 : 15;
  float d, id, min = 0.0f;
  if (with_min) {
    float mn = std::numeric_limits<float>::max(), mx = -std::numeric_limits<float>::max();
    for (int j = 0; j < qk; ++j) mn = std::min(mn, x[j]), mx = std::max(mx, x[j]);
    d = (mx - mn) / static_cast<float>(top);
    min = mn;
  } else {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < qk; ++j)
      if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), max = x[j];
    d = max / (five ? -16.0f : -8.0f);
  }
  id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(out, d);
  if (with_min) put_f16(out + 2, min);
  uint8_t* qs = out + (with_min ? 4 : 2) + (five ? 4 : 0);
  uint32_t qh = 0;
  for (int j = 0; j < qk / 2; ++j) {
    int v[2];
    for (int h = 0; h < 2; ++h) {
      const float xv = with_min ? (x[j + 16 * h] - min) * id : x[j + 16 * h] * id;
      const float off = with_min ? 0.5f : (five ? 16.5f : 8.5f);
      v[h] = with_min && five ? static_cast<uint8_t>(xv + off) : std::min(top, static_cast<int>(static_cast<int8_t>(xv + off)));
      qh |= static_cast<uint32_t>((v[h] >> 4) & 1) << (j + 16 * h);
    }
    qs[j] = static_cast<uint8_t>((v[0] & 0x0F) | ((v[1] & 0x0F) << 4));
  }
  if (five) std::memcpy(out + (with_min ? 4 : 2), &qh, 4);
}

struct Weights {
  std::shared_ptr<std::vector<uint8_t>> bytes;
  QuantMatrix w;
};

// (n, k) floats in [-1, 1) quantized row by row.
inline Weights quantized_weights(Type type, int64_t n, int64_t k, uint32_t seed) {
  const std::vector<float> f = random_floats(static_cast<size_t>(n * k), seed);
  auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(n * gguf::row_bytes(type, k)));
  const int64_t bs = gguf::type_size(type);
  for (int64_t i = 0; i < n * k / 32; ++i) quantize_block(type, &f[i * 32], bytes->data() + i * bs);
  return {bytes, QuantMatrix::view(type, n, k, bytes->data(), bytes)};
}

// Random bytes with fp16 scales (K-quants: super-block scales) in [-0.05, 0.05) at the type's scale offsets (every nibble, fifth bit and int8
// pattern appears, Q8_0's -128 included).
inline Weights random_weights(Type type, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(n * gguf::row_bytes(type, k)));
  for (uint8_t& b : *bytes) b = static_cast<uint8_t>(byte(gen));
  const int64_t bs = gguf::type_size(type), blocks = n * k / gguf::block_size(type);
  for (int64_t i = 0; i < blocks; ++i) {
    uint8_t* blk = bytes->data() + i * bs;
    switch (type) {
      case Type::Q4_0: case Type::Q5_0: case Type::Q8_0: put_f16(blk, scale(gen)); break;
      case Type::Q4_1: case Type::Q5_1: case Type::Q4_K: case Type::Q5_K:
        put_f16(blk, scale(gen));
        put_f16(blk + 2, scale(gen));
        break;
      case Type::Q6_K: put_f16(blk + 208, scale(gen)); break;
      case Type::Q2_K:
        put_f16(blk + 80, scale(gen));
        put_f16(blk + 82, scale(gen));
        break;
      case Type::Q3_K: put_f16(blk + 108, scale(gen)); break;
      case Type::F16: put_f16(blk, scale(gen) * 20.0f); break;
      case Type::BF16: {
        const uint32_t bits = std::bit_cast<uint32_t>(scale(gen) * 20.0f);
        const uint16_t top = static_cast<uint16_t>(bits >> 16);
        std::memcpy(blk, &top, 2);
        break;
      }
      case Type::F32: {
        const float v = scale(gen) * 20.0f;
        std::memcpy(blk, &v, 4);
        break;
      }
      default: break;
    }
  }
  return {bytes, QuantMatrix::view(type, n, k, bytes->data(), bytes)};
}

using GemmFn = std::function<void(const float*, int64_t, int64_t, const QuantMatrix&, const float*, float*, int64_t)>;
struct Path {
  std::string name;
  GemmFn fn;
};

// The builds this CPU runs, by name (QKV_ISA caps only the dispatched gemm_quant, not these entry points).
inline std::vector<Path> builds() {
  std::vector<Path> p;
  if (kernels::cpu_supports(kernels::Isa::kAvx2)) p.push_back({"avx2", kernels::avx2::gemm_quant});
  if (kernels::cpu_supports(kernels::Isa::kAvx512Vnni)) {
    p.push_back({"avx512vnni", kernels::avx512::gemm_quant});
    p.push_back({"avx512vnni repacked", [](const float* x, int64_t m, int64_t ldx, const QuantMatrix& w,
                                           const float* bias, float* y, int64_t ldy) {
                   kernels::avx512::gemm_quant(x, m, ldx, w.repacked(), bias, y, ldy);
                 }});
  }
  p.push_back({"dispatched", kernels::gemm_quant});
  return p;
}

inline std::vector<float> run(const GemmFn& fn, const std::vector<float>& x, int64_t m, const QuantMatrix& w,
                       const float* bias) {
  std::vector<float> y(static_cast<size_t>(m * w.rows), -777.0f);
  fn(x.data(), m, w.cols, w, bias, y.data(), w.rows);
  return y;
}

// Same bits, or NaN in both.
::testing::AssertionResult SameBits(const std::vector<float>& a, const std::vector<float>& b,
                                    const std::string& what) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]))
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << a[i] << ", reference " << b[i];
  }
  return ::testing::AssertionSuccess();
}

// |y - x·Wᵀ| for the integer product, from how its activations are quantized (per block of 32: d = amax / 127,
// q = round(x / d) within 1/2 + float rounding, d stored as fp16 dh) and its float32 epilogue:
//   per element |x - dh·q| <= e = d (1/2 + 2^-10) + 127 |d - dh|;
//   per block, for w = dw·q + m: sum_e |dw q| · e  +  |m| · (2^-11 |d Σq| + |Σq| |d - dh| + 32 e)  (the s term);
//   the float32 sums: (blocks + 4) · 2^-22 · Σ (|w| + |m|)(|x| + e).
inline double quantization_error_bound(const std::vector<float>& wrow, const std::vector<float>& mins, const float* x,
                                int64_t k) {
  double bound = 0.0, mag = 0.0;
  const int64_t nb = k / 32;
  for (int64_t b = 0; b < nb; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const double d = amax / 127.0f;
    const double dh = fp16_to_float(kernels::fp16_from_float(static_cast<float>(d)));
    const double e = d * (0.5 + std::ldexp(1.0, -10)) + 127.0 * std::fabs(d - dh);
    const double m = std::fabs(mins[b]);
    double qsum = 16.0;  // |Σq| <= Σ|x| / d + 16
    for (int j = 0; j < 32; ++j) {
      const double w = std::fabs(wrow[b * 32 + j]);
      bound += (w + m) * e;
      mag += (w + m) * (std::fabs(x[b * 32 + j]) + e);
      qsum += d > 0 ? std::fabs(x[b * 32 + j]) / d : 0.0;
    }
    bound += m * (std::ldexp(1.0, -11) * d * qsum + qsum * std::fabs(d - dh) + 32.0 * e);
  }
  return bound + static_cast<double>(nb + 4) * std::ldexp(1.0, -22) * mag;
}

// The block mins (fp16 m of Q4_1 / Q5_1; 0 otherwise) of row j, one per block.
inline std::vector<float> row_mins(const QuantMatrix& w, int64_t j) {
  std::vector<float> m(static_cast<size_t>(w.cols / 32), 0.0f);
  if (w.type != Type::Q4_1 && w.type != Type::Q5_1) return m;
  const int64_t bs = gguf::type_size(w.type);
  for (size_t b = 0; b < m.size(); ++b) {
    uint16_t h;
    std::memcpy(&h, w.data + j * w.row_bytes + static_cast<int64_t>(b) * bs + 2, 2);
    m[b] = fp16_to_float(h);
  }
  return m;
}


}  // namespace qkv::testing
