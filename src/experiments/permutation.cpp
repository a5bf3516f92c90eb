// Experiment "permutation" (article §4): without positional information self-attention is a set operation —
// shuffling the input shuffles the output the same way — and each positional encoding breaks that; an
// order-sensitive task (reversal) is then learned only with positions, while copying (order-blind) needs none.
#include <algorithm>
#include <cmath>

#include "common.h"
#include "qkv/plot/plot.h"
#include "tagger_train.h"

namespace qkv::experiments {
namespace {

struct Deviation {
  double per_position = 0.0;  // max |f(P x) - P f(x)| / max |f(x)|
  double pooled = 0.0;        // max |mean_t f(P x) - mean_t f(x)| / max |f(x)|
  double scale = 0.0;         // max |f(x)|
};

Deviation permutation_deviation(const Tagger& m, const Ids& ids, const std::vector<int64_t>& perm) {
  const int64_t B = ids.shape[0], T = ids.shape[1];
  Ids shuffled = ids;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) shuffled.data[b * T + t] = ids.data[b * T + perm[t]];
  const Tensor y = tagger_logits(m, ids).contiguous(), yp = tagger_logits(m, shuffled).contiguous();
  const int64_t V = y.size(2);
  Deviation d;
  for (int64_t i = 0; i < y.numel(); ++i) d.scale = std::max(d.scale, std::fabs(static_cast<double>(y.data()[i])));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t v = 0; v < V; ++v) {
        const double a = yp.data()[(b * T + t) * V + v], c = y.data()[(b * T + perm[t]) * V + v];
        d.per_position = std::max(d.per_position, std::fabs(a - c));
      }
    for (int64_t v = 0; v < V; ++v) {
      double sa = 0, sc = 0;
      for (int64_t t = 0; t < T; ++t) {
        sa += yp.data()[(b * T + t) * V + v];
        sc += y.data()[(b * T + t) * V + v];
      }
      d.pooled = std::max(d.pooled, std::fabs(sa - sc) / T);
    }
  }
  d.per_position /= d.scale;
  d.pooled /= d.scale;
  return d;
}

}  // namespace

