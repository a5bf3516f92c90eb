// The kernels outside attention and sgemm (LayerNorm rows, the fused residual + LayerNorm and bias + GELU epilogues,
// the Adam update, the RNN gates, the gradient kernels), each build named explicitly and compared with its plain
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

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// max |a - ref| <= atol + rtol · max |ref| over all entries (NaN anywhere fails).
struct Tol {
  double atol, rtol;
};
constexpr Tol kDoubleStats{1e-6, 1e-6};  // float output of double-accumulated statistics: a few float roundings
constexpr Tol kFloatStats{1e-6, 2e-5};   // statistics accumulated in float over rows of up to ~300
constexpr Tol kPolynomial{1e-6, 1e-6};   // the no-libm exp/tanh/erf polynomials, ~2 ulp, plus float arithmetic

::testing::AssertionResult Close(const std::vector<float>& a, const std::vector<double>& ref, Tol tol,
                                 const std::string& what) {
  if (a.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << a.size() << " vs " << ref.size();
  double mag = 0.0, err = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return ::testing::AssertionFailure() << what << "[" << i << "] is NaN";
    mag = std::max(mag, std::abs(ref[i]));
    const double e = std::abs(static_cast<double>(a[i]) - ref[i]);
    if (e > err) err = e, worst = i;
  }
  if (err <= tol.atol + tol.rtol * mag) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max error " << err << " at " << worst << " (" << a[worst]
                                       << " vs " << ref[worst] << ") > " << tol.atol << " + " << tol.rtol << " * "
                                       << mag;
}

// The paths of a kernel family that this CPU runs, by name; the rest are reported as not run.
std::vector<Isa> runnable(std::initializer_list<Isa> paths, const char* family) {
  std::vector<Isa> out;
  std::string ran, not_run;
  for (Isa p : paths) {
    if (kernels::cpu_supports(p)) {
      out.push_back(p);
      ran += std::string(ran.empty() ? "" : ",") + kernels::isa_name(p);
    } else {
      not_run += std::string(not_run.empty() ? "" : ",") + kernels::isa_name(p);
    }
  }
  std::cout << "[ paths    ] " << family << ": ran " << ran << (not_run.empty() ? "" : "; not on this CPU: ")
            << not_run << "\n";
  ::testing::Test::RecordProperty(std::string(family) + "_paths_run", ran);
  return out;
}

// Odd row lengths around the vector widths (4, 8, 16 lanes), and 1.
const std::vector<int64_t> kWidths{1, 3, 7, 8, 9, 17, 33, 257};

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
    EXPECT_NE(std::string(e.what()).find("portable, avx2, avx2vnni, avx512, avx512vnni, avx512bf16"),
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
  EXPECT_EQ(kernels::sgemm_avx512_supported(), f.avx512);
  std::cout << "[ cpu      ] avx2+fma " << f.avx2 << ", avx512 f/bw/dq/vl " << f.avx512 << ", avx512-vnni "
            << f.avx512_vnni << ", avx512-bf16 " << f.avx512_bf16 << ", avx-vnni " << f.avx_vnni << "\n";
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
  // AVX512-BF16 adds the bf16 products.
  const Isa flash = want == Isa::kAvx512Vnni ? Isa::kAvx512 : want == Isa::kAvx2Vnni ? Isa::kAvx2 : want;
  EXPECT_EQ(std::string(kernels::flash_isa_name(kernels::FlashIsa::kAuto)), kernels::isa_name(flash));
  if (want < Isa::kAvx512) {
    EXPECT_EQ(std::string(kernels::sgemm_backend()), "openblas");
  }
  const std::string bf16 = kernels::lowp_paths().bf16, int8 = kernels::lowp_paths().int8;
  const bool avx2 = want >= Isa::kAvx2;
  if (want >= Isa::kAvx512Bf16) EXPECT_EQ(bf16.rfind("avx512bf16 vdpbf16ps", 0), 0u) << bf16;
  else EXPECT_NE(bf16.find(avx2 ? "float32 avx2 kernels" : "float32 portable kernels"), std::string::npos) << bf16;
  if (want >= Isa::kAvx512Vnni) EXPECT_EQ(int8.rfind("avx512vnni vpdpbusd", 0), 0u) << int8;
  else if (want == Isa::kAvx2Vnni) EXPECT_EQ(int8.rfind("avx2vnni vpdpbusd ymm", 0), 0u) << int8;
  else EXPECT_EQ(int8.rfind(avx2 ? "avx2 vpmaddwd" : "portable", 0), 0u) << int8;
  // The packed int8 product runs on its two builds' paths (the same bits as the unpacked product there) and refuses
  // every other; an int8 linear gives those bits whichever it takes.
  {
    const bool packed_runs = want >= Isa::kAvx512Vnni || want == Isa::kAvx2Vnni;
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

// --- LayerNorm --------------------------------------------------------------------------------------------------

struct LnCase {
  int64_t rows, e;
  bool affine;
};

std::vector<LnCase> ln_cases() {
  std::vector<LnCase> cs;
  for (int64_t e : kWidths)
    for (int64_t rows : {1, 5}) cs.push_back({rows, e, e % 2 == 1});
  cs.push_back({300, 129, true});  // rows·E >= 2^15: the reference's threaded rows; 2^17 is the tape kernels'
  cs.push_back({1100, 127, true});
  return cs;
}

// float64 LayerNorm of one row set: y, mean, rstd.
void ln_oracle(const std::vector<float>& x, const float* w, const float* b, double eps, int64_t rows, int64_t e,
               std::vector<double>& y, std::vector<double>& mean, std::vector<double>& rstd) {
  y.assign(x.size(), 0.0);
  mean.assign(static_cast<size_t>(rows), 0.0);
  rstd.assign(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0.0, q = 0.0;
    for (int64_t j = 0; j < e; ++j) s += x[r * e + j];
    const double m = s / e;
    for (int64_t j = 0; j < e; ++j) q += (x[r * e + j] - m) * (x[r * e + j] - m);
    const double rs = 1.0 / std::sqrt(q / e + eps);
    mean[r] = m;
    rstd[r] = rs;
    for (int64_t j = 0; j < e; ++j)
      y[r * e + j] = (x[r * e + j] - m) * rs * (w ? w[j] : 1.0) + (b ? b[j] : 0.0);
  }
}

// float64 LayerNorm backward: dx, dw, db.
void ln_backward_oracle(const std::vector<float>& x, const float* w, const std::vector<float>& dy, double eps,
                        int64_t rows, int64_t e, std::vector<double>& dx, std::vector<double>& dw,
                        std::vector<double>& db) {
  std::vector<double> y, mean, rstd;
  ln_oracle(x, nullptr, nullptr, eps, rows, e, y, mean, rstd);  // y = x̂
  dx.assign(x.size(), 0.0);
  dw.assign(static_cast<size_t>(e), 0.0);
  db.assign(static_cast<size_t>(e), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double sdn = 0.0, sdnx = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      const double dn = dy[r * e + j] * (w ? w[j] : 1.0);
      sdn += dn;
      sdnx += dn * y[r * e + j];
      dw[j] += dy[r * e + j] * y[r * e + j];
      db[j] += dy[r * e + j];
    }
    for (int64_t j = 0; j < e; ++j) {
      const double dn = dy[r * e + j] * (w ? w[j] : 1.0);
      dx[r * e + j] = rstd[r] * (dn - sdn / e - y[r * e + j] * sdnx / e);
    }
  }
}

TEST(LayerNormKernels, ForwardReferenceAndTapeKernelMatchFloat64Oracle) {
  uint32_t seed = 100;
  for (const LnCase& c : ln_cases()) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " e " + std::to_string(c.e));
    const size_t n = static_cast<size_t>(c.rows * c.e);
    std::vector<float> x = random_floats(n, ++seed);
    for (float& v : x) v += 3.0f;  // an offset mean: centring must not lose it
    const std::vector<float> w = random_floats(c.e, ++seed), b = random_floats(c.e, ++seed);
    const float* pw = c.affine ? w.data() : nullptr;
    const float* pb = c.affine ? b.data() : nullptr;
    std::vector<double> y, mean, rstd;
    ln_oracle(x, pw, pb, 1e-5, c.rows, c.e, y, mean, rstd);
    std::vector<float> yr(n), mr(c.rows), sr(c.rows), yt(n), mt(c.rows), st(c.rows);
    kernels::layer_norm_rows_reference(x.data(), pw, pb, 1e-5f, c.rows, c.e, yr.data(), mr.data(), sr.data());
    kernels::layer_norm_rows(x.data(), pw, pb, 1e-5f, c.rows, c.e, yt.data(), mt.data(), st.data());
    EXPECT_TRUE(Close(yr, y, kDoubleStats, "reference y"));
    EXPECT_TRUE(Close(mr, mean, kDoubleStats, "reference mean"));
    EXPECT_TRUE(Close(sr, rstd, kDoubleStats, "reference rstd"));
    EXPECT_TRUE(Close(yt, y, kFloatStats, "tape y"));
    EXPECT_TRUE(Close(mt, mean, kFloatStats, "tape mean"));
    EXPECT_TRUE(Close(st, rstd, kFloatStats, "tape rstd"));
  }
}

