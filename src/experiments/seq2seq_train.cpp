// The family-independent parts of the encoder-decoder experiments: encoding text pairs, the training loop (one
// source length per batch, AdamW, warmup + cosine, clipping, through train::Run), batched greedy decoding and sequence scores.
#include "seq2seq_train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "qkv/core/error.h"
#include "qkv/data/tokenizer.h"
#include "qkv/decode/search.h"
#include "qkv/train/run.h"
#include "qkv/train/optim.h"
#include "qkv/train/schedule.h"

namespace qkv::experiments {

const char* s2s_name(S2SKind k) {
  switch (k) {
    case S2SKind::kRnn: return "GRU";
    case S2SKind::kBahdanau: return "GRU+Bahdanau";
    case S2SKind::kLuong: return "GRU+Luong";
    case S2SKind::kTransformer: return "Transformer";
  }
  return "?";
}

S2STask encode_task(const std::vector<data::TextPair>& train, const std::vector<data::TextPair>& test,
                    data::TokenizerKind kind) {
  std::vector<std::string> src, tgt;
  for (const auto& p : train) {
    src.push_back(p.src);
    tgt.push_back(p.tgt);
  }
  S2STask t{data::Vocabulary::build(src, kind), data::Vocabulary::build(tgt, kind), {}, {}};
  for (const auto& p : train) t.train.push_back({t.src_vocab.encode(p.src), t.tgt_vocab.encode(p.tgt)});
  for (const auto& p : test) t.test.push_back({t.src_vocab.encode(p.src), t.tgt_vocab.encode(p.tgt)});
  return t;
}

S2SModel make_s2s(S2SKind kind, int64_t src_vocab, int64_t tgt_vocab, const S2SSize& size, uint64_t seed) {
  train::TextModelConfig t;
  t.source_eos = true;
  if (kind == S2SKind::kTransformer) {
    t.kind = train::TextModelKind::kTransformerSeq2Seq;
    t.mask_target_padding = true;
    models::TransformerSeq2SeqConfig& c = t.transformer;
    c.src_vocab = src_vocab;
    c.tgt_vocab = tgt_vocab;
    c.transformer.layer.d_model = size.d_model;
    c.transformer.layer.nhead = size.heads;
    c.transformer.layer.dim_feedforward = size.ff;
    c.transformer.layer.dropout = size.dropout;
    c.transformer.num_encoder_layers = size.layers;
    c.transformer.num_decoder_layers = size.layers;
  } else {  // GRU without attention, with Bahdanau or with Luong-general
    t.kind = train::TextModelKind::kRnnSeq2Seq;
    models::Seq2SeqConfig& c = t.rnn;
    c.src_vocab = src_vocab;
    c.tgt_vocab = tgt_vocab;
    c.embed_dim = size.embed;
    c.hidden_size = size.hidden;
    c.cell = models::RnnCell::kGRU;
    c.attention = kind == S2SKind::kBahdanau ? models::Seq2SeqAttention::kBahdanau
                  : kind == S2SKind::kLuong  ? models::Seq2SeqAttention::kLuongGeneral
                                             : models::Seq2SeqAttention::kNone;
  }
  Rng rng(seed);
  S2SModel m;
  m.kind = kind;
  m.model = train::make_text_model(t, rng);
  m.module = &m.model->module();
  return m;
}

S2SCurve train_s2s(S2SModel& model, const std::vector<data::Example>& train, const S2STrainConfig& cfg,
                   const Options& o, const std::string& label) {
  QKV_CHECK_ARG(!train.empty() && cfg.steps >= 1 && cfg.batch >= 1, "[experiment] empty training set or steps");
  const auto start = std::chrono::steady_clock::now();
  std::map<size_t, std::vector<size_t>> by_len;
  for (size_t i = 0; i < train.size(); ++i) by_len[train[i].src.size()].push_back(i);
  std::vector<std::vector<size_t>> buckets;
  for (auto& kv : by_len) buckets.push_back(kv.second);
  model.module->train();
  ad::ParameterSet ps(*model.module);
  train::AdamOptions ao;
  ao.lr = cfg.lr;
  ao.weight_decay = 0.01;
  train::AdamW opt(ps, ao);
  train::LrSchedule sched;
  sched.kind = train::LrSchedule::Kind::kWarmupCosine;
  sched.lr = cfg.lr;
  sched.warmup = std::min(cfg.warmup, cfg.steps);
  sched.total_steps = cfg.steps;
  sched.min_lr = cfg.lr * 0.05;
  Rng rng(cfg.seed * 104729 + 5);
  train::RunOptions ro;
  ro.steps = cfg.steps;
  ro.batch_size = cfg.batch;
  ro.clip = cfg.clip;
  ro.dropout_seed = cfg.seed + 99;
  ro.loss.ignore_index = data::Vocabulary::kPad;
  train::Run run(ps, opt, sched, *model.module, static_cast<int64_t>(train.size()), ro);
  S2SCurve curve;
  double acc = 0.0;
  int64_t acc_n = 0;
  std::vector<double> tail;
  train::RunHooks hooks;
  // A bucket with probability proportional to its size, then a batch from it (with replacement).
  hooks.batch = [&](int64_t) {
    size_t pick = rng.below(train.size()), b = 0;
    while (pick >= buckets[b].size()) pick -= buckets[b++].size();
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < cfg.batch; ++i)
      rows.push_back(static_cast<int64_t>(buckets[b][rng.below(buckets[b].size())]));
    return rows;
  };
  hooks.forward = [&](const nn::Context& g, const std::vector<int64_t>& rows) {
    std::vector<const data::Example*> batch;
    for (const int64_t i : rows) batch.push_back(&train[static_cast<size_t>(i)]);
    return model.model->teacher_forced(g, batch);
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
      log(o, label + ": step " + std::to_string(step) + " loss " + fmt(curve.loss.empty() ? r.loss : curve.loss.back(), 4) +
                 " (" + fmt(seconds_since(start), 1) + " s)");
  };
  const train::RunResult rr = run.run(hooks);
  if (rr.diverged) log(o, label + ": non-finite loss at step " + std::to_string(rr.step + 1) + ", stopped");
  curve.final_loss = tail.empty() ? (curve.loss.empty() ? NAN : curve.loss.back()) : mean(tail);
  curve.seconds = seconds_since(start);
  model.module->eval();
  return curve;
}

