// The K-quants' integer product (Q4_K, Q5_K, Q6_K in kernels::gemm_quant and gated_mlp_quant): every build against
// the portable reference bit for bit, the reference against a float64 product with the dequantized weights within
// a bound derived from the activations' quantization, the element layout against kernels::dequantize_row, batch
// and thread-count invariance, the repacked tiles' size, and Q2_K / Q3_K on the float32 path.
#include "quant_testing.h"

namespace qkv {
namespace {

using namespace qkv::testing;

const std::vector<Type> kKTypes{Type::Q4_K, Type::Q5_K, Type::Q6_K};

std::string what(Type type, int64_t m, int64_t n, int64_t k) {
  return gguf::type_name(type) + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
}

// dmin · m of each 32-element sub-block of row j (Q4_K, Q5_K; 0 for Q6_K), by ggml's get_scale_min_k4.
std::vector<float> k_mins(const QuantMatrix& w, int64_t j) {
  std::vector<float> out(static_cast<size_t>(w.cols / 32), 0.0f);
  if (w.type == Type::Q6_K) return out;
  const int64_t bs = gguf::type_size(w.type);
  for (int64_t s = 0; s < w.cols / 256; ++s) {
    const uint8_t* blk = w.data + j * w.row_bytes + s * bs;
    uint16_t h;
    std::memcpy(&h, blk + 2, 2);
    const uint8_t* q = blk + 4;
    for (int sub = 0; sub < 8; ++sub) {
      const int m = sub < 4 ? q[sub + 4] & 63 : (q[sub + 4] >> 4) | ((q[sub] >> 6) << 4);
      out[static_cast<size_t>(s * 8 + sub)] = fp16_to_float(h) * static_cast<float>(m);
    }
  }
  return out;
}

TEST(QuantKQuant, KTypesHaveTheIntegerProductAndQ2KQ3KTheFloatPath) {
  for (Type type : kKTypes) {
    EXPECT_TRUE(kernels::quant_gemm_integer(type)) << gguf::type_name(type);
    EXPECT_EQ(kernels::quant_gemm_path(type), kernels::quant_gemm_path());
  }
  for (Type type : {Type::Q2_K, Type::Q3_K, Type::Q8_K}) {
    EXPECT_FALSE(kernels::quant_gemm_integer(type)) << gguf::type_name(type);
    EXPECT_EQ(kernels::quant_gemm_path(type), "float32 (dequantized rows)");
  }
}

TEST(QuantKQuant, EveryBuildGivesThePortableBitsAtAwkwardSizes) {
  const std::vector<Path> paths = builds();
  uint32_t seed = 1;
  for (Type type : kKTypes)
    for (int64_t k : {256, 512, 2048})
      for (int64_t n : {1, 16, 17, 35, 64})
        for (int64_t m : {1, 2, 3, 4, 5, 8, 13}) {
          if (k == 2048 && m > 2 && n != 35) continue;
          const Weights w = random_weights(type, n, k, seed);
          const std::vector<float> x = random_floats(static_cast<size_t>(m * k), seed + 1000, -3.0f, 3.0f);
          const std::vector<float> bias = random_floats(static_cast<size_t>(n), seed + 2000);
          ++seed;
          const std::vector<float> ref = run(kernels::portable::gemm_quant, x, m, w.w, bias.data());
          for (const Path& p : paths)
            ASSERT_TRUE(SameBits(run(p.fn, x, m, w.w, bias.data()), ref, what(type, m, n, k) + " " + p.name));
          const std::vector<float> ref0 = run(kernels::portable::gemm_quant, x, m, w.w, nullptr);
          for (const Path& p : paths)
            ASSERT_TRUE(SameBits(run(p.fn, x, m, w.w, nullptr), ref0, what(type, m, n, k) + " " + p.name));
        }
}

TEST(QuantKQuant, SuperBlockScalesOfEveryFp16ClassGiveThePortableBits) {
  const uint16_t kHalves[] = {0x0000, 0x8000, 0x0001, 0x03FF, 0x8200, 0x0400, 0x3C00, 0xB555, 0x7BFF,
                              0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7D01, 0xFE01};
  const int64_t n = 35, k = 768, m = 3;
  for (Type type : kKTypes) {
    Weights w = random_weights(type, n, k, 51);
    const int64_t bs = gguf::type_size(type), blocks = n * k / 256;
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* blk = w.bytes->data() + b * bs;
      const uint16_t d = kHalves[b % std::size(kHalves)], mn = kHalves[(b * 7 + 3) % std::size(kHalves)];
      if (b % 3 != 0) std::memcpy(blk + (type == Type::Q6_K ? 208 : 0), &d, 2);
      if (type != Type::Q6_K && b % 2 == 0) std::memcpy(blk + 2, &mn, 2);
    }
    const std::vector<float> x = random_floats(static_cast<size_t>(m * k), 52);
    const std::vector<float> ref = run(kernels::portable::gemm_quant, x, m, w.w, nullptr);
    for (const Path& p : builds())
      EXPECT_TRUE(SameBits(run(p.fn, x, m, w.w, nullptr), ref, gguf::type_name(type) + " " + p.name));
#if defined(__x86_64__)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);  // FTZ | DAZ: still one set of bits
    const std::vector<float> ref_daz = run(kernels::portable::gemm_quant, x, m, w.w, nullptr);
    std::vector<std::vector<float>> got_daz;
    for (const Path& p : builds()) got_daz.push_back(run(p.fn, x, m, w.w, nullptr));
    _mm_setcsr(csr);
    for (size_t i = 0; i < got_daz.size(); ++i)
      EXPECT_TRUE(SameBits(got_daz[i], ref_daz, gguf::type_name(type) + " " + builds()[i].name + " FTZ/DAZ"));
#endif
  }
}

// One-hot activations 127/128 (d = 2^-7 exactly, q = 127): output j is element e of row j times 127/128 up to the
// epilogue's roundings, so every element's place in the integer product is the one kernels::dequantize_row gives it.
TEST(QuantKQuant, OneHotActivationsReadEveryElementWhereTheDequantizerDoes) {
  const int64_t n = 32, k = 512;
  for (Type type : kKTypes) {
    const Weights w = random_weights(type, n, k, 61);
    std::vector<float> x(static_cast<size_t>(k * k), 0.0f);
    for (int64_t e = 0; e < k; ++e) x[e * k + e] = 127.0f / 128.0f;
    std::vector<float> wrow(static_cast<size_t>(n * k));
    for (int64_t j = 0; j < n; ++j)
      kernels::dequantize_row(type, w.w.data + j * w.w.row_bytes, &wrow[j * k], k);
    std::vector<Path> paths = builds();
    paths.push_back({"portable", kernels::portable::gemm_quant});
    for (const Path& p : paths) {
      const std::vector<float> y = run(p.fn, x, k, w.w, nullptr);
      for (int64_t e = 0; e < k; ++e)
        for (int64_t j = 0; j < n; ++j) {
          const double want = static_cast<double>(wrow[j * k + e]) * 127.0 / 128.0;
          const double scale = std::fabs(want) + 2.0 * std::fabs(k_mins(w.w, j)[e / 32]);
          ASSERT_LE(std::fabs(y[e * n + j] - want), std::ldexp(scale, -21))
              << gguf::type_name(type) << " " << p.name << " element " << e << " row " << j;
        }
    }
  }
}

// The bound of quant_testing.h with the sub-block mins counted twice (dsc · q and dmin · m are rounded apart, so
// their magnitudes, |w| + |m| each at most, enter the float32 roundings).
TEST(QuantKQuant, ReferenceWithinQuantizationErrorOfFloat64) {
  const int64_t n = 17, m = 5;
  for (Type type : kKTypes)
    for (int64_t k : {256, 1024}) {
      const Weights w = random_weights(type, n, k, 77 + static_cast<uint32_t>(k));
      const std::vector<float> x = random_floats(static_cast<size_t>(m * k), 5 + static_cast<uint32_t>(k), -2.0f, 2.0f);
      const std::vector<float> bias = random_floats(static_cast<size_t>(n), 9);
      const std::vector<float> y = run(kernels::portable::gemm_quant, x, m, w.w, bias.data());
      for (int64_t j = 0; j < n; ++j) {
        std::vector<float> wrow(static_cast<size_t>(k));
        kernels::dequantize_row(type, w.w.data + j * w.w.row_bytes, wrow.data(), k);
        std::vector<float> mins = k_mins(w.w, j);
        for (float& v : mins) v = 2.0f * v;
        for (int64_t i = 0; i < m; ++i) {
          double ref = bias[j];
          for (int64_t e = 0; e < k; ++e) ref += static_cast<double>(wrow[e]) * x[i * k + e];
          const double bound = quantization_error_bound(wrow, mins, &x[i * k], k) + std::ldexp(std::fabs(ref), -23);
          ASSERT_LE(std::fabs(y[i * n + j] - ref), bound) << gguf::type_name(type) << " k=" << k << " (" << i << ", "
                                                          << j << ")";
        }
      }
    }
}

TEST(QuantKQuant, RowBitsIndependentOfBatchPlaceAndThreads) {
  const int64_t n = 64 + 5, k = 512;
  const int saved = omp_get_max_threads();
  for (Type type : kKTypes) {
    const Weights w = random_weights(type, n, k, 31);
    const std::vector<float> batch = random_floats(static_cast<size_t>(17 * k), 32, -4.0f, 4.0f);
    const std::vector<float> row(batch.begin() + 5 * k, batch.begin() + 6 * k);  // row 5 of the batch
    std::vector<Path> paths = builds();
    paths.push_back({"portable", kernels::portable::gemm_quant});
    for (const Path& p : paths) {
      omp_set_num_threads(1);
      const std::vector<float> alone = run(p.fn, row, 1, w.w, nullptr);
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        for (int64_t m : {1, 2, 5, 8, 17}) {  // 8: the row with 7 others
          const int64_t at = std::min<int64_t>(5, m - 1), first = 5 - at;
          const std::vector<float> x(batch.begin() + first * k, batch.begin() + (first + m) * k);
          const std::vector<float> y = run(p.fn, x, m, w.w, nullptr);
          EXPECT_TRUE(SameBits(std::vector<float>(y.begin() + at * n, y.begin() + (at + 1) * n), alone,
                               gguf::type_name(type) + " " + p.name + " m=" + std::to_string(m) + " threads=" +
                                   std::to_string(threads)));
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST(QuantKQuant, NonFiniteActivationsGiveNaNRows) {
  const int64_t n = 19, k = 256, m = 3;
  for (Type type : kKTypes) {
    const Weights w = random_weights(type, n, k, 3);
    std::vector<float> x = random_floats(static_cast<size_t>(m * k), 4);
    x[1 * k + 40] = std::numeric_limits<float>::infinity();
    const std::vector<float> clean0(x.begin(), x.begin() + k);
    for (const Path& p : builds()) {
      const std::vector<float> y = run(p.fn, x, m, w.w, nullptr);
      for (int64_t j = 0; j < n; ++j) EXPECT_TRUE(std::isnan(y[1 * n + j])) << p.name << " " << gguf::type_name(type);
      EXPECT_TRUE(SameBits(std::vector<float>(y.begin(), y.begin() + n), run(p.fn, clean0, 1, w.w, nullptr),
                           p.name + " row 0"));
    }
  }
}

// The repacked copy: the file's bytes rearranged, with each 6-bit scale and min unpacked to a byte (+4 bytes per
// row and super-block for Q4_K, Q5_K; Q6_K none), each tile padded to 64 bytes; slices keep tiles on boundaries.
TEST(QuantKQuant, RepackedTilesAreTheFilesSizeAndSlicesKeepTheBits) {
  for (Type type : kKTypes) {
    const int64_t k = 768;
    const Weights w = random_weights(type, 40, k, 51);
    const QuantMatrix p = w.w.repacked();
    ASSERT_NE(p.packed, nullptr) << gguf::type_name(type);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.packed) % 64, 0u);
    const int64_t extra = type == Type::Q6_K ? 0 : 16 * (k / 256) * 4;
    EXPECT_LE(p.packed_stride, (16 * w.w.row_bytes + extra + 63) / 64 * 64) << gguf::type_name(type);
    const std::vector<float> x = random_floats(3 * k, 52, -2.0f, 2.0f);
    for (const auto& [b, e] : {std::pair<int64_t, int64_t>{16, 40}, {5, 37}, {0, 32}}) {
      const std::vector<float> ref = run(kernels::portable::gemm_quant, x, 3, w.w.slice(b, e), nullptr);
      for (const Path& path : builds())
        EXPECT_TRUE(SameBits(run(path.fn, x, 3, p.slice(b, e), nullptr), ref,
                             gguf::type_name(type) + " slice " + std::to_string(b) + " " + path.name));
    }
  }
}

// Q4_K_M's mix in one MLP: gate and up Q4_K (or Q5_K), down Q6_K; the composition's bits at any batch and thread
// count, with and without the repacked copies.
TEST(QuantKQuant, GatedMlpOnKTypesGivesTheCompositionsBits) {
  const int saved = omp_get_max_threads();
  const int64_t e = 256, f = 512;
  for (Type type : {Type::Q4_K, Type::Q5_K}) {
    const Weights gate = random_weights(type, f, e, 81), up = random_weights(type, f, e, 82),
                  down = random_weights(Type::Q6_K, e, f, 83);
    const std::vector<float> bd = random_floats(static_cast<size_t>(e), 84);
    const std::vector<float> batch = random_floats(static_cast<size_t>(9 * e), 85, -2.0f, 2.0f);
    for (bool repacked : {false, true}) {
      const QuantMatrix g = repacked ? gate.w.repacked() : gate.w, u = repacked ? up.w.repacked() : up.w,
                        d = repacked ? down.w.repacked() : down.w;
      std::vector<float> want(static_cast<size_t>(9 * e));
      kernels::gated_mlp_quant_reference(batch.data(), 9, e, g, nullptr, u, nullptr, d, bd.data(), want.data(), e);
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        for (int64_t m : {1, 4, 9}) {
          const int64_t first = 9 - m;
          std::vector<float> y(static_cast<size_t>(m * e));
          kernels::gated_mlp_quant(batch.data() + first * e, m, e, g, nullptr, u, nullptr, d, bd.data(), y.data(), e);
          EXPECT_TRUE(SameBits(y, std::vector<float>(want.begin() + first * e, want.end()),
                               gguf::type_name(type) + " m=" + std::to_string(m) + " threads=" +
                                   std::to_string(threads) + (repacked ? " repacked" : "")));
        }
      }
      omp_set_num_threads(saved);
    }
  }
}

}  // namespace
}  // namespace qkv
