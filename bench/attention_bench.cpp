// Attention benchmark, all ratios measured in one run: the fused kernel (forward, forward+backward), the reference
// path, the machine's ceilings (OpenBLAS sgemm, a stream copy) and PyTorch SDPA + the article's NumPy code.
#include <cblas.h>
#include <omp.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/core/storage_pool.h"
#include "qkv/core/tensor.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/attention_varlen.h"

extern "C" void openblas_set_num_threads(int);

namespace {

using qkv::AttentionOptions;
using qkv::Causal;
using qkv::Shape;
using qkv::Tensor;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Args {
  int threads = 2;
  int reps = 10;
  bool python = true;
  bool quick = false;
  bool variants_only = false;  // --variants: only the attention-variant rows (GQA, window, packed)
  bool sweep_only = false;     // --read-sweep: only the read sweep's GB/s
  bool tiny = false;           // --tiny: the variant rows at small sizes (a smoke run, no numbers)
  std::string python_exe = std::string(QKV_SOURCE_DIR) + "/.venv/bin/python";
  std::string script = std::string(QKV_SOURCE_DIR) + "/bench/torch_sdpa.py";
  std::string json = "out/bench/attention.json";
  std::string memory_child;  // internal: "T,H,D" runs one fused forward and prints "ms extra_mib"
};

// Wall clock, or (--cpu-time) this process's CPU time: with --threads 1 on a machine shared with other jobs, CPU
// time leaves out the time the scheduler gave to others and keeps the ratios meaningful.
bool g_cpu_time = false;

double now() {
  if (g_cpu_time) {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best of `reps` timed calls after one warm-up, in seconds.
double best_of(int reps, const std::function<void()>& f) {
  f();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    f();
    best = std::min(best, now() - t0);
  }
  return best;
}

double max_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

// OpenBLAS sgemm GF/s on n x n matrices: the compute ceiling.
double sgemm_gflops(int n, int reps) {
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 7) * 0.25f - 0.5f;
    b[i] = static_cast<float>(i % 5) * 0.25f - 0.5f;
  }
  const double t = best_of(reps, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                n);
  });
  return 2.0 * n * n * n / t / 1e9;
}

// The ceilings' buffers come from the allocator the tensors use (storage_pool::system_alloc: 2 MiB pages where the
// kernel grants them), so a kernel and its ceiling read memory through the same kind of pages.
struct FreeBuffer {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeBuffer>;
Buffer buffer(int64_t n) {
  Buffer b(static_cast<float*>(qkv::storage_pool::system_alloc(static_cast<size_t>(n) * sizeof(float))));
  if (!b) throw std::bad_alloc();
  return b;
}

// Stream copy GB/s (STREAM convention: bytes read + bytes written) over buffers far larger than the L3 cache.
double stream_copy_gbs(int64_t bytes, int reps, int threads) {
  const int64_t n = bytes / 4;
  const Buffer src = buffer(n), dst = buffer(n);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) src[i] = static_cast<float>(i & 1023), dst[i] = 0.0f;
  const double t = best_of(reps, [&] {
#pragma omp parallel num_threads(threads)
    {
      const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t lo = n * id / nt, hi = n * (id + 1) / nt;
      std::memcpy(dst.get() + lo, src.get() + lo, static_cast<size_t>(hi - lo) * 4);
    }
  });
  return 2.0 * static_cast<double>(n) * 4.0 / t / 1e9;
}

// Read-only sweep GB/s (a sum over the same buffer size): what a kernel that only reads, like decoding, can reach.
double stream_read_gbs(int64_t bytes, int reps, int threads) {
  const int64_t n = bytes / 4;
  const Buffer src = buffer(n);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) src[i] = static_cast<float>(i & 1023);
  volatile float sink = 0.0f;
  const double t = best_of(reps, [&] {
    float total = 0.0f;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
    for (int64_t blk = 0; blk < n / 64; ++blk) {
      float acc[16] = {};
      const float* p = src.get() + blk * 64;
      for (int r = 0; r < 4; ++r)
#pragma omp simd
        for (int l = 0; l < 16; ++l) acc[l] += p[r * 16 + l];
      for (int l = 0; l < 16; ++l) total += acc[l];
    }
    sink = sink + total;
  });
  return static_cast<double>(n / 64 * 64) * 4.0 / t / 1e9;
}

