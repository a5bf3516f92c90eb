// A tiny Llama configuration shared by the tests that need a whole model with tied embeddings (read by the first
// node and by the last) and grouped-query attention (2 query heads over 1 kv head): 2 layers, width 8, FFN 12.
#pragma once

#include <cstdint>

#include "qkv/models/llama.h"

namespace qkv::testing {

inline models::LlamaConfig tiny_tied_gqa_llama(int64_t vocab) {
  models::LlamaConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.tie_word_embeddings = true;
  c.layer_sliding.assign(2, false);
  return c;
}

// A tiny config with GQA 4/2; gemma: Gemma 2's switches too (a window of 3 on layer 0, both soft-caps, a custom
// scale, (1 + w) norms, sandwich norms, scaled embeddings, GeGLU, tied embeddings); plain Llama otherwise. 2 layers,
// width 16, FFN 24, vocabulary 23.
inline models::LlamaConfig tiny_gqa_llama(bool gemma) {
  models::LlamaConfig c;
  c.model_type = gemma ? "gemma2" : "llama";
  c.vocab_size = 23;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 6;
  c.layer_sliding = {gemma, false};
  if (gemma) {
    c.sliding_window = 3;
    c.attn_logit_softcapping = 1.5f;
    c.final_logit_softcapping = 3.0f;
    c.attention_scale = 0.3f;
    c.norm_unit_offset = c.scale_embeddings = c.sandwich_norms = true;
    c.hidden_act = models::GatedActivation::kGeluTanh;
    c.tie_word_embeddings = true;
  }
  return c;
}

}  // namespace qkv::testing
