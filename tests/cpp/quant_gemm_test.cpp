// The quantized linear product (qkv/kernels/quant_gemm.h): every build against the portable reference bit for bit,
// the reference against a float64 product with the dequantized weights within a bound derived from the block
// scales, batch invariance at 1 and 2 threads, non-finite activations, argument errors, quantized embeddings and
// LinearWeight::quantized. Weights come from a quantizer written here by ggml's quantize_row_*_ref rules, or from
// random bytes with sane fp16 scales.
#include "quant_testing.h"

namespace qkv {
namespace {

using namespace qkv::testing;

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
  EXPECT_EQ(kernels::quant_gemm_path(Type::Q3_K), "float32 (dequantized rows)");
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
    ASSERT_EQ(fast.sum_lo, plain.sum_lo) << "ldx " << ldx;
    EXPECT_TRUE(SameBits(fast.d, plain.d, "d, ldx " + std::to_string(ldx)));
    EXPECT_TRUE(SameBits(fast.s, plain.s, "s, ldx " + std::to_string(ldx)));
  }
  // Block 1 has d = 1: its halves go away from zero.
  EXPECT_EQ(plain.q[32], -16);
  EXPECT_EQ(plain.q[32 + 15], -1);
  EXPECT_EQ(plain.q[32 + 16], 1);
  EXPECT_TRUE(std::isnan(plain.d[9]));  // row 1, block 0 holds the inf
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
  for (Type type : {Type::F32, Type::F16, Type::BF16, Type::Q2_K, Type::Q3_K}) {
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

TEST(QuantGemm, PackedOnlyDropsTheRowsWhereTheProductsReadOnlyTilesAndRefusesTheOthers) {
  for (Type type : {Type::Q4_1, Type::Q8_0, Type::Q4_K}) {
    const int64_t k = type == Type::Q4_K ? 256 : 96;
    const std::vector<float> xk = random_floats(3 * k, 58, -2.0f, 2.0f);
    const Weights w = random_weights(type, 32, k, 56);
    const QuantMatrix p = w.w.packed_only();
    const std::vector<float> ref = run(kernels::portable::gemm_quant, xk, 3, w.w, nullptr);
    const bool k_quant = type == Type::Q4_K;
    const bool tiles_only = kernels::active_isa() >= kernels::Isa::kAvx512Vnni ||
                            (k_quant && kernels::active_isa() >= kernels::Isa::kAvx2);
    EXPECT_EQ(p.data == nullptr, tiles_only) << gguf::type_name(type);
    EXPECT_TRUE(p.defined());
    // The dispatching product gives the stored rows' bits either way.
    EXPECT_TRUE(SameBits(run(kernels::gemm_quant, xk, 3, p, nullptr), ref, gguf::type_name(type) + " packed_only"));
    if (!tiles_only) continue;
    float y[3 * 32];
    EXPECT_THROW(kernels::portable::gemm_quant(xk.data(), 3, k, p, nullptr, y, 32), std::runtime_error);
    const int64_t id = 3;
    EXPECT_THROW(kernels::embedding_rows(p, &id, 1, y), std::runtime_error);
    EXPECT_THROW(kernels::gemm_quant(xk.data(), 3, k, p.slice(5, 21), nullptr, y, 16), std::invalid_argument);
  }
  // Rows past the last whole tile keep the stored rows.
  EXPECT_NE(random_weights(Type::Q4_1, 40, 96, 59).w.packed_only().data, nullptr);
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