struct Inputs {
  Tensor q, k, v, d_out;
  AttentionOptions o;
  Shape batch;
  float scale = 1.0f;
};

Inputs make_inputs(int64_t b, int64_t h, int64_t tq, int64_t tk, int64_t d, bool causal, bool grad) {
  qkv::Rng rng(42);
  Inputs in;
  in.q = rng.normal({b, h, tq, d});
  in.k = rng.normal({b, h, tk, d});
  in.v = rng.normal({b, h, tk, d});
  if (grad) in.d_out = rng.normal({b, h, tq, d});
  in.o.causal = causal ? Causal::kBottomRight : Causal::kNone;
  in.o.return_lse = true;
  in.batch = qkv::attention_check(in.q, in.k, in.v, in.o, "bench");
  in.scale = qkv::attention_scale(in.o, d);
  return in;
}

struct Row {
  std::string name;
  int64_t b, h, tq, tk, d;
  bool causal;
  std::string mode;  // fwd | fwdbwd | memory | decode
  std::string target;
  // measured
  double qkv_ms = kNaN, ref_ms = kNaN, torch_ms = kNaN, numpy_ms = kNaN;
  double qkv_rss_mib = kNaN, torch_rss_mib = kNaN;
  double flops() const {
    const double f = 4.0 * b * h * tq * tk * d * (causal ? 0.5 : 1.0);
    return mode == "fwdbwd" ? 3.5 * f : f;
  }
  double kv_bytes() const { return 2.0 * b * h * tk * d * 4.0; }
};

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  return out;
}

// The number after "key": in a flat JSON object; NaN when absent.
double json_num(const std::string& s, const std::string& key) {
  const size_t at = s.find("\"" + key + "\"");
  if (at == std::string::npos) return kNaN;
  const size_t colon = s.find(':', at);
  return colon == std::string::npos ? kNaN : std::strtod(s.c_str() + colon + 1, nullptr);
}

std::string json_str(const std::string& s, const std::string& key) {
  const size_t at = s.find("\"" + key + "\"");
  if (at == std::string::npos) return "";
  const size_t q1 = s.find('"', s.find(':', at) + 1), q2 = s.find('"', q1 + 1);
  return (q1 == std::string::npos || q2 == std::string::npos) ? "" : s.substr(q1 + 1, q2 - q1 - 1);
}

void measure_qkv(Row& r, const Args& a) {
  const qkv::kernels::FlashConfig cfg{qkv::kernels::FlashIsa::kAuto, a.threads};
  const bool grad = r.mode == "fwdbwd";
  const Inputs in = make_inputs(r.b, r.h, r.tq, r.tk, r.d, r.causal, grad);
  const int reps = r.mode == "decode" ? 4 * a.reps : a.reps;
  if (!grad) {
    r.qkv_ms = 1e3 * best_of(reps, [&] {
      qkv::kernels::attention_flash_forward(in.q, in.k, in.v, in.o, in.batch, in.scale, cfg);
    });
    const bool ref_fits = static_cast<double>(r.b * r.h * r.tq) * static_cast<double>(r.tk) * 4.0 < 1.5e9;
    if (ref_fits)
      r.ref_ms = 1e3 * best_of(std::max(1, a.reps / 2), [&] { qkv::attention_reference(in.q, in.k, in.v, in.o); });
  } else {
    r.qkv_ms = 1e3 * best_of(reps, [&] {
      const qkv::AttentionResult f =
          qkv::kernels::attention_flash_forward(in.q, in.k, in.v, in.o, in.batch, in.scale, cfg);
      qkv::kernels::attention_flash_backward(in.q, in.k, in.v, f.out, f.lse, in.d_out, in.o, in.batch, in.scale,
                                             cfg);
    });
    r.ref_ms = 1e3 * best_of(std::max(1, a.reps / 2), [&] {
      const qkv::AttentionResult f = qkv::attention_reference(in.q, in.k, in.v, in.o);
      qkv::attention_backward_reference(in.q, in.k, in.v, f.out, f.lse, in.d_out, in.o);
    });
  }
}

