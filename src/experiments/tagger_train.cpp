// Tagger training (one length per batch, AdamW, warmup + cosine, clipping, through train::Run) and per-length evaluation.
#include "tagger_train.h"

#include <algorithm>
#include <cmath>

#include "qkv/core/error.h"
#include "qkv/data/tasks.h"
#include "qkv/train/run.h"
#include "qkv/train/optim.h"
#include "qkv/train/schedule.h"

namespace qkv::experiments {
namespace {

TagData encode_pairs(const std::vector<data::TextPair>& pairs, const data::Vocabulary& vocab) {
  TagData d;
  for (const auto& p : pairs) {
    d.src.push_back(vocab.encode(p.src));
    d.tgt.push_back(vocab.encode(p.tgt));
    QKV_ASSERT(d.src.back().size() == d.tgt.back().size());
  }
  return d;
}

Ids batch_ids(const std::vector<std::vector<int64_t>>& seqs, const std::vector<size_t>& rows) {
  const int64_t T = static_cast<int64_t>(seqs[rows[0]].size());
  Ids ids;
  ids.shape = {static_cast<int64_t>(rows.size()), T};
  for (size_t r : rows) ids.data.insert(ids.data.end(), seqs[r].begin(), seqs[r].end());
  return ids;
}

}  // namespace

TagTask make_tag_task(const std::string& name, int64_t train_size, int64_t test_size, int64_t min_len,
                      int64_t max_len, uint64_t seed) {
  data::TaskOptions to;
  to.train_size = train_size;
  to.test_size = test_size;
  to.min_len = min_len;
  to.max_len = max_len;
  to.seed = seed;
  const data::Task t = data::make_task(name, to);
  TagTask out{data::Vocabulary::build({"0123456789"}, data::TokenizerKind::kChar), {}, {}};
  out.train = encode_pairs(t.train, out.vocab);
  out.test = encode_pairs(t.test, out.vocab);
  return out;
}

TagData make_tag_data(const std::string& name, const data::Vocabulary& vocab, int64_t size, int64_t min_len,
                      int64_t max_len, uint64_t seed) {
  data::TaskOptions to;
  to.train_size = size;
  to.test_size = 0;
  to.min_len = min_len;
  to.max_len = max_len;
  to.seed = seed;
  return encode_pairs(data::make_task(name, to).train, vocab);
}

TagCurve train_tagger(Tagger& model, const TagData& data, const TagTrainConfig& cfg, const Options& o,
                      const std::string& label) {
  QKV_CHECK_ARG(data.size() > 0 && cfg.steps >= 1 && cfg.batch >= 1, "[experiment] empty training set or steps");
  std::map<size_t, std::vector<size_t>> by_len;
  for (size_t i = 0; i < data.size(); ++i) by_len[data.src[i].size()].push_back(i);
  std::vector<std::vector<size_t>> buckets;
  for (auto& kv : by_len) buckets.push_back(kv.second);

  ad::ParameterSet ps(model);
  train::AdamOptions ao;
  ao.lr = cfg.lr;
  ao.weight_decay = cfg.weight_decay;
  train::AdamW opt(ps, ao);
  train::LrSchedule sched;
  sched.kind = train::LrSchedule::Kind::kWarmupCosine;
  sched.lr = cfg.lr;
  sched.warmup = std::min(cfg.warmup, cfg.steps);
  sched.total_steps = cfg.steps;
  sched.min_lr = cfg.lr * 0.05;
  Rng rng(cfg.seed * 7919 + 17);
  train::RunOptions ro;
  ro.steps = cfg.steps;
  ro.batch_size = cfg.batch;
  ro.clip = cfg.clip;
  ro.dropout_seed = 0;  // the tagger has no dropout
  train::Run run(ps, opt, sched, model, static_cast<int64_t>(data.size()), ro);
  TagCurve curve;
  double acc = 0.0;
  int64_t acc_n = 0;
  std::vector<double> tail;
  train::RunHooks hooks;
  // A bucket with probability proportional to its size, then a batch from it (with replacement).
  hooks.batch = [&](int64_t) {
    size_t pick = rng.below(data.size()), b = 0;
    while (pick >= buckets[b].size()) pick -= buckets[b++].size();
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < cfg.batch; ++i)
      rows.push_back(static_cast<int64_t>(buckets[b][rng.below(buckets[b].size())]));
    return rows;
  };
  hooks.forward = [&](const nn::Context& g, const std::vector<int64_t>& rows) {
    const std::vector<size_t> r(rows.begin(), rows.end());
    const Ids tgt = batch_ids(data.tgt, r);
    return train::TeacherForced{model.forward(g, batch_ids(data.src, r)), tgt.data,
                                static_cast<int64_t>(tgt.data.size())};
  };
  hooks.on_step = [&](const train::RunStep& r) {
    const int64_t step = r.step;
    acc += r.loss;
    ++acc_n;
    if (step > cfg.steps - std::max<int64_t>(1, cfg.steps / 10)) tail.push_back(r.loss);
    if (step % cfg.curve_every == 0 || step == cfg.steps) {
      curve.step.push_back(static_cast<double>(step));
      curve.loss.push_back(acc / acc_n);
      acc = 0.0;
      acc_n = 0;
    }
    if (cfg.log_every > 0 && step % cfg.log_every == 0)
      log(o, label + ": step " + std::to_string(step) + " loss " + fmt(curve.loss.empty() ? r.loss : curve.loss.back(), 4));
  };
  const train::RunResult rr = run.run(hooks);
  if (rr.diverged) {
    curve.diverged = true;
    log(o, label + ": non-finite loss at step " + std::to_string(rr.step + 1) + ", stopped");
  }
  curve.final_loss = tail.empty() ? (curve.loss.empty() ? NAN : curve.loss.back()) : mean(tail);
  return curve;
}