TEST(LayerNormKernels, BackwardReferenceAndTapeKernelMatchFloat64Oracle) {
  uint32_t seed = 200;
  for (const LnCase& c : ln_cases()) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " e " + std::to_string(c.e));
    const size_t n = static_cast<size_t>(c.rows * c.e);
    const std::vector<float> x = random_floats(n, ++seed), dy = random_floats(n, ++seed);
    const std::vector<float> w = random_floats(c.e, ++seed), base = random_floats(n, ++seed);
    const float* pw = c.affine ? w.data() : nullptr;
    std::vector<double> dx, dw, db;
    ln_backward_oracle(x, pw, dy, 1e-5, c.rows, c.e, dx, dw, db);
    std::vector<float> mean(c.rows), rstd(c.rows), y(n);
    kernels::layer_norm_rows_reference(x.data(), nullptr, nullptr, 1e-5f, c.rows, c.e, y.data(), mean.data(),
                                       rstd.data());
    std::vector<float> rdx(n), rdw(c.e), rdb(c.e);
    kernels::layer_norm_rows_backward_reference(x.data(), pw, mean.data(), rstd.data(), dy.data(), c.rows, c.e,
                                                rdx.data(), rdw.data(), rdb.data());
    EXPECT_TRUE(Close(rdx, dx, kDoubleStats, "reference dx"));
    EXPECT_TRUE(Close(rdw, dw, kDoubleStats, "reference dw"));
    EXPECT_TRUE(Close(rdb, db, kDoubleStats, "reference db"));
    std::vector<float> tdx(n), tdw(c.e), tdb(c.e);
    kernels::layer_norm_rows_backward(x.data(), pw, mean.data(), rstd.data(), dy.data(), c.rows, c.e, tdx.data(),
                                      nullptr, tdw.data(), tdb.data());
    EXPECT_TRUE(Close(tdx, dx, kFloatStats, "tape dx"));
    EXPECT_TRUE(Close(tdw, dw, kFloatStats, "tape dw"));
    EXPECT_TRUE(Close(tdb, db, kFloatStats, "tape db"));
    // Accumulating into a base gradient, in place: dx = base + the same.
    std::vector<float> acc = base;
    kernels::layer_norm_rows_backward(x.data(), pw, mean.data(), rstd.data(), dy.data(), c.rows, c.e, acc.data(),
                                      acc.data(), nullptr, nullptr);
    std::vector<double> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = base[i] + dx[i];
    EXPECT_TRUE(Close(acc, want, kFloatStats, "tape dx accumulated"));
  }
}

