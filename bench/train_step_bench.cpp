// Training-step benchmark: one AdamW step (forward, cross-entropy, backward, optimizer) of the model, a
// 2-layer pre-LN causal decoder-only Transformer (d 128, 4 heads, FFN 512, vocab 64, batch 32 x 128), and of a GRU
// Seq2Seq with Bahdanau attention. Prints one JSON line per model with the median step time in milliseconds.
//   train_step_bench [--steps N] [--warmup N] [--model decoder|seq2seq|all]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/models/seq2seq.h"
#include "qkv/models/transformer.h"
#include "train_step_common.h"
#include "qkv/train/trainer.h"
#include "qkv/train/loss.h"
#include "qkv/train/optim.h"

namespace {

using Clock = std::chrono::steady_clock;
using qkv::bench::cpu_ms;

// Random token batch (B, T) and next-token targets, from a fixed seed (the same numbers as train_step_torch.py is
// not required: timing does not depend on the values).
void make_batch(int64_t B, int64_t T, int64_t V, qkv::Ids& ids, std::vector<int64_t>& targets) {
  qkv::Rng rng(123);
  ids = {std::vector<int64_t>(static_cast<size_t>(B * T)), {B, T}};
  for (auto& x : ids.data) x = static_cast<int64_t>(rng.below(static_cast<uint64_t>(V)));
  targets.assign(ids.data.size(), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      targets[static_cast<size_t>(b * T + t)] = t + 1 < T ? ids.data[static_cast<size_t>(b * T + t + 1)] : -100;
}

// warmup + steps Trainer steps (AdamW at its default rate, no dropout) of loss_fn on model's parameters; reports the
// timed ones as one JSON line and returns the median wall time.
double time_steps(const char* name, qkv::nn::Module& model, int steps, int warmup,
                  const qkv::train::Trainer::LossFn& loss_fn) {
  using namespace qkv;
  ad::ParameterSet params(model);
  train::AdamW opt(params);
  train::LrSchedule constant;
  constant.lr = opt.lr();
  Rng no_dropout(0);
  train::Trainer trainer(params, opt, constant, no_dropout);
  std::vector<double> ms, cpu;
  float loss = 0.0f;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto t0 = Clock::now();
    const double c0 = cpu_ms();
    const train::StepResult r = trainer.step(i + 1, loss_fn);
    const auto t1 = Clock::now();
    const double c1 = cpu_ms();
    loss = static_cast<float>(r.loss);
    if (i >= warmup) {
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      cpu.push_back(c1 - c0);
    }
  }
  return bench::report(name, ms, cpu, loss);
}

double bench_decoder(int steps, int warmup) {
  using namespace qkv;
  models::DecoderOnlyConfig c;
  c.vocab = 64;
  c.max_len = 128;
  c.num_layers = 2;
  c.layer.d_model = 128;
  c.layer.nhead = 4;
  c.layer.dim_feedforward = 512;
  c.layer.dropout = 0.0f;
  c.layer.norm_first = true;
  c.layer.activation = nn::Activation::kGelu;
  Rng rng(1);
  models::DecoderOnlyTransformer model(c, rng);
  Ids ids;
  std::vector<int64_t> targets;
  make_batch(32, 128, c.vocab, ids, targets);
  return time_steps("decoder", model, steps, warmup,
                    [&](nn::Context& g) { return train::cross_entropy(model.forward(g, ids), targets); });
}

// GRU Seq2Seq + Bahdanau: embed 128, hidden 256, batch 32, source and target length 20, vocab 64, AdamW.
double bench_seq2seq(int steps, int warmup) {
  using namespace qkv;
  models::Seq2SeqConfig c;
  c.src_vocab = 64;
  c.tgt_vocab = 64;
  c.embed_dim = 128;
  c.hidden_size = 256;
  c.num_layers = 1;
  c.cell = models::RnnCell::kGRU;
  c.attention = models::Seq2SeqAttention::kBahdanau;
  Rng rng(2);
  models::Seq2Seq model(c, rng);
  const int64_t B = 32, T = 20;
  Rng data(7);
  Ids src{std::vector<int64_t>(B * T), {B, T}}, tgt{std::vector<int64_t>(B * T), {B, T}};
  for (auto& x : src.data) x = static_cast<int64_t>(data.below(64));
  for (auto& x : tgt.data) x = static_cast<int64_t>(data.below(64));
  std::vector<int64_t> targets(tgt.data.begin(), tgt.data.end());
  return time_steps("seq2seq_gru_bahdanau", model, steps, warmup, [&](nn::Context& g) {
    return train::cross_entropy(model.forward(g, src, {}, tgt).logits, targets);
  });
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 10, warmup = 3;
  std::string model = "all";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--warmup")) warmup = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
  }
  if (model == "all" || model == "decoder") bench_decoder(steps, warmup);
  if (model == "all" || model == "seq2seq") bench_seq2seq(steps, warmup);
  return 0;
}
