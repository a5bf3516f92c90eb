// The experiment registry, the runner that times a run and writes results.json, and the Markdown report.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "common.h"
#include "qkv/core/error.h"
#include "qkv/core/io.h"
#include "qkv/core/json.h"

namespace qkv::experiments {

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  double s = 0.0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean(v);
  double s = 0.0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string fmt(double v, int decimals) {
  char buf[64];
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  const double a = std::abs(v);
  if (a != 0.0 && (a < std::pow(10.0, -decimals) || a >= 1e7))
    std::snprintf(buf, sizeof buf, "%.2e", v);
  else
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string fmt_pm(const std::vector<double>& v, int decimals) {
  if (v.size() < 2) return fmt(mean(v), decimals);
  return fmt(mean(v), decimals) + " ± " + fmt(stddev(v), decimals);
}

void save_figure(const Options& options, Outcome& outcome, const std::string& file, const Image& image) {
  write_png((std::filesystem::path(options.out_dir) / file).string(), image);
  outcome.figures.push_back(file);
}

void log(const Options& options, const std::string& line) {
  if (options.log) options.log(line);
}

std::string verdict(const Options& options, const std::string& v) {
  return options.quick ? v + " (quick run: too small to judge)" : v;
}

std::string Table::text() const {
  std::vector<size_t> w(header.size(), 0);
  auto width = [](const std::string& s) {  // display width: count UTF-8 code points
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  for (size_t c = 0; c < header.size(); ++c) w[c] = width(header[c]);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], width(r[c]));
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < w.size(); ++c) {
      const std::string cell = c < cells.size() ? cells[c] : "";
      out += cell;
      if (c + 1 < w.size()) out += std::string(w[c] - width(cell) + 2, ' ');
    }
    out += "\n";
  };
  line(header);
  size_t total = 0;
  for (size_t c = 0; c < w.size(); ++c) total += w[c] + (c + 1 < w.size() ? 2 : 0);
  out += std::string(total, '-') + "\n";
  for (const auto& r : rows) line(r);
  return out;
}

std::string Table::markdown() const {
  std::string out = "|";
  for (const auto& h : header) out += " " + h + " |";
  out += "\n|";
  for (size_t c = 0; c < header.size(); ++c) out += c == 0 ? "---|" : "--:|";
  out += "\n";
  for (const auto& r : rows) {
    out += "|";
    for (size_t c = 0; c < header.size(); ++c) out += " " + (c < r.size() ? r[c] : std::string()) + " |";
    out += "\n";
  }
  return out;
}

const std::vector<Experiment>& registry() {
  static const std::vector<Experiment> kAll = {
      {"bottleneck", "§1-2", "GRU Seq2Seq without attention vs Bahdanau / Luong attention: accuracy vs source length",
       run_bottleneck},
      {"parallelism", "§1", "forward wall time vs length: GRU encoder vs self-attention layer; sequential steps",
       run_parallelism},
      {"alignment", "§2", "decoder attention heatmaps of trained Bahdanau models (reversal, dates)", run_alignment},
      {"scaling", "§3", "1/sqrt(d_k): softmax entropy, max weight and gradient at init; training with and without",
       run_scaling},
      {"heads", "§4", "per-head maps, head diversity (Jensen-Shannon) and single-head ablations", run_heads},
      {"permutation", "§4", "self-attention is permutation-equivariant without positions; reversal needs them",
       run_permutation},
      {"positional", "beyond", "none / sinusoidal / learned / Shaw / T5 / RoPE / ALiBi: train <= L, test to 2L",
       run_positional},
      {"components", "§4 table", "residuals, LayerNorm, pre- vs post-LN across depth", run_components},
      {"translation", "real data", "git's French and Chinese catalogs: RNN vs RNN+attention vs Transformer, BLEU/chrF",
       run_translation},
  };
  return kAll;
}

const Experiment& find_experiment(const std::string& name) {
  std::string names;
  for (const Experiment& e : registry()) {
    if (e.name == name) return e;
    names += (names.empty() ? "" : ", ") + e.name;
  }
  throw std::invalid_argument("[experiment] unknown experiment '" + name + "' (choose " + names + ")");
}

RunRecord run_experiment(const std::string& name, const Options& options) {
  const Experiment& e = find_experiment(name);
  QKV_CHECK_ARG(!options.out_dir.empty(), "[experiment] an output directory is required");
  QKV_CHECK_ARG(options.threads >= 1, "[experiment] threads must be >= 1, got ", options.threads);
  std::filesystem::create_directories(options.out_dir);
  const int old_threads = omp_get_max_threads();
  omp_set_num_threads(options.threads);
  RunRecord rec;
  rec.name = name;
  rec.threads = options.threads;
  rec.quick = options.quick;
  const auto start = std::chrono::steady_clock::now();
  try {
    rec.outcome = e.run(options);
  } catch (...) {
    omp_set_num_threads(old_threads);
    throw;
  }
  omp_set_num_threads(old_threads);
  rec.wall_seconds = seconds_since(start);
  json::Value j = json::Value::object();
  j.set("experiment", name);
  j.set("mode", options.quick ? "quick" : "full");
  j.set("seed", static_cast<int64_t>(options.seed));
  j.set("threads", options.threads);
  j.set("wall_seconds", rec.wall_seconds);
  j.set("claim", rec.outcome.claim);
  j.set("verdict", rec.outcome.verdict);
  j.set("figures", rec.outcome.figures);
  j.set("setup", rec.outcome.setup);
  j.set("discussion", rec.outcome.discussion);
  json::Value tables = json::Value::array();
  for (const Table& t : rec.outcome.tables) {
    json::Value tj = json::Value::object();
    tj.set("header", t.header);
    json::Value rows = json::Value::array();
    for (const auto& r : t.rows) rows.push(json::Value(r));
    tj.set("rows", rows);
    tables.push(tj);
  }
  j.set("tables", tables);
  j.set("results", rec.outcome.results);
  write_file_atomic((std::filesystem::path(options.out_dir) / "results.json").string(), j.dump(2));
  return rec;
}

