// Experiment "translation" (real data): git's own French and Simplified Chinese message catalogs, as Debian installs
// them, read with qkv's .mo parser. RNN without attention vs RNN with attention vs Transformer, character level;
// corpus BLEU-4 per source-length bucket (Bahdanau et al.'s Figure 2 in miniature) and chrF.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>

#include "common.h"
#include "qkv/core/error.h"
#include "qkv/plot/plot.h"
#include "qkv/corpus/mo.h"
#include "qkv/data/tokenizer.h"
#include "qkv/eval/metrics.h"
#include "seq2seq_train.h"

namespace qkv::experiments {
namespace {

// FNV-1a of the English source: the split depends on the message only, not on file order or platform.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

int64_t words(const std::string& s) { return static_cast<int64_t>(data::tokenize(s, data::TokenizerKind::kWord).size()); }

struct Bucket {
  int64_t lo, hi;  // source words, inclusive
  std::string name() const { return std::to_string(lo) + (hi >= 99 ? "+" : "-" + std::to_string(hi)); }
};

}  // namespace

Outcome run_translation(const Options& o) {
  Outcome out;
  struct Lang {
    std::string code, name;
    eval::BleuTokenizer tok;
    int64_t max_tgt_chars;
  };
  const std::vector<Lang> langs = {{"fr", "French", eval::BleuTokenizer::k13a, 60},
                                   {"zh_CN", "Simplified Chinese", eval::BleuTokenizer::kZh, 30}};
  const int64_t max_src_chars = o.quick ? 20 : 40;
  const std::vector<Bucket> buckets = {{1, 2}, {3, 4}, {5, 6}, {7, 99}};
  const std::vector<S2SKind> kinds = {S2SKind::kRnn, S2SKind::kBahdanau, S2SKind::kTransformer};
  S2SSize sz;
  sz.embed = 64;
  sz.hidden = o.quick ? 32 : 128;
  sz.d_model = o.quick ? 32 : 96;
  sz.heads = 4;
  sz.ff = o.quick ? 64 : 192;
  sz.layers = 2;
  sz.dropout = o.quick ? 0.0f : 0.1f;
  S2STrainConfig tc;
  tc.steps = o.quick ? 20 : 2000;
  tc.batch = 64;
  tc.lr = 2e-3;
  tc.warmup = o.quick ? 2 : 200;
  tc.log_every = o.quick ? 0 : 500;
  tc.seed = o.seed;

  Table summary;
  summary.header = {"target", "model", "params", "train s", "BLEU", "chrF"};
  for (const Bucket& b : buckets) summary.header.push_back("BLEU " + b.name() + " w");
  json::Value langs_json = json::Value::array();
  std::vector<Image> panels;
  // bleu[lang][kind] -> overall, per bucket
  std::map<std::string, std::map<S2SKind, std::pair<double, std::vector<double>>>> bleu;
  std::string licences;
  for (const Lang& lang : langs) {
    const std::string path = "/usr/share/locale/" + lang.code + "/LC_MESSAGES/git.mo";
    QKV_CHECK_RUNTIME(std::filesystem::exists(path), "[experiment translation] ", path,
                      " is missing: install Debian's git package (it ships its translations)");
    const data::MoCatalog cat = data::load_mo(path);
    data::MoPairOptions po;
    po.max_chars = std::max(max_src_chars, lang.max_tgt_chars);
    std::vector<data::TextPair> train, test;
    for (const auto& p : data::mo_to_pairs(cat, po)) {
      if (static_cast<int64_t>(p.src.size()) > max_src_chars) continue;
      int64_t tgt_chars = 0;
      for (unsigned char c : p.tgt) tgt_chars += (c & 0xC0) != 0x80;
      if (tgt_chars > lang.max_tgt_chars) continue;
      (fnv1a(p.src) % 10 == 0 ? test : train).push_back(p);
    }
    if (o.quick) {
      train.resize(std::min<size_t>(train.size(), 300));
      test.resize(std::min<size_t>(test.size(), 40));
    }
    licences += lang.name + " catalog: " + path + " (" + std::to_string(cat.entries.size()) + " messages; header: " +
                cat.header_field("Language-Team") + "; " + cat.header_field("Project-Id-Version") + "). ";
    const S2STask task = encode_task(train, test);
    log(o, lang.code + ": " + std::to_string(train.size()) + " train / " + std::to_string(test.size()) +
               " test pairs, vocab " + std::to_string(task.src_vocab.size()) + " -> " +
               std::to_string(task.tgt_vocab.size()));
    plot::LineChart c;
    c.title = "English -> " + lang.name;
    c.x_label = "source length (words)";
    c.y_label = "corpus BLEU-4";
    c.y_min = 0.0;
    c.width = 520;
    c.height = 380;
    for (size_t b = 0; b < buckets.size(); ++b) {
      c.x_ticks.push_back(static_cast<double>(b + 1));
      c.x_tick_labels.push_back(buckets[b].name());
    }
    json::Value lj = json::Value::object();
    lj.set("target", lang.code);
    lj.set("catalog", path);
    lj.set("train_pairs", static_cast<int64_t>(train.size()));
    lj.set("test_pairs", static_cast<int64_t>(test.size()));
    json::Value models = json::Value::array();
    for (size_t ki = 0; ki < kinds.size(); ++ki) {
      const S2SKind k = kinds[ki];
      S2SModel m = make_s2s(k, task.src_vocab.size(), task.tgt_vocab.size(), sz, o.seed + 900 + ki);
      const S2SCurve cv = train_s2s(m, task.train, tc, o, lang.code + "/" + s2s_name(k));
      const auto hyps_ids = greedy_s2s(m, task.test, lang.max_tgt_chars + 10);
      std::vector<std::string> hyps, refs;
      for (size_t i = 0; i < test.size(); ++i) {
        hyps.push_back(task.tgt_vocab.decode(hyps_ids[i]));
        refs.push_back(test[i].tgt);
      }
      const double b_all = eval::corpus_bleu(hyps, refs, lang.tok).score;
      const double chrf = eval::corpus_chrf(hyps, refs).score;
      std::vector<double> per;
      json::Value pb = json::Value::array();
      plot::Series se;
      se.label = s2s_name(k);
      se.color = plot::palette(static_cast<int>(ki));
      for (size_t b = 0; b < buckets.size(); ++b) {
        std::vector<std::string> h, r;
        for (size_t i = 0; i < test.size(); ++i) {
          const int64_t w = words(test[i].src);
          if (w >= buckets[b].lo && w <= buckets[b].hi) {
            h.push_back(hyps[i]);
            r.push_back(refs[i]);
          }
        }
        const double v = h.empty() ? NAN : eval::corpus_bleu(h, r, lang.tok).score;
        per.push_back(v);
        se.x.push_back(static_cast<double>(b + 1));
        se.y.push_back(v);
        json::Value j = json::Value::object();
        j.set("bucket_words", buckets[b].name());
        j.set("n", static_cast<int64_t>(h.size()));
        j.set("bleu", v);
        j.set("chrf", h.empty() ? NAN : eval::corpus_chrf(h, r).score);
        pb.push_back(j);
      }
      c.series.push_back(se);
      bleu[lang.code][k] = {b_all, per};
      std::vector<std::string> row = {lang.code, s2s_name(k), std::to_string(m.num_parameters()), fmt(cv.seconds, 1),
                                      fmt(b_all, 2), fmt(chrf, 2)};
      for (double v : per) row.push_back(fmt(v, 2));
      summary.rows.push_back(row);
      json::Value mj = json::Value::object();
      mj.set("model", s2s_name(k));
      mj.set("params", m.num_parameters());
      mj.set("train_seconds", cv.seconds);
      mj.set("final_train_loss", cv.final_loss);
      mj.set("loss_curve", cv.loss);
      mj.set("bleu", b_all);
      mj.set("chrf", chrf);
      mj.set("by_source_words", pb);
      json::Value ex = json::Value::array();
      for (size_t i = 0; i < std::min<size_t>(8, test.size()); ++i) {
        json::Value e = json::Value::object();
        e.set("source", test[i].src);
        e.set("reference", refs[i]);
        e.set("output", hyps[i]);
        ex.push_back(e);
      }
      mj.set("examples", ex);
      models.push_back(mj);
      log(o, lang.code + "/" + s2s_name(k) + ": BLEU " + fmt(b_all, 2) + ", chrF " + fmt(chrf, 2));
    }
    lj.set("models", models);
    langs_json.push_back(lj);
    panels.push_back(plot::render(c));
  }
  out.tables.push_back(summary);
  out.results.set("languages", langs_json);
  std::string bucket_names;
  for (size_t b = 0; b < buckets.size(); ++b)
    bucket_names += (b ? ", " : "") + std::to_string(b + 1) + " = " + buckets[b].name() + " words";
  out.results.set("buckets", bucket_names);
  save_figure(o, out, "bleu_by_length.png", plot::compose(panels, 2, "git messages: BLEU by source length"));

  // Criteria fixed before running: (1) in both languages an attention model (Bahdanau or Transformer) beats the
  // no-attention GRU in overall BLEU; (2) from the shortest to the longest bucket the no-attention GRU loses more
  // BLEU than the better attention model.
  bool beats = true, drops_more = true;
  std::string disc;
  for (const Lang& lang : langs) {
    auto& m = bleu[lang.code];
    const S2SKind best = m[S2SKind::kBahdanau].first >= m[S2SKind::kTransformer].first ? S2SKind::kBahdanau
                                                                                         : S2SKind::kTransformer;
    beats = beats && m[best].first > m[S2SKind::kRnn].first;
    const auto drop = [&](S2SKind k) { return m[k].second.front() - m[k].second.back(); };
    drops_more = drops_more && drop(S2SKind::kRnn) > drop(best);
    disc += lang.name + ": BLEU " + fmt(m[S2SKind::kRnn].first, 2) + " (GRU), " +
            fmt(m[S2SKind::kBahdanau].first, 2) + " (GRU+Bahdanau), " + fmt(m[S2SKind::kTransformer].first, 2) +
            " (Transformer). ";
  }
  out.claim =
      "A fixed-length encoding loses more information the longer the sentence (translation quality of an "
      "encoder-decoder without attention falls with length), and attention removes this loss; shown on real "
      "human translations that nobody here wrote.";
  out.setup = "Data: the gettext catalogs of git 2.39 installed by Debian 12's `git` package, read with qkv's .mo "
              "parser (include/qkv/corpus/mo.h). " + licences +
              "git, its translations included, is licensed GPL-2 (/usr/share/doc/git/copyright: \"Files: *\" ... "
              "\"License: GPL-2\"; the .po files state \"This file is distributed under the same license as the git "
              "package\"); we use them only as evaluation data and redistribute none of them. Pairs: translated "
              "singular and plural (first form) messages without line breaks, English side <= " +
              std::to_string(max_src_chars) +
              " characters, target <= 60 (French) / 30 (Chinese) characters, duplicates dropped; test = the messages "
              "whose FNV-1a hash of the English text is 0 mod 10 (deterministic, about 10%). Character-level models: "
              "GRU encoder-decoder (embedding 64, hidden " + std::to_string(sz.hidden) +
              ") without and with Bahdanau attention, Transformer (d = " + std::to_string(sz.d_model) +
              ", 4 heads, 2+2 layers, feed-forward " + std::to_string(sz.ff) + ", dropout 0.1); " +
              std::to_string(tc.steps) +
              " AdamW steps of 64 each (lr 2e-3, warmup 200 + cosine, clip 1); greedy decoding. Metrics: corpus "
              "BLEU-4 (sacrebleu 13a; zh tokenizer for Chinese) and chrF, by qkv's own implementation, checked "
              "against sacrebleu 2.6.0 in tests/python/test_metrics.py.";
  out.verdict = verdict(o, beats && drops_more ? "confirmed" : (beats ? "partly" : "not reproduced"));
  disc += std::string("Attention beats no attention in both languages: ") + (beats ? "yes" : "no") +
          "; the no-attention model loses more BLEU from short to long sources: " + (drops_more ? "yes" : "no") +
          ". A few thousand short software messages are a tiny corpus: absolute BLEU is low and the long buckets "
          "hold few sentences, so bucket-level numbers are noisy (see n in results.json).";
  out.discussion = disc;
  return out;
}

}  // namespace qkv::experiments
