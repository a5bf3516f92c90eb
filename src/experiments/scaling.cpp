// Experiment "scaling" (article §3, the 1/sqrt(d_k) factor): with unit-variance q and k the dot product has
// variance d_k, so unscaled scores saturate the softmax and starve it of gradient. Part 1 measures this at
// initialisation for d_k = 4..1024; part 2 trains the same Transformer with and without the factor.
#include <cmath>

#include "common.h"
#include "qkv/plot/plot.h"
#include "qkv/ops/matmul.h"
#include "qkv/ops/softmax.h"
#include "tagger_train.h"

namespace qkv::experiments {
namespace {

struct InitStats {
  double entropy = 0.0;    // mean over rows of -sum p log p (nats)
  double max_weight = 0.0; // mean over rows of max_j p_j
  double grad_norm = 0.0;  // mean over rows of ||d loss / d logits|| for a unit-normal upstream gradient
  double grad_q = 0.0;     // mean over rows of ||d loss / d q|| (includes the factor itself: dq = s · dlogits · k)
};

InitStats softmax_stats(int64_t dk, bool scaled, int64_t rows, int64_t keys, Rng& rng) {
  const Tensor q = rng.normal({rows / 16, 16, dk}), k = rng.normal({rows / 16, keys, dk});
  Tensor logits = matmul(q, k.transpose(1, 2));
  if (scaled) {
    const float s = 1.0f / std::sqrt(static_cast<float>(dk));
    float* p = logits.data();
    for (int64_t i = 0; i < logits.numel(); ++i) p[i] *= s;
  }
  const Tensor w = softmax(logits, -1).contiguous();
  const Tensor dy = rng.normal(w.shape());
  const Tensor dx = softmax_backward(w, dy, -1).contiguous();
  const Tensor dq = matmul(dx, k).contiguous();  // times the scale below
  InitStats st;
  const int64_t n = w.numel() / keys;
  for (int64_t r = 0; r < n; ++r) {
    const float* p = w.data() + r * keys;
    const float* g = dx.data() + r * keys;
    double h = 0, mx = 0, gn = 0;
    for (int64_t j = 0; j < keys; ++j) {
      if (p[j] > 0) h -= p[j] * std::log(static_cast<double>(p[j]));
      mx = std::max(mx, static_cast<double>(p[j]));
      gn += static_cast<double>(g[j]) * g[j];
    }
    st.entropy += h;
    st.max_weight += mx;
    st.grad_norm += std::sqrt(gn);
  }
  const float s = scaled ? 1.0f / std::sqrt(static_cast<float>(dk)) : 1.0f;
  for (int64_t r = 0; r < n; ++r) {
    double g = 0;
    for (int64_t c = 0; c < dk; ++c) g += static_cast<double>(dq.data()[r * dk + c]) * dq.data()[r * dk + c];
    st.grad_q += s * std::sqrt(g);
  }
  st.grad_q /= n;
  st.entropy /= n;
  st.max_weight /= n;
  st.grad_norm /= n;
  return st;
}

}  // namespace

Outcome run_scaling(const Options& o) {
  Outcome out;
  // ---- part 1: at initialisation ----
  const int64_t keys = 64, rows = o.quick ? 256 : 2048;
  std::vector<int64_t> dks;
  for (int64_t d = 4; d <= 1024; d *= 2) dks.push_back(d);
  Rng rng(o.seed + 3);
  Table t1;
  t1.header = {"d_k", "entropy scaled", "entropy unscaled", "max weight scaled", "max weight unscaled",
               "grad norm scaled", "grad norm unscaled", "||dq|| scaled", "||dq|| unscaled"};
  std::vector<InitStats> sc, un;
  json::Value part1 = json::Value::array();
  for (int64_t dk : dks) {
    sc.push_back(softmax_stats(dk, true, rows, keys, rng));
    un.push_back(softmax_stats(dk, false, rows, keys, rng));
    t1.rows.push_back({std::to_string(dk), fmt(sc.back().entropy, 3), fmt(un.back().entropy, 3),
                       fmt(sc.back().max_weight, 3), fmt(un.back().max_weight, 3), fmt(sc.back().grad_norm, 4),
                       fmt(un.back().grad_norm, 4), fmt(sc.back().grad_q, 4), fmt(un.back().grad_q, 4)});
    json::Value j = json::Value::object();
    j.set("d_k", dk);
    j.set("entropy_scaled", sc.back().entropy);
    j.set("entropy_unscaled", un.back().entropy);
    j.set("max_weight_scaled", sc.back().max_weight);
    j.set("max_weight_unscaled", un.back().max_weight);
    j.set("grad_norm_scaled", sc.back().grad_norm);
    j.set("grad_norm_unscaled", un.back().grad_norm);
    j.set("grad_q_scaled", sc.back().grad_q);
    j.set("grad_q_unscaled", un.back().grad_q);
    part1.push_back(j);
  }
  out.tables.push_back(t1);
  out.results.set("keys", keys);
  out.results.set("rows", rows);
  out.results.set("init", part1);

  auto chart = [&](const std::string& title, const std::string& ylabel, auto get, bool logy) {
    plot::LineChart c;
    c.title = title;
    c.x_label = "d_k";
    c.y_label = ylabel;
    c.log_x = true;
    c.log_y = logy;
    c.x_ticks.assign(dks.begin(), dks.end());
    plot::Series a, b;
    a.label = "scaled 1/sqrt(d_k)";
    b.label = "unscaled";
    for (size_t i = 0; i < dks.size(); ++i) {
      a.x.push_back(static_cast<double>(dks[i]));
      b.x.push_back(static_cast<double>(dks[i]));
      a.y.push_back(get(sc[i]));
      b.y.push_back(get(un[i]));
    }
    b.dashed = true;
    c.series = {a, b};
    c.width = 520;
    c.height = 380;
    return plot::render(c);
  };
  const Image f1 = chart("Softmax entropy (64 keys)", "nats", [](const InitStats& s) { return s.entropy; }, false);
  const Image f2 = chart("Largest weight per row", "max p", [](const InitStats& s) { return s.max_weight; }, false);
  const Image f3 = chart("Gradient reaching the scores", "||dL/dscores||", [](const InitStats& s) { return s.grad_norm; }, true);
  save_figure(o, out, "init_softmax.png", plot::compose({f1, f2, f3}, 3, "Unit-variance q, k at initialisation"));

  // ---- part 2: training with and without the factor ----
  const int n_seeds = o.quick ? 1 : 3;
  struct Arm {
    int64_t dk;
    bool scaled;
  };
  // Same width for every arm (identical parameter counts): d_k = d_model with one head, or d_k = 16 with
  // d_model / 16 heads.
  const int64_t width = o.quick ? 64 : 256, big = width, small = 16;
  const std::vector<Arm> arms = {{big, true}, {big, false}, {small, true}, {small, false}};
  TagTrainConfig tc;
  tc.steps = o.quick ? 40 : 800;
  tc.batch = 64;
  tc.lr = 1e-3;
  tc.warmup = tc.steps / 10;
  tc.curve_every = o.quick ? 10 : 20;
  tc.log_every = o.quick ? 0 : 400;
  const TagTask data = make_tag_task("reverse", o.quick ? 500 : 6000, o.quick ? 100 : 1000, 3, 8, o.seed + 41);
  Table t2;
  t2.header = {"d_k", "heads", "scale", "final train loss", "test token accuracy", "loss at 25% of steps"};
  json::Value part2 = json::Value::array();
  plot::LineChart curves;
  curves.title = "Reversal, d_model " + std::to_string(width) + ": training loss with and without 1/sqrt(d_k)";
  curves.x_label = "step";
  curves.y_label = "cross-entropy (mean of seeds)";
  curves.log_y = true;
  std::vector<std::vector<double>> final_acc(arms.size());
  for (size_t a = 0; a < arms.size(); ++a) {
    std::vector<double> fl, acc, early;
    std::vector<std::vector<double>> seed_curves;
    std::vector<double> steps;
    for (int s = 0; s < n_seeds; ++s) {
      TaggerConfig c;
      c.vocab_in = c.vocab_out = data.vocab.size();
      c.d_model = width;
      c.heads = width / arms[a].dk;
      c.ff = 2 * width;
      c.layers = 2;
      c.scaled = arms[a].scaled;
      c.pos = PosKind::kSinusoidal;
      Rng init(o.seed + 300 + s);
      Tagger m(c, init);
      tc.seed = o.seed + s;
      const std::string label = "d_k " + std::to_string(arms[a].dk) + (arms[a].scaled ? " scaled" : " unscaled") +
                                " seed " + std::to_string(s);
      const TagCurve cv = train_tagger(m, data.train, tc, o, label);
      fl.push_back(cv.final_loss);
      acc.push_back(eval_tagger(m, data.test).token_accuracy);
      early.push_back(cv.loss[std::min(cv.loss.size() - 1, cv.loss.size() / 4)]);
      seed_curves.push_back(cv.loss);
      steps = cv.step;
    }
    final_acc[a] = acc;
    plot::Series se;
    se.label = "d_k " + std::to_string(arms[a].dk) + (arms[a].scaled ? ", scaled" : ", unscaled");
    se.color = plot::palette(arms[a].dk == big ? 0 : 2);
    se.dashed = !arms[a].scaled;
    se.markers = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      std::vector<double> vals;
      for (const auto& sc2 : seed_curves)
        if (i < sc2.size()) vals.push_back(sc2[i]);
      se.x.push_back(steps[i]);
      se.y.push_back(mean(vals));
      se.spread.push_back(stddev(vals));
    }
    curves.series.push_back(se);
    t2.rows.push_back({std::to_string(arms[a].dk), std::to_string(width / arms[a].dk),
                       arms[a].scaled ? "1/sqrt(d_k)" : "1", fmt_pm(fl, 3), fmt_pm(acc, 3),
                       fmt_pm(early, 3)});
    json::Value j = json::Value::object();
    j.set("d_k", arms[a].dk);
    j.set("scaled", arms[a].scaled);
    j.set("final_train_loss", fl);
    j.set("test_token_accuracy", acc);
    j.set("loss_at_quarter", early);
    j.set("steps", steps);
    json::Value cj = json::Value::array();
    for (const auto& c2 : seed_curves) cj.push(json::Value(c2));
    j.set("loss_curves", cj);
    part2.push_back(j);
  }
  out.tables.push_back(t2);
  out.results.set("training", part2);
  save_figure(o, out, "training_curves.png", plot::render(curves));