std::vector<std::vector<int64_t>> greedy_s2s(S2SModel& model, const std::vector<data::Example>& examples,
                                             int64_t max_len) {
  std::vector<size_t> order(examples.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return examples[a].src.size() < examples[b].src.size(); });
  std::vector<std::vector<int64_t>> out(examples.size());
  model.module->eval();
  const decode::SearchOptions so{max_len, data::Vocabulary::kBos, data::Vocabulary::kEos};
  for (size_t start = 0; start < order.size(); start += 128) {
    std::vector<std::vector<int64_t>> sources;
    for (size_t i = start; i < std::min(order.size(), start + 128); ++i) sources.push_back(examples[order[i]].src);
    std::vector<decode::Hypothesis> hyps = decode::greedy_search(*model.model->decoder(sources), so);
    for (size_t i = 0; i < hyps.size(); ++i) {
      std::vector<int64_t>& toks = hyps[i].tokens;
      if (!toks.empty() && toks.back() == data::Vocabulary::kEos) toks.pop_back();
      out[order[start + i]] = std::move(toks);
    }
  }
  return out;
}

Tensor alignment_map(S2SModel& model, const data::Example& example) {
  if (model.kind == S2SKind::kTransformer || model.kind == S2SKind::kRnn) return {};
  const auto* rnn = dynamic_cast<const models::Seq2Seq*>(model.module);
  QKV_CHECK_ARG(rnn != nullptr, "[experiment] alignment maps need the RNN Seq2Seq");
  model.module->eval();
  const data::Seq2SeqBatch b = data::make_seq2seq_batch({&example}, true);
  const models::Seq2SeqOutput o = rnn->forward(b.src.ids, b.src.lengths, b.tgt_in.ids);
  const int64_t tt = b.tgt_out.lengths[0], ts = b.src.lengths[0];
  return o.alignments.select(0, 0).slice(0, 0, tt).slice(1, 0, ts).contiguous();
}

SeqScore score_sequences(const std::vector<std::vector<int64_t>>& hyps, const std::vector<data::Example>& refs) {
  QKV_CHECK_ARG(hyps.size() == refs.size(), "[experiment] ", hyps.size(), " hypotheses for ", refs.size(), " refs");
  SeqScore s;
  if (hyps.empty()) return s;
  double tok = 0;
  for (size_t i = 0; i < hyps.size(); ++i) {
    const auto& h = hyps[i];
    const auto& r = refs[i].tgt;
    s.exact += h == r;
    size_t ok = 0;
    for (size_t t = 0; t < std::min(h.size(), r.size()); ++t) ok += h[t] == r[t];
    tok += static_cast<double>(ok) / static_cast<double>(std::max<size_t>(1, std::max(h.size(), r.size())));
  }
  s.exact /= static_cast<double>(hyps.size());
  s.token_accuracy = tok / static_cast<double>(hyps.size());
  return s;
}

}  // namespace qkv::experiments
