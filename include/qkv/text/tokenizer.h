// The one tokenizer interface of the language models (text <-> ids, as Hugging Face `tokenizers` does), its
// streaming decoder, and the loaders: tokenizer.json (HF) and the tokenizer of a GGUF file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/text/bpe.h"

namespace qkv::text {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // text (UTF-8; invalid bytes throw std::invalid_argument) -> ids. add_special_tokens applies the
  // post-processor (bos/eos template), as HF's encode(text, add_special_tokens=True).
  virtual std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const = 0;
  // The same, with no special or added token recognised inside the byte ranges [begin, end) of `plain` (what a
  // user typed into a chat: "<|im_start|>" there is text). Outside them, and where nothing special-looking is
  // inside them, the ids are encode(text)'s.
  virtual std::vector<int64_t> encode(std::string_view text, bool add_special_tokens,
                                      const std::vector<std::pair<size_t, size_t>>& plain) const = 0;
  // ids -> the bytes the decoder gives, byte for byte (a byte-level token may end inside a UTF-8 sequence: the
  // bytes stay as they are). Ids out of [0, vocab_size) throw std::invalid_argument.
  virtual std::string decode_bytes(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const = 0;
  // ids -> text exactly as HF's decode: decode_bytes with every ill-formed UTF-8 part replaced by U+FFFD (one per
  // maximal ill-formed subpart, as Rust's String::from_utf8_lossy; one per byte for a byte-fallback run).
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const = 0;

  virtual int64_t vocab_size() const = 0;                // model vocabulary and added tokens together
  virtual const std::string& token(int64_t id) const = 0;  // the token's string as stored; throws when out of range
  virtual int64_t id(std::string_view token) const = 0;  // -1 when absent
  virtual int64_t bos_token_id() const = 0;              // -1 when none
  virtual int64_t eos_token_id() const = 0;              // -1 when none
  virtual const std::vector<int64_t>& special_token_ids() const = 0;  // ascending
  virtual bool is_special(int64_t id) const = 0;
};

// Ids in, text out, one id at a time: push() returns the text that is complete so far and not yet returned. A
// multi-byte UTF-8 sequence cut by a byte token is held back until its last byte comes; bytes that can never
// become valid UTF-8 come out as U+FFFD. flush() returns what is held back (U+FFFD for an unfinished sequence) and
// starts over. The concatenation of every push() and the final flush() equals tokenizer.decode(all ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(int64_t id);
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int64_t> ids_;  // the context id (last one fully returned) and the ids since
  size_t done_ = 0;           // bytes of decode_bytes(ids_) already returned or belonging to the context
};

// Builds the tokenizer a spec describes (checks it: std::invalid_argument naming spec.source on a bad spec).
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerSpec spec);

// A tokenizer.json (with tokenizer_config.json / special_tokens_map.json beside it for bos and eos). Throws
// std::runtime_error naming the file when it cannot be read, and "<file>: <key> ..." for a model, normalizer,
// pre-tokenizer, post-processor or decoder this reader does not implement.
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path);
// The parsed tokenizer.json as a spec (load_tokenizer_json = make_tokenizer(read_tokenizer_json(path))).
// stream: model.vocab and model.merges read from the text straight into the spec and only the rest of the document
// as a json::Value tree (a few MB at most, where the whole tree of a 50 K-token vocabulary takes about 25 MB);
// documents it does not read exactly as the tree reader does go to the tree reader, so the spec and every error
// are those of stream = false (the whole document as one tree: the reference the tests compare with).
TokenizerSpec read_tokenizer_json(const std::string& path, bool stream = true);

// The language-model tokenizer of a GGUF file's metadata: tokenizer.ggml.model "gpt2" (byte-level BPE; pre
// "smollm", "llama-bpe", "qwen2", "gpt2", "default") or "llama" (SentencePiece BPE with byte fallback, merged by
// score as HF's converter does). Anything else is refused naming the file and the key.
std::unique_ptr<Tokenizer> from_gguf(const std::string& path);

// A file path or a folder: a .gguf file, a tokenizer.json file, or a folder holding tokenizer.json.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace qkv::text
