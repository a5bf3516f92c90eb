// The installed qkv library from another project: causal self-attention over a (batch, heads, time, head_dim)
// tensor, and, given a language model (a .gguf file or a Hugging Face folder) as the first argument or in
// QKV_CONSUMER_MODEL, a greedy chat reply to one user message, printed as it is generated.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "qkv/core/json.h"
#include "qkv/core/rng.h"
#include "qkv/decode/generate.h"
#include "qkv/models/language_model.h"
#include "qkv/ops/attention.h"
#include "qkv/text/tokenizer.h"

namespace {

void attention_check() {
  qkv::Rng rng(42);
  // q, k, v: (B=2, H=4, T=16, D=32)
  const qkv::Tensor q = rng.normal({2, 4, 16, 32});
  const qkv::Tensor k = rng.normal({2, 4, 16, 32});
  const qkv::Tensor v = rng.normal({2, 4, 16, 32});

  qkv::AttentionOptions options;
  options.causal = qkv::Causal::kTopLeft;  // query i sees keys 0..i
  options.return_lse = true;
  const qkv::AttentionResult r = qkv::attention(q, k, v, options);

  std::printf("out %s, lse %s, out[0,0,0,0] = %.6f\n", qkv::str(r.out.shape()).c_str(),
              qkv::str(r.lse.shape()).c_str(), r.out.at({0, 0, 0, 0}));
}

// The model's chat template around one user message, then greedy decoding until an end-of-generation id (or 48
// new tokens), each piece of text printed as soon as it is complete.
int chat(const std::string& path) {
  const qkv::models::LanguageModel lm = qkv::models::LanguageModel::load(path);
  qkv::json::Value user = qkv::json::Value::object();
  user.set("role", "user");
  user.set("content", "What is the capital of France? Answer in one sentence.");
  qkv::json::Value messages = qkv::json::Value::array();
  messages.push(user);
  const std::vector<int64_t> prompt = lm.encode_chat(messages, /*add_generation_prompt=*/true);

  qkv::decode::GenerateOptions options;  // greedy
  options.max_new_tokens = 48;
  options.stop_ids = lm.stop_ids;
  qkv::text::StreamDecoder text(*lm.tokenizer, /*skip_special_tokens=*/true);
  std::printf("%s: %zu prompt tokens\nassistant: ", path.c_str(), prompt.size());
  const qkv::decode::Generation g = qkv::decode::generate(*lm.model, prompt, options, [&](int64_t id) {
    std::fputs(text.push(id).c_str(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::printf("%s\n[%zu tokens, %s]\n", text.flush().c_str(), g.tokens.size(),
              qkv::decode::finish_reason_name(g.finish));
  return g.tokens.empty() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  attention_check();
  const char* env = std::getenv("QKV_CONSUMER_MODEL");
  const std::string model = argc > 1 ? argv[1] : env ? env : "";
  if (model.empty()) return 0;
  try {
    return chat(model);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
