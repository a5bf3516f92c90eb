// `qkv demo`: the article's §5 "minimal runnable" multi-head self-attention, with the transpose done right.
// Input (2, 10, 64), 4 heads; prints the shapes and a row sum, and writes the four heads' maps for sample 0 as a PNG.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "commands.h"
#include "demo.h"
#include "run_common.h"
#include "qkv/plot/image.h"
#include "qkv/core/rng.h"
#include "qkv/ops/attention.h"
#include "qkv/ops/matmul.h"

namespace qkv::cli {
namespace {

std::string one_decimal_or_more(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f", x);
  std::string s = buf;
  while (s.size() > 1 && s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
  return s;
}

}  // namespace

DemoAttention demo_attention(uint64_t seed) {
  const int64_t B = 2, T = 10, E = 64, H = 4, D = E / H;
  Rng rng(seed);
  // As in the article: W ~ N(0, 1/sqrt(d_model)), x ~ N(0, 1), projections are x @ W (no bias).
  const float w_std = 1.0f / std::sqrt(static_cast<float>(E));
  const Tensor wq = rng.normal({E, E}, 0.0f, w_std), wk = rng.normal({E, E}, 0.0f, w_std);
  const Tensor wv = rng.normal({E, E}, 0.0f, w_std), wo = rng.normal({E, E}, 0.0f, w_std);
  const Tensor x = rng.normal({B, T, E});

  // split_heads: (B, T, E) -> (B, T, H, D) -> (B, H, T, D), a view (no copy).
  auto split_heads = [&](const Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };
  const Tensor q = split_heads(matmul(x, wq)), k = split_heads(matmul(x, wk)), v = split_heads(matmul(x, wv));

  AttentionOptions opts;
  opts.return_weights = true;
  const AttentionResult r = attention(q, k, v, opts);  // k's last two axes are swapped inside: (B, H, D, T)
  const Tensor merged = r.out.transpose(1, 2).reshape({B, T, E});
  return {matmul(merged, wo), r.weights};
}

namespace {

int run_demo(const std::string& out_dir, uint64_t seed) {
  const DemoAttention d = demo_attention(seed);
  const Tensor& out = d.out;
  const int64_t T = d.weights.size(2), H = d.weights.size(1);

  double row_sum = 0.0;
  for (int64_t j = 0; j < T; ++j) row_sum += d.weights.at({0, 0, 0, j});

  std::printf("output shape: %s\n", str(out.shape()).c_str());
  std::printf("weights shape: %s\n", str(d.weights.shape()).c_str());
  std::printf("first row sum: %s\n", one_decimal_or_more(row_sum).c_str());
  std::printf(
      "note: the article's NumPy code calls K.transpose(0, 2, 1) on the 4-D (B, H, T, d_k) tensor, which NumPy "
      "rejects; the scores need the last two axes swapped, K.transpose(0, 1, 3, 2), as qkv does.\n");

  std::vector<Tensor> maps;
  for (int64_t h = 0; h < H; ++h) maps.push_back(d.weights.select(0, 0).select(0, h));
  std::filesystem::create_directories(out_dir);
  const std::string png = (std::filesystem::path(out_dir) / "attention_heads.png").string();
  write_png(png, heatmap_grid(maps, 24, static_cast<int>(H)));
  std::printf("heatmaps (sample 0, heads 0-3, rows = queries, columns = keys): %s\n", png.c_str());
  return 0;
}

}  // namespace

void add_demo(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "The article's multi-head self-attention example, done right");
  auto out = std::make_shared<std::string>("out/demo");
  auto seed = std::make_shared<uint64_t>(0);
  cmd->add_option("--out", *out, "Directory for the heatmap PNG")->capture_default_str();
  cmd->add_option("--seed", *seed, "Seed of the random weights and input")->capture_default_str()->check(seed_value());
  cmd->callback([out, seed]() {
    const int rc = run_demo(*out, *seed);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace qkv::cli
