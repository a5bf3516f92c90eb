// Low precision at the fronts (split from precision_test.cpp): nn modules' set_precision (fp32 bit for bit, bf16
// as rounding then fp32, load_state_dict converting again, int8 refused on a tape) and bf16 attention on every flash
// set against twice the error of a float64 attention on the rounded inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "attention_oracle.h"
#include "ops_testing.h"
#include "qkv/core/precision.h"
#include "qkv/kernels/cpu.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/kernels/lowp.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/multihead_attention.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/lowp.h"
#include "qkv/ops/matmul.h"

namespace qkv {
namespace {

using kernels::Isa;
using testing::max_abs_diff;

TEST(PrecisionFronts, Fp32StaysBitForBitAndBf16IsRoundThenFp32) {
  Rng rng(5);
  nn::Linear lin(33, 17, rng);
  const Tensor x = testing::randn({4, 3, 33}, 9);
  const Tensor before = lin.forward(x);
  lin.set_precision(Precision::kBFloat16);
  EXPECT_EQ(lin.precision(), Precision::kBFloat16);
  const Tensor y16 = lin.forward(x);
  // With AVX512-BF16 the product runs vdpbf16ps (its own float32 summation order), else the float32 kernel on the
  // rounded operands, bit for bit.
  const testing::Tol round_then_fp32 =
      kernels::active_isa() >= Isa::kAvx512Bf16 ? testing::Tol{1e-5, 1e-5} : testing::kExact;
  EXPECT_TRUE(testing::AllClose(y16, linear(x, LinearWeight(lin.weight, Precision::kBFloat16), lin.bias),
                                testing::kExact));
  EXPECT_TRUE(testing::AllClose(y16, linear(round_to_bf16(x), round_to_bf16(lin.weight), lin.bias), round_then_fp32));
  EXPECT_FALSE(testing::AllClose(y16, before, testing::kExact));
  lin.set_precision(Precision::kFloat32);
  EXPECT_TRUE(testing::AllClose(lin.forward(x), before, testing::kExact));
  EXPECT_TRUE(testing::AllClose(linear(x, LinearWeight(lin.weight, Precision::kFloat32), lin.bias), before,
                                testing::kExact));

  // load_state_dict converts the new weights (the conversion is not per call, and not stale).
  lin.set_precision(Precision::kBFloat16);
  nn::StateDict sd = lin.state_dict();
  sd["weight"] = testing::randn({17, 33}, 77);
  lin.load_state_dict(sd);
  EXPECT_TRUE(testing::AllClose(lin.forward(x), linear(round_to_bf16(x), round_to_bf16(sd["weight"]), lin.bias),
                                round_then_fp32));
  EXPECT_TRUE(testing::AllClose(lin.forward(x), linear(x, LinearWeight(sd["weight"], Precision::kBFloat16), lin.bias),
                                testing::kExact));

  // A forward that records a tape refuses int8 (bf16 trains: tests/cpp/bf16_training_test.cpp).
  lin.set_precision(Precision::kInt8);
  ad::Tape tape;
  ad::ParameterSet params(lin);
  nn::Context train(tape, params);
  try {
    lin.forward(train, ad::Var(x));
    FAIL() << "trained at int8";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[Linear] precision int8 is for inference", 0), 0u) << e.what();
  }
}

TEST(PrecisionFronts, MultiheadAttentionSetPrecisionIsRecursive) {
  Rng rng(3);
  nn::MultiheadAttention mha(16, 4, rng);
  const Tensor x = testing::randn({2, 5, 16}, 4);
  const Tensor ref = mha.forward(x, x, x).out.value;
  mha.set_precision(Precision::kBFloat16);
  EXPECT_EQ(mha.out_proj.precision(), Precision::kBFloat16);
  const Tensor y = mha.forward(x, x, x).out.value;
  EXPECT_FALSE(testing::AllClose(y, ref, testing::kExact));
  EXPECT_TRUE(testing::AllClose(y, ref, {2e-2, 2e-2}));
  mha.set_precision(Precision::kInt8);
  EXPECT_TRUE(testing::AllClose(mha.forward(x, x, x).out.value, ref, {5e-2, 5e-2}));
  mha.set_precision(Precision::kFloat32);
  EXPECT_TRUE(testing::AllClose(mha.forward(x, x, x).out.value, ref, testing::kExact));
}

// bf16 attention against the float64 oracle of the float32 inputs: within 2x the error of that oracle run on the
// bf16-rounded inputs (plus fp32 tolerance), on odd shapes, T = 1, Tq != Tk, masks, causal, a window, a soft cap and
// GQA, on every set of the fused kernel this CPU has, by name (avx512bf16 runs both products on vdpbf16ps with P
// rounded to bf16; the others run float32 products on the rounded inputs, bit for bit as attention() on them),
// with small tiles (many tile edges) and the default ones. attention() runs the widest set QKV_ISA allows.
TEST(PrecisionFronts, Bf16AttentionWithinTwiceTheInputErrorOnEveryFlashSet) {
  struct Case {
    Shape q, k;
    int64_t dv;
    Causal causal;
    bool mask;
    int64_t window = -1;
    float softcap = 0.0f;
  };
  const std::vector<Case> cases{Case{{1, 2, 1, 8}, {1, 2, 1, 8}, 8, Causal::kNone, false},
                                Case{{2, 3, 7, 33}, {2, 3, 13, 33}, 17, Causal::kBottomRight, false},
                                Case{{1, 2, 9, 64}, {1, 2, 9, 64}, 64, Causal::kTopLeft, true},
                                Case{{1, 1, 5, 16}, {1, 1, 40, 16}, 16, Causal::kNone, true},
                                Case{{1, 2, 70, 31}, {1, 2, 83, 31}, 45, Causal::kNone, false},
                                Case{{2, 1, 130, 64}, {2, 1, 130, 64}, 64, Causal::kTopLeft, false, 37},
                                Case{{1, 4, 50, 48}, {1, 2, 61, 48}, 48, Causal::kBottomRight, false, -1, 20.0f},
                                Case{{1, 1, 300, 64}, {1, 1, 301, 64}, 64, Causal::kNone, true}};
  std::vector<std::pair<kernels::FlashIsa, Isa>> sets{{kernels::FlashIsa::kPortable, Isa::kPortable},
                                                      {kernels::FlashIsa::kAvx2, Isa::kAvx2},
                                                      {kernels::FlashIsa::kAvx512, Isa::kAvx512},
                                                      {kernels::FlashIsa::kAvx512Bf16, Isa::kAvx512Bf16},
                                                      {kernels::FlashIsa::kAmx, Isa::kAmx},
                                                      {kernels::FlashIsa::kAmxEmulated, Isa::kAvx512Bf16}};
  std::string ran;
  for (const auto& [set, isa] : sets)
    if (kernels::cpu_supports(isa)) ran += std::string(ran.empty() ? "" : ",") + kernels::flash_isa_name(set);
  std::cout << "[ paths    ] bf16 attention: ran " << ran << "\n";
  for (const Case& c : cases) {
    SCOPED_TRACE(str(c.q) + " " + str(c.k));
    const Tensor q = testing::randn(c.q, 1, 2.0f), k = testing::randn(c.k, 2, 2.0f);
    Shape vs = c.k;
    vs.back() = c.dv;
    const Tensor v = testing::randn(vs, 3);
    AttentionOptions o;
    o.causal = c.causal;
    o.window_left = c.window;
    o.softcap = c.softcap;
    if (c.q[1] != c.k[1]) o.enable_gqa = true;
    if (c.mask) {
      Tensor m = Tensor::ones({c.q[2], c.k[2]});
      for (int64_t i = 0; i < c.q[2]; ++i)
        for (int64_t j = 0; j < c.k[2]; ++j)
          if ((i * 7 + j * 3) % 5 == 0 && j != i % c.k[2]) m.data()[i * c.k[2] + j] = 0.0f;
      o.mask = m;
      o.mask_kind = MaskKind::kKeep;
    }
    AttentionOptions o16 = o;
    o16.precision = Precision::kBFloat16;
    const Tensor qr = round_to_bf16(q), kr = round_to_bf16(k), vr = round_to_bf16(v);
    auto oracle = [&](const Tensor& a, const Tensor& b, const Tensor& cc) {
      return testing::attention_oracle(a, b, cc, o).out;
    };
    const std::vector<double> exact = oracle(q, k, v);
    const double input_err = max_abs_diff(oracle(qr, kr, vr), exact);
    const Shape batch = attention_check(q, k, v, o, "attention");
    const float scale = attention_scale(o, q.size(-1));
    for (const auto& [set, isa] : sets) {
      if (!kernels::cpu_supports(isa)) continue;
      for (int64_t tile : {int64_t{0}, int64_t{16}}) {
        SCOPED_TRACE(std::string(kernels::flash_isa_name(set)) + " tiles " + std::to_string(tile));
        kernels::FlashConfig cfg;
        cfg.isa = set;
        cfg.fwd_q_tile = cfg.fwd_k_tile = tile;
        const Tensor out = kernels::attention_flash_forward(qr, kr, vr, o16, batch, scale, cfg).out;
        const double err = max_abs_diff(testing::to_double(out), exact);
        EXPECT_LE(err, 2 * input_err + 1e-5) << "error " << err << ", float64 of bf16 inputs " << input_err;
        if (isa < Isa::kAvx512Bf16) {  // float32 products on the rounded inputs: the fp32 kernel's bits
          EXPECT_TRUE(testing::AllClose(out, kernels::attention_flash_forward(qr, kr, vr, o, batch, scale, cfg).out,
                                        testing::kExact));
        }
        if (tile == 0) std::cout << "[ bf16 attn] " << kernels::flash_isa_name(set) << " " << str(c.q) << ": error " << err
                                 << ", float64 of bf16 inputs " << input_err << "\n";
      }
    }
    // The front: attention() at bf16 is the widest set's kernel on the rounded inputs; with weights, the reference.
    const AttentionResult r = attention(q, k, v, o16);
    EXPECT_TRUE(testing::AllClose(r.out, kernels::attention_flash_forward(qr, kr, vr, o16, batch, scale).out,
                                  testing::kExact));
    AttentionOptions w16 = o16;
    w16.return_weights = true;
    const double ref_err = max_abs_diff(testing::to_double(attention(q, k, v, w16).out), exact);
    EXPECT_LE(ref_err, 2 * input_err + 1e-5);
  }
  AttentionOptions bad;
  bad.precision = Precision::kInt8;
  const Tensor t = Tensor::ones({1, 2, 4});
  try {
    attention(t, t, t, bad);
    FAIL() << "int8 attention accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[attention] precision int8", 0), 0u) << e.what();
  }
}

