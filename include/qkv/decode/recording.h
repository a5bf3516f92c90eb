// One sequence decoded step by step by its caller on the cached decoding step of decode::generate and the
// Scheduler (paged KV caches, the same kernels and so the same logits), every forward recording what
// ForwardOptions ask: the attentions of the new positions over every cached key and the hidden states. For viewers
// that draw each token's attention as it is generated (`qkv serve --model`'s live page); the caller picks the tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "qkv/models/llama.h"
#include "qkv/models/outputs.h"

namespace qkv::decode {

namespace detail {
class Batch;
}

class RecordingDecoder {
 public:
  // page_size >= 1: the KV pages; capacity: the positions first reserved (they grow as needed); kv_cache: their
  // storage (GenerateOptions::kv_cache). The model must outlive this.
  RecordingDecoder(const models::LlamaForCausalLM& model, int64_t page_size, int64_t capacity,
                   Precision kv_cache = Precision::kFloat32);
  ~RecordingDecoder();
  RecordingDecoder(const RecordingDecoder&) = delete;
  RecordingDecoder& operator=(const RecordingDecoder&) = delete;
  // The prompt (P >= 1 ids), once, first -> logits (1, P, V) and what options ask (attentions (1, Hq, P, P)).
  models::CausalLMOutput prefill(const std::vector<int64_t>& prompt, const models::ForwardOptions& options);
  // One more token after those fed -> logits (1, 1, V) and what options ask (attentions (1, Hq, 1, T_keys)).
  models::CausalLMOutput step(int64_t token, const models::ForwardOptions& options);
  int64_t length() const;  // the positions fed so far

 private:
  std::unique_ptr<detail::Batch> batch_;
};

}  // namespace qkv::decode
