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

}  // namespace qkv::testing