RunRecord load_run(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "results.json").string();
  std::ifstream in(path, std::ios::binary);
  QKV_CHECK_RUNTIME(in.good(), "[experiment] cannot open '", path, "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json::Value v = json::Value::parse(text, "[experiment] " + path);
  auto str = [&](const json::Value& o, const char* key) {
    const json::Value* m = o.find(key);
    QKV_CHECK_ARG(m && m->type() == json::Value::Type::kString, "[experiment] ", path, ": '", key,
                  "' is missing or not a string");
    return m->as_string();
  };
  auto list = [&](const json::Value& o, const char* key) {
    const json::Value* m = o.find(key);
    QKV_CHECK_ARG(m && m->type() == json::Value::Type::kArray, "[experiment] ", path, ": '", key,
                  "' is missing or not an array");
    return m->items();
  };
  auto strings = [&](const std::vector<json::Value>& a) {
    std::vector<std::string> out;
    for (const auto& e : a) {
      QKV_CHECK_ARG(e.type() == json::Value::Type::kString, "[experiment] ", path, ": expected strings");
      out.push_back(e.as_string());
    }
    return out;
  };
  RunRecord r;
  r.name = str(v, "experiment");
  find_experiment(r.name);
  const json::Value* wall = v.find("wall_seconds");
  QKV_CHECK_ARG(wall && wall->type() == json::Value::Type::kNumber, "[experiment] ", path,
                ": 'wall_seconds' is missing");
  r.wall_seconds = wall->as_number();
  r.quick = str(v, "mode") == "quick";
  const json::Value* th = v.find("threads");
  r.threads = th && th->type() == json::Value::Type::kNumber ? static_cast<int>(th->as_number()) : 0;
  r.outcome.claim = str(v, "claim");
  r.outcome.verdict = str(v, "verdict");
  r.outcome.setup = str(v, "setup");
  r.outcome.discussion = str(v, "discussion");
  r.outcome.figures = strings(list(v, "figures"));
  for (const auto& t : list(v, "tables")) {
    Table tb;
    tb.header = strings(list(t, "header"));
    for (const auto& row : list(t, "rows")) {
      QKV_CHECK_ARG(row.type() == json::Value::Type::kArray, "[experiment] ", path, ": a table row is not an array");
      tb.rows.push_back(strings(row.items()));
    }
    r.outcome.tables.push_back(tb);
  }
  return r;
}

std::string markdown_report(const std::vector<RunRecord>& runs, const std::string& figure_dir,
                            const std::map<std::string, std::string>& notes) {
  std::string md =
      "# Experiments: the article's claims, measured\n\n"
      "Generated by `make experiments`, which runs `qkv experiment NAME --out out/experiments/NAME` for each claim\n"
      "(full mode), then `qkv experiment report --out out/experiments --doc docs/EXPERIMENTS.md`.\n"
      "Each section states a claim of the article (\"Transformer 注意力机制详解：从 Seq2Seq 到 Self-Attention\") in our own\n"
      "words, how it was tested, what was measured, and whether the measurement supports it. The numbers come from the\n"
      "runs that wrote this file; rerun one claim with `qkv experiment NAME --out out/experiments/NAME`, then rebuild\n"
      "this page with the report command. Wall times are from a shared 2-core machine and include waiting for other\n"
      "processes. The paragraphs headed \"Notes\" are written by hand (docs/experiments/NAME/notes.md) after reading\n"
      "the results; everything else is generated.\n\n";
  md += "| experiment | article | verdict | wall time | threads |\n|---|---|---|--:|--:|\n";
  for (const RunRecord& r : runs) {
    const Experiment& e = find_experiment(r.name);
    md += "| [" + r.name + "](#" + r.name + ") | " + e.section + " | " + r.outcome.verdict + " | " +
          fmt(r.wall_seconds, 1) + " s | " + std::to_string(r.threads) + (r.quick ? " (quick run)" : "") + " |\n";
  }
  for (const RunRecord& r : runs) {
    const Experiment& e = find_experiment(r.name);
    md += "\n## " + r.name + "\n\n";
    md += "**Claim (" + e.section + ").** " + r.outcome.claim + "\n\n";
    md += "**Setup.** " + r.outcome.setup + "\n\n";
    md += "**Measured.**\n\n";
    for (const Table& t : r.outcome.tables) md += t.markdown() + "\n";
    for (const std::string& f : r.outcome.figures) md += "![" + f + "](" + figure_dir + "/" + r.name + "/" + f + ")\n";
    md += "\n**Wall time.** " + fmt(r.wall_seconds, 1) + " s with " + std::to_string(r.threads) + " thread" +
          (r.threads == 1 ? "" : "s") + (r.quick ? " (a --quick run: its numbers prove nothing)" : "") + ".\n\n";
    md += "**Verdict: " + r.outcome.verdict + ".** " + r.outcome.discussion + "\n";
    const auto note = notes.find(r.name);
    if (note != notes.end() && !note->second.empty()) md += "\n**Notes (written after reading the results).** " + note->second + "\n";
  }
  return md;
}

}  // namespace qkv::experiments
