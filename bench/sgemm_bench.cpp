// GF/s of qkv::kernels::sgemm against OpenBLAS cblas_sgemm (default core type, and OPENBLAS_CORETYPE=SKYLAKEX in
// a child process) on the linear-layer shapes of training and MiniLM, forward NT, dX NN and dW TN, plus squares.
#include <omp.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/kernels/sgemm.h"

extern "C" void openblas_set_num_threads(int);

namespace {

using qkv::kernels::sgemm;
using qkv::kernels::sgemm_reference;

struct Shape {
  std::string group, op;
  bool ta, tb;
  int64_t m, n, k;
  std::string key() const {
    std::string o = op;
    std::replace(o.begin(), o.end(), ' ', '_');
    return o + "/" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  }
};

// A linear layer y = x Wᵀ with x (M, K), W (N, K): forward NT (M, N, K), dX = dY W NN (M, K, N), dW = dYᵀ X TN
// (N, K, M).
void add_linear(std::vector<Shape>& out, const std::string& group, int64_t M, int64_t N, int64_t K) {
  out.push_back({group, "fwd NT", false, true, M, N, K});
  out.push_back({group, "dX NN", false, false, M, K, N});
  out.push_back({group, "dW TN", true, false, N, K, M});
}

std::vector<Shape> shapes(bool quick) {
  std::vector<Shape> s;
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{384, 128}, {128, 128}, {512, 128}, {128, 512}, {64, 128}})
    add_linear(s, "train", 4096, n, k);
  for (int64_t m : {600, 1900})
    for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{1152, 384}, {384, 384}, {1536, 384}, {384, 1536}})
      add_linear(s, "minilm", m, n, k);
  s.push_back({"square", "NN", false, false, 1024, 1024, 1024});
  if (!quick) s.push_back({"square", "NN", false, false, 3072, 3072, 3072});
  return s;
}

double now(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Buffers {
  std::vector<float> a, b, c;
};

Buffers make(const Shape& s) {
  qkv::Rng rng(1);
  Buffers x;
  x.a.resize(static_cast<size_t>(s.m * s.k));
  x.b.resize(static_cast<size_t>(s.k * s.n));
  x.c.assign(static_cast<size_t>(s.m * s.n), 0.0f);
  for (float& v : x.a) v = rng.uniform(-1.0f, 1.0f);
  for (float& v : x.b) v = rng.uniform(-1.0f, 1.0f);
  return x;
}

// Best-of-`reps` GF/s; each rep repeats the call until ~40 ms have passed. One thread: process CPU time (robust to
// a busy machine); more threads: wall time.
double gflops(bool blas, const Shape& s, Buffers& x, int threads, int reps) {
  const int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
  auto call = [&] {
    if (blas)
      sgemm_reference(s.ta, s.tb, s.m, s.n, s.k, 1.0f, x.a.data(), lda, x.b.data(), ldb, 0.0f, x.c.data(), s.n);
    else
      sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, x.a.data(), lda, x.b.data(), ldb, 0.0f, x.c.data(), s.n);
  };
  const clockid_t clock = threads == 1 ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC;
  call();  // warm up (buffers, threads)
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    int iters = 0;
    const double t0 = now(clock);
    double t = t0;
    do {
      call();
      ++iters;
      t = now(clock);
    } while (t - t0 < 0.04);
    best = std::min(best, (t - t0) / iters);
  }
  return 2.0 * double(s.m) * double(s.n) * double(s.k) / best * 1e-9;
}

// Runs this program with OPENBLAS_CORETYPE=SKYLAKEX --blas-only and reads "threads key gflops" lines.
std::map<std::string, double> skylakex(const std::string& threads_arg, int reps, bool quick,
                                       const std::string& only) {
  std::map<std::string, double> out;
  char self[4096] = {0};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) return out;
  const std::string cmd = std::string("OPENBLAS_CORETYPE=SKYLAKEX '") + self + "' --blas-only --threads " +
                          threads_arg + " --reps " + std::to_string(reps) + (quick ? " --quick" : "") +
                          (only.empty() ? "" : " --only " + only);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char line[512];
  while (fgets(line, sizeof(line), p)) {
    char key[256];
    int t = 0;
    double g = 0;
    if (sscanf(line, "%d %255s %lf", &t, key, &g) == 3) out[std::to_string(t) + " " + key] = g;
  }
  pclose(p);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  bool blas_only = false, qkv_only = false, quick = false, no_skx = false;
  std::string threads_arg = "1,2", only;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--blas-only") blas_only = true;
    else if (a == "--qkv-only") qkv_only = true, no_skx = true;
    else if (a == "--quick") quick = true;
    else if (a == "--no-skylakex") no_skx = true;
    else if (a == "--threads" && i + 1 < argc) threads_arg = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: sgemm_bench [--threads 1,2] [--reps N] [--quick] [--no-skylakex] [--only train|minilm|square]\n"
                   "                   [--blas-only | --qkv-only]\n"
                   "  --blas-only: OpenBLAS only, one 'threads shape gflops' line per case (used with\n"
                   "  OPENBLAS_CORETYPE=SKYLAKEX by the parent run)\n");
      return 2;
    }
  }
  std::vector<int> thread_counts;
  for (const char* p = threads_arg.c_str(); *p;) {
    thread_counts.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  std::vector<Shape> all = shapes(quick);
  if (!only.empty())
    all.erase(std::remove_if(all.begin(), all.end(), [&](const Shape& s) { return s.group != only; }), all.end());
  if (blas_only) {
    for (int t : thread_counts) {
      omp_set_num_threads(t);
      openblas_set_num_threads(t);
      for (const Shape& s : all) {
        Buffers x = make(s);
        std::printf("%d %s %.2f\n", t, s.key().c_str(), gflops(true, s, x, t, reps));
        std::fflush(stdout);
      }
    }
    return 0;
  }
  const std::map<std::string, double> skx = no_skx ? std::map<std::string, double>{}
                                                   : skylakex(threads_arg, reps, quick, only);
  std::printf("qkv sgemm backend: %s; GF/s, best of %d (1 thread: CPU time; more: wall time)\n",
              qkv::kernels::sgemm_backend(), reps);
  std::printf("%-7s %-7s %5s %5s %5s %3s %8s %8s %6s %8s %6s\n", "group", "op", "m", "n", "k", "thr", "qkv",
              "blas", "x", "blas-skx", "x-skx");
  for (int t : thread_counts) {
    omp_set_num_threads(t);
    openblas_set_num_threads(t);
    for (const Shape& s : all) {
      Buffers x = make(s);
      const double q = gflops(false, s, x, t, reps);
      const double b = qkv_only ? 0.0 : gflops(true, s, x, t, reps);
      const auto it = skx.find(std::to_string(t) + " " + s.key());
      const double k = it == skx.end() ? 0.0 : it->second;
      std::printf("%-7s %-7s %5lld %5lld %5lld %3d %8.1f %8.1f %6.2f %8.1f %6.2f\n", s.group.c_str(), s.op.c_str(),
                  (long long)s.m, (long long)s.n, (long long)s.k, t, q, b, b > 0 ? q / b : 0.0, k, k > 0 ? q / k : 0.0);
      std::fflush(stdout);
    }
  }
  return 0;
}
