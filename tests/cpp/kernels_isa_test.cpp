// The kernels outside attention and sgemm (the Adam update, the RNN gates, the gradient kernels; LayerNorm and the
// activations are in norm_activation_kernels_test.cpp), each build named explicitly and compared with its plain
// reference against a float64 oracle on odd sizes; plus the one CPU probe and the QKV_ISA cap that dispatch reads.
// Paths this CPU cannot run are reported, and the dispatchers are checked never to pick them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels_isa_testing.h"
#include "qkv/core/tensor.h"
#include "qkv/kernels/activations.h"
#include "qkv/kernels/adam.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/kernels/cpu.h"
#include "qkv/kernels/grad.h"
#include "qkv/kernels/layer_norm.h"
#include "qkv/kernels/lowp.h"
#include "qkv/kernels/rnn_cells.h"
#include "qkv/kernels/sgemm.h"
#include "qkv/ops/elementwise.h"
#include "qkv/ops/lowp.h"

namespace qkv {
namespace {

using kernels::Isa;
using namespace testing;  // kernels_isa_testing.h: random_floats, Close and its tolerances, runnable, kWidths

// --- the CPU probe ----------------------------------------------------------------------------------------------

TEST(CpuProbe, ResolveIsaCapsAtTheWidestPathTheCpuHas) {
  kernels::CpuFeatures none, avx2, avx512;
  avx2.avx2 = true;
  avx512.avx2 = avx512.avx512 = true;
  EXPECT_EQ(kernels::resolve_isa(nullptr, none), Isa::kPortable);
  EXPECT_EQ(kernels::resolve_isa(nullptr, avx2), Isa::kAvx2);
  EXPECT_EQ(kernels::resolve_isa("", avx512), Isa::kAvx512);
  EXPECT_EQ(kernels::resolve_isa("portable", avx512), Isa::kPortable);
  EXPECT_EQ(kernels::resolve_isa("avx2", avx512), Isa::kAvx2);
  EXPECT_EQ(kernels::resolve_isa("avx512", avx512), Isa::kAvx512);
  EXPECT_EQ(kernels::resolve_isa("avx2", avx2), Isa::kAvx2);
  kernels::CpuFeatures vnni = avx512, bf16 = avx512;
  vnni.avx512_vnni = true;
  bf16.avx512_vnni = bf16.avx512_bf16 = true;
  EXPECT_EQ(kernels::resolve_isa(nullptr, vnni), Isa::kAvx512Vnni);
  EXPECT_EQ(kernels::resolve_isa(nullptr, bf16), Isa::kAvx512Bf16);
  EXPECT_EQ(kernels::resolve_isa("avx512vnni", bf16), Isa::kAvx512Vnni);
  EXPECT_EQ(kernels::resolve_isa("avx512", bf16), Isa::kAvx512);
  EXPECT_THROW(kernels::resolve_isa("avx512bf16", vnni), std::runtime_error);
  EXPECT_THROW(kernels::resolve_isa("avx512vnni", avx512), std::runtime_error);
  // AMX sits on top where it is usable (Sapphire Rapids with Linux's permission); QKV_ISA=avx512bf16 caps it; a CPU
  // whose AMX was refused (amx false, its reason set) stays at avx512bf16 and refuses QKV_ISA=amx.
  kernels::CpuFeatures spr = bf16, refused = bf16;
  spr.amx = true;
  refused.amx_refused = "AMX unused: the kernel refused tile data (arch_prctl EPERM)";
  EXPECT_EQ(kernels::resolve_isa(nullptr, spr), Isa::kAmx);
  EXPECT_EQ(kernels::resolve_isa("amx", spr), Isa::kAmx);
  EXPECT_EQ(kernels::resolve_isa("avx512bf16", spr), Isa::kAvx512Bf16);
  EXPECT_EQ(kernels::resolve_isa(nullptr, refused), Isa::kAvx512Bf16);
  EXPECT_THROW(kernels::resolve_isa("amx", refused), std::runtime_error);
  EXPECT_THROW(kernels::resolve_isa("amx", bf16), std::runtime_error);
  kernels::CpuFeatures amx_without_bf16 = vnni;  // not a real CPU: the AMX kernels use AVX512-BF16 code too
  amx_without_bf16.amx = true;
  EXPECT_EQ(kernels::resolve_isa(nullptr, amx_without_bf16), Isa::kAvx512Vnni);
  EXPECT_FALSE(kernels::cpu_supports(Isa::kAmx, amx_without_bf16));
  EXPECT_EQ(std::string(kernels::isa_name(Isa::kAmx)), "amx");
}

// AVX-VNNI is a side branch: chosen only without AVX-512, and accepted by QKV_ISA wherever the CPU has it.
TEST(CpuProbe, ResolveIsaTakesAvx2VnniByFeatureNotByOrder) {
  kernels::CpuFeatures alder, zen4, zen5, avx2, vnni_only;
  alder.avx2 = alder.avx_vnni = true;  // AVX2 + AVX-VNNI, no AVX-512 (Alder / Raptor / Meteor / Arrow Lake)
  zen4.avx2 = zen4.avx512 = zen4.avx512_vnni = zen4.avx512_bf16 = true;  // AVX-512 with its VNNI, no AVX-VNNI
  zen5 = zen4;
  zen5.avx_vnni = true;  // both
  avx2.avx2 = true;
  vnni_only.avx_vnni = true;  // not a real CPU: AVX-VNNI kernels need AVX2 too
  EXPECT_EQ(kernels::resolve_isa(nullptr, alder), Isa::kAvx2Vnni);
  EXPECT_EQ(kernels::resolve_isa("avx2vnni", alder), Isa::kAvx2Vnni);
  EXPECT_EQ(kernels::resolve_isa("avx2", alder), Isa::kAvx2);
  EXPECT_EQ(kernels::resolve_isa("portable", alder), Isa::kPortable);
  for (const char* wider : {"avx512", "avx512vnni", "avx512bf16"})
    EXPECT_THROW(kernels::resolve_isa(wider, alder), std::runtime_error) << wider;
  EXPECT_EQ(kernels::resolve_isa(nullptr, zen4), Isa::kAvx512Bf16);
  EXPECT_THROW(kernels::resolve_isa("avx2vnni", zen4), std::runtime_error);
  EXPECT_EQ(kernels::resolve_isa(nullptr, zen5), Isa::kAvx512Bf16);  // the AVX-512 ladder, not the side branch
  EXPECT_EQ(kernels::resolve_isa("avx2vnni", zen5), Isa::kAvx2Vnni);
  EXPECT_EQ(kernels::resolve_isa("avx512vnni", zen5), Isa::kAvx512Vnni);
  EXPECT_THROW(kernels::resolve_isa("avx2vnni", avx2), std::runtime_error);
  EXPECT_EQ(kernels::resolve_isa(nullptr, vnni_only), Isa::kPortable);
  EXPECT_THROW(kernels::resolve_isa("avx2vnni", vnni_only), std::runtime_error);
  EXPECT_TRUE(kernels::cpu_supports(Isa::kAvx2Vnni, zen5));
  EXPECT_FALSE(kernels::cpu_supports(Isa::kAvx2Vnni, zen4));
  EXPECT_FALSE(kernels::cpu_supports(Isa::kAvx512, alder));
  EXPECT_EQ(std::string(kernels::isa_name(Isa::kAvx2Vnni)), "avx2vnni");
  // The refusal names what was asked for and says the CPU lacks it, in one line.
  try {
    kernels::resolve_isa("avx2vnni", zen4);
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[cpu] QKV_ISA=avx2vnni asks for avx2vnni kernels but this CPU lacks them", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  try {
    kernels::resolve_isa("avx2vni", zen5);
    ADD_FAILURE() << "QKV_ISA='avx2vni' was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("portable, avx2, avx2vnni, avx512, avx512vnni, avx512bf16, amx"),
              std::string::npos)
        << e.what();
  }
}

TEST(CpuProbeErrors, QkvIsaAboveTheCpuOrUnknownThrowsNamingCpu) {
  kernels::CpuFeatures avx2;
  avx2.avx2 = true;
  for (const char* bad : {"avx512", "AVX2", "sse", "avx2 "}) {
    try {
      kernels::resolve_isa(bad, avx2);
      ADD_FAILURE() << "QKV_ISA='" << bad << "' was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("[cpu]", 0), 0u) << e.what();
    }
  }
  EXPECT_THROW(kernels::resolve_isa("avx2", kernels::CpuFeatures{}), std::runtime_error);
}

TEST(CpuProbe, FeaturesAreConsistent) {
  const kernels::CpuFeatures& f = kernels::cpu_features();
  EXPECT_TRUE(kernels::cpu_supports(Isa::kPortable));
  EXPECT_EQ(kernels::cpu_supports(Isa::kAvx2), f.avx2);
  EXPECT_EQ(kernels::cpu_supports(Isa::kAvx512), f.avx512);
  EXPECT_EQ(kernels::cpu_supports(Isa::kAvx512Vnni), f.avx512_vnni);
  EXPECT_EQ(kernels::cpu_supports(Isa::kAvx512Bf16), f.avx512_bf16);
  EXPECT_EQ(kernels::cpu_supports(Isa::kAvx2Vnni), f.avx2 && f.avx_vnni);
  EXPECT_TRUE(!f.avx512 || f.avx2);  // every AVX-512 kernel also uses AVX2 + FMA
  EXPECT_TRUE(!f.avx_vnni || f.avx2);
  EXPECT_TRUE(!f.avx512_vnni || f.avx512);
  EXPECT_TRUE(!f.avx512_bf16 || f.avx512_vnni);
  EXPECT_EQ(kernels::cpu_supports(Isa::kAmx), f.avx512_bf16 && f.amx);
  EXPECT_TRUE(!f.amx || *f.amx_refused == '\0');  // a reason only where AMX is not used
  EXPECT_EQ(kernels::sgemm_avx512_supported(), f.avx512);
  std::cout << "[ cpu      ] avx2+fma " << f.avx2 << ", avx512 f/bw/dq/vl " << f.avx512 << ", avx512-vnni "
            << f.avx512_vnni << ", avx512-bf16 " << f.avx512_bf16 << ", avx-vnni " << f.avx_vnni << ", amx " << f.amx
            << (*f.amx_refused ? std::string(" (") + f.amx_refused + ")" : std::string()) << "\n";
}

// Run once plainly and, from CMake, again under QKV_ISA=portable / avx2 / a bad value: the dispatchers of every
// family follow active_isa(), and a bad QKV_ISA makes them throw instead of picking some path.
TEST(CpuProbe, DispatchersFollowQkvIsa) {
  const char* env = std::getenv("QKV_ISA");
  bool env_ok = true;
  Isa want = Isa::kPortable;
  try {
    want = kernels::resolve_isa(env, kernels::cpu_features());
  } catch (const std::runtime_error&) {
    env_ok = false;
  }
  std::vector<float> x(16, 0.5f), y(16);
  if (!env_ok) {
    try {  // one line that names the value asked for
      kernels::active_isa();
      ADD_FAILURE() << "QKV_ISA='" << env << "' was accepted";
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("[cpu] QKV_ISA=", 0), 0u) << msg;
      EXPECT_NE(msg.find(env), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
    EXPECT_THROW(kernels::gemm_int8_packed_runs(), std::runtime_error);
    EXPECT_THROW(kernels::gemm_bf16_packed_runs(), std::runtime_error);
    EXPECT_THROW(kernels::gelu_forward(x.data(), y.data(), 16, false), std::runtime_error);
    EXPECT_THROW(kernels::add_layer_norm_rows(y.data(), nullptr, 16, nullptr, nullptr, nullptr, 1, 16, 1e-5f),
                 std::runtime_error);
    EXPECT_THROW(kernels::flash_isa_name(kernels::FlashIsa::kAuto), std::runtime_error);
    EXPECT_THROW(kernels::bf16_round(x.data(), y.data(), 16), std::runtime_error);
    EXPECT_THROW(kernels::lowp_paths(), std::runtime_error);
    std::cout << "[ QKV_ISA  ] '" << env << "' rejected by every dispatcher\n";
    return;
  }
  EXPECT_EQ(kernels::active_isa(), want);
  // The fused attention's sets: AVX512-VNNI and AVX-VNNI add nothing there (their sets are avx512's and avx2's),
  // AVX512-BF16 adds the bf16 products, AMX puts them on tiles (the amx set).
  const Isa flash = want == Isa::kAvx512Vnni ? Isa::kAvx512 : want == Isa::kAvx2Vnni ? Isa::kAvx2 : want;
  EXPECT_EQ(std::string(kernels::flash_isa_name(kernels::FlashIsa::kAuto)), kernels::isa_name(flash));
  if (want < Isa::kAvx512) {
    EXPECT_EQ(std::string(kernels::sgemm_backend()), "openblas");
  }
  const std::string bf16 = kernels::lowp_paths().bf16, int8 = kernels::lowp_paths().int8;
  const bool avx2 = want >= Isa::kAvx2;
  if (want >= Isa::kAmx) EXPECT_EQ(bf16.rfind("amx tdpbf16ps", 0), 0u) << bf16;
  else if (want >= Isa::kAvx512Bf16) EXPECT_EQ(bf16.rfind("avx512bf16 vdpbf16ps", 0), 0u) << bf16;
  else EXPECT_NE(bf16.find(avx2 ? "float32 avx2 kernels" : "float32 portable kernels"), std::string::npos) << bf16;
  if (want >= Isa::kAmx) EXPECT_EQ(int8.rfind("amx tdpbusd", 0), 0u) << int8;
  else if (want >= Isa::kAvx512Vnni) EXPECT_EQ(int8.rfind("avx512vnni vpdpbusd", 0), 0u) << int8;
  else if (want == Isa::kAvx2Vnni) EXPECT_EQ(int8.rfind("avx2vnni vpdpbusd ymm", 0), 0u) << int8;
  else EXPECT_EQ(int8.rfind(avx2 ? "avx2 vpmaddwd" : "portable", 0), 0u) << int8;
  // The packed int8 product runs from avx2 on (vpdpbusd zmm / ymm, or its quads as vpmaddwd pairs: the same bits as
  // the unpacked product) and refuses the portable path; an int8 linear gives those bits whichever it takes. The
  // packed bf16 product runs from avx512bf16 on.
  EXPECT_EQ(kernels::gemm_bf16_packed_runs(), want >= Isa::kAvx512Bf16);
  {
    const bool packed_runs = want >= Isa::kAvx2;
    EXPECT_EQ(kernels::gemm_int8_packed_runs(), packed_runs);
    const int64_t m = 5, n = 19, k = 70;
    const std::vector<float> xv = random_floats(static_cast<size_t>(m * k), 21);
    const std::vector<float> wv = random_floats(static_cast<size_t>(n * k), 22);
    const std::vector<float> bv = random_floats(static_cast<size_t>(n), 23);
    kernels::Int8Rows a, b;
    kernels::quantize_rows_int8(xv.data(), m, k, k, a, false);
    kernels::quantize_rows_int8(wv.data(), n, k, k, b, true);
    std::vector<float> want_c(static_cast<size_t>(m * n)), c(want_c.size(), NAN);
    kernels::gemm_int8_nt(a.view(), b.view(), bv.data(), want_c.data(), n);
    kernels::PackedB pw;
    kernels::pack_int8(b.view(), pw);
    if (packed_runs) {
      kernels::gemm_int8_packed(a.view(), pw.view(), bv.data(), c.data(), n);
      EXPECT_EQ(c, want_c) << "packed int8 under " << kernels::isa_name(want);
    } else {
      EXPECT_THROW(kernels::gemm_int8_packed(a.view(), pw.view(), bv.data(), c.data(), n), std::runtime_error);
    }
    const Tensor x = Tensor::from_vector({m, k}, xv), w = Tensor::from_vector({n, k}, wv),
                 bias = Tensor::from_vector({n}, bv);
    EXPECT_EQ(linear(x, LinearWeight(w, Precision::kInt8), bias).to_vector(), want_c) << "int8 linear";
  }
  // The packed products refuse to run below their level instead of picking another path.
  if (want < Isa::kAvx512Bf16) {
    kernels::PackedB w;
    kernels::pack_bf16(x.data(), 2, 8, 8, 1, w);
    EXPECT_THROW(kernels::gemm_bf16_packed(x.data(), 1, 8, w.view(), nullptr, y.data(), 2), std::runtime_error);
  }
  std::cout << "[ QKV_ISA  ] " << (env ? env : "(unset)") << " -> " << kernels::isa_name(want) << "\n";
}


// --- Adam -------------------------------------------------------------------------------------------------------

struct AdamCase {
  double lr, beta1, beta2, eps, wd;
  bool decoupled;
  int64_t step;
};

kernels::AdamScalars scalars(const AdamCase& a) {
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
  return {static_cast<float>(1.0 - a.lr * a.wd), static_cast<float>(a.wd),   static_cast<float>(1.0 - a.beta1),
          static_cast<float>(a.beta2),           static_cast<float>(1.0 - a.beta2), static_cast<float>(a.eps),
          static_cast<float>(-(a.lr / bc1)),     static_cast<float>(std::sqrt(bc2)), a.wd != 0.0, a.decoupled};
}

TEST(AdamKernels, EveryPathMatchesFloat64OracleAndPathsAgreeBitForBit) {
  const std::vector<Isa> paths = runnable({Isa::kPortable, Isa::kAvx2}, "adam_update");
  const std::vector<AdamCase> cases{
      {1e-3, 0.9, 0.999, 1e-8, 0.0, false, 1},    // Adam, first step
      {1e-2, 0.9, 0.999, 1e-8, 0.01, false, 7},   // Adam with L2 decay in the gradient
      {3e-3, 0.9, 0.98, 1e-6, 0.1, true, 12},     // AdamW
      {1e-2, 0.3, 0.9, 1e-8, 0.05, true, 3},      // beta1 < 0.5: the other lerp form
  };
  uint32_t seed = 500;
  for (const AdamCase& a : cases)
    for (int64_t n : {1, 3, 7, 8, 9, 17, 37}) {
      SCOPED_TRACE("n " + std::to_string(n) + " beta1 " + std::to_string(a.beta1) + " decoupled " +
                   std::to_string(a.decoupled));
      const std::vector<float> p0 = random_floats(n, ++seed), g = random_floats(n, ++seed);
      const std::vector<float> m0 = random_floats(n, ++seed, -0.1f, 0.1f), v0 = random_floats(n, ++seed, 0.0f, 0.1f);
      // float64 torch.optim formula
      std::vector<double> pw(n), mw(n), vw(n);
      const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
      const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
      for (int64_t j = 0; j < n; ++j) {
        double pj = p0[j], gj = g[j];
        if (a.wd != 0.0) {
          if (a.decoupled) pj *= 1.0 - a.lr * a.wd;
          else gj += a.wd * pj;
        }
        mw[j] = a.beta1 * m0[j] + (1.0 - a.beta1) * gj;
        vw[j] = a.beta2 * v0[j] + (1.0 - a.beta2) * gj * gj;
        pw[j] = pj - a.lr / bc1 * mw[j] / (std::sqrt(vw[j]) / std::sqrt(bc2) + a.eps);
      }
      const kernels::AdamScalars c = scalars(a);
      std::vector<float> first_p;
      for (Isa isa : paths) {
        std::vector<float> p = p0, m = m0, v = v0;
        if (isa == Isa::kAvx2)
          kernels::avx2::adam_update_range(c, 0, n, p.data(), g.data(), m.data(), v.data());
        else
          kernels::portable::adam_update_range(c, 0, n, p.data(), g.data(), m.data(), v.data());
        // Parameters near 1 after steps of ~1e-2: float rounding of p itself dominates.
        EXPECT_TRUE(Close(m, mw, {1e-7, 1e-6}, std::string(kernels::isa_name(isa)) + " exp_avg"));
        EXPECT_TRUE(Close(v, vw, {1e-8, 1e-6}, std::string(kernels::isa_name(isa)) + " exp_avg_sq"));
        EXPECT_TRUE(Close(p, pw, {1e-6, 1e-6}, std::string(kernels::isa_name(isa)) + " param"));
        if (first_p.empty()) {
          first_p = p;
        } else {
          EXPECT_EQ(p, first_p) << kernels::isa_name(isa) << " differs in bits from the portable path";
        }
      }
    }
}

TEST(AdamKernels, ThreadedDispatcherEqualsOneRangeBitForBit) {
  const AdamCase a{1e-3, 0.9, 0.999, 1e-8, 0.01, true, 5};
  const int64_t n = (int64_t{1} << 17) + 13;  // above the threading threshold, odd
  const std::vector<float> p0 = random_floats(n, 601), g = random_floats(n, 602);
  const std::vector<float> m0 = random_floats(n, 603, -0.1f, 0.1f), v0 = random_floats(n, 604, 0.0f, 0.1f);
  const kernels::AdamScalars c = scalars(a);
  std::vector<float> p = p0, m = m0, v = v0, q = p0, mq = m0, vq = v0;
  kernels::adam_update(c, n, p.data(), g.data(), m.data(), v.data());
  kernels::portable::adam_update_range(c, 0, n, q.data(), g.data(), mq.data(), vq.data());
  EXPECT_EQ(p, q);
  EXPECT_EQ(m, mq);
  EXPECT_EQ(v, vq);
}

// --- RNN gates --------------------------------------------------------------------------------------------------

double sigmoid64(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(RnnCellKernels, GruAndLstmGatesMatchReferenceAndFloat64Oracle) {
  uint32_t seed = 700;
  const int64_t nb = 3;
  for (int64_t hs : {1, 3, 4, 5, 7, 9, 33}) {
    SCOPED_TRACE("hs " + std::to_string(hs));
    for (int64_t gates : {3, 4}) {
      const int64_t xi_rs = gates * hs + 2;  // a strided view of a wider projection
      const std::vector<float> xi = random_floats(nb * xi_rs, ++seed, -6.0f, 6.0f);
      const std::vector<float> hh = random_floats(nb * gates * hs, ++seed, -6.0f, 6.0f);
      const std::vector<float> prev = random_floats(nb * hs, ++seed);
      const size_t n = static_cast<size_t>(nb * hs);
      using Outs = std::vector<std::vector<float>>;
      auto run = [&](bool reference) {
        Outs o(6, std::vector<float>(n));
        if (gates == 3) {
          auto f = reference ? kernels::reference::gru_cell_rows : kernels::gru_cell_rows;
          f(nb, hs, xi.data(), xi_rs, hh.data(), prev.data(), o[0].data(), o[1].data(), o[2].data(), o[3].data(),
            o[4].data());
          o.resize(5);
        } else {
          auto f = reference ? kernels::reference::lstm_cell_rows : kernels::lstm_cell_rows;
          f(nb, hs, xi.data(), xi_rs, hh.data(), prev.data(), o[0].data(), o[1].data(), o[2].data(), o[3].data(),
            o[4].data(), o[5].data());
        }
        return o;
      };
      // float64 oracle
      std::vector<std::vector<double>> want(gates == 3 ? 5 : 6, std::vector<double>(n));
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t j = 0; j < hs; ++j) {
          const size_t k = static_cast<size_t>(b * hs + j);
          auto pre = [&](int64_t gate) {
            return static_cast<double>(xi[b * xi_rs + gate * hs + j]) + hh[b * gates * hs + gate * hs + j];
          };
          if (gates == 3) {
            const double r = sigmoid64(pre(0)), z = sigmoid64(pre(1)), hn = hh[b * 3 * hs + 2 * hs + j];
            const double nv = std::tanh(xi[b * xi_rs + 2 * hs + j] + r * hn);
            want[0][k] = r, want[1][k] = z, want[2][k] = nv, want[3][k] = hn;
            want[4][k] = (1.0 - z) * nv + z * prev[k];
          } else {
            const double i = sigmoid64(pre(0)), f = sigmoid64(pre(1)), g = std::tanh(pre(2)), o = sigmoid64(pre(3));
            const double c = f * prev[k] + i * g;
            want[0][k] = i, want[1][k] = f, want[2][k] = g, want[3][k] = o, want[4][k] = c;
            want[5][k] = o * std::tanh(c);
          }
        }
      const Outs fast = run(false), ref = run(true);
      for (size_t t = 0; t < want.size(); ++t) {
        const std::string what = (gates == 3 ? "gru out " : "lstm out ") + std::to_string(t);
        EXPECT_TRUE(Close(fast[t], want[t], kPolynomial, "vectorised " + what));
        EXPECT_TRUE(Close(ref[t], want[t], kPolynomial, "reference " + what));
      }
    }
  }
}

// --- gradient kernels -------------------------------------------------------------------------------------------

TEST(GradKernels, ColumnSumsMatchFloat64Oracle) {
  uint32_t seed = 800;
  for (int64_t rows : {0, 1, 3, 129})
    for (int64_t cols : {1, 7, 33}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
      const std::vector<float> g = random_floats(rows * cols, ++seed), start = random_floats(cols, ++seed);
      std::vector<double> sums(cols, 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) sums[j] += g[r * cols + j];
      std::vector<float> out = start;
      kernels::column_sums(g.data(), rows, cols, out.data(), /*overwrite=*/true);
      EXPECT_TRUE(Close(out, sums, kFloatStats, "written"));
      out = start;
      kernels::column_sums(g.data(), rows, cols, out.data(), /*overwrite=*/false);
      std::vector<double> added(cols);
      for (int64_t j = 0; j < cols; ++j) added[j] = start[j] + sums[j];
      EXPECT_TRUE(Close(out, added, kFloatStats, "added"));
    }
}

TEST(GradKernels, AddIntoStridedViewsMatchesElementwiseSum) {
  const Tensor base = Tensor::from_vector({5, 7}, random_floats(35, 901));
  const Tensor src_t = Tensor::from_vector({7, 5}, random_floats(35, 902)).transpose(0, 1);  // (5, 7), strided
  for (bool overwrite : {false, true}) {
    Tensor dst = base.clone();
    kernels::add_into(dst, src_t, overwrite);
    std::vector<double> want(35);
    const std::vector<float> b = base.to_vector(), s = src_t.to_vector();
    for (size_t i = 0; i < 35; ++i) want[i] = (overwrite ? 0.0 : b[i]) + s[i];
    EXPECT_TRUE(Close(dst.to_vector(), want, {0.0, 1e-7}, overwrite ? "overwrite" : "add"));
  }
  // into a strided destination (a column slice)
  Tensor wide = Tensor::zeros({5, 9});
  Tensor view = wide.slice(1, 1, 8);
  kernels::add_into(view, src_t);
  const std::vector<float> got = view.to_vector(), s = src_t.to_vector();
  EXPECT_EQ(got, s);
}

TEST(GradKernels, SumToTrailingTakesOnlyTheTrailingCase) {
  const Tensor g = Tensor::from_vector({4, 3, 5}, random_floats(60, 903));
  const Tensor t = kernels::sum_to_trailing(g, {1, 5});
  ASSERT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{1, 5}));
  const std::vector<float> gv = g.to_vector();
  std::vector<double> want(5, 0.0);
  for (size_t i = 0; i < gv.size(); ++i) want[i % 5] += gv[i];
  EXPECT_TRUE(Close(t.to_vector(), want, kFloatStats, "sum to (1, 5)"));
  EXPECT_FALSE(kernels::sum_to_trailing(g, {4, 1, 5}).defined());  // a middle dim: the general op's case
  EXPECT_FALSE(kernels::sum_to_trailing(g.transpose(0, 2), {4}).defined());  // not contiguous
}

TEST(GradKernelsErrors, AddIntoShapeMismatchThrowsNamingAutograd) {
  Tensor dst = Tensor::zeros({2, 3});
  try {
    kernels::add_into(dst, Tensor::zeros({3, 2}));
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[autograd]", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace qkv
