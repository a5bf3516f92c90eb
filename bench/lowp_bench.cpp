// GF/s of qkv's linear layer at each precision: float32 (sgemm packing the weight per call, and on the weight
// packed once, as a module whose precision is set reads it), bf16 (vdpbf16ps on weights packed once where the
// CPU has AVX512-BF16, else rounding then float32) and int8 (activation quantization included; vpdpbusd where the
// CPU has AVX512-VNNI, else vpmaddwd), on a square and on MiniLM's and decoding's shapes. The sides take turns,
// `--repeats` times each, so that a machine that slows down slows all alike; each figure is the median. Last,
// decoding from memory: one token through the linear layers of a 12 x 768 Llama (400 MB at fp32), against a read
// sweep over the same weights.
//
//   OMP_NUM_THREADS=2 ./build-bench/bench/lowp_bench [--repeats 7] [--json out.json]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/kernels/cpu.h"
#include "qkv/kernels/lowp.h"
#include "qkv/ops/lowp.h"
#include "qkv/ops/matmul.h"

namespace {

double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

qkv::Tensor randn(qkv::Shape s, uint64_t seed) {
  qkv::Rng rng(seed);
  qkv::Tensor t = qkv::Tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = rng.normal();
  return t;
}

struct Row {
  const char* what;
  int64_t m, n, k;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One decoded token through a 12 x 768 Llama's linear layers (q, k, v, o, gate, up, down per layer, then the 32000-row
// head; GQA 12/4 heads, FFN 2048), each weight its own allocation as a model holds them: 400 MB at fp32, far past
// any cache. Tokens/s at each precision and the weight bytes that reads per second, against a read sweep (a sum over
// every weight, each split between the threads) over the same fp32 weights in the same run.
void decode_from_memory(int repeats) {
  struct Shape2 {
    int64_t n, k;
  };
  std::vector<Shape2> shapes;
  for (int l = 0; l < 12; ++l)
    for (Shape2 s : {Shape2{768, 768}, {256, 768}, {256, 768}, {768, 768}, {2048, 768}, {2048, 768}, {768, 2048}})
      shapes.push_back(s);
  shapes.push_back({32000, 768});
  std::vector<qkv::Tensor> w;
  std::vector<qkv::LinearWeight> w16, w8;
  double params = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    w.push_back(randn({shapes[i].n, shapes[i].k}, 10 + i));
    w16.emplace_back(w.back(), qkv::Precision::kBFloat16);
    w8.emplace_back(w.back(), qkv::Precision::kInt8);
    params += static_cast<double>(shapes[i].n * shapes[i].k);
  }
  const qkv::Tensor x768 = randn({1, 768}, 4), x2048 = randn({1, 2048}, 5);
  const int tokens = 10;
  std::vector<double> t[4];
  volatile float sink = 0.0f;
  for (int rep = 0; rep <= repeats; ++rep)
    for (int side = 0; side < 4; ++side) {
      const double t0 = now();
      for (int tok = 0; tok < tokens; ++tok)
        for (size_t i = 0; i < w.size(); ++i) {
          const qkv::Tensor& x = shapes[i].k == 768 ? x768 : x2048;
          if (side == 0) {  // the read sweep
            const float* p = w[i].data();
            const int64_t n = w[i].numel();
            float total = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : total)
            for (int64_t b = 0; b < n / 64; ++b) {
              float acc[16] = {};
              for (int r = 0; r < 4; ++r)
#pragma omp simd
                for (int l = 0; l < 16; ++l) acc[l] += p[b * 64 + r * 16 + l];
              for (int l = 0; l < 16; ++l) total += acc[l];
            }
            sink = sink + total;
            continue;
          }
          const qkv::Tensor y = side == 1 ? qkv::linear(x, w[i]) : qkv::linear(x, side == 2 ? w16[i] : w8[i]);
          sink = sink + y.data()[0];
        }
      if (rep > 0) t[side].push_back((now() - t0) / tokens);
    }
  const double sweep = params * 4 / median(t[0]) * 1e-9;
  std::printf("  Llama 12x768 decode from memory (%.0f MB at fp32): read sweep %.1f GB/s\n", params * 4 / 1e6, sweep);
  const char* names[] = {"", "fp32", "bf16", "int8"};
  const double bytes[] = {0, 4, 2, 1};
  for (int side = 1; side < 4; ++side) {
    const double gbs = params * bytes[side] / median(t[side]) * 1e-9;
    std::printf("    %s  %6.1f tokens/s  %5.1f GB/s of weights (%.2f of the sweep)\n", names[side],
                1.0 / median(t[side]), gbs, gbs / sweep);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 7;
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else {
      std::fprintf(stderr, "usage: lowp_bench [--repeats N] [--json out.json]\n");
      return 2;
    }
  }
  const Row rows[] = {{"square 2048^3", 2048, 2048, 2048},
                      {"MiniLM QKV 1024x1152x384", 1024, 1152, 384},
                      {"MiniLM FFN up 1024x1536x384", 1024, 1536, 384},
                      {"MiniLM FFN down 1024x384x1536", 1024, 384, 1536},
                      {"decode 1x4096x4096", 1, 4096, 4096},
                      {"decode 8x4096x4096", 8, 4096, 4096},
                      {"short sentence 16x384x384", 16, 384, 384},
                      {"short sentence 16x1536x384", 16, 1536, 384},
                      {"32x4096x4096", 32, 4096, 4096},
                      {"Llama prefill 128x768x768", 128, 768, 768},
                      {"Llama prefill 128x2048x768", 128, 2048, 768},
                      {"Llama prefill 128x768x2048", 128, 768, 2048},
                      {"Llama decode 1x256x768", 1, 256, 768},
                      {"Llama decode 1x768x768", 1, 768, 768},
                      {"Llama decode 1x2048x768", 1, 2048, 768},
                      {"Llama decode 1x768x2048", 1, 768, 2048},
                      {"Llama decode head 1x32000x768", 1, 32000, 768}};
  const qkv::kernels::LowpPaths paths = qkv::kernels::lowp_paths();
  std::printf("qkv linear at fp32 / bf16 / int8, %d repeats (median), isa %s\n  bf16: %s\n  int8: %s\n", repeats,
              qkv::kernels::isa_name(qkv::kernels::active_isa()), paths.bf16, paths.int8);
  std::string out = "{\"isa\": \"" + std::string(qkv::kernels::isa_name(qkv::kernels::active_isa())) + "\", \"rows\": [";
  for (const Row& r : rows) {
    const qkv::Tensor x = randn({r.m, r.k}, 1), w = randn({r.n, r.k}, 2), b = randn({r.n}, 3);
    const qkv::LinearWeight w32(w, qkv::Precision::kFloat32), w16(w, qkv::Precision::kBFloat16),
        w8(w, qkv::Precision::kInt8);
    const qkv::LinearWeight* lw[] = {nullptr, &w32, &w16, &w8};  // side 0: the bare weight, packed per call
    const double flop = 2.0 * r.m * r.n * r.k;
    // Enough calls per timing for about 50 ms at 100 GF/s.
    const int calls = std::max(1, static_cast<int>(5e9 / flop));
    std::vector<double> t[4];
    for (int rep = 0; rep <= repeats; ++rep) {
      for (int side = 0; side < 4; ++side) {
        const double t0 = now();
        for (int c = 0; c < calls; ++c) {
          qkv::Tensor y = side == 0 ? qkv::linear(x, w, b) : qkv::linear(x, *lw[side], b);
          if (y.data()[0] == 12345.678f) std::printf(" ");
        }
        if (rep > 0) t[side].push_back((now() - t0) / calls);  // rep 0 warms up
      }
    }
    double gf[4];
    for (int side = 0; side < 4; ++side) {
      std::sort(t[side].begin(), t[side].end());
      gf[side] = flop / t[side][t[side].size() / 2] * 1e-9;
    }
    std::printf("  %-32s fp32 %7.1f GF/s   packed once %7.1f (%.2fx)   bf16 %7.1f GF/s (%.2fx fp32)   "
                "int8 %7.1f GF/s (%.2fx fp32, %.2fx bf16)\n",
                r.what, gf[0], gf[1], gf[1] / gf[0], gf[2], gf[2] / gf[0], gf[3], gf[3] / gf[0], gf[3] / gf[2]);
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s{\"shape\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"fp32_gflops\": %.2f, "
                  "\"fp32_packed_gflops\": %.2f, \"bf16_gflops\": %.2f, \"int8_gflops\": %.2f}",
                  &r == rows ? "" : ", ", r.what, static_cast<long long>(r.m), static_cast<long long>(r.n),
                  static_cast<long long>(r.k), gf[0], gf[1], gf[2], gf[3]);
    out += buf;
  }
  out += "]}\n";
  decode_from_memory(repeats);
  if (json) {
    FILE* f = std::fopen(json, "w");
    if (!f) {
      std::fprintf(stderr, "lowp_bench: cannot write %s\n", json);
      return 1;
    }
    std::fputs(out.c_str(), f);
    std::fclose(f);
  }
  return 0;
}