Outcome run_permutation(const Options& o) {
  Outcome out;
  // ---- part 1: equivariance at initialisation, every positional encoding ----
  const int64_t B = 8, T = 16;
  Rng rng(o.seed + 11);
  Ids ids;
  ids.shape = {B, T};
  for (int64_t i = 0; i < B * T; ++i) ids.data.push_back(4 + static_cast<int64_t>(rng.below(10)));
  std::vector<int64_t> perm(T);
  for (int64_t t = 0; t < T; ++t) perm[t] = t;
  for (int64_t t = T - 1; t > 0; --t) std::swap(perm[t], perm[rng.below(static_cast<uint64_t>(t + 1))]);

  Table t1;
  t1.header = {"positional encoding", "max |f(Px) - P f(x)| / max|f|", "pooled output change", "equivariant?"};
  json::Value part1 = json::Value::array();
  plot::BarChart bc;
  bc.title = "Shuffle the input: how far is f(Px) from P f(x)?";
  bc.y_label = "relative deviation";
  bc.log_y = true;
  bc.groups = {{"per position", {}, {}}, {"mean-pooled", {}, {}}};
  bc.value_labels = false;
  const double kFloatLevel = 1e-5;  // relative deviations below this are float32 rounding
  bool none_equivariant = false, all_others_break = true;
  double none_dev = 0.0, min_other_dev = 1e30;
  for (PosKind p : all_pos_kinds()) {
    TaggerConfig c;
    c.vocab_in = c.vocab_out = 14;
    c.d_model = 64;
    c.heads = 4;
    c.ff = 128;
    c.layers = 2;
    c.pos = p;
    Rng init(o.seed + 100);
    Tagger m(c, init);
    const Deviation d = permutation_deviation(m, ids, perm);
    const bool eq = d.per_position < kFloatLevel;
    if (p == PosKind::kNone) {
      none_equivariant = eq && d.pooled < kFloatLevel;
      none_dev = d.per_position;
    } else {
      all_others_break = all_others_break && !eq;
      min_other_dev = std::min(min_other_dev, d.per_position);
    }
    t1.rows.push_back({pos_name(p), fmt(d.per_position, 8), fmt(d.pooled, 8), eq ? "yes" : "no"});
    json::Value j = json::Value::object();
    j.set("positional", pos_name(p));
    j.set("max_rel_deviation", d.per_position);
    j.set("pooled_rel_deviation", d.pooled);
    j.set("output_scale", d.scale);
    part1.push_back(j);
    bc.categories.push_back(pos_name(p));
    bc.groups[0].values.push_back(std::max(d.per_position, 1e-9));
    bc.groups[1].values.push_back(std::max(d.pooled, 1e-9));
  }
  out.tables.push_back(t1);
  out.results.set("equivariance_at_init", part1);
  save_figure(o, out, "equivariance.png", plot::render(bc));

  // ---- part 3: reversal needs positions; copying does not ----
  const int64_t min_len = 3, max_len = o.quick ? 6 : 10;
  const int n_seeds = o.quick ? 1 : 3;
  TagTrainConfig tc;
  tc.steps = o.quick ? 60 : 1000;
  tc.batch = 64;
  tc.lr = 2e-3;
  tc.warmup = tc.steps / 10;
  tc.log_every = o.quick ? 0 : 500;
  Table t3;
  t3.header = {"task", "positions", "test token accuracy", "test exact match", "final train loss"};
  json::Value part3 = json::Value::array();
  plot::BarChart acc_chart;
  acc_chart.title = "Learned with and without positional encoding";
  acc_chart.y_label = "test token accuracy";
  acc_chart.y_min = 0.0;
  acc_chart.y_max = 1.05;
  acc_chart.value_labels = true;
  acc_chart.groups = {{"no positions", {}, {}}, {"sinusoidal", {}, {}}};
  std::map<std::string, std::map<std::string, std::vector<double>>> acc_of;
  for (const std::string task : {"copy", "reverse"}) {
    acc_chart.categories.push_back(task);
    for (PosKind p : {PosKind::kNone, PosKind::kSinusoidal}) {
      std::vector<double> tok, ex, fl;
      for (int s = 0; s < n_seeds; ++s) {
        const TagTask data = make_tag_task(task, o.quick ? 500 : 6000, o.quick ? 100 : 1000, min_len, max_len,
                                           o.seed + 31 + s);
        TaggerConfig c;
        c.vocab_in = c.vocab_out = data.vocab.size();
        c.d_model = 64;
        c.heads = 4;
        c.ff = 128;
        c.layers = 2;
        c.pos = p;
        Rng init(o.seed + 200 + s);
        Tagger m(c, init);
        tc.seed = o.seed + s;
        const TagCurve curve = train_tagger(m, data.train, tc, o, task + "/" + pos_name(p) + "/seed" + std::to_string(s));
        const TagEval e = eval_tagger(m, data.test);
        tok.push_back(e.token_accuracy);
        ex.push_back(e.exact_match);
        fl.push_back(curve.final_loss);
      }
      acc_of[task][pos_name(p)] = tok;
      t3.rows.push_back({task, pos_name(p), fmt_pm(tok, 3), fmt_pm(ex, 3), fmt_pm(fl, 3)});
      json::Value j = json::Value::object();
      j.set("task", task);
      j.set("positional", pos_name(p));
      j.set("token_accuracy", tok);
      j.set("exact_match", ex);
      j.set("final_train_loss", fl);
      part3.push_back(j);
      acc_chart.groups[p == PosKind::kNone ? 0 : 1].values.push_back(mean(tok));
      acc_chart.groups[p == PosKind::kNone ? 0 : 1].errors.push_back(stddev(tok));
    }
  }
  out.tables.push_back(t3);
  out.results.set("training", part3);
  save_figure(o, out, "reversal_needs_positions.png", plot::render(acc_chart));

  const double rev_none = mean(acc_of["reverse"]["none"]), rev_sin = mean(acc_of["reverse"]["sinusoidal"]);
  const double copy_none = mean(acc_of["copy"]["none"]);
  const bool learned = rev_sin > 0.9 && copy_none > 0.9 && rev_none < 0.5;
  out.claim =
      "Self-attention by itself is a set operation: shuffle the words and the result is the same (the outputs are "
      "shuffled along), so a positional encoding is required to give the model word order.";
  out.setup = "Part 1: a 2-layer, 4-head, d = 64 pre-LN Transformer encoder at initialisation, batch of " +
              std::to_string(B) + " random digit strings of length " + std::to_string(T) +
              ", one random permutation P; the deviation is max |f(Px) − P f(x)| relative to max |f(x)| over all output "
              "logits, and the same for the mean over positions. Part 3: the same encoder trained to emit, at each "
              "position, the target token (copy: the input; reverse: the input read backwards), lengths " +
              std::to_string(min_len) + "–" + std::to_string(max_len) + ", " + std::to_string(tc.steps) +
              " AdamW steps of batch 64, " + std::to_string(n_seeds) + " seed(s), with no positions vs sinusoidal.";
  out.verdict = verdict(o, none_equivariant && all_others_break && learned
                               ? "confirmed"
                               : (none_equivariant && all_others_break ? "partly" : "not reproduced"));
  out.discussion =
      "Without positions the relative deviation is " + fmt(none_dev, 8) +
      ", float32 rounding, so the encoder is permutation-equivariant and mean-pooled outputs are "
      "invariant — the article's \"shuffle the words, same result\" holds in that precise sense. Every positional "
      "encoding breaks it (smallest relative deviation " + fmt(min_other_dev, 4) + "), including the relative ones (Shaw, T5, RoPE, ALiBi), which are "
      "equivariant only to shifts, not to shuffles. Training: reversal reaches " + fmt(rev_sin, 3) +
      " token accuracy with sinusoidal positions against " + fmt(rev_none, 3) +
      " without; copying, which needs no order, reaches " + fmt(copy_none, 3) +
      " without positions, so the failure is about order, not capacity.";
  return out;
}

}  // namespace qkv::experiments
