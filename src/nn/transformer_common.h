// Private helpers shared by the transformer modules' sources (not installed): config checks, seeds, input checks,
// the stacks' StackRecord filling. Errors name the calling module via `op`.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/nn/transformer.h"

namespace qkv::nn::detail {

// Validates d_model, nhead, dim_feedforward, dropout and eps; returns d_model.
int64_t checked_layer_config(const TransformerLayerConfig& c, const char* op);

// x must be (B, T, d_model), or (N, d_model) when packed (cu_seqlens given).
void check_sequence(const Tensor& x, int64_t d_model, const char* op, const char* name, bool packed = false);

// Fills a stack's StackRecord (null: records nothing): the input, then each layer's output (the last replaced by
// the final norm's, when the stack has one), and the asked layers' attention weights. A record whose
// attention_layers is neither empty nor one entry per layer throws std::invalid_argument "[op] ...".
class Recorder {
 public:
  // cross: a decoder stack (cross_attentions recorded too).
  Recorder(StackRecord* record, size_t num_layers, const char* op, bool cross = false) : r_(record) {
    if (!r_) return;
    QKV_CHECK_ARG(r_->attention_layers.empty() || r_->attention_layers.size() == num_layers, "[", op,
                  "] the record asks for the attentions of ", r_->attention_layers.size(), " layers, the stack has ",
                  num_layers);
    r_->hidden_states.clear();
    r_->attentions.clear();
    r_->cross_attentions.clear();
    if (!r_->attention_layers.empty()) {
      r_->attentions.assign(num_layers, Tensor());
      if (cross) r_->cross_attentions.assign(num_layers, Tensor());
    }
  }
  // Where layer i's self- / cross-attention weights go, or null when not asked.
  Tensor* attention(size_t i) const { return asked(i) ? &r_->attentions[i] : nullptr; }
  Tensor* cross_attention(size_t i) const { return asked(i) ? &r_->cross_attentions[i] : nullptr; }
  void hidden(const ad::Var& x) const {
    if (r_ && r_->output_hidden_states) r_->hidden_states.push_back(x.value);
  }
  void replace_last_hidden(const ad::Var& x) const {
    if (r_ && r_->output_hidden_states) r_->hidden_states.back() = x.value;
  }

 private:
  bool asked(size_t i) const { return r_ && !r_->attention_layers.empty() && r_->attention_layers[i]; }
  StackRecord* r_;
};

}  // namespace qkv::nn::detail
