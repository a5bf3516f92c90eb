// Experiments that reproduce the article's claims with measurements: a registry of named runs, each producing a
// results JSON, PNG figures, a short text table and a Markdown section (claim, setup, table, figures, verdict).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "qkv/core/json.h"

namespace qkv::experiments {

struct Options {
  bool quick = false;     // a reduced run (well under a minute) for smoke tests; its numbers prove nothing
  std::string out_dir;    // figures are written here; must exist (run_experiment creates it)
  uint64_t seed = 0;      // base seed; experiments derive every Rng from it
  int threads = 2;        // OpenMP threads for the run
  // Progress lines (never stdout from the library); may be empty.
  std::function<void(const std::string&)> log;
};

// A small table printed by the CLI and rendered into the Markdown report.
struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::string text() const;      // aligned plain text
  std::string markdown() const;  // GitHub table
};

struct Outcome {
  json::Value results = json::Value::object();     // measured numbers (the runner adds name, mode, seed, wall time, figures)
  std::vector<Table> tables;         // printed and reported; the first is the headline
  std::vector<std::string> figures;  // PNG file names written under out_dir
  std::string claim;                 // the article's claim in our words
  std::string setup;                 // Markdown: task, sizes, steps, seeds
  std::string verdict;               // "confirmed" | "partly" | "not reproduced" (+ " (quick run)" in quick mode)
  std::string discussion;            // Markdown: why that verdict, what was measured, caveats
};

struct Experiment {
  std::string name;     // e.g. "scaling"
  std::string section;  // where the claim is in the article, e.g. "§3"
  std::string summary;  // one line for `qkv experiment list`
  std::function<Outcome(const Options&)> run;
};

// Every experiment, in the article's order.
const std::vector<Experiment>& registry();
// The experiment called `name`; throws std::invalid_argument "[experiment] unknown experiment 'x' (choose ...)".
const Experiment& find_experiment(const std::string& name);

struct RunRecord {
  std::string name;
  Outcome outcome;
  double wall_seconds = 0.0;
  int threads = 0;     // OpenMP threads of the run
  bool quick = false;  // a --quick run
};

// Creates options.out_dir, sets the thread count, runs the experiment, times it, and writes
// out_dir/results.json atomically (results plus name, mode, seed, threads, wall_seconds, verdict, figures).
RunRecord run_experiment(const std::string& name, const Options& options);

// Reads back a run written by run_experiment (DIR/results.json); the figures stay in DIR.
// Throws std::runtime_error when the file cannot be read, std::invalid_argument when it is malformed.
RunRecord load_run(const std::string& dir);

// The Markdown report (docs/EXPERIMENTS.md) for finished runs; `figure_dir` is the figures' path relative to the
// report (each run's figures are expected under figure_dir/<name>/). `notes`: hand-written remarks per experiment
// name (read after the results were seen), printed after the generated verdict under "Notes".
std::string markdown_report(const std::vector<RunRecord>& runs, const std::string& figure_dir,
                            const std::map<std::string, std::string>& notes = {});

}  // namespace qkv::experiments