TagEval eval_tagger(const Tagger& model, const TagData& data, const TaggerRun& run) {
  std::map<size_t, std::vector<size_t>> by_len;
  for (size_t i = 0; i < data.size(); ++i) by_len[data.src[i].size()].push_back(i);
  TagEval e;
  int64_t tok = 0, tok_ok = 0, seq = 0, seq_ok = 0;
  for (const auto& [len, rows_all] : by_len) {
    int64_t ltok = 0, ltok_ok = 0, lseq_ok = 0;
    for (size_t start = 0; start < rows_all.size(); start += 256) {
      const std::vector<size_t> rows(rows_all.begin() + static_cast<std::ptrdiff_t>(start),
                                     rows_all.begin() + static_cast<std::ptrdiff_t>(std::min(rows_all.size(), start + 256)));
      const Tensor logits = tagger_logits(model, batch_ids(data.src, rows), run).contiguous();
      const int64_t V = logits.size(2);
      const float* p = logits.data();
      for (size_t r = 0; r < rows.size(); ++r) {
        bool all = true;
        for (size_t t = 0; t < len; ++t) {
          const float* row = p + (static_cast<int64_t>(r) * static_cast<int64_t>(len) + static_cast<int64_t>(t)) * V;
          const int64_t arg = std::max_element(row, row + V) - row;
          const bool ok = arg == data.tgt[rows[r]][t];
          ltok_ok += ok;
          all = all && ok;
        }
        ltok += static_cast<int64_t>(len);
        lseq_ok += all;
      }
    }
    e.by_length[static_cast<int64_t>(len)] = {static_cast<double>(ltok_ok) / ltok,
                                              static_cast<double>(lseq_ok) / rows_all.size()};
    tok += ltok;
    tok_ok += ltok_ok;
    seq += static_cast<int64_t>(rows_all.size());
    seq_ok += lseq_ok;
  }
  e.token_accuracy = tok ? static_cast<double>(tok_ok) / tok : 0.0;
  e.exact_match = seq ? static_cast<double>(seq_ok) / seq : 0.0;
  return e;
}

}  // namespace qkv::experiments
