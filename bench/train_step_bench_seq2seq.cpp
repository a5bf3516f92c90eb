// The GRU Seq2Seq + Bahdanau half of train_step_bench (a separate unit: models/seq2seq.h and models/transformer.h
// cannot be included together). Embed 128, hidden 256, batch 32, source and target length 20, vocab 64, AdamW.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "qkv/core/rng.h"
#include "qkv/models/seq2seq.h"
#include "train_step_common.h"
#include "qkv/train/trainer.h"
#include "qkv/train/loss.h"
#include "qkv/train/optim.h"

double bench_seq2seq(int steps, int warmup) {
  using namespace qkv;
  using Clock = std::chrono::steady_clock;
  using bench::cpu_ms;
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
    const train::StepResult r = trainer.step(i + 1, [&](nn::Context& g) {
      return train::cross_entropy(model.forward(g, src, {}, tgt).logits, targets);
    });
    const auto t1 = Clock::now();
    const double c1 = cpu_ms();
    loss = static_cast<float>(r.loss);
    if (i >= warmup) {
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      cpu.push_back(c1 - c0);
    }
  }
  return bench::report("seq2seq_gru_bahdanau", ms, cpu, loss);
}
