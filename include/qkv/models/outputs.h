// What a model's forward returns beside its main output, under Hugging Face's names (transformers'
// modeling_outputs.py): the options that ask for attention probabilities and hidden states, and one output struct
// per model kind (causal LM, encoder, encoder-decoder).
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/core/tensor.h"

namespace qkv::models {

// What a forward records beside its output (HF's output_attentions / output_hidden_states), for every model family.
struct ForwardOptions {
  bool output_attentions = false;     // the outputs' attentions (every attention block of the model)
  bool output_hidden_states = false;  // the outputs' hidden_states
  // With output_attentions: the layers whose probabilities are computed (empty: every layer); the others stay
  // undefined tensors in the attentions, which always hold one entry per layer. Each in [0, L) (an encoder-decoder
  // model: in [0, max(L_enc, L_dec)), each stack recording the ones it has).
  std::vector<int64_t> attention_layers;
};

// Which of L layers record their attention probabilities under `options` (all false without output_attentions).
// An attention_layers entry outside [0, L) throws std::invalid_argument "[op] attention layer l is outside [0, L)".
std::vector<bool> attention_layers_asked(const ForwardOptions& options, int64_t num_layers, const char* op);

// HF's CausalLMOutputWithPast under its names; B, T: the ids' shape, T_keys: the cached positions before the call
// plus T.
struct CausalLMOutput {
  Tensor logits;                     // (B, T, V)
  std::vector<Tensor> attentions;    // L entries (B, Hq, T, T_keys) when output_attentions, else empty
  // L + 1 entries (B, T, E) when output_hidden_states, else empty: the embeddings (times sqrt(E) for Gemma), then
  // the output of each layer, the last one after the final norm (transformers replaces the last layer's raw output
  // by the normalised one).
  std::vector<Tensor> hidden_states;
};

// HF's BaseModelOutput (an encoder such as BertModel): B, T the ids' shape.
struct BaseModelOutput {
  Tensor last_hidden_state;          // (B, T, E)
  // L entries (B, H, T, T) when output_attentions, else empty: softmax over the keys, 0 at padded keys.
  std::vector<Tensor> attentions;
  // L + 1 entries (B, T, E) when output_hidden_states, else empty: the embeddings' output, then each layer's
  // (the last one is last_hidden_state).
  std::vector<Tensor> hidden_states;
};

// HF's Seq2SeqLMOutput: Ts the source length, Tt the target length. The attention lists hold one entry per layer
// of their stack, (B, H, Tq, Tk): encoder self-attention (Ts, Ts), decoder self-attention (Tt, Tt), cross-attention
// (Tt, Ts). The hidden-state lists hold L + 1 entries (B, T, E): the stack's input (the embeddings), then each
// layer's output, the last one after the stack's final norm when it has one (as transformers' BART and T5).
struct Seq2SeqLMOutput {
  Tensor logits;                              // (B, Tt, V)
  Tensor encoder_last_hidden_state;           // (B, Ts, E): the memory the decoder attends to
  std::vector<Tensor> encoder_attentions;     // when output_attentions, else empty
  std::vector<Tensor> decoder_attentions;     // when output_attentions, else empty
  std::vector<Tensor> cross_attentions;       // when output_attentions, else empty
  std::vector<Tensor> encoder_hidden_states;  // when output_hidden_states, else empty
  std::vector<Tensor> decoder_hidden_states;  // when output_hidden_states, else empty
};

}  // namespace qkv::models
