// The layers a forward records the attention probabilities of (ForwardOptions::attention_layers), checked once for
// every model family.
#include "qkv/models/outputs.h"

#include "qkv/core/error.h"

namespace qkv::models {

std::vector<bool> attention_layers_asked(const ForwardOptions& options, int64_t num_layers, const char* op) {
  std::vector<bool> asked(static_cast<size_t>(num_layers),
                          options.output_attentions && options.attention_layers.empty());
  if (!options.output_attentions) return asked;
  for (int64_t l : options.attention_layers) {
    QKV_CHECK_ARG(l >= 0 && l < num_layers, "[", op, "] attention layer ", l, " is outside [0, ", num_layers, ")");
    asked[static_cast<size_t>(l)] = true;
  }
  return asked;
}

}  // namespace qkv::models
