// The oracles of cached decoding: step models that run the model's whole forward over the prefix every step (no
// cache, no padding). The library's cached step (qkv/decode/cached_step.h) must give their logits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/decode/search.h"
#include "qkv/models/llama.h"
#include "qkv/models/transformer.h"
#include "qkv/nn/kv_cache.h"

namespace qkv::testing {

inline void check_recompute_step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens,
                                 int64_t prev_rows, int64_t vocab, const char* op) {
  QKV_CHECK_ARG(!rows.empty() && rows.size() == tokens.size(), "[", op, "] ", rows.size(), " rows and ",
                tokens.size(), " tokens");
  for (size_t i = 0; i < rows.size(); ++i)
    QKV_CHECK_ARG(rows[i] >= 0 && rows[i] < prev_rows && tokens[i] >= 0 && tokens[i] < vocab, "[", op, "] row ",
                  rows[i], " of ", prev_rows, ", token ", tokens[i], " of ", vocab);
}

// models::Seq2SeqTransformer: the decoder over the whole target prefix every step, the memory encoded once.
class TransformerRecomputeStep : public decode::StepModel {
 public:
  TransformerRecomputeStep(models::Seq2SeqTransformer& model, const Ids& src, int64_t pad_id) : model_(&model) {
    model.eval();
    sources_ = src.shape[0];
    src_block_ = models::padding_mask(src, pad_id);
    nn::AttentionMasks src_masks;
    src_masks.key_padding_mask = src_block_;
    memory_ = model.encode(src, src_masks);
  }
  int64_t num_sources() const override { return sources_; }
  int64_t vocab_size() const override { return model_->config().tgt_vocab; }
  void start() override {
    prefix_.assign(static_cast<size_t>(sources_), {});
    row_source_.resize(static_cast<size_t>(sources_));
    for (int64_t s = 0; s < sources_; ++s) row_source_[static_cast<size_t>(s)] = s;
  }
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override {
    check_recompute_step(rows, tokens, static_cast<int64_t>(row_source_.size()), vocab_size(),
                         "TransformerRecomputeStep");
    const int64_t N = static_cast<int64_t>(rows.size());
    std::vector<std::vector<int64_t>> prefix(rows.size());
    std::vector<int64_t> src(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      prefix[i] = prefix_[static_cast<size_t>(rows[i])];
      prefix[i].push_back(tokens[i]);
      src[i] = row_source_[static_cast<size_t>(rows[i])];
    }
    prefix_ = std::move(prefix);
    row_source_ = std::move(src);
    const int64_t T = static_cast<int64_t>(prefix_[0].size());
    Ids ids{{}, {N, T}};
    for (const auto& p : prefix_) ids.data.insert(ids.data.end(), p.begin(), p.end());
    nn::AttentionMasks memory_masks;
    memory_masks.key_padding_mask = nn::gather_rows(src_block_, row_source_);
    const Tensor logits = model_->decode(ids, nn::gather_rows(memory_, row_source_),
                                         models::Seq2SeqMasks::causal_self_attention(), memory_masks);
    return logits.select(1, T - 1).contiguous();
  }

 private:
  models::Seq2SeqTransformer* model_;
  int64_t sources_;
  Tensor memory_;  // (S, Ts, E)
  Tensor src_block_;
  std::vector<std::vector<int64_t>> prefix_;
  std::vector<int64_t> row_source_;
};

// models::DecoderOnlyTransformer: the model's forward over prompt + prefix, one row at a time.
class DecoderOnlyRecomputeStep : public decode::StepModel {
 public:
  DecoderOnlyRecomputeStep(models::DecoderOnlyTransformer& model, std::vector<std::vector<int64_t>> prompts)
      : model_(&model), prompts_(std::move(prompts)) {
    for (const auto& p : prompts_) prompt_len_ = std::max<int64_t>(prompt_len_, static_cast<int64_t>(p.size()));
    model.eval();
  }
  int64_t num_sources() const override { return static_cast<int64_t>(prompts_.size()); }
  int64_t vocab_size() const override { return model_->config().vocab; }
  int64_t capacity() const override { return model_->config().max_len - prompt_len_; }
  void start() override { seq_ = prompts_; }
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override {
    check_recompute_step(rows, tokens, static_cast<int64_t>(seq_.size()), vocab_size(), "DecoderOnlyRecomputeStep");
    std::vector<std::vector<int64_t>> seq(rows.size());
    const int64_t N = static_cast<int64_t>(rows.size()), V = vocab_size();
    Tensor out = Tensor::empty({N, V});
    for (size_t i = 0; i < rows.size(); ++i) {
      seq[i] = seq_[static_cast<size_t>(rows[i])];
      seq[i].push_back(tokens[i]);
      const int64_t T = static_cast<int64_t>(seq[i].size());
      const Tensor logits = model_->forward(Ids{seq[i], {1, T}});  // (1, T, V)
      out.select(0, static_cast<int64_t>(i)).copy_from(logits.select(0, 0).select(0, T - 1));
    }
    seq_ = std::move(seq);
    return out;
  }