TEST(LayerNormKernels, FusedResidualLayerNormEveryPathMatchesFloat64Oracle) {
  using Fn = void (*)(float*, const float*, int64_t, const float*, const float*, const float*, int64_t, int64_t,
                      float);
  const std::vector<Isa> paths = runnable({Isa::kPortable, Isa::kAvx2}, "add_layer_norm_rows");
  uint32_t seed = 300;
  for (Isa isa : paths) {
    const Fn fn = isa == Isa::kAvx2 ? kernels::avx2::add_layer_norm_rows : kernels::portable::add_layer_norm_rows;
    for (const LnCase& c : ln_cases())
      for (int terms = 0; terms < 4; ++terms) {  // bit 0: residual x (strided rows), bit 1: bias c
        SCOPED_TRACE(std::string(kernels::isa_name(isa)) + " rows " + std::to_string(c.rows) + " e " +
                     std::to_string(c.e) + " terms " + std::to_string(terms));
        const int64_t xs = c.e + 3;  // x rows further apart than y's
        const size_t n = static_cast<size_t>(c.rows * c.e);
        const std::vector<float> y0 = random_floats(n, ++seed), xr = random_floats(c.rows * xs, ++seed);
        const std::vector<float> cb = random_floats(c.e, ++seed), w = random_floats(c.e, ++seed),
                                 b = random_floats(c.e, ++seed);
        const float* px = terms & 1 ? xr.data() : nullptr;
        const float* pc = terms & 2 ? cb.data() : nullptr;
        const float* pw = c.affine ? w.data() : nullptr;
        const float* pb = c.affine ? b.data() : nullptr;
        std::vector<float> s(n);
        for (int64_t r = 0; r < c.rows; ++r)
          for (int64_t j = 0; j < c.e; ++j)
            s[r * c.e + j] = (px ? px[r * xs + j] : 0.0f) + (y0[r * c.e + j] + (pc ? pc[j] : 0.0f));
        std::vector<double> want, mean, rstd;
        ln_oracle(s, pw, pb, 1e-5, c.rows, c.e, want, mean, rstd);
        std::vector<float> y = y0;
        fn(y.data(), px, xs, pc, pw, pb, c.rows, c.e, 1e-5f);
        EXPECT_TRUE(Close(y, want, kDoubleStats, "y"));
        // The threaded dispatcher gives the result of the path active_isa() selects.
        if (isa == (kernels::active_isa() >= Isa::kAvx2 ? Isa::kAvx2 : Isa::kPortable)) {
          std::vector<float> yd = y0;
          kernels::add_layer_norm_rows(yd.data(), px, xs, pc, pw, pb, c.rows, c.e, 1e-5f);
          EXPECT_EQ(yd, y);
        }
      }
  }
}

