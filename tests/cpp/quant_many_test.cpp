// Several products of one x in one call (kernels::gemm_quant_many, an attention layer's Q, K and V): each output has
// gemm_quant's bits at every batch size and thread count, whatever mix of types, repacked copies, column counts
// past the last whole tile and biases; its argument errors. CMake runs this binary also under QKV_ISA=avx2 and
// QKV_ISA=portable, so every build's tiles are checked by name.
#include "quant_testing.h"

namespace qkv {
namespace {

using namespace qkv::testing;

struct Product {
  Weights w;
  std::vector<float> bias;
};

// Q (n 80), K and V (n 40 and 24: the last columns past a whole 16-row tile run the reference), and a float32-path
// type among them (F16: dequantized rows, run on its own).
std::vector<Product> products(Type q, Type kv, bool with_f16, int64_t k, uint32_t seed) {
  std::vector<Product> p;
  const std::vector<std::pair<Type, int64_t>> shapes =
      with_f16 ? std::vector<std::pair<Type, int64_t>>{{q, 80}, {Type::F16, 40}, {kv, 24}}
               : std::vector<std::pair<Type, int64_t>>{{q, 80}, {kv, 40}, {kv, 24}};
  for (auto [type, n] : shapes) {
    p.push_back({random_weights(type, n, k, seed), random_floats(static_cast<size_t>(n), seed + 100)});
    ++seed;
  }
  return p;
}

TEST(QuantGemmMany, EveryOutputHasGemmQuantsBits) {
  const int saved = omp_get_max_threads();
  const int64_t k = 256;  // one K-quant super-block, 8 blocks of 32
  const std::vector<float> x = random_floats(static_cast<size_t>(17 * k), 7, -2.0f, 2.0f);
  const std::vector<std::pair<Type, Type>> mixes{{Type::Q4_1, Type::Q4_1}, {Type::Q8_0, Type::Q4_0},
                                                 {Type::Q5_1, Type::Q5_0}, {Type::Q4_K, Type::Q6_K},
                                                 {Type::Q5_K, Type::Q8_0}};
  for (auto [q, kv] : mixes) {
    for (bool with_f16 : {false, true}) {
      const std::vector<Product> ps = products(q, kv, with_f16, k, 11);
      for (bool repacked : {false, true}) {
        std::vector<QuantMatrix> w;
        for (const Product& p : ps) w.push_back(repacked ? p.w.w.for_products() : p.w.w);
        for (bool bias : {false, true}) {
          for (int threads : {1, 2}) {
            omp_set_num_threads(threads);
            for (int64_t m : {1, 3, 17}) {
              std::vector<std::vector<float>> want, got;
              std::vector<kernels::QuantProduct> call;
              for (size_t i = 0; i < ps.size(); ++i) {
                const int64_t n = w[i].rows, ldy = n + 2;
                const float* b = bias ? ps[i].bias.data() : nullptr;
                want.emplace_back(static_cast<size_t>(m * ldy), -777.0f);
                got.emplace_back(static_cast<size_t>(m * ldy), -777.0f);
                kernels::gemm_quant(x.data(), m, k, w[i], b, want.back().data(), ldy);
                call.push_back({&w[i], b, nullptr, ldy});
              }
              for (size_t i = 0; i < ps.size(); ++i) call[i].y = got[i].data();
              kernels::gemm_quant_many(x.data(), m, k, call.data(), static_cast<int64_t>(call.size()));
              for (size_t i = 0; i < ps.size(); ++i)
                EXPECT_TRUE(SameBits(got[i], want[i],  // ldy's gaps stay -777 in both
                                     std::string(kernels::quant_gemm_path()) + " " +
                                         gguf::type_name(w[i].type) + " product " + std::to_string(i) +
                                         " m=" + std::to_string(m) + " threads=" + std::to_string(threads) +
                                         (repacked ? " repacked" : "") + (bias ? " bias" : "")));
            }
          }
          omp_set_num_threads(saved);
        }
      }
    }
  }
}

// Bigger than the threshold of a parallel region (m·Σn·k >= 2^18), with the columns of two threads split across
// the products: still gemm_quant's bits.
TEST(QuantGemmMany, OneParallelRegionOverEveryProduct) {
  const int saved = omp_get_max_threads();
  const int64_t k = 576;
  const std::vector<float> x = random_floats(static_cast<size_t>(5 * k), 21, -2.0f, 2.0f);
  const Weights q = random_weights(Type::Q4_1, 576, k, 1), kk = random_weights(Type::Q4_1, 192, k, 2),
                v = random_weights(Type::Q8_0, 192, k, 3);
  const QuantMatrix w[3] = {q.w.for_products(), kk.w.for_products(), v.w.for_products()};
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (int64_t m : {1, 5}) {
      std::vector<std::vector<float>> want(3), got(3);
      kernels::QuantProduct call[3];
      for (int i = 0; i < 3; ++i) {
        want[i].assign(static_cast<size_t>(m * w[i].rows), 0.0f);
        got[i].assign(want[i].size(), -1.0f);
        kernels::gemm_quant(x.data(), m, k, w[i], nullptr, want[i].data(), w[i].rows);
        call[i] = {&w[i], nullptr, got[i].data(), w[i].rows};
      }
      kernels::gemm_quant_many(x.data(), m, k, call, 3);
      for (int i = 0; i < 3; ++i)
        EXPECT_TRUE(SameBits(got[i], want[i], "product " + std::to_string(i) + " m=" + std::to_string(m) +
                                                  " threads=" + std::to_string(threads)));
    }
  }
  omp_set_num_threads(saved);
}

TEST(QuantGemmMany, RefusesWeightsOfDifferentInputLengthsAndBadArguments) {
  const Weights a = random_weights(Type::Q4_1, 32, 64, 1), b = random_weights(Type::Q4_1, 32, 96, 2);
  const std::vector<float> x = random_floats(96, 3);
  std::vector<float> ya(32), yb(32);
  kernels::QuantProduct call[2] = {{&a.w, nullptr, ya.data(), 32}, {&b.w, nullptr, yb.data(), 32}};
  try {
    kernels::gemm_quant_many(x.data(), 1, 96, call, 2);
    FAIL() << "weights of k 64 and 96 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[gemm_quant_many]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(32, 96)"), std::string::npos) << e.what();
  }
  kernels::QuantProduct none[1] = {{nullptr, nullptr, ya.data(), 32}};
  EXPECT_THROW(kernels::gemm_quant_many(x.data(), 1, 64, none, 1), std::invalid_argument);
  EXPECT_THROW(kernels::gemm_quant_many(x.data(), 1, 64, nullptr, 1), std::invalid_argument);
  kernels::QuantProduct small_ldy[1] = {{&a.w, nullptr, ya.data(), 16}};
  EXPECT_THROW(kernels::gemm_quant_many(x.data(), 1, 64, small_ldy, 1), std::invalid_argument);
  EXPECT_NO_THROW(kernels::gemm_quant_many(x.data(), 1, 64, nullptr, 0));
}

}  // namespace
}  // namespace qkv