  // Verdict criteria (fixed before running): part 1 holds if at d_k = 1024 the unscaled max weight exceeds 0.9 and
  // its gradient norm is under a tenth of the scaled one while the scaled entropy stays within 10% of its d_k = 4
  // value; part 2 holds if at the large d_k the scaled model's test accuracy beats the unscaled one by more than
  // two (pooled) standard deviations.
  const InitStats& s_hi = sc.back();
  const InitStats& u_hi = un.back();
  const bool init_ok = u_hi.max_weight > 0.9 && u_hi.grad_norm < 0.1 * s_hi.grad_norm &&
                       std::fabs(s_hi.entropy - sc.front().entropy) < 0.1 * sc.front().entropy;
  const double gap = mean(final_acc[0]) - mean(final_acc[1]);
  const double spread = std::sqrt(0.5 * (stddev(final_acc[0]) * stddev(final_acc[0]) +
                                         stddev(final_acc[1]) * stddev(final_acc[1])));
  const bool train_ok = gap > 2 * spread && gap > 0.02;
  out.claim =
      "Dot products of d_k-dimensional vectors have variance growing with d_k; without dividing by sqrt(d_k) the "
      "softmax saturates into a near one-hot, its gradient nearly vanishes, and training stalls.";
  out.setup = "Part 1: q ~ N(0, I), k ~ N(0, I), " + std::to_string(rows) + " query rows over " +
              std::to_string(keys) +
              " keys per d_k; the gradient is softmax_backward of a unit-normal upstream gradient, i.e. what reaches "
              "the scores. Part 2: a 2-layer pre-LN encoder with sinusoidal "
              "positions, d_model " + std::to_string(width) + ", trained on digit reversal (lengths 3–8, 6000 examples) for " +
              std::to_string(tc.steps) + " AdamW steps (lr 1e-3, warmup + cosine, clip 1): one head (d_k = " +
              std::to_string(big) + ") or " + std::to_string(width / small) + " heads (d_k = " + std::to_string(small) +
              ", the control: same parameters, small d_k), each with and without the factor, " +
              std::to_string(n_seeds) + " seed(s) each.";
  out.verdict = verdict(o, init_ok && train_ok ? "confirmed" : (init_ok || train_ok ? "partly" : "not reproduced"));
  out.discussion =
      "At d_k = 1024 the unscaled softmax puts " + fmt(u_hi.max_weight, 3) + " of its mass on one key (entropy " +
      fmt(u_hi.entropy, 3) + " nats) and passes a gradient of norm " + fmt(u_hi.grad_norm, 4) + ", against " +
      fmt(s_hi.max_weight, 3) + ", " + fmt(s_hi.entropy, 3) + " nats and " + fmt(s_hi.grad_norm, 4) +
      " with the factor, which keeps all three flat in d_k. The gradient does not vanish outright: it shrinks " +
      fmt(s_hi.grad_norm / u_hi.grad_norm, 1) + "x relative to the scaled case at the scores, and the gradient "
      "reaching q itself is " + fmt(u_hi.grad_q, 3) + " unscaled vs " + fmt(s_hi.grad_q, 3) +
      " scaled (the factor also multiplies the backward pass), so what saturation costs is mostly the softmax's "
      "ability to spread weight, not raw gradient magnitude. In training at d_k = " + std::to_string(big) +
      ", test token accuracy is " + fmt_pm(final_acc[0], 3) + " scaled vs " + fmt_pm(final_acc[1], 3) +
      " unscaled (at d_k = " + std::to_string(small) + ": " + fmt_pm(final_acc[2], 3) + " vs " +
      fmt_pm(final_acc[3], 3) + "). " +
      (train_ok ? "The unscaled model lags clearly."
                : "The training gap is small against the seed spread, so the article's \"training gets stuck\" is "
                  "stronger than what we measured here (one possible reason, not tested: Adam rescales each "
                  "parameter's update, which offsets small gradients).");
  out.discussion += std::string(" Pre-registered criteria: initialisation (unscaled max weight > 0.9, score gradient "
                                "< 1/10 of the scaled one, scaled entropy flat within 10%) ") +
                    (init_ok ? "met" : "not met") + "; training (scaled beats unscaled at the large d_k by more than "
                    "two pooled standard deviations and 0.02) " + (train_ok ? "met" : "not met") + ".";
  return out;
}

}  // namespace qkv::experiments