 private:
  models::DecoderOnlyTransformer* model_;
  std::vector<std::vector<int64_t>> prompts_;
  std::vector<std::vector<int64_t>> seq_;  // per row: prompt + tokens so far
  int64_t prompt_len_ = 0;
};

// models::LlamaForCausalLM over prompts of any lengths (empty allowed), recomputing prompt + prefix each step, one
// row at a time (no cache, no padding): the oracle of decode::cached_step over unequal prompts. SearchOptions::bos
// is fed first, as to any StepModel.
class CausalLmRecomputeStep : public decode::StepModel {
 public:
  CausalLmRecomputeStep(const models::LlamaForCausalLM& model, std::vector<std::vector<int64_t>> prompts)
      : model_(&model), prompts_(std::move(prompts)) {
    QKV_CHECK_ARG(!prompts_.empty(), "[CausalLmRecomputeStep] no prompts");
  }
  int64_t num_sources() const override { return static_cast<int64_t>(prompts_.size()); }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  void start() override { rows_ = prompts_; }
  Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens) override {
    const auto n = static_cast<int64_t>(rows.size());
    check_recompute_step(rows, tokens, static_cast<int64_t>(rows_.size()), vocab_size(), "CausalLmRecomputeStep");
    std::vector<std::vector<int64_t>> next;
    const int64_t v = vocab_size();
    Tensor out = Tensor::empty({n, v});
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int64_t> seq = rows_[static_cast<size_t>(rows[static_cast<size_t>(i)])];
      seq.push_back(tokens[static_cast<size_t>(i)]);
      const auto t = static_cast<int64_t>(seq.size());
      const Tensor last = model_->logits(Ids{seq, {1, t}}).select(1, t - 1).contiguous();  // (1, T, V) -> (V)
      std::copy(last.data(), last.data() + v, out.data() + i * v);
      next.push_back(std::move(seq));
    }
    rows_ = std::move(next);
    return out;
  }

 private:
  const models::LlamaForCausalLM* model_;
  std::vector<std::vector<int64_t>> prompts_;
  std::vector<std::vector<int64_t>> rows_;  // per row: prompt + tokens so far
};

// The oracle of a causal model's recorded attention under decode::forced_attention(step, tokens, bos): source s's
// prompt, bos and tokens[s] but its last, run alone through `last_layer` (ids (1, T) -> the last layer's attention
// weights (1, H, T, T)); the rows of the fed tokens (bos first), heads averaged, over the step's max(P, 1) prompt
// columns (P: the longest prompt), where source s's left padding (P - |prompt s| columns) comes first, at 0.
inline std::vector<Tensor> prompt_attention_oracle(const std::function<Tensor(const Ids&)>& last_layer,
                                                   const std::vector<std::vector<int64_t>>& prompts,
                                                   const std::vector<std::vector<int64_t>>& tokens, int64_t bos) {
  int64_t P = 0;
  for (const auto& p : prompts) P = std::max<int64_t>(P, static_cast<int64_t>(p.size()));
  const int64_t C = std::max<int64_t>(P, 1);
  std::vector<Tensor> out;
  for (size_t s = 0; s < prompts.size(); ++s) {
    const auto len = static_cast<int64_t>(prompts[s].size()), n = static_cast<int64_t>(tokens[s].size());
    if (n == 0) {  // forced_attention's undefined tensor
      out.emplace_back();
      continue;
    }
    std::vector<int64_t> seq = prompts[s];
    seq.push_back(bos);
    seq.insert(seq.end(), tokens[s].begin(), tokens[s].end() - 1);
    const auto T = static_cast<int64_t>(seq.size());
    const Tensor w = last_layer(Ids{seq, {1, T}}).contiguous();  // (1, H, T, T)
    const int64_t H = w.size(1), pad = P - len;
    Tensor a = Tensor::zeros({n, C});
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = pad; c < C; ++c) {
        double sum = 0;
        for (int64_t h = 0; h < H; ++h) sum += w.data()[(h * T + len + t) * T + c - pad];
        a.data()[t * C + c] = static_cast<float>(sum / static_cast<double>(H));
      }
    out.push_back(a);
  }
  return out;
}

}  // namespace qkv::testing
