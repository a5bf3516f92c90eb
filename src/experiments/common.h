// Shared helpers of the experiments (internal): timing, statistics, number formatting, figure saving, logging,
// and the declarations of the individual experiment runs (one .cpp each).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "qkv/plot/image.h"
#include "qkv/experiments/experiment.h"

namespace qkv::experiments {

// Seconds of wall time since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double mean(const std::vector<double>& v);
double stddev(const std::vector<double>& v);  // sample standard deviation (n - 1); 0 for fewer than 2 values
double median(std::vector<double> v);

// Fixed-point with `decimals` digits, or scientific for tiny/huge magnitudes ("1.2e-07").
std::string fmt(double v, int decimals = 3);
// "mean ± std" (std omitted for a single value).
std::string fmt_pm(const std::vector<double>& v, int decimals = 3);

// Writes out_dir/file as PNG and records it in outcome.figures.
void save_figure(const Options& options, Outcome& outcome, const std::string& file, const Image& image);
// Calls options.log when set.
void log(const Options& options, const std::string& line);
// "confirmed" etc. with " (quick run: too small to judge)" appended in quick mode.
std::string verdict(const Options& options, const std::string& v);

// The experiments.
Outcome run_bottleneck(const Options& options);
Outcome run_parallelism(const Options& options);
Outcome run_alignment(const Options& options);
Outcome run_scaling(const Options& options);
Outcome run_heads(const Options& options);
Outcome run_permutation(const Options& options);
Outcome run_positional(const Options& options);
Outcome run_components(const Options& options);
Outcome run_translation(const Options& options);

}  // namespace qkv::experiments
