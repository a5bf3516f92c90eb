// Experiment "components" (article §4 table): residual connections let gradients through so that layers can stack,
// and LayerNorm stabilises training. Ablations across depth: pre-LN (the reference), post-LN, no LayerNorm,
// no residuals; loss curves and final accuracy on reversal.
#include <algorithm>
#include <cmath>
#include <map>

#include "common.h"
#include "qkv/plot/plot.h"
#include "tagger_train.h"

namespace qkv::experiments {

Outcome run_components(const Options& o) {
  Outcome out;
  struct Variant {
    std::string name;
    NormKind norm;
    bool residual;
  };
  const std::vector<Variant> variants = {{"pre-LN + residual", NormKind::kPre, true},
                                         {"post-LN + residual", NormKind::kPost, true},
                                         {"no LayerNorm + residual", NormKind::kNone, true},
                                         {"pre-LN, no residual", NormKind::kPre, false}};
  const std::vector<int64_t> depths = o.quick ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2, 6, 12};
  const int n_seeds = o.quick ? 1 : 2;
  TagTrainConfig tc;
  tc.steps = o.quick ? 30 : 1200;
  tc.batch = 64;
  tc.lr = 1e-3;
  tc.warmup = tc.steps / 10;
  tc.curve_every = o.quick ? 10 : 20;
  const TagTask data = make_tag_task("reverse", o.quick ? 500 : 6000, o.quick ? 100 : 1000, 3, 8, o.seed + 81);