// The bf16 attention's products on AMX tiles (the emulated tile unit where the CPU has no AMX) from 4 threads at
// once on this machine's 2 cores, each giving the core away while it holds tile state: every run gives the bits of
// a run alone. Where neither exists, both sets must refuse by name.
TEST(PrecisionFronts, AmxAttentionKeepsItsBitsOversubscribed) {
  const bool amx = kernels::cpu_supports(Isa::kAmx), emulated = kernels::cpu_supports(Isa::kAvx512Bf16);
  std::cout << "[ paths    ] amx attention oversubscribed: "
            << (amx ? "amx tiles" : emulated ? "amx emulated (no AMX on this CPU)" : "none (no AVX512-BF16)") << "\n";
  kernels::FlashConfig cfg;
  cfg.isa = amx ? kernels::FlashIsa::kAmx : kernels::FlashIsa::kAmxEmulated;
  cfg.threads = 1;
  const Tensor q = round_to_bf16(testing::randn({1, 2, 70, 64}, 51));
  const Tensor k = round_to_bf16(testing::randn({1, 2, 90, 64}, 52));
  const Tensor v = round_to_bf16(testing::randn({1, 2, 90, 64}, 53));
  AttentionOptions o;
  o.causal = Causal::kBottomRight;
  o.precision = Precision::kBFloat16;
  const Shape batch = attention_check(q, k, v, o, "attention");
  const float scale = attention_scale(o, q.size(-1));
  if (!amx && !emulated) {
    EXPECT_THROW(kernels::attention_flash_forward(q, k, v, o, batch, scale, cfg), std::runtime_error);
    cfg.isa = kernels::FlashIsa::kAmx;
    EXPECT_THROW(kernels::attention_flash_forward(q, k, v, o, batch, scale, cfg), std::runtime_error);
    return;
  }
  const std::vector<float> alone = kernels::attention_flash_forward(q, k, v, o, batch, scale, cfg).out.to_vector();
  constexpr int kThreads = 4, kRuns = 4;
  std::vector<std::vector<float>> out(kThreads * kRuns);
  {
    std::vector<std::thread> team;
    for (int t = 0; t < kThreads; ++t)
      team.emplace_back([&, t] {
        for (int r = 0; r < kRuns; ++r) {
          out[static_cast<size_t>(t * kRuns + r)] =
              kernels::attention_flash_forward(q, k, v, o, batch, scale, cfg).out.to_vector();
          std::this_thread::yield();
        }
      });
    for (std::thread& th : team) th.join();
  }
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], alone) << "thread " << i / kRuns << " run " << i % kRuns;
}

}  // namespace
}  // namespace qkv