// --- activations ------------------------------------------------------------------------------------------------

TEST(ActivationKernels, EveryPathMatchesFloat64Oracle) {
  struct Path {
    Isa isa;
    void (*gelu)(const float*, float*, int64_t, bool);
    void (*gelu_bwd)(const float*, const float*, float*, int64_t, bool);
    void (*tanh)(const float*, float*, int64_t);
    void (*sigmoid)(const float*, float*, int64_t);
    void (*silu)(const float*, float*, int64_t);
  };
  const std::vector<Path> all{
      {Isa::kPortable, kernels::portable::gelu_forward, kernels::portable::gelu_backward,
       kernels::portable::tanh_forward, kernels::portable::sigmoid_forward, kernels::portable::silu_forward},
      {Isa::kAvx2, kernels::avx2::gelu_forward, kernels::avx2::gelu_backward, kernels::avx2::tanh_forward,
       kernels::avx2::sigmoid_forward, kernels::avx2::silu_forward}};
  const std::vector<Isa> paths = runnable({Isa::kPortable, Isa::kAvx2}, "activations");
  const double k = 0.7978845608028654, c = 0.044715;  // sqrt(2/pi), the tanh form's cubic coefficient
  uint32_t seed = 350;
  for (const Path& p : all) {
    if (std::find(paths.begin(), paths.end(), p.isa) == paths.end()) continue;
    for (int64_t n : kWidths) {
      SCOPED_TRACE(std::string(kernels::isa_name(p.isa)) + " n " + std::to_string(n));
      const std::vector<float> x = random_floats(n, ++seed, -8.0f, 8.0f), dy = random_floats(n, ++seed);
      std::vector<double> ge(n), gt(n), dge(n), dgt(n), th(n), sg(n), sl(n);
      for (int64_t i = 0; i < n; ++i) {
        const double v = x[i], t = std::tanh(k * (v + c * v * v * v));
        ge[i] = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
        gt[i] = 0.5 * v * (1.0 + t);
        const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
        dge[i] = dy[i] * (0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) + v * pdf);
        dgt[i] = dy[i] * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * c * v * v));
        th[i] = std::tanh(v);
        sg[i] = 1.0 / (1.0 + std::exp(-v));
        sl[i] = v * sg[i];
      }
      std::vector<float> y(n);
      p.gelu(x.data(), y.data(), n, false);
      EXPECT_TRUE(Close(y, ge, kPolynomial, "gelu"));
      p.gelu(x.data(), y.data(), n, true);
      EXPECT_TRUE(Close(y, gt, kPolynomial, "gelu tanh"));
      p.gelu_bwd(x.data(), dy.data(), y.data(), n, false);
      EXPECT_TRUE(Close(y, dge, kPolynomial, "gelu backward"));
      p.gelu_bwd(x.data(), dy.data(), y.data(), n, true);
      EXPECT_TRUE(Close(y, dgt, kPolynomial, "gelu tanh backward"));
      p.tanh(x.data(), y.data(), n);
      EXPECT_TRUE(Close(y, th, kPolynomial, "tanh"));
      p.sigmoid(x.data(), y.data(), n);
      EXPECT_TRUE(Close(y, sg, kPolynomial, "sigmoid"));
      p.silu(x.data(), y.data(), n);
      EXPECT_TRUE(Close(y, sl, kPolynomial, "silu"));
    }
    // Far tails and infinities: as the libm reference (ops silu_reference) and PyTorch: -inf gives NaN, +inf inf,
    // and below -88 the product underflows to (minus) zero instead of keeping the clamped exp's ~5e-39.
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> x{-inf, -1000.0f, -100.0f, -88.5f, -87.0f, 0.0f, 90.0f, inf, 3.0f};
    std::vector<float> y(x.size());
    p.silu(x.data(), y.data(), static_cast<int64_t>(x.size()));
    EXPECT_TRUE(std::isnan(y[0])) << kernels::isa_name(p.isa);
    for (size_t i = 1; i < 5; ++i) EXPECT_LE(std::abs(y[i]), 1e-30f) << x[i];
    EXPECT_EQ(y[5], 0.0f);
    EXPECT_FLOAT_EQ(y[6], 90.0f);
    EXPECT_EQ(y[7], inf);
  }
}