  Table t;
  t.header = {"layers", "variant", "params", "final train loss", "steps to loss < 0.1", "test token accuracy",
              "test exact match"};
  json::Value runs = json::Value::array();
  std::vector<Image> panels;
  std::map<int64_t, std::map<std::string, double>> acc, reach;
  plot::BarChart bars;
  bars.title = "Test token accuracy after " + std::to_string(tc.steps) + " steps";
  bars.y_label = "token accuracy";
  bars.y_min = 0.0;
  bars.y_max = 1.05;
  for (int64_t d : depths) bars.categories.push_back(std::to_string(d) + " layers");
  for (const Variant& v : variants) bars.groups.push_back({v.name, {}, {}});
  for (size_t di = 0; di < depths.size(); ++di) {
    const int64_t depth = depths[di];
    plot::LineChart c;
    c.title = std::to_string(depth) + " layer" + (depth > 1 ? "s" : "");
    c.x_label = "step";
    c.y_label = "train loss";
    c.log_y = true;
    c.width = 480;
    c.height = 340;
    c.legend = plot::LineChart::Legend::kTopRight;
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      const Variant& v = variants[vi];
      std::vector<double> fl, tok, ex, to01;
      std::vector<std::vector<double>> curves;
      std::vector<double> steps;
      int64_t params = 0;
      for (int s = 0; s < n_seeds; ++s) {
        TaggerConfig cfg;
        cfg.vocab_in = cfg.vocab_out = data.vocab.size();
        cfg.d_model = 64;
        cfg.heads = 4;
        cfg.ff = 128;
        cfg.layers = depth;
        cfg.norm = v.norm;
        cfg.residual = v.residual;
        cfg.pos = PosKind::kSinusoidal;
        Rng init(o.seed + 500 + s);
        Tagger m(cfg, init);
        params = m.num_parameters();
        tc.seed = o.seed + s;
        const TagCurve cv = train_tagger(m, data.train, tc, o, std::to_string(depth) + "L " + v.name);
        const TagEval e = eval_tagger(m, data.test);
        fl.push_back(cv.diverged ? NAN : cv.final_loss);
        tok.push_back(e.token_accuracy);
        ex.push_back(e.exact_match);
        curves.push_back(cv.loss);
        double first = NAN;  // first logged step whose mean loss is under 0.1 (NaN: never)
        for (size_t i = 0; i < cv.loss.size(); ++i)
          if (cv.loss[i] < 0.1) {
            first = cv.step[i];
            break;
          }
        to01.push_back(first);
        if (cv.step.size() > steps.size()) steps = cv.step;
      }
      acc[depth][v.name] = mean(tok);
      reach[depth][v.name] = mean(to01);  // NaN when any seed never got there
      log(o, std::to_string(depth) + " layers, " + v.name + ": token accuracy " + fmt_pm(tok, 3));
      t.rows.push_back({std::to_string(depth), v.name, std::to_string(params), fmt_pm(fl, 3),
                        std::isnan(mean(to01)) ? "never" : fmt_pm(to01, 0), fmt_pm(tok, 3), fmt_pm(ex, 3)});
      bars.groups[vi].values.push_back(mean(tok));
      bars.groups[vi].errors.push_back(stddev(tok));
      plot::Series se;
      se.label = v.name;
      se.color = plot::palette(static_cast<int>(vi));
      se.markers = false;
      for (size_t i = 0; i < steps.size(); ++i) {
        std::vector<double> vals;
        for (const auto& cv : curves)
          if (i < cv.size()) vals.push_back(cv[i]);
        se.x.push_back(steps[i]);
        se.y.push_back(mean(vals));
      }
      c.series.push_back(se);
      json::Value r = json::Value::object();
      r.set("layers", depth);
      r.set("variant", v.name);
      r.set("params", params);
      r.set("final_train_loss", fl);
      r.set("test_token_accuracy", tok);
      r.set("test_exact_match", ex);
      r.set("steps_to_loss_0.1", to01);
      r.set("steps", steps);
      json::Value cj = json::Value::array();
      for (const auto& cv : curves) cj.push(json::Value(cv));
      r.set("loss_curves", cj);
      runs.push_back(r);
    }
    panels.push_back(plot::render(c));
  }
  out.tables.push_back(t);
  out.results.set("runs", runs);
  save_figure(o, out, "loss_curves.png",
              plot::compose(panels, static_cast<int>(depths.size()), "Reversal: training loss by depth and variant"));
  save_figure(o, out, "final_accuracy.png", plot::render(bars));

  // Criteria: at the largest depth, pre-LN + residual beats "no residual" by more than 0.2 token accuracy
  // (residuals carry deep stacks), and reaches a training loss of 0.1 at least 20% sooner than "no LayerNorm"
  // (LayerNorm speeds up convergence). The first version judged LayerNorm by final accuracy (> 0.05 better); in the
  // first full run every residual variant reached 1.0, so that could not separate them: the article's claim is
  // about convergence, which the steps-to-0.1 column measures. Both are reported.
  const int64_t deep = depths.back();
  const double ref = acc[deep]["pre-LN + residual"];
  const bool res_ok = ref - acc[deep]["pre-LN, no residual"] > 0.2;
  const double r_ln = reach[deep]["pre-LN + residual"], r_noln = reach[deep]["no LayerNorm + residual"];
  const bool ln_ok = !std::isnan(r_ln) && (std::isnan(r_noln) || r_ln <= 0.8 * r_noln);
  const bool ln_final = ref - acc[deep]["no LayerNorm + residual"] > 0.05;
  out.claim =
      "Residual connections let the gradient pass straight through and make deep stacks trainable; LayerNorm keeps "
      "each layer's output distribution stable and speeds up convergence.";
  out.setup = "Encoder-only model (4 heads, d = 64, feed-forward 128, sinusoidal positions) on digit reversal, lengths "
              "3–8, at depths " +
              [&] {
                std::string s;
                for (int64_t d : depths) s += (s.empty() ? "" : ", ") + std::to_string(d);
                return s;
              }() +
              ". Variants: pre-LN with residuals (x + f(LN(x)), final LN), post-LN with residuals (LN(x + f(x))), "
              "residuals without any LayerNorm, and pre-LN without residuals (x = f(LN(x))). Same init, data, " +
              std::to_string(tc.steps) + " AdamW steps (lr 1e-3, warmup 10% + cosine, clip 1), " +
              std::to_string(n_seeds) + " seed(s).";
  out.verdict = verdict(o, res_ok && ln_ok ? "confirmed" : (res_ok || ln_ok ? "partly" : "not reproduced"));
  std::string disc = "At " + std::to_string(deep) + " layers: pre-LN + residual " + fmt(ref, 3) + ", post-LN " +
                     fmt(acc[deep]["post-LN + residual"], 3) + ", no LayerNorm " +
                     fmt(acc[deep]["no LayerNorm + residual"], 3) + ", no residual " +
                     fmt(acc[deep]["pre-LN, no residual"], 3) + " test token accuracy (chance ≈ 0.1). ";
  disc += "Steps to a training loss of 0.1 at " + std::to_string(deep) + " layers: pre-LN " +
          (std::isnan(r_ln) ? std::string("never") : fmt(r_ln, 0)) + ", post-LN " +
          (std::isnan(reach[deep]["post-LN + residual"]) ? std::string("never") : fmt(reach[deep]["post-LN + residual"], 0)) +
          ", no LayerNorm " + (std::isnan(r_noln) ? std::string("never") : fmt(r_noln, 0)) + ". ";
  disc += std::string("Residual criterion ") + (res_ok ? "met" : "not met") + "; LayerNorm convergence criterion " +
          (ln_ok ? "met" : "not met") + " (final-accuracy version: " + (ln_final ? "met" : "not met") + "). ";
  disc += "At " + std::to_string(depths.front()) + " layers the same four reach " +
          fmt(acc[depths.front()]["pre-LN + residual"], 3) + ", " + fmt(acc[depths.front()]["post-LN + residual"], 3) +
          ", " + fmt(acc[depths.front()]["no LayerNorm + residual"], 3) + ", " +
          fmt(acc[depths.front()]["pre-LN, no residual"], 3) + ".";
  auto range = [&](int64_t d) {
    double lo = 1e9, hi = -1e9;
    for (const auto& kv : acc[d]) {
      lo = std::min(lo, kv.second);
      hi = std::max(hi, kv.second);
    }
    return hi - lo;
  };
  disc += range(deep) > range(depths.front()) + 0.05
              ? " The spread between variants widens with depth: the components matter more as the stack grows."
              : " The spread between variants does not widen with depth here.";
  out.discussion = disc;
  return out;
}

}  // namespace qkv::experiments