// The memory row runs in a fresh process (this program re-executed), so its peak RSS reflects only that forward.
void measure_qkv_memory(Row& r, const Args& a, const char* self) {
  std::ostringstream cmd;
  cmd << "OMP_NUM_THREADS=" << a.threads << " '" << self << "' --threads " << a.threads
      << (g_cpu_time ? " --cpu-time" : "") << " --memory-child " << r.tq << "," << r.h << "," << r.d;
  const std::string out = run_capture(cmd.str());
  std::istringstream is(out);
  is >> r.qkv_ms >> r.qkv_rss_mib;
}

int memory_child(const Args& a) {
  int64_t t = 0, h = 0, d = 0;
  if (std::sscanf(a.memory_child.c_str(), "%ld,%ld,%ld", &t, &h, &d) != 3) return 2;
  const Inputs in = make_inputs(1, h, t, t, d, false, false);
  const qkv::kernels::FlashConfig cfg{qkv::kernels::FlashIsa::kAuto, a.threads};
  // Warm the thread pool on a tiny problem so its stacks are counted in the baseline, not as kernel memory.
  const Inputs small = make_inputs(1, 1, 64, 64, d, false, false);
  qkv::kernels::attention_flash_forward(small.q, small.k, small.v, small.o, small.batch, small.scale, cfg);
  const double base = max_rss_mib();
  const double t0 = now();
  const qkv::AttentionResult r = qkv::kernels::attention_flash_forward(in.q, in.k, in.v, in.o, in.batch, in.scale, cfg);
  const double ms = (now() - t0) * 1e3;
  // Everything the call added, its own output (T x D floats, 8 MiB here) included, as torch's figure includes its.
  std::printf("%.3f %.3f\n", ms, max_rss_mib() - base);
  return r.out.numel() > 0 ? 0 : 1;
}

void measure_python(Row& r, const Args& a) {
  std::ostringstream cmd;
  cmd << "'" << a.python_exe << "' '" << a.script << "' --b " << r.b << " --h " << r.h << " --tq " << r.tq
      << " --tk " << r.tk << " --d " << r.d << " --threads " << a.threads << " --reps " << a.reps << " --mode "
      << (r.mode == "decode" ? "fwd" : r.mode) << (r.causal ? " --causal" : "")
      << (r.mode == "fwd" ? " --numpy" : "") << (g_cpu_time ? " --cpu-time" : "") << " 2>/dev/null";
  const std::string out = run_capture(cmd.str());
  r.torch_ms = json_num(out, "torch_ms");
  r.numpy_ms = json_num(out, "numpy_ms");
  r.torch_rss_mib = json_num(out, "torch_extra_rss_mib");
}

std::string fmt(double x, int prec = 2) {
  if (std::isnan(x)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, x);
  return buf;
}

std::string jnum(double x) { return std::isnan(x) ? "null" : fmt(x, 4); }

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "attention_bench: %s needs a value\n", s.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (s == "--threads") a.threads = std::atoi(next().c_str());
    else if (s == "--reps") a.reps = std::atoi(next().c_str());
    else if (s == "--json") a.json = next();
    else if (s == "--python") a.python_exe = next();
    else if (s == "--no-python") a.python = false;
    else if (s == "--quick") a.quick = true;
    else if (s == "--variants") a.variants_only = true;
    else if (s == "--read-sweep") a.sweep_only = true;
    else if (s == "--tiny") a.tiny = true;
    else if (s == "--cpu-time") g_cpu_time = true;
    else if (s == "--memory-child") a.memory_child = next();
    else {
      std::fprintf(stderr,
                   "usage: attention_bench [--threads N] [--reps N] [--json PATH] [--python EXE] [--no-python] "
                   "[--quick] [--variants] [--read-sweep] [--tiny] [--cpu-time]\n");
      std::exit(2);
    }
  }
  return a;
}

