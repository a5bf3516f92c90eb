// `qkv info`: what this build of qkv is: version, the attention kernels this CPU runs, and whether it was built with
// MPI (data parallelism and ring attention across processes) and which MPI library.
// `qkv info --model PATH`: what a language model (a .gguf file or a folder) is, read without loading its weights:
// architecture, sizes, rotary scaling, weight types, tokenizer, end-of-generation ids and chat template.
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "commands.h"
#include "qkv/core/error.h"
#include "qkv/core/gguf.h"
#include "qkv/core/json.h"
#include "qkv/core/safetensors.h"
#include "qkv/parallel/comm.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/kernels/lowp.h"
#include "qkv/models/language_model.h"
#include "qkv/models/llama.h"
#include "qkv/text/chat_template.h"
#include "qkv/text/tokenizer.h"
#include "run_common.h"

#ifndef QKV_VERSION
#define QKV_VERSION "unknown"
#endif

namespace qkv::cli {
namespace {

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

const char* rope_type_name(RopeScaling::Type t) {
  switch (t) {
    case RopeScaling::Type::kDefault: return "default";
    case RopeScaling::Type::kLinear: return "linear";
    case RopeScaling::Type::kLlama3: return "llama3";
    case RopeScaling::Type::kYarn: return "yarn";
  }
  return "?";
}

std::string counts_line(const std::map<std::string, int64_t>& counts) {  // "q4_1 x 211, f32 x 61"
  std::string out;
  for (const auto& [name, n] : counts) out += (out.empty() ? "" : ", ") + name + " x " + std::to_string(n);
  return out;
}

// The dtypes of a folder's safetensors files (model.safetensors, or the shards of its index), counted per tensor.
std::map<std::string, int64_t> folder_weight_types(const std::string& dir) {
  std::vector<std::string> files;
  if (is_file(join(dir, "model.safetensors"))) {
    files.push_back(join(dir, "model.safetensors"));
  } else {
    const std::string index = join(dir, "model.safetensors.index.json");
    QKV_CHECK_RUNTIME(is_file(index), "[info] ", dir,
                      " has neither model.safetensors nor model.safetensors.index.json");
    const json::Value doc = json::Value::parse(read_file_text(index, "info"), index);
    std::set<std::string> shards;
    if (const json::Value* map = doc.find("weight_map"))
      for (const auto& [name, file] : map->members())
        if (file.is_string()) shards.insert(file.as_string());
    for (const std::string& s : shards) files.push_back(join(dir, s));
  }
  std::map<std::string, int64_t> counts;
  for (const std::string& f : files)
    for (const SafeTensorsEntry& e : read_safetensors_bytes(f, /*map=*/true).header.entries)
      ++counts[dtype_name(e.dtype)];
  return counts;
}

// "49152 tokens, byte-level BPE (GGUF tokenizer.ggml.model gpt2, pre smollm)" and the like.
std::string tokenizer_kind(const std::string& path, bool gguf_file) {
  if (gguf_file) {
    const gguf::File f = gguf::File::open(path);
    const gguf::Value* model = f.find("tokenizer.ggml.model");
    const gguf::Value* pre = f.find("tokenizer.ggml.pre");
    const std::string m = model ? model->as_string() : "?";
    const std::string kind = m == "gpt2" ? "byte-level BPE" : m == "llama" ? "SentencePiece BPE" : m;
    return kind + " (tokenizer.ggml.model " + m + (pre ? ", pre " + pre->as_string() : "") + ")";
  }
  const text::TokenizerSpec spec = text::read_tokenizer_json(join(path, "tokenizer.json"));
  bool byte_level = false;
  for (const text::PreTokenizerStep& s : spec.pre_tokenizer)
    byte_level |= s.kind == text::PreTokenizerStep::Kind::kByteLevel;
  return std::string(byte_level ? "byte-level BPE" : spec.byte_fallback ? "BPE with byte fallback" : "BPE") +
         " (tokenizer.json)";
}

void print_model_info(const std::string& path) {
  struct stat st {};
  QKV_CHECK_RUNTIME(::stat(path.c_str(), &st) == 0, "[info] ", path,
                    " does not exist (a .gguf file or a model folder)");
  const bool gguf_file = S_ISREG(st.st_mode);
  models::LlamaConfig c;
  std::map<std::string, int64_t> weights;
  std::string chat_template;
  if (gguf_file) {
    const gguf::File f = gguf::File::open(path);
    c = models::llama_config_from_gguf(f);
    for (const gguf::TensorInfo& t : f.tensors()) ++weights[gguf::type_name(t.type)];
    if (const gguf::Value* t = f.find("tokenizer.chat_template")) chat_template = t->as_string();
    std::printf("model: %s (GGUF v%u, %zu tensors)\n", path.c_str(), f.version(), f.tensors().size());
  } else {
    c = models::LlamaConfig::from_json_file(join(path, "config.json"));
    weights = folder_weight_types(path);
    try {
      chat_template = text::find_chat_template(path);
    } catch (const std::runtime_error&) {
      // none: a base model
    }
    std::printf("model: %s (folder)\n", path.c_str());
  }
  std::printf("architecture: %s\n", c.model_type.c_str());
  std::printf("layers: %lld\n", static_cast<long long>(c.num_hidden_layers));
  std::printf("hidden: %lld (mlp %lld)\n", static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.intermediate_size));
  std::printf("heads: %lld, kv heads: %lld, head_dim: %lld\n", static_cast<long long>(c.num_attention_heads),
              static_cast<long long>(c.num_key_value_heads), static_cast<long long>(c.head_dim));
  std::printf("vocab: %lld\n", static_cast<long long>(c.vocab_size));
  std::printf("context: %lld\n", static_cast<long long>(c.max_position_embeddings));
  const RopeScaling& r = c.rope_scaling;
  const auto number = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  std::string rope = "theta " + number(c.rope_theta) + ", scaling " + rope_type_name(r.type);
  if (r.type != RopeScaling::Type::kDefault) rope += " factor " + number(r.factor);
  if (r.original_max_position_embeddings > 0)
    rope += ", original context " + std::to_string(r.original_max_position_embeddings);
  if (!r.freq_factors.empty()) rope += ", rope_freqs (" + std::to_string(r.freq_factors.size()) + ")";
  std::printf("rope: %s\n", rope.c_str());
  if (c.sliding_window > 0) std::printf("sliding window: %lld\n", static_cast<long long>(c.sliding_window));
  std::printf("weights: %s\n", counts_line(weights).c_str());

