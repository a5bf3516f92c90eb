// The quantized linear product (qkv/kernels/quant_gemm.h): every build against the portable reference bit for bit,
// the reference against a float64 product with the dequantized weights within a bound derived from the block
// scales, batch invariance at 1 and 2 threads, non-finite activations, argument errors, quantized embeddings and
// LinearWeight::quantized. Weights come from a quantizer written here by ggml's quantize_row_*_ref rules, or from
// random bytes with sane fp16 scales.
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

namespace qkv {
namespace {

using gguf::Type;
using kernels::QuantMatrix;

const std::vector<Type> kIntegerTypes{Type::Q4_0, Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::Q8_0};

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

void put_f16(uint8_t* p, float v) {
  const uint16_t h = kernels::fp16_from_float(v);
  std::memcpy(p, &h, 2);
}

// One block of 32 floats in `type`, by ggml's quantize_row_{q4_0,q4_1,q5_0,q5_1,q8_0}_ref.
void quantize_block(Type type, const float* x, uint8_t* out) {
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
Weights quantized_weights(Type type, int64_t n, int64_t k, uint32_t seed) {
  const std::vector<float> f = random_floats(static_cast<size_t>(n * k), seed);
  auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(n * gguf::row_bytes(type, k)));
  const int64_t bs = gguf::type_size(type);
  for (int64_t i = 0; i < n * k / 32; ++i) quantize_block(type, &f[i * 32], bytes->data() + i * bs);
  return {bytes, QuantMatrix::view(type, n, k, bytes->data(), bytes)};
}

// Random bytes with fp16 scales in [-0.05, 0.05) at the type's scale offsets (every nibble, fifth bit and int8
// pattern appears, Q8_0's -128 included).
Weights random_weights(Type type, int64_t n, int64_t k, uint32_t seed) {
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
std::vector<Path> builds() {
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

std::vector<float> run(const GemmFn& fn, const std::vector<float>& x, int64_t m, const QuantMatrix& w,
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
double quantization_error_bound(const std::vector<float>& wrow, const std::vector<float>& mins, const float* x,
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
std::vector<float> row_mins(const QuantMatrix& w, int64_t j) {
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

// --- the scalar pieces -------------------------------------------------------------------------------------------

TEST(QuantGemm, Fp16FromFloatRoundTripsEveryHalfAndRoundsToNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(kernels::fp16_from_float(f))));
      continue;
    }
    ASSERT_EQ(kernels::fp16_from_float(f), h) << f;
  }
  EXPECT_EQ(kernels::fp16_from_float(1.0f + 0x1p-11f), kernels::fp16_from_float(1.0f));   // tie to even (down)
  EXPECT_EQ(kernels::fp16_from_float(1.0f + 3 * 0x1p-11f), kernels::fp16_from_float(1.0f + 0x1p-9f));  // (up)
  EXPECT_EQ(kernels::fp16_from_float(65519.0f), 0x7BFF);
  EXPECT_EQ(kernels::fp16_from_float(65520.0f), 0x7C00);
  EXPECT_EQ(kernels::fp16_from_float(-1e30f), 0xFC00);
  EXPECT_EQ(kernels::fp16_from_float(0x1p-25f), 0x0000);       // half of the smallest subnormal: to even 0
  EXPECT_EQ(kernels::fp16_from_float(3 * 0x1p-25f), 0x0002);   // 1.5 units: to even 2
  EXPECT_EQ(kernels::fp16_from_float(0x1p-14f - 0x1p-26f), 0x0400);  // rounds up into the smallest normal
}

TEST(QuantGemm, ActivationsFollowGgmlQ8Rules) {
  std::vector<float> x(64, 0.0f);
  x[0] = 127.0f, x[1] = 2.5f, x[2] = -2.5f, x[3] = 0.49f, x[4] = -127.0f;  // d = 1: roundf, halves away from 0
  kernels::QuantActivations a;
  kernels::quantize_activations(x.data(), 1, 64, 64, a);
  ASSERT_EQ(a.blocks, 2);
  EXPECT_EQ(a.d[0], 1.0f);
  EXPECT_EQ(a.q[0], 127);
  EXPECT_EQ(a.q[1], 3);
  EXPECT_EQ(a.q[2], -3);
  EXPECT_EQ(a.q[3], 0);
  EXPECT_EQ(a.q[4], -127);
  EXPECT_EQ(a.sum[0], 0);
  EXPECT_EQ(a.s[0], 0.0f);
  EXPECT_EQ(a.d[1], 0.0f);  // an all-zero block: d = 0, q = 0
  EXPECT_EQ(a.q[40], 0);
  // d = 0.1 / 127 stored as fp16; s = fp16(d · Σq) with the float32 d.
  std::fill(x.begin(), x.end(), 0.1f);
  kernels::quantize_activations(x.data(), 1, 64, 64, a);
  const float d = 0.1f / 127.0f;
  EXPECT_EQ(a.d[0], fp16_to_float(kernels::fp16_from_float(d)));
  EXPECT_EQ(a.q[7], 127);
  EXPECT_EQ(a.sum[0], 32 * 127);
  EXPECT_EQ(a.s[0], fp16_to_float(kernels::fp16_from_float(static_cast<float>(32 * 127) * d)));
}

TEST(QuantGemm, PathNames) {
  const kernels::Isa isa = kernels::active_isa();
  const std::string want = isa >= kernels::Isa::kAvx512Vnni ? "avx512vnni"
                           : isa >= kernels::Isa::kAvx2     ? "avx2"
                                                            : "portable";
  EXPECT_EQ(kernels::quant_gemm_path(), want);
  EXPECT_EQ(kernels::quant_gemm_path(Type::Q4_1), want);
  EXPECT_EQ(kernels::quant_gemm_path(Type::Q6_K), "float32 (dequantized rows)");
  std::cout << "[ paths    ] quant_gemm: dispatched " << want << "; builds run:";
  for (const Path& p : builds()) std::cout << " " << p.name;
  std::cout << "\n";
}

// --- the integer product -----------------------------------------------------------------------------------------

TEST(QuantGemm, EveryBuildGivesThePortableBitsAtAwkwardSizes) {
  const std::vector<Path> paths = builds();
  uint32_t seed = 1;
  for (Type type : kIntegerTypes)
    for (int64_t k : {32, 64, 96, 4096})
      for (int64_t n : {1, 3, 17, 64})
        for (int64_t m : {1, 2, 3, 4, 7, 13, 33}) {
          if (k == 4096 && m > 2 && n * 2 < m) continue;  // at k = 4096 the larger m with the larger n only
          const Weights w = (seed % 2) ? random_weights(type, n, k, seed) : quantized_weights(type, n, k, seed);
          const std::vector<float> x = random_floats(static_cast<size_t>(m * k), seed + 1000, -3.0f, 3.0f);
          const std::vector<float> bias = random_floats(static_cast<size_t>(n), seed + 2000);
          ++seed;
          const std::string what = gguf::type_name(type) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                   " k=" + std::to_string(k);
          const std::vector<float> ref = run(kernels::portable::gemm_quant, x, m, w.w, bias.data());
          for (const Path& p : paths) ASSERT_TRUE(SameBits(run(p.fn, x, m, w.w, bias.data()), ref, what + " " + p.name));
          if (k == 4096) continue;  // without a bias: the smaller k
          const std::vector<float> ref0 = run(kernels::portable::gemm_quant, x, m, w.w, nullptr);
          for (const Path& p : paths) ASSERT_TRUE(SameBits(run(p.fn, x, m, w.w, nullptr), ref0, what + " " + p.name));
        }
}

TEST(QuantGemm, ScalesOfEveryFp16ClassGiveThePortableBits) {
  // d and m cycling through zero, subnormals, the smallest and largest normals, infinities and NaNs (quiet and
  // signaling): the builds convert a row tile's scales together, the reference one at a time.
  const uint16_t kHalves[] = {0x0000, 0x8000, 0x0001, 0x03FF, 0x8200, 0x0400, 0x3C00, 0xB555, 0x7BFF,
                              0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7D01, 0xFE01};
  const int64_t n = 35, k = 160, m = 3;
  for (Type type : kIntegerTypes) {
    Weights w = random_weights(type, n, k, 51);
    const int64_t bs = gguf::type_size(type), blocks = n * k / 32;
    const bool with_min = type == Type::Q4_1 || type == Type::Q5_1;
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* blk = w.bytes->data() + b * bs;
      const uint16_t d = kHalves[b % std::size(kHalves)], mn = kHalves[(b * 7 + 3) % std::size(kHalves)];
      if (b % 3 != 0) std::memcpy(blk, &d, 2);  // every third block keeps its ordinary scale
      if (with_min && b % 2 == 0) std::memcpy(blk + 2, &mn, 2);
    }
    const std::vector<float> x = random_floats(static_cast<size_t>(m * k), 52);
    const std::vector<float> ref = run(kernels::portable::gemm_quant, x, m, w.w, nullptr);
    for (const Path& p : builds()) EXPECT_TRUE(SameBits(run(p.fn, x, m, w.w, nullptr), ref, gguf::type_name(type) + " " + p.name));
#if defined(__x86_64__)
    // With flush-to-zero and denormals-are-zero set (as torch.set_flush_denormal(True) does), still one set of bits:
    // no build converts a subnormal fp16 scale through a float32 subnormal. (MXCSR is per thread: these products
    // are below the parallel threshold, so they run on this one.)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);  // FTZ | DAZ
    const std::vector<float> ref_daz = run(kernels::portable::gemm_quant, x, m, w.w, nullptr);
    std::vector<std::vector<float>> got_daz;
    for (const Path& p : builds()) got_daz.push_back(run(p.fn, x, m, w.w, nullptr));
    _mm_setcsr(csr);
    for (size_t i = 0; i < got_daz.size(); ++i)
      EXPECT_TRUE(SameBits(got_daz[i], ref_daz, gguf::type_name(type) + " " + builds()[i].name + " FTZ/DAZ"));
#endif
  }
}

TEST(QuantGemm, ReferenceWithinQuantizationErrorOfFloat64) {
  for (Type type : kIntegerTypes)
    for (int64_t k : {32, 96, 4096}) {
      const int64_t n = 17, m = 7;
      const Weights w = quantized_weights(type, n, k, 77 + static_cast<uint32_t>(k));
      const std::vector<float> x = random_floats(static_cast<size_t>(m * k), 5 + static_cast<uint32_t>(k), -2.0f, 2.0f);
      const std::vector<float> bias = random_floats(static_cast<size_t>(n), 9);
      const std::vector<float> y = run(kernels::portable::gemm_quant, x, m, w.w, bias.data());
      for (int64_t j = 0; j < n; ++j) {
        std::vector<float> wrow(static_cast<size_t>(k));
        kernels::dequantize_row(type, w.w.data + j * w.w.row_bytes, wrow.data(), k);
        const std::vector<float> mins = row_mins(w.w, j);
        for (int64_t i = 0; i < m; ++i) {
          double ref = bias[j];
          for (int64_t e = 0; e < k; ++e) ref += static_cast<double>(wrow[e]) * x[i * k + e];
          const double bound = quantization_error_bound(wrow, mins, &x[i * k], k) + std::ldexp(std::fabs(ref), -23);
          ASSERT_LE(std::fabs(y[i * n + j] - ref), bound)
              << gguf::type_name(type) << " k=" << k << " (" << i << ", " << j << ")";
        }
      }
    }
}

TEST(QuantGemm, RowBitsIndependentOfBatchPlaceAndThreads) {
  const int64_t n = 64 + 5, k = 256;
  const int saved = omp_get_max_threads();
  for (Type type : kIntegerTypes) {
    const Weights w = random_weights(type, n, k, 31);
    const std::vector<float> batch = random_floats(static_cast<size_t>(65 * k), 32, -4.0f, 4.0f);
    const std::vector<float> row(batch.begin() + 5 * k, batch.begin() + 6 * k);  // row 5 of the batch
    std::vector<Path> paths = builds();
    paths.push_back({"portable", kernels::portable::gemm_quant});
    for (const Path& p : paths) {
      omp_set_num_threads(1);
      const std::vector<float> alone = run(p.fn, row, 1, w.w, nullptr);
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        for (int64_t m : {1, 2, 3, 4, 5, 7, 8, 16, 17, 33, 48, 65}) {
          const int64_t at = std::min<int64_t>(5, m - 1), first = 5 - at;  // batch row 5 at place `at`
          const std::vector<float> x(batch.begin() + first * k, batch.begin() + (first + m) * k);
          const std::vector<float> y = run(p.fn, x, m, w.w, nullptr);
          const std::vector<float> got(y.begin() + at * n, y.begin() + (at + 1) * n);
          EXPECT_TRUE(SameBits(got, alone, gguf::type_name(type) + " " + p.name + " m=" + std::to_string(m) +
                                               " threads=" + std::to_string(threads)));
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

// The dispatched quantizer (the avx512vnni build's vector loop where it runs) against the plain loop, bit for bit:
// halves exactly between two integers (roundf takes them away from zero), zeros, subnormals, the extremes of a
// block, and blocks with inf or NaN.
TEST(QuantGemm, VectorQuantizerGivesThePlainLoopsBits) {
  const int64_t k = 32 * 9, m = 5;
  std::vector<float> x = random_floats(static_cast<size_t>(m * k), 41, -3.0f, 3.0f);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16) + 0.5f;  // amax 15.5: d = 15.5 / 127
  x[31] = 127.0f;                                                           // block 1: d = 1, halves stay halves
  for (int j = 0; j < 31; ++j) x[32 + j] = static_cast<float>(j) - 15.5f;
  x[63] = -127.0f;
  for (int j = 64; j < 96; ++j) x[j] = 0.0f;                              // all zero: d = 0
  for (int j = 96; j < 128; ++j) x[j] = std::ldexp(static_cast<float>(j - 111), -140);  // subnormals
  x[k + 5] = std::numeric_limits<float>::infinity();
  x[2 * k + 40] = std::numeric_limits<float>::quiet_NaN();
  x[3 * k + 70] = -std::numeric_limits<float>::infinity();
  kernels::QuantActivations fast, plain;
  for (int64_t ldx : {k, k + 32}) {
    std::vector<float> xs(static_cast<size_t>(m * ldx), 9.0f);
    for (int64_t i = 0; i < m; ++i) std::copy_n(x.begin() + i * k, k, xs.begin() + i * ldx);
    kernels::quantize_activations(xs.data(), m, ldx, k, fast);
    kernels::quantize_activations_reference(xs.data(), m, ldx, k, plain);
    ASSERT_EQ(fast.q, plain.q) << "ldx " << ldx;
    ASSERT_EQ(fast.sum, plain.sum) << "ldx " << ldx;
    EXPECT_TRUE(SameBits(fast.d, plain.d, "d, ldx " + std::to_string(ldx)));
    EXPECT_TRUE(SameBits(fast.s, plain.s, "s, ldx " + std::to_string(ldx)));
  }
  // Block 1 has d = 1: its halves go away from zero.
  EXPECT_EQ(plain.q[32], -16);
  EXPECT_EQ(plain.q[32 + 15], -1);
  EXPECT_EQ(plain.q[32 + 16], 1);
  EXPECT_TRUE(std::isnan(plain.d[9]));  // row 1, block 0 holds the inf
}

// --- the gated MLP ------------------------------------------------------------------------------------------------

// (e, f) = (96, 160): down's 96 outputs are 6 whole 16-column tiles, gate / up's 160 are 5 blocks of 32 (2 threads
// split them 2 + 3); (64, 96): 3 blocks (1 + 2). Each with the repacked copies where the avx512vnni build runs
// (QuantMatrix::for_products), and with biases.
TEST(QuantGemm, GatedMlpGivesTheCompositionsBitsAtAnyBatchAndThreadCount) {
  const int saved = omp_get_max_threads();
  for (auto [e, f] : {std::pair<int64_t, int64_t>{96, 160}, {64, 96}}) {
    for (Type type : kIntegerTypes) {
      const Weights gate = random_weights(type, f, e, 51), up = random_weights(type, f, e, 52);
      const Type down_type = type == Type::Q8_0 ? Type::Q4_1 : Type::Q8_0;  // the types may differ across layers
      const Weights down = random_weights(down_type, e, f, 53);
      const std::vector<float> bg = random_floats(static_cast<size_t>(f), 54), bu = random_floats(static_cast<size_t>(f), 55),
                               bd = random_floats(static_cast<size_t>(e), 56);
      const std::vector<float> batch = random_floats(static_cast<size_t>(9 * e), 57, -2.0f, 2.0f);
      for (bool repacked : {false, true}) {
        const QuantMatrix g = repacked ? gate.w.for_products() : gate.w, u = repacked ? up.w.for_products() : up.w,
                          d = repacked ? down.w.for_products() : down.w;
        for (bool bias : {false, true}) {
          const float* pg = bias ? bg.data() : nullptr;
          const float* pu = bias ? bu.data() : nullptr;
          const float* pd = bias ? bd.data() : nullptr;
          std::vector<float> want(static_cast<size_t>(9 * e));
          kernels::gated_mlp_quant_reference(batch.data(), 9, e, g, pg, u, pu, d, pd, want.data(), e);
          for (int threads : {1, 2}) {
            omp_set_num_threads(threads);
            for (int64_t m : {1, 4, 9}) {
              const int64_t first = 9 - m;  // the batch's last m rows
              std::vector<float> y(static_cast<size_t>(m * (e + 3)), -777.0f);
              kernels::gated_mlp_quant(batch.data() + first * e, m, e, g, pg, u, pu, d, pd, y.data(), e + 3);
              std::vector<float> got, ref;
              for (int64_t i = 0; i < m; ++i) {
                got.insert(got.end(), y.begin() + i * (e + 3), y.begin() + i * (e + 3) + e);
                ref.insert(ref.end(), want.begin() + (first + i) * e, want.begin() + (first + i + 1) * e);
                EXPECT_EQ(y[static_cast<size_t>(i * (e + 3) + e)], -777.0f);  // ldy's gap untouched
              }
              EXPECT_TRUE(SameBits(got, ref, gguf::type_name(type) + " e=" + std::to_string(e) + " m=" +
                                                 std::to_string(m) + " threads=" + std::to_string(threads) +
                                                 (repacked ? " repacked" : "") + (bias ? " bias" : "")));
            }
          }
          omp_set_num_threads(saved);
        }
      }
    }
  }
}

// The reference is the composition it names: gemm_quant, SiLU, the product, gemm_quant (portable builds).
TEST(QuantGemm, GatedMlpReferenceIsTheComposition) {
  const int64_t e = 64, f = 96, m = 3;
  const Weights gate = random_weights(Type::Q4_1, f, e, 61), up = random_weights(Type::Q4_1, f, e, 62),
                down = random_weights(Type::Q8_0, e, f, 63);
  const std::vector<float> x = random_floats(static_cast<size_t>(m * e), 64, -2.0f, 2.0f);
  std::vector<float> g(static_cast<size_t>(m * f)), u(g.size()), h(g.size()), want(static_cast<size_t>(m * e)),
      got(want.size());
  kernels::portable::gemm_quant(x.data(), m, e, gate.w, nullptr, g.data(), f);
  kernels::portable::gemm_quant(x.data(), m, e, up.w, nullptr, u.data(), f);
  kernels::silu_forward(g.data(), h.data(), m * f);
  for (size_t i = 0; i < h.size(); ++i) h[i] = h[i] * u[i];
  kernels::portable::gemm_quant(h.data(), m, f, down.w, nullptr, want.data(), e);
  kernels::gated_mlp_quant_reference(x.data(), m, e, gate.w, nullptr, up.w, nullptr, down.w, nullptr, got.data(), e);
  EXPECT_TRUE(SameBits(got, want, "reference"));
}

TEST(QuantGemm, GatedMlpRejectsMismatchedWeightsNamingTheShapes) {
  const Weights gate = random_weights(Type::Q4_0, 64, 32, 71), up = random_weights(Type::Q4_0, 64, 32, 72),
                down = random_weights(Type::Q4_0, 32, 64, 73), f32 = random_weights(Type::F32, 64, 32, 74),
                up5 = random_weights(Type::Q5_0, 64, 32, 75);
  std::vector<float> x(64, 0.5f), y(64);
  const auto expect_error = [&](const QuantMatrix& g, const QuantMatrix& u, const QuantMatrix& d, int64_t m,
                                int64_t ldx, int64_t ldy, const std::string& part) {
    try {
      kernels::gated_mlp_quant(x.data(), m, ldx, g, nullptr, u, nullptr, d, nullptr, y.data(), ldy);
      ADD_FAILURE() << "no error for " << part;
    } catch (const std::invalid_argument& err) {
      const std::string msg = err.what();
      EXPECT_EQ(msg.rfind("[gated_mlp_quant]", 0), 0u) << msg;
      EXPECT_NE(msg.find(part), std::string::npos) << msg;
    }
  };
  expect_error(f32.w, up.w, down.w, 1, 32, 32, "gate F32 (64, 32)");
  expect_error(gate.w, up5.w, down.w, 1, 32, 32, "must be one type and shape");
  expect_error(gate.w, up.w, gate.w, 1, 32, 32, "down (64, 32) must be (e, f)");
  expect_error(gate.w, up.w, down.w, 1, 16, 32, "ldx 16");
  expect_error(gate.w, up.w, down.w, -1, 32, 32, "need m >= 0");
}

TEST(QuantGemm, NonFiniteActivationsGiveNaNRows) {
  const int64_t n = 19, k = 96, m = 4;
  for (Type type : kIntegerTypes) {
    const Weights w = quantized_weights(type, n, k, 3);
    std::vector<float> x = random_floats(static_cast<size_t>(m * k), 4);
    x[1 * k + 40] = std::numeric_limits<float>::infinity();
    x[2 * k + 95] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> clean0(x.begin(), x.begin() + k), clean3(x.begin() + 3 * k, x.end());
    for (const Path& p : builds()) {
      const std::vector<float> y = run(p.fn, x, m, w.w, nullptr);
      for (int64_t j = 0; j < n; ++j) {
        EXPECT_TRUE(std::isnan(y[1 * n + j])) << p.name << " " << gguf::type_name(type) << " col " << j;
        EXPECT_TRUE(std::isnan(y[2 * n + j])) << p.name << " " << gguf::type_name(type) << " col " << j;
      }
      const std::vector<float> y0 = run(p.fn, clean0, 1, w.w, nullptr), y3 = run(p.fn, clean3, 1, w.w, nullptr);
      EXPECT_TRUE(SameBits(std::vector<float>(y.begin(), y.begin() + n), y0, p.name + " row 0"));
      EXPECT_TRUE(SameBits(std::vector<float>(y.begin() + 3 * n, y.end()), y3, p.name + " row 3"));
    }
  }
}

TEST(QuantGemm, StridedRowsAndEmptyShapes) {
  const int64_t n = 20, k = 64, m = 3, ldx = 80, ldy = 29;
  const Weights w = quantized_weights(Type::Q4_1, n, k, 8);
  const std::vector<float> x = random_floats(static_cast<size_t>(m * ldx), 9);
  std::vector<float> packed(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m; ++i) std::copy_n(&x[i * ldx], k, &packed[i * k]);
  const std::vector<float> want = run(kernels::portable::gemm_quant, packed, m, w.w, nullptr);
  for (const Path& p : builds()) {
    std::vector<float> y(static_cast<size_t>(m * ldy), -5.0f);
    p.fn(x.data(), m, ldx, w.w, nullptr, y.data(), ldy);
    for (int64_t i = 0; i < m; ++i) {
      EXPECT_TRUE(SameBits(std::vector<float>(&y[i * ldy], &y[i * ldy] + n),
                           std::vector<float>(&want[i * n], &want[i * n] + n), p.name));
      EXPECT_EQ(y[i * ldy + n], -5.0f) << "wrote past column n";
    }
  }
  kernels::gemm_quant(nullptr, 0, k, w.w, nullptr, nullptr, n);  // m = 0: nothing read or written
  const QuantMatrix none = w.w.slice(4, 4);
  kernels::gemm_quant(x.data(), m, ldx, none, nullptr, nullptr, 0);  // n = 0
}

TEST(QuantGemm, BadShapesThrowNamingTheOpAndShapes) {
  const Weights w = quantized_weights(Type::Q8_0, 8, 64, 1);
  std::vector<float> x(64 * 2), y(16);
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  for (const Path& p : builds()) {
    const std::string a = message([&] { p.fn(x.data(), 2, 32, w.w, nullptr, y.data(), 8); });
    EXPECT_NE(a.find("[gemm_quant]"), std::string::npos) << a;
    EXPECT_NE(a.find("ldx 32"), std::string::npos) << a;
    EXPECT_NE(a.find("(8, 64)"), std::string::npos) << a;
    EXPECT_NE(message([&] { p.fn(x.data(), 2, 64, w.w, nullptr, y.data(), 7); }).find("ldy 7"), std::string::npos);
    EXPECT_NE(message([&] { p.fn(x.data(), -1, 64, w.w, nullptr, y.data(), 8); }).find("[gemm_quant]"),
              std::string::npos);
    EXPECT_NE(message([&] { p.fn(nullptr, 2, 64, w.w, nullptr, y.data(), 8); }).find("null x or y"),
              std::string::npos);
  }
  EXPECT_THROW(QuantMatrix::view(Type::Q4_0, 2, 48, x.data()), std::invalid_argument);  // 48 not a block multiple
  EXPECT_THROW(QuantMatrix::view(Type::Q4_0, 2, 64, nullptr), std::invalid_argument);
  EXPECT_THROW(QuantMatrix::view(static_cast<Type>(4), 2, 64, x.data()), std::invalid_argument);
  EXPECT_THROW(w.w.slice(3, 9), std::invalid_argument);
  EXPECT_THROW(w.w.slice(5, 4), std::invalid_argument);
  // A type ggml defines but nothing here multiplies: one std::runtime_error line.
  std::vector<uint8_t> iq(static_cast<size_t>(gguf::row_bytes(Type::IQ2_XXS, 256)));
  const QuantMatrix wiq = QuantMatrix::view(Type::IQ2_XXS, 1, 256, iq.data());
  std::vector<float> x256(256);
  try {
    kernels::gemm_quant(x256.data(), 1, 256, wiq, nullptr, y.data(), 1);
    ADD_FAILURE() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("IQ2_XXS"), std::string::npos) << e.what();
  }
}

// --- the float32 path --------------------------------------------------------------------------------------------

TEST(QuantGemm, FloatPathTypesMatchFloat64AndAreBatchInvariant) {
  const int64_t n = 21, m = 5;
  for (Type type : {Type::F32, Type::F16, Type::BF16, Type::Q4_K, Type::Q5_K, Type::Q6_K}) {
    const int64_t k = gguf::block_size(type) == 1 ? 67 : 512;
    const Weights w = random_weights(type, n, k, 12);
    const std::vector<float> x = random_floats(static_cast<size_t>(m * k), 13);
    const std::vector<float> bias = random_floats(static_cast<size_t>(n), 14);
    const std::vector<float> ref = run(kernels::portable::gemm_quant, x, m, w.w, bias.data());
    for (const Path& p : builds()) ASSERT_TRUE(SameBits(run(p.fn, x, m, w.w, bias.data()), ref, p.name));
    for (int64_t j = 0; j < n; ++j) {
      std::vector<float> wrow(static_cast<size_t>(k));
      kernels::dequantize_row(type, w.w.data + j * w.w.row_bytes, wrow.data(), k);
      for (int64_t i = 0; i < m; ++i) {
        double exact = bias[j], mag = std::fabs(bias[j]);
        for (int64_t e = 0; e < k; ++e) {
          exact += static_cast<double>(wrow[e]) * x[i * k + e];
          mag += std::fabs(static_cast<double>(wrow[e]) * x[i * k + e]);
        }
        // float32 sums of k / 8 + 4 terms per lane and the tree: (k / 8 + 5) roundings of at most 2^-24 · mag.
        EXPECT_LE(std::fabs(ref[i * n + j] - exact), static_cast<double>(k / 8 + 5) * std::ldexp(mag, -24))
            << gguf::type_name(type);
      }
    }
    const std::vector<float> row(x.begin() + 2 * k, x.begin() + 3 * k);
    const std::vector<float> alone = run(kernels::gemm_quant, row, 1, w.w, bias.data());
    EXPECT_TRUE(SameBits(alone, std::vector<float>(ref.begin() + 2 * n, ref.begin() + 3 * n), "row 2 alone"));
  }
}

// --- embeddings and LinearWeight ---------------------------------------------------------------------------------

TEST(QuantGemm, EmbeddingRowsDequantizeTheAskedRows) {
  const Weights w = quantized_weights(Type::Q8_0, 10, 64, 21);
  const std::vector<int64_t> ids{7, 0, 7, 9};
  std::vector<float> out(ids.size() * 64);
  kernels::embedding_rows(w.w, ids.data(), static_cast<int64_t>(ids.size()), out.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<float> want(64);
    kernels::dequantize_row(Type::Q8_0, w.w.data + ids[i] * w.w.row_bytes, want.data(), 64);
    EXPECT_TRUE(SameBits(std::vector<float>(&out[i * 64], &out[i * 64] + 64), want, "id " + std::to_string(ids[i])));
  }
  const int64_t bad[] = {3, 10};
  try {
    kernels::embedding_rows(w.w, bad, 2, out.data());
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[embedding_rows] id 10 at position 1"), std::string::npos) << e.what();
  }
}

TEST(QuantGemm, RepackedHoldsWholeTilesAndSlicesKeepThemOnTileBoundaries) {
  for (Type type : kIntegerTypes) {
    const Weights w = random_weights(type, 40, 96, 51);
    EXPECT_EQ(w.w.packed, nullptr);
    const QuantMatrix p = w.w.repacked();
    ASSERT_NE(p.packed, nullptr) << gguf::type_name(type);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.packed) % 64, 0u);
    EXPECT_EQ(p.packed_stride % 64, 0);
    EXPECT_EQ(p.data, w.w.data);  // the stored blocks stay the source
    EXPECT_EQ(p.slice(16, 40).packed, p.packed + p.packed_stride);
    EXPECT_EQ(p.slice(5, 40).packed, nullptr);  // off a tile boundary: products read the stored blocks
    // A slice's products: the portable bits of the same rows, from the packed tiles and without them.
    const std::vector<float> x = random_floats(3 * 96, 52, -2.0f, 2.0f);
    for (const auto& [b, e] : {std::pair<int64_t, int64_t>{16, 40}, {5, 37}, {0, 32}}) {
      const std::vector<float> ref = run(kernels::portable::gemm_quant, x, 3, w.w.slice(b, e), nullptr);
      for (const Path& path : builds())
        EXPECT_TRUE(SameBits(run(path.fn, x, 3, p.slice(b, e), nullptr), ref,
                             gguf::type_name(type) + " slice " + std::to_string(b) + " " + path.name));
    }
  }
  // Fewer than 16 rows, or a type read through float32 rows: nothing to repack.
  EXPECT_EQ(random_weights(Type::Q4_0, 15, 64, 53).w.repacked().packed, nullptr);
  EXPECT_EQ(random_weights(Type::F16, 32, 64, 54).w.repacked().packed, nullptr);
  const QuantMatrix f = random_weights(Type::Q8_0, 32, 64, 55).w.for_products();
  EXPECT_EQ(f.packed != nullptr, kernels::active_isa() >= kernels::Isa::kAvx512Vnni);
}

TEST(QuantGemm, LinearWeightQuantizedRunsTheStoredBlocksAndSlicesRows) {
  const int64_t n = 48, k = 128, m = 3;
  const Weights w = quantized_weights(Type::Q4_1, n, k, 41);
  const LinearWeight lw = LinearWeight::quantized(w.w);
  EXPECT_TRUE(lw.quantized());
  EXPECT_EQ(lw.precision(), Precision::kInt8);
  EXPECT_EQ(lw.out_features(), n);
  EXPECT_EQ(lw.in_features(), k);
  const std::vector<float> xv = random_floats(static_cast<size_t>(m * k), 42);
  const std::vector<float> bv = random_floats(static_cast<size_t>(n), 43);
  Tensor x = Tensor::empty({m, k}), bias = Tensor::empty({n});
  std::copy(xv.begin(), xv.end(), x.data());
  std::copy(bv.begin(), bv.end(), bias.data());
  const Tensor y = linear(x, lw, bias);
  const std::vector<float> want = run(kernels::gemm_quant, xv, m, w.w, bv.data());
  EXPECT_TRUE(SameBits(std::vector<float>(y.data(), y.data() + m * n), want, "linear"));
  // rows [16, 32): the same bits as those columns of the whole product (bias sliced alike).
  Tensor b16 = Tensor::empty({16});
  std::copy(bv.begin() + 16, bv.begin() + 32, b16.data());
  const Tensor ys = linear(x, lw.rows(16, 32), b16);
  for (int64_t i = 0; i < m; ++i)
    EXPECT_TRUE(SameBits(std::vector<float>(ys.data() + i * 16, ys.data() + (i + 1) * 16),
                         std::vector<float>(&want[i * n + 16], &want[i * n + 32]), "rows(16, 32)"));
  EXPECT_THROW(linear(Tensor::empty({m, k + 1}), lw), std::invalid_argument);
  EXPECT_THROW(linear(x, lw, Tensor::empty({n + 1})), std::invalid_argument);
  const LinearWeight lf = LinearWeight::quantized(random_weights(Type::F16, 4, 8, 2).w);
  EXPECT_EQ(lf.precision(), Precision::kFloat32);
}

}  // namespace
}  // namespace qkv