// The attention variants, each ratio measured against a baseline in the same run (the GQA prefill against torch's
// enable_gqa is in bench/torch_sdpa_bench.py).
struct VariantCheck {
  std::string what;
  double value, limit;
  bool at_least;
  std::string detail;
};

std::vector<VariantCheck> measure_variants(const Args& a, double sweep) {
  using qkv::kernels::attention_flash_forward;
  const qkv::kernels::FlashConfig cfg{qkv::kernels::FlashIsa::kAuto, a.threads};
  const int64_t div = a.tiny ? 16 : 1;
  const int reps = a.tiny ? 1 : a.reps;
  qkv::Rng rng(7);
  std::vector<VariantCheck> out;
  {  // GQA decode: 32 query heads over 8 kv heads, one query against Tk keys; K/V must be read once per group.
    const int64_t tk = 8192 / div, d = 128;
    const Tensor q = rng.normal({1, 32, 1, d}), k = rng.normal({1, 8, tk, d}), v = rng.normal({1, 8, tk, d});
    AttentionOptions o;
    o.enable_gqa = true;
    const Shape batch = qkv::attention_check(q, k, v, o, "bench");
    const float scale = qkv::attention_scale(o, d);
    const double t = best_of(4 * reps, [&] { attention_flash_forward(q, k, v, o, batch, scale, cfg); });
    const double gbs = 2.0 * 8 * static_cast<double>(tk) * d * 4.0 / t / 1e9;
    out.push_back({"GQA decode Hq32 Hkv8 Tk" + std::to_string(tk) + " D128: K/V GB/s / read sweep", gbs / sweep,
                   0.8, true, fmt(gbs, 1) + " GB/s, " + fmt(t * 1e3, 3) + " ms"});
  }
  {  // A window of 512 against full causal at T = 16384 (B1 H2 D64): the window's cost must not grow with T.
    const int64_t t = 16384 / div, w = 512 / div;
    const Tensor q = rng.normal({1, 2, t, 64}), k = rng.normal({1, 2, t, 64}), v = rng.normal({1, 2, t, 64});
    AttentionOptions full;
    full.causal = Causal::kBottomRight;
    AttentionOptions win = full;
    win.window_left = w - 1;  // sliding_window = w
    win.window_right = 0;
    const Shape batch = qkv::attention_check(q, k, v, full, "bench");
    const float scale = qkv::attention_scale(full, 64);
    const int r = std::max(1, reps / 5);
    const double tf = best_of(r, [&] { attention_flash_forward(q, k, v, full, batch, scale, cfg); });
    const double tw = best_of(r, [&] { attention_flash_forward(q, k, v, win, batch, scale, cfg); });
    out.push_back({"window " + std::to_string(w) + " / full causal time, T" + std::to_string(t), tw / tf, 0.1,
                   false, fmt(tw * 1e3) + " ms vs " + fmt(tf * 1e3) + " ms"});
  }
  {  // A packed MiniLM-like batch (H12 D32, lengths 5..128) against the same batch padded to 128 with a key mask:
     // the packed time over the padded one, divided by sum T^2 / (B max T^2), should be about 1.
    const int64_t nseq = 64 / div, maxt = 128, h = 12, d = 32;
    std::vector<int32_t> cu{0};
    double sum_t2 = 0.0;
    for (int64_t i = 0; i < nseq; ++i) {
      const int32_t len = static_cast<int32_t>(5 + (i * 37) % 124);
      cu.push_back(cu.back() + len);
      sum_t2 += static_cast<double>(len) * len;
    }
    const Tensor pq = rng.normal({cu.back(), h, d}), pk = rng.normal({cu.back(), h, d});
    const Tensor pv = rng.normal({cu.back(), h, d});
    const Tensor q = rng.normal({nseq, h, maxt, d}), k = rng.normal({nseq, h, maxt, d});
    const Tensor v = rng.normal({nseq, h, maxt, d});
    Tensor keep = Tensor::zeros({nseq, 1, 1, maxt});
    for (int64_t b = 0; b < nseq; ++b)
      for (int64_t j = 0; j < cu[b + 1] - cu[b]; ++j) keep.data()[b * maxt + j] = 1.0f;
    AttentionOptions po;
    po.mask = keep;
    po.mask_kind = qkv::MaskKind::kKeep;
    const Shape batch = qkv::attention_check(q, k, v, po, "bench");
    const float scale = qkv::attention_scale(po, d);
    const double tp = best_of(reps, [&] { qkv::attention_varlen(pq, pk, pv, cu, cu, maxt, maxt); });
    const double tpad = best_of(reps, [&] { attention_flash_forward(q, k, v, po, batch, scale, cfg); });
    const double work = sum_t2 / (static_cast<double>(nseq) * maxt * maxt);
    out.push_back({"packed / padded time over sum T^2 / (B max T^2), B" + std::to_string(nseq), (tp / tpad) / work,
                   1.5, false, fmt(tp * 1e3) + " ms vs " + fmt(tpad * 1e3) + " ms, work ratio " + fmt(work, 3)});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  omp_set_num_threads(a.threads);
  openblas_set_num_threads(a.threads);
  if (!a.memory_child.empty()) return memory_child(a);

  std::vector<Row> rows = {
      {"fwd B1 H8 T2048 D64", 1, 8, 2048, 2048, 64, false, "fwd", ">= 0.75 x sgemm"},
      {"fwd B1 H8 T4096 D64", 1, 8, 4096, 4096, 64, false, "fwd", "no drop vs T=2048"},
      {"fwd B1 H8 T4096 D64 causal", 1, 8, 4096, 4096, 64, true, "fwd", "time <= 0.55 x full"},
      {"fwd+bwd B1 H8 T1024 D64", 1, 8, 1024, 1024, 64, false, "fwdbwd", ">= 0.55 x sgemm (3.5x fwd FLOPs)"},
      {"fwd B1 H1 T32768 D64 (memory)", 1, 1, 32768, 32768, 64, false, "memory", "extra RSS < 64 MiB"},
      {"decode B1 H32 Tq1 Tk4096 D128", 1, 32, 1, 4096, 128, false, "decode", "K/V GB/s >= 0.7 x stream copy"},
  };
  if (a.quick) rows.erase(rows.begin() + 4);  // the 32k row takes the longest
  if (a.sweep_only) {  // the ceiling alone, for another benchmark's bytes-read ratio (llama_cpp_bench.py)
    std::printf("read sweep %.2f GB/s (%d threads, 512 MiB, best of 5)\n",
                stream_read_gbs(int64_t{512} << 20, 5, a.threads), a.threads);
    return 0;
  }
  if (a.variants_only) {
    const double sweep = stream_read_gbs(int64_t{a.tiny ? 32 : 512} << 20, a.tiny ? 1 : 5, a.threads);
    std::printf("qkv attention variants: %d threads, kernels %s, %s, read sweep %.1f GB/s%s\n", a.threads,
                qkv::kernels::flash_isa_name(), cpu_model().c_str(), sweep, a.tiny ? " (tiny sizes)" : "");
    for (const VariantCheck& c : measure_variants(a, sweep)) {
      const bool ok = c.at_least ? c.value >= c.limit : c.value <= c.limit;
      std::printf("  %-66s %8s  (%s %.2f)  %s  [%s]\n", c.what.c_str(), fmt(c.value, 3).c_str(),
                  c.at_least ? ">=" : "<=", c.limit, ok ? "ok" : "MISSED", c.detail.c_str());
    }
    return 0;
  }

  std::fprintf(stderr, "attention_bench: %d threads, kernels %s, %s\n", a.threads,
               qkv::kernels::flash_isa_name(), cpu_model().c_str());
  const double sgemm = sgemm_gflops(a.quick ? 2048 : 3072, 5);
  const double stream = stream_copy_gbs(int64_t{512} << 20, 5, a.threads);
  const double sweep = stream_read_gbs(int64_t{512} << 20, 5, a.threads);
  std::fprintf(stderr, "ceilings: sgemm %.1f GF/s, stream copy %.1f GB/s, read sweep %.1f GB/s\n", sgemm, stream,
               sweep);

  for (Row& r : rows) {
    std::fprintf(stderr, "measuring %s ...\n", r.name.c_str());
    if (r.mode == "memory") measure_qkv_memory(r, a, argv[0]);
    else measure_qkv(r, a);
    if (a.python) measure_python(r, a);
  }

  // Ratios and targets.
  auto gf = [](const Row& r, double ms) { return r.flops() / (ms * 1e-3) / 1e9; };
  const Row& f2k = rows[0];
  const Row& f4k = rows[1];
  const Row& c4k = rows[2];
  struct Check {
    std::string what;
    double value;
    double limit;
    bool at_least;
    bool is_target = true;  // false: shown for information, not counted
  };
  std::vector<Check> checks = {
      {"T=2048 fwd GF/s / sgemm GF/s", gf(f2k, f2k.qkv_ms) / sgemm, 0.75, true},
      {"T=4096 GF/s / T=2048 GF/s", gf(f4k, f4k.qkv_ms) / gf(f2k, f2k.qkv_ms), 0.97, true},
      {"T=4096 causal time / full time", c4k.qkv_ms / f4k.qkv_ms, 0.55, false},
      {"T=1024 fwd+bwd GF/s / sgemm GF/s", gf(rows[3], rows[3].qkv_ms) / sgemm, 0.55, true},
  };
  for (const Row& r : rows) {
    if (r.mode == "memory") checks.push_back({"T=32768 extra RSS MiB", r.qkv_rss_mib, 64.0, false});
    if (r.mode == "decode") {
      const double kv = r.kv_bytes() / (r.qkv_ms * 1e-3) / 1e9;
      checks.push_back({"decode K/V GB/s / stream copy GB/s", kv / stream, 0.7, true});
      checks.push_back({"decode K/V GB/s / read sweep GB/s (information)", kv / sweep, 0.7, true, false});
    }
  }
  for (const Row& r : rows)
    if (!std::isnan(r.torch_ms)) checks.push_back({"torch ms / qkv ms, " + r.name, r.torch_ms / r.qkv_ms, 1.0, true});
  for (const VariantCheck& c : measure_variants(a, sweep)) checks.push_back({c.what, c.value, c.limit, c.at_least});

  std::printf("\nqkv attention benchmark: %d threads, kernels %s, %s, %s\n", a.threads,
              qkv::kernels::flash_isa_name(), cpu_model().c_str(), g_cpu_time ? "CPU time" : "wall time");
  std::printf("ceilings: OpenBLAS sgemm %.1f GF/s, stream copy %.1f GB/s (read + write bytes), read sweep %.1f GB/s\n\n",
              sgemm, stream, sweep);
  std::printf("| %-31s | %9s | %7s | %6s | %9s | %9s | %7s | %9s | %8s |\n", "row", "qkv ms", "GF/s", "xsgemm",
              "ref ms", "torch ms", "GF/s", "numpy ms", "vs torch");
  std::printf("|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", std::string(33, '-').c_str(), std::string(11, '-').c_str(),
              std::string(9, '-').c_str(), std::string(8, '-').c_str(), std::string(11, '-').c_str(),
              std::string(11, '-').c_str(), std::string(9, '-').c_str(), std::string(11, '-').c_str(),
              std::string(10, '-').c_str());
  for (const Row& r : rows) {
    std::printf("| %-31s | %9s | %7s | %6s | %9s | %9s | %7s | %9s | %7sx |\n", r.name.c_str(), fmt(r.qkv_ms).c_str(),
                fmt(gf(r, r.qkv_ms), 1).c_str(), fmt(gf(r, r.qkv_ms) / sgemm).c_str(), fmt(r.ref_ms).c_str(),
                fmt(r.torch_ms).c_str(), fmt(gf(r, r.torch_ms), 1).c_str(), fmt(r.numpy_ms).c_str(),
                fmt(r.torch_ms / r.qkv_ms).c_str());
  }
  for (const Row& r : rows) {
    if (r.mode == "memory")
      std::printf("\nT=32768 extra peak RSS: qkv %s MiB, torch %s MiB\n", fmt(r.qkv_rss_mib, 1).c_str(),
                  fmt(r.torch_rss_mib, 1).c_str());
    if (r.mode == "decode")
      std::printf("decode K/V read: qkv %s GB/s, torch %s GB/s (stream copy %.1f GB/s, read sweep %.1f GB/s)\n",
                  fmt(r.kv_bytes() / (r.qkv_ms * 1e-3) / 1e9, 1).c_str(),
                  fmt(r.kv_bytes() / (r.torch_ms * 1e-3) / 1e9, 1).c_str(), stream, sweep);
  }
  std::printf("\ntargets:\n");
  int missed = 0;
  for (const Check& c : checks) {
    const bool ok = c.at_least ? c.value >= c.limit : c.value <= c.limit;
    missed += c.is_target && !ok;
    std::printf("  %-52s %8s  (%s %.2f)  %s\n", c.what.c_str(), fmt(c.value, 3).c_str(), c.at_least ? ">=" : "<=",
                c.limit, !c.is_target ? "(info)" : ok ? "ok" : "MISSED");
  }

  // JSON
  const std::string dir = a.json.substr(0, a.json.find_last_of('/'));
  if (a.json.find('/') != std::string::npos) std::system(("mkdir -p '" + dir + "'").c_str());
  std::ofstream js(a.json);
  js << "{\n  \"threads\": " << a.threads << ",\n  \"clock\": \"" << (g_cpu_time ? "cpu" : "wall")
     << "\",\n  \"kernels\": \"" << qkv::kernels::flash_isa_name()
     << "\",\n  \"cpu\": \"" << cpu_model() << "\",\n  \"sgemm_gflops\": " << jnum(sgemm)
     << ",\n  \"stream_copy_gbs\": " << jnum(stream) << ",\n  \"read_sweep_gbs\": " << jnum(sweep)
     << ",\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    js << "    {\"name\": \"" << r.name << "\", \"mode\": \"" << r.mode << "\", \"b\": " << r.b << ", \"h\": " << r.h
       << ", \"tq\": " << r.tq << ", \"tk\": " << r.tk << ", \"d\": " << r.d
       << ", \"causal\": " << (r.causal ? "true" : "false") << ", \"flops\": " << jnum(r.flops())
       << ", \"qkv_ms\": " << jnum(r.qkv_ms) << ", \"qkv_gflops\": " << jnum(gf(r, r.qkv_ms))
       << ", \"reference_ms\": " << jnum(r.ref_ms) << ", \"torch_ms\": " << jnum(r.torch_ms)
       << ", \"numpy_ms\": " << jnum(r.numpy_ms) << ", \"qkv_extra_rss_mib\": " << jnum(r.qkv_rss_mib)
       << ", \"torch_extra_rss_mib\": " << jnum(r.torch_rss_mib) << ", \"target\": \"" << r.target << "\"}"
       << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  js << "  ],\n  \"checks\": [\n";
  for (size_t i = 0; i < checks.size(); ++i) {
    const Check& c = checks[i];
    const bool ok = c.at_least ? c.value >= c.limit : c.value <= c.limit;
    js << "    {\"what\": \"" << c.what << "\", \"value\": " << jnum(c.value) << ", \"limit\": " << c.limit
       << ", \"ok\": " << (ok ? "true" : "false") << "}" << (i + 1 < checks.size() ? "," : "") << "\n";
  }
  js << "  ]\n}\n";
  std::printf("\nwrote %s; %d target(s) missed\n", a.json.c_str(), missed);
  return 0;
}
