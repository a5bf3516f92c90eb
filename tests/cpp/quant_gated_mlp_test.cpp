// The SwiGLU MLP of a GGUF layer in one kernel (kernels::gated_mlp_quant): the bits of its reference composition
// (gate and up products, SiLU · up, down) at every batch size and thread count, and its argument errors.
#include "quant_testing.h"

namespace qkv {
namespace {

using namespace qkv::testing;

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


}  // namespace
}  // namespace qkv
