// Experiment "heads" (article §4): with several heads, each can learn its own relation. A 2-layer, 4-head encoder
// trained on sorting: per-head attention maps, head diversity (mean pairwise Jensen-Shannon divergence, trained vs
// at initialisation) and the accuracy lost when each head alone is switched off.
#include <algorithm>
#include <cmath>

#include "common.h"
#include "qkv/plot/plot.h"
#include "tagger_train.h"

namespace qkv::experiments {
namespace {

// Mean over query rows of the Jensen-Shannon divergence (nats) between the attention rows of heads a and b.
double js_divergence(const Tensor& w, int64_t a, int64_t b) {  // w: (B, H, T, T) contiguous
  const int64_t B = w.size(0), H = w.size(1), T = w.size(2);
  double total = 0;
  for (int64_t n = 0; n < B; ++n)
    for (int64_t i = 0; i < T; ++i) {
      const float* p = w.data() + ((n * H + a) * T + i) * T;
      const float* q = w.data() + ((n * H + b) * T + i) * T;
      double js = 0;
      for (int64_t j = 0; j < T; ++j) {
        const double m = 0.5 * (p[j] + q[j]);
        if (p[j] > 0) js += 0.5 * p[j] * std::log(p[j] / m);
        if (q[j] > 0) js += 0.5 * q[j] * std::log(q[j] / m);
      }
      total += js;
    }
  return total / static_cast<double>(B * T);
}

// Mean pairwise JSD over the heads of each layer, averaged over layers.
double diversity(const Tagger& m, const TagData& data, int64_t T) {
  std::vector<size_t> rows;
  for (size_t i = 0; i < data.size() && rows.size() < 64; ++i)
    if (static_cast<int64_t>(data.src[i].size()) == T) rows.push_back(i);
  Ids ids;
  ids.shape = {static_cast<int64_t>(rows.size()), T};
  for (size_t r : rows) ids.data.insert(ids.data.end(), data.src[r].begin(), data.src[r].end());
  std::vector<Tensor> att;
  TaggerRun run;
  run.attention = &att;
  tagger_logits(m, ids, run);
  double sum = 0;
  int n = 0;
  for (const Tensor& w0 : att) {
    const Tensor w = w0.contiguous();
    for (int64_t a = 0; a < w.size(1); ++a)
      for (int64_t b = a + 1; b < w.size(1); ++b) {
        sum += js_divergence(w, a, b);
        ++n;
      }
  }
  return n ? sum / n : 0.0;
}

}  // namespace

Outcome run_heads(const Options& o) {
  Outcome out;
  const int64_t layers = 2, heads = 4, show_len = 8;
  const int n_seeds = o.quick ? 1 : 2;
  TagTrainConfig tc;
  tc.steps = o.quick ? 40 : 2000;
  tc.batch = 64;
  tc.lr = 2e-3;
  tc.warmup = tc.steps / 10;
  tc.log_every = o.quick ? 0 : 500;
  const TagTask data = make_tag_task("sort", o.quick ? 500 : 8000, o.quick ? 100 : 1000, 3, 10, o.seed + 91);
  Table t;
  t.header = {"seed", "test token acc", "diversity at init (JSD)", "diversity trained (JSD)", "most important head",
              "its ablation drop", "least important head drop"};
  Table ab;
  ab.header = {"seed", "head ablated", "test token accuracy", "drop"};
  json::Value runs = json::Value::array();
  std::vector<double> div_init, div_trained;
  std::vector<std::vector<double>> all_drops;
  for (int s = 0; s < n_seeds; ++s) {
    TaggerConfig cfg;
    cfg.vocab_in = cfg.vocab_out = data.vocab.size();
    cfg.d_model = 64;
    cfg.heads = heads;
    cfg.ff = 128;
    cfg.layers = layers;
    cfg.pos = PosKind::kSinusoidal;
    Rng init(o.seed + 600 + s);
    Tagger m(cfg, init);
    const double d0 = diversity(m, data.test, show_len);
    tc.seed = o.seed + s;
    train_tagger(m, data.train, tc, o, "sort/seed" + std::to_string(s));
    const double d1 = diversity(m, data.test, show_len);
    div_init.push_back(d0);
    div_trained.push_back(d1);
    const double base = eval_tagger(m, data.test).token_accuracy;
    std::vector<double> drops;
    json::Value abl = json::Value::array();
    for (int64_t h = 0; h < layers * heads; ++h) {
      TaggerRun run;
      run.head_mask.assign(static_cast<size_t>(layers * heads), 1.0f);
      run.head_mask[static_cast<size_t>(h)] = 0.0f;
      const double acc = eval_tagger(m, data.test, run).token_accuracy;
      drops.push_back(base - acc);
      const std::string name = std::string("L") + std::to_string(h / heads) + "H" + std::to_string(h % heads);
      ab.rows.push_back({std::to_string(s), name, fmt(acc, 3), fmt(base - acc, 3)});
      json::Value j = json::Value::object();
      j.set("head", name);
      j.set("token_accuracy", acc);
      j.set("drop", base - acc);
      abl.push_back(j);
    }
    all_drops.push_back(drops);
    const size_t best = static_cast<size_t>(std::max_element(drops.begin(), drops.end()) - drops.begin());
    const size_t least = static_cast<size_t>(std::min_element(drops.begin(), drops.end()) - drops.begin());
    auto hname = [&](size_t h) { return std::string("L") + std::to_string(h / heads) + "H" + std::to_string(h % heads); };
    t.rows.push_back({std::to_string(s), fmt(base, 3), fmt(d0, 4), fmt(d1, 4), hname(best), fmt(drops[best], 3),
                      fmt(drops[least], 3)});
    json::Value r = json::Value::object();
    r.set("seed", static_cast<int64_t>(s));
    r.set("test_token_accuracy", base);
    r.set("diversity_init", d0);
    r.set("diversity_trained", d1);
    r.set("ablations", abl);
    runs.push_back(r);

    if (s == 0) {  // maps of one test string, every head of every layer
      size_t pick = 0;
      while (pick < data.test.size() && static_cast<int64_t>(data.test.src[pick].size()) != show_len) ++pick;
      if (pick == data.test.size()) pick = 0;
      const auto& src = data.test.src[pick];
      Ids ids{src, {1, static_cast<int64_t>(src.size())}};
      std::vector<Tensor> att;
      TaggerRun run;
      run.attention = &att;
      tagger_logits(m, ids, run);
      std::vector<std::string> labels;
      for (int64_t id : src) labels.push_back(data.vocab.token(id));
      std::vector<Image> panels;
      for (int64_t l = 0; l < layers; ++l)
        for (int64_t h = 0; h < heads; ++h) {
          plot::Heatmap hm;
          hm.values = att[static_cast<size_t>(l)].select(0, 0).select(0, h).contiguous();
          hm.title = std::string("L") + std::to_string(l) + "H" + std::to_string(h) + "  drop " +
                     fmt(drops[static_cast<size_t>(l * heads + h)], 3);
          hm.row_labels = labels;
          hm.col_labels = labels;
          hm.vmin = 0.0f;
          hm.vmax = 1.0f;
          hm.cell_px = 26;
          hm.colorbar = h == heads - 1;
          panels.push_back(plot::render(hm));
        }
      save_figure(o, out, "head_maps.png",
                  plot::compose(panels, static_cast<int>(heads),
                                "Sorting " + data.vocab.decode(src) + ": attention of each head (rows: queries)"));
      plot::BarChart bc;
      bc.title = "Accuracy lost when one head is switched off (seed 0)";
      bc.y_label = "token accuracy drop";
      for (int64_t h = 0; h < layers * heads; ++h) bc.categories.push_back(hname(static_cast<size_t>(h)));
      bc.groups = {{"", drops, {}}};
      bc.value_labels = true;
      save_figure(o, out, "head_ablation.png", plot::render(bc));
    }
  }
  out.tables.push_back(t);
  out.tables.push_back(ab);
  out.results.set("runs", runs);
  // Criteria fixed before running: trained heads are more diverse than at initialisation in every seed, and the
  // most important head's ablation costs at least 3x the least important's (heads are not interchangeable).
  bool more_diverse = true;
  for (size_t i = 0; i < div_init.size(); ++i) more_diverse = more_diverse && div_trained[i] > div_init[i];
  bool unequal = true;
  for (const auto& drops : all_drops) {
    const double mx = *std::max_element(drops.begin(), drops.end());
    const double mn = *std::min_element(drops.begin(), drops.end());
    unequal = unequal && mx >= 3 * std::max(mn, 0.005);
  }
  out.claim =
      "One set of Q, K, V captures one pattern of attention; several heads attend in parallel in different "
      "subspaces and each learns its own relation.";
  out.setup = "Encoder-only model, 2 layers × 4 heads, d = 64 (d_k = 16), sinusoidal positions, trained to sort digit "
              "strings of length 3–10 (" + std::to_string(tc.steps) + " AdamW steps of 64, " +
              std::to_string(n_seeds) +
              " seed(s)). Diversity: mean Jensen–Shannon divergence (nats, max ln 2 ≈ 0.693) between the attention "
              "rows of every pair of heads in a layer, averaged over 64 test strings of length 8. Ablation: one head's "
              "output multiplied by 0 before the output projection, test token accuracy re-measured.";
  out.verdict = verdict(o, more_diverse && unequal ? "confirmed" : (more_diverse || unequal ? "partly" : "not reproduced"));
  out.discussion = "Head diversity went from " + fmt_pm(div_init, 4) + " at initialisation to " +
                   fmt_pm(div_trained, 4) + " after training. " +
                   std::string(unequal ? "Ablations are strongly unequal: some heads carry the task, others can be "
                                         "removed at little cost, so the heads did not learn the same thing. "
                                       : "Ablation costs are similar across heads. ") +
                   "Which relation each head encodes is read off the maps; we make no claim that heads track "
                   "\"syntax\" or \"coreference\", which a digit-sorting model cannot show.";
  return out;
}

}  // namespace qkv::experiments