  const std::unique_ptr<text::Tokenizer> tok = text::load_tokenizer(path);
  std::printf("tokenizer: %lld tokens, %s\n", static_cast<long long>(tok->vocab_size()),
              tokenizer_kind(path, gguf_file).c_str());
  const auto named = [&](int64_t id) {
    if (id < 0) return std::string("none");
    return std::to_string(id) + " " +
           (id < tok->vocab_size() ? tok->token(id) : std::string("(outside the tokenizer)"));
  };
  std::printf("bos: %s\n", named(tok->bos_token_id()).c_str());
  std::printf("eos: %s\n", named(tok->eos_token_id()).c_str());
  std::string stops;
  for (int64_t id : models::end_of_generation_ids(path, tok.get())) stops += (stops.empty() ? "" : ", ") + named(id);
  std::printf("stop ids: %s\n", stops.empty() ? "none" : stops.c_str());
  if (chat_template.empty()) {
    std::printf("chat template: none (plain text completion only)\n");
  } else {
    std::printf("chat template: yes (%zu characters)\n", chat_template.size());
  }
}

}  // namespace

void add_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Version, CPU kernels and MPI support of this build; or, with --model, what "
                                         "a language model is");
  auto model = std::make_shared<std::string>();
  cmd->add_option("--model", *model, "A .gguf file or a model folder: print its architecture, sizes, weight types, "
                                     "tokenizer and chat template instead");
  cmd->callback([model]() {
    if (!model->empty()) {
      print_model_info(*model);
      flush_stdout("info");
      return;
    }
    std::printf("qkv %s\n", QKV_VERSION);
    std::printf("attention kernels: %s\n", kernels::flash_isa_name());
    std::printf("bf16: %s\n", kernels::lowp_paths().bf16);
    std::printf("int8: %s\n", kernels::lowp_paths().int8);
    if (parallel::built_with_mpi()) {
      std::printf("mpi: yes (%s)\n", parallel::mpi_library_version().c_str());
    } else {
      std::printf("mpi: no (built without MPI: one process only; install libopenmpi-dev and rebuild)\n");
    }
  });
}

}  // namespace qkv::cli
