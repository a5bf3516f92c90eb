// Continuous batching's throughput: tokens/s of one stream against n concurrent streams (decode::Scheduler, greedy,
// no stop id) on a GGUF model as stored, SmolLM2-135M-Instruct Q4_1 by default. Each stream continues its own prompt
// by --new tokens; the figure is every stream's tokens over the wall time from the first submit to the last reply
// (prefills included). The sides take turns, --repeats times each, and each figure is the median. It also checks
// that every stream's tokens are the same alone and batched (the kernels' batch invariance).
//
//   OMP_NUM_THREADS=2 ./build-bench/bench/serve_batch_bench [--model F.gguf] [--streams 8] [--new 64]
//                     [--prompt 32] [--repeats 3]
#include <time.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/decode/scheduler.h"
#include "smollm2.h"

namespace {

double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

struct Run {
  double seconds = 0.0;
  int64_t tokens = 0;
  std::vector<std::vector<int64_t>> replies;
};

// The prompts submitted together to a scheduler of max_batch = their number; waits for every reply.
Run serve(const qkv::models::LlamaForCausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
          int64_t new_tokens) {
  qkv::decode::SchedulerOptions so;
  so.max_batch = static_cast<int64_t>(prompts.size());
  so.reuse_prefix = false;
  qkv::decode::Scheduler s(model, so);
  qkv::decode::RequestOptions o;
  o.max_new_tokens = new_tokens;
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  Run run;
  run.replies.resize(prompts.size());
  const double t0 = now();
  for (size_t i = 0; i < prompts.size(); ++i)
    s.submit(prompts[i], o, {}, [&, i](const qkv::decode::RequestResult& r) {
      std::lock_guard<std::mutex> lock(mu);
      run.replies[i] = r.generation.tokens;
      run.tokens += static_cast<int64_t>(r.generation.tokens.size());
      ++done;
      cv.notify_all();
    });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == prompts.size(); });
  run.seconds = now() - t0;
  return run;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  int64_t streams = 8, new_tokens = 64, prompt_len = 32, repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model") model_path = argv[i + 1];
    else if (a == "--streams") streams = std::atoll(argv[i + 1]);
    else if (a == "--new") new_tokens = std::atoll(argv[i + 1]);
    else if (a == "--prompt") prompt_len = std::atoll(argv[i + 1]);
    else if (a == "--repeats") repeats = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "serve_batch_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (streams < 1 || new_tokens < 1 || prompt_len < 1 || repeats < 1) {
    std::fprintf(stderr, "serve_batch_bench: --streams, --new, --prompt and --repeats must be >= 1\n");
    return 2;
  }
  try {
    if (model_path.empty()) model_path = qkv::testing::smollm2_gguf();
    const auto model = qkv::models::LlamaForCausalLM::from_gguf(model_path, std::nullopt);
    const int64_t vocab = model->config().vocab_size;
    std::vector<std::vector<int64_t>> prompts;
    qkv::Rng rng(1);
    for (int64_t i = 0; i < streams; ++i) {
      std::vector<int64_t> p;
      for (int64_t t = 0; t < prompt_len + i; ++t)  // lengths differ: the rows are ragged
        p.push_back(static_cast<int64_t>(rng.uniform() * static_cast<float>(std::min<int64_t>(vocab, 4000))));
      prompts.push_back(std::move(p));
    }
    std::vector<double> one, many;
    bool same = true;
    for (int64_t r = 0; r < repeats; ++r) {
      std::vector<std::vector<int64_t>> alone;
      double seconds = 0.0;
      int64_t tokens = 0;
      for (const auto& p : prompts) {  // one stream at a time
        const Run run = serve(*model, {p}, new_tokens);
        seconds += run.seconds;
        tokens += run.tokens;
        alone.push_back(run.replies[0]);
      }
      one.push_back(static_cast<double>(tokens) / seconds);
      const Run run = serve(*model, prompts, new_tokens);
      many.push_back(static_cast<double>(run.tokens) / run.seconds);
      same = same && run.replies == alone;
    }
    const double a = median(one), b = median(many);
    std::printf("model %s\n", model_path.c_str());
    std::printf("prompts %lld..%lld tokens, %lld new tokens each, greedy, %lld repeats (median)\n",
                static_cast<long long>(prompt_len), static_cast<long long>(prompt_len + streams - 1),
                static_cast<long long>(new_tokens), static_cast<long long>(repeats));
    std::printf("1 stream:   %8.1f tokens/s\n", a);
    std::printf("%lld streams: %8.1f tokens/s in total (%.2fx)\n", static_cast<long long>(streams), b, b / a);
    std::printf("same tokens alone and batched: %s\n", same ? "yes" : "NO");
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve_batch_bench: %s\n", e.what());
    return 1;
  }
}
