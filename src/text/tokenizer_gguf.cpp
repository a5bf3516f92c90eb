// The tokenizer of a GGUF file: its tokenizer.ggml.* metadata read through core/gguf into GgufTokenizerData, then
// spec_from_gguf (src/text/tokenizer.cpp) builds what HF builds from them.
#include "qkv/core/error.h"
#include "qkv/core/gguf.h"
#include "qkv/text/tokenizer.h"

namespace qkv::text {

std::unique_ptr<Tokenizer> from_gguf(const std::string& path) {
  GgufTokenizerData d;
  d.source = path;
  {  // the File (its parsed metadata and the mapped pages) is gone before the spec and the tokenizer are built
    const gguf::File file = gguf::File::open(path);
    std::string key;
    try {
      auto find = [&](const char* k) {
        key = std::string("tokenizer.ggml.") + k;
        return file.find(key);
      };
      const gguf::Value* model = find("model");
      QKV_CHECK_RUNTIME(model != nullptr, "[tokenizer] ", path, ": tokenizer.ggml.model is missing (no tokenizer)");
      d.model = model->as_string();
      if (auto v = find("pre")) d.pre = v->as_string();
      const gguf::Value* tokens = find("tokens");
      QKV_CHECK_RUNTIME(tokens != nullptr, "[tokenizer] ", path, ": tokenizer.ggml.tokens is missing");
      d.tokens = tokens->as_strings();
      if (auto v = find("token_type"))
        for (int64_t t : v->as_ints()) d.token_types.push_back(static_cast<int32_t>(t));
      if (auto v = find("merges")) d.merges = v->as_strings();
      if (auto v = find("scores")) d.scores = v->as_floats();
      if (auto v = find("bos_token_id")) d.bos_id = v->as_int();
      if (auto v = find("eos_token_id")) d.eos_id = v->as_int();
      if (auto v = find("unknown_token_id")) d.unk_id = v->as_int();
      if (auto v = find("padding_token_id")) d.pad_id = v->as_int();
      if (auto v = find("add_bos_token")) d.add_bos = v->as_bool() ? 1 : 0;
      if (auto v = find("add_eos_token")) d.add_eos = v->as_bool() ? 1 : 0;
      if (auto v = find("add_space_prefix")) d.add_space_prefix = v->as_bool() ? 1 : 0;
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      if (what.rfind("[tokenizer]", 0) == 0) throw;
      throw std::runtime_error("[tokenizer] " + path + ": " + key + ": " + what);
    }
  }
  return make_tokenizer(spec_from_gguf(std::move(d)));
}

}  // namespace qkv::text