TEST(ActivationKernels, SiluOpMatchesItsReferenceOnContiguousAndStridedInput) {
  const Tensor x = Tensor::from_vector({6, 37}, random_floats(6 * 37, 77, -12.0f, 12.0f));
  const Tensor fast = silu(x), ref = silu_reference(x);
  const Tensor strided = silu(x.transpose(0, 1)).contiguous();  // a view: the reference loop
  for (int64_t i = 0; i < x.numel(); ++i)
    EXPECT_NEAR(fast.data()[i], ref.data()[i], 1e-6f + 1e-6f * std::abs(ref.data()[i]));
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 37; ++c) EXPECT_EQ(strided.data()[c * 6 + r], ref.data()[r * 37 + c]);
}

// --- bias + GELU ------------------------------------------------------------------------------------------------

TEST(ActivationKernels, AddBiasGeluMatchesFloat64Oracle) {
  uint32_t seed = 400;
  for (bool tanh_approx : {false, true})
    for (int64_t f : {1, 7, 9, 33, 2049})
      for (int64_t rows : {1, 3, 40}) {  // 40 x 2049: several blocks over the threads
        SCOPED_TRACE("f " + std::to_string(f) + " rows " + std::to_string(rows) + " tanh " +
                     std::to_string(tanh_approx));
        const size_t n = static_cast<size_t>(rows * f);
        const std::vector<float> x0 = random_floats(n, ++seed, -5.0f, 5.0f), bias = random_floats(f, ++seed);
        for (bool with_bias : {false, true}) {
          std::vector<double> want(n);
          for (size_t i = 0; i < n; ++i) {
            const double v = static_cast<double>(x0[i] + (with_bias ? bias[i % f] : 0.0f));
            want[i] = tanh_approx ? 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
                                  : 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
          }
          std::vector<float> x = x0;
          kernels::add_bias_gelu_rows(x.data(), with_bias ? bias.data() : nullptr, rows, f, tanh_approx);
          EXPECT_TRUE(Close(x, want, kPolynomial, with_bias ? "gelu(x + b)" : "gelu(x)"));
        }
      }
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
