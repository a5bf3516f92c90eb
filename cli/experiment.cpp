// `qkv experiment NAME [--quick] --out DIR`: runs one of the article's claims as an experiment, writes
// DIR/results.json and PNG figures, and prints its table. `list` names them; `all` runs every one (--doc: report).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "run_common.h"
#include "qkv/core/io.h"
#include "qkv/experiments/experiment.h"

namespace qkv::cli {
namespace {

struct ExperimentArgs {
  std::string name;
  bool quick = false;
  std::string out = "out/experiments";
  uint64_t seed = 0;
  int threads = 2;
  std::string doc;
  bool quiet = false;
};

void print_record(const experiments::RunRecord& r) {
  std::printf("== %s (%s) ==\n", r.name.c_str(), r.outcome.verdict.c_str());
  for (const auto& t : r.outcome.tables) std::printf("%s\n", t.text().c_str());
  std::printf("wall time: %.1f s\n", r.wall_seconds);
  std::fflush(stdout);
}

// Copies each run's figures beside the report (<doc dir>/experiments/<name>/*.png, linked relatively) and writes
// the report. `nested`: run folders are <out>/<name>, else <out> itself.
void write_report(const std::vector<experiments::RunRecord>& records, const std::string& out, bool nested,
                  const std::string& doc) {
  namespace fs = std::filesystem;
  const fs::path doc_dir = fs::path(doc).parent_path();
  for (const auto& r : records) {
    const fs::path dst = doc_dir / "experiments" / r.name;
    fs::create_directories(dst);
    const fs::path src = nested ? fs::path(out) / r.name : fs::path(out);
    for (const auto& f : r.outcome.figures) fs::copy_file(src / f, dst / f, fs::copy_options::overwrite_existing);
  }
  // Hand-written remarks, if any: <doc dir>/experiments/<name>/notes.md.
  std::map<std::string, std::string> notes;
  for (const auto& r : records) {
    std::ifstream in(doc_dir / "experiments" / r.name / "notes.md", std::ios::binary);
    if (in) notes[r.name] = std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  write_file_atomic(doc, experiments::markdown_report(records, "experiments", notes));
  std::printf("report: %s\n", doc.c_str());
}

int run_experiment_command(const ExperimentArgs& a) {
  namespace fs = std::filesystem;
  if (a.name == "list") {
    for (const auto& e : experiments::registry())
      std::printf("%-12s %-9s %s\n", e.name.c_str(), e.section.c_str(), e.summary.c_str());
    return 0;
  }
  if (a.name == "report") {  // the Markdown report from runs already on disk: <out>/<name>/results.json
    if (a.doc.empty()) throw std::invalid_argument("[experiment] report needs --doc PATH");
    std::vector<experiments::RunRecord> records;
    for (const auto& e : experiments::registry()) {
      const fs::path dir = fs::path(a.out) / e.name;
      if (fs::exists(dir / "results.json")) records.push_back(experiments::load_run(dir.string()));
      else std::fprintf(stderr, "experiment %s: no results in %s, left out of the report\n", e.name.c_str(),
                        dir.string().c_str());
    }
    write_report(records, a.out, true, a.doc);
    return 0;
  }
  experiments::Options o;
  o.quick = a.quick;
  o.seed = a.seed;
  o.threads = a.threads;
  if (!a.quiet) o.log = [](const std::string& line) { std::fprintf(stderr, "  %s\n", line.c_str()); };
  std::vector<std::string> names;
  if (a.name == "all") {
    for (const auto& e : experiments::registry()) names.push_back(e.name);
  } else {
    experiments::find_experiment(a.name);  // fails early on a typo
    names.push_back(a.name);
  }
  std::vector<experiments::RunRecord> records;
  for (const std::string& n : names) {
    o.out_dir = a.name == "all" ? (fs::path(a.out) / n).string() : a.out;
    if (!a.quiet)
      std::fprintf(stderr, "experiment %s%s -> %s\n", n.c_str(), a.quick ? " (quick)" : "", o.out_dir.c_str());
    records.push_back(experiments::run_experiment(n, o));
    print_record(records.back());
    std::printf("results: %s\n\n", (fs::path(o.out_dir) / "results.json").string().c_str());
  }
  if (!a.doc.empty()) write_report(records, a.out, a.name == "all", a.doc);
  return 0;
}

}  // namespace

void add_experiment(CLI::App& app) {
  auto* cmd = app.add_subcommand("experiment", "Reproduce one of the article's claims (or 'list', or 'all')");
  auto a = std::make_shared<ExperimentArgs>();
  cmd->add_option("name", a->name,
                  "Experiment name, 'list', 'all', or 'report' (rebuild --doc from <out>/<name>/results.json)")
      ->required();
  cmd->add_flag("--quick", a->quick, "Small run (well under a minute) that only checks the pipeline");
  cmd->add_option("--out", a->out, "Output directory (results.json + figures; 'all' uses one folder each)")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Base seed")->capture_default_str()->check(seed_value());
  cmd->add_option("--threads", a->threads, "OpenMP threads")->capture_default_str()->check(at_least(1));
  cmd->add_option("--doc", a->doc, "Also write the Markdown report here (e.g. docs/EXPERIMENTS.md)");
  cmd->add_flag("--quiet", a->quiet, "No progress or header lines on stderr");
  cmd->callback([a]() {
    const int rc = run_experiment_command(*a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace qkv::cli
