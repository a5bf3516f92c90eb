// The OpenAI API as llama.cpp's llama-server speaks it, without the HTTP: request bodies of /v1/chat/completions
// and /v1/completions checked into a scheduler request, a reply's text cut at stop strings as tokens come, and the
// response, chunk, log-probability and error objects. cli/serve_openai.cpp puts it on the wire.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "qkv/core/json.h"
#include "qkv/decode/generate.h"
#include "qkv/decode/scheduler.h"
#include "qkv/models/language_model.h"
#include "qkv/text/tokenizer.h"

namespace qkv::serve {

// A request the server answers with an OpenAI error object: HTTP status, error type ("invalid_request_error",
// "exceed_context_size_error", "authentication_error", "not_found_error", "unavailable_error", "server_error") and
// message; `extra` holds more members of the error object (n_prompt_tokens and n_ctx for a prompt too long).
class ApiError : public std::invalid_argument {
 public:
  ApiError(int status, std::string type, const std::string& message, json::Value extra = json::Value::object());
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const json::Value& extra() const { return extra_; }

 private:
  int status_;
  std::string type_;
  json::Value extra_;
};

// {"error": {"code": status, "message": ..., "type": ..., extra members}}
json::Value error_body(int status, const std::string& type, const std::string& message,
                       const json::Value& extra = json::Value::object());
json::Value error_body(const ApiError& e);

// A request body as a JSON object: ApiError 400 when it is not JSON or not an object.
json::Value parse_body(const std::string& body);

enum class Endpoint { kChat, kCompletion };

// The options of a completion request, checked (ApiError 400 names the field): everything but the prompt.
struct CompletionOptions {
  int64_t max_tokens = -1;                 // -1: until the context's end
  decode::SamplingOptions sampling;        // temperature, top_p, top_k (llama-server's), seed
  bool seeded = false;                     // whether the body gave a seed
  std::vector<std::string> stop;           // stop strings: the reply ends before the first one
  int64_t n = 1;                           // choices, each its own scheduler request (seed + index)
  bool stream = false;
  bool include_usage = false;              // stream_options.include_usage
  int64_t logprobs = -1;                   // -1: none; k >= 0: the chosen token's and the k most likely
};
constexpr int64_t kMaxChoices = 8;
constexpr int64_t kMaxTopLogprobs = 20;
constexpr size_t kMaxStops = 16;

// Chat: logprobs (bool) and top_logprobs (0..20, needs logprobs); completions: logprobs (an integer 0..20).
// max_completion_tokens wins over max_tokens. Fields this server does not read are ignored, as llama-server does;
// those whose meaning it cannot honour (frequency_penalty or presence_penalty other than 0, tools, a response
// format other than text) are refused.
CompletionOptions parse_options(const json::Value& body, Endpoint endpoint);

// Chat: the "messages" list checked (a non-empty list of {"role": system|developer|user|assistant|tool, "content":
// a string or a list of {"type": "text", "text": ...} parts}) and normalised to {"role", "content": string}
// objects (developer becomes system), ready for the chat template.
json::Value chat_messages(const json::Value& body);

// The prompt's ids: chat messages through the model's template (ApiError 400 when it has none or it raises), or a
// completion's "prompt" (a string, a list of one string, or a list of ids in [0, vocab_size)) tokenized with the
// tokenizer's special tokens. ApiError 400 "exceed_context_size_error" when it leaves no room in `context`.
std::vector<int64_t> prompt_ids(const json::Value& body, Endpoint endpoint, const models::LanguageModel& lm,
                                int64_t context);

// The scheduler request of one choice: max_new_tokens capped to the context (context - prompt), the model's stop
// ids, the sampling seed + index, top_logprobs.
decode::RequestOptions request_options(const CompletionOptions& options, const models::LanguageModel& lm,
                                       int64_t prompt_tokens, int64_t context, int64_t index);

// Text in pieces, cut before the first stop string: push() appends and returns what is safe to release, holding
// back a tail that could still begin a stop string; once a stop string is complete, stopped() is true and the
// text before it is all that was ever released.
class StopText {
 public:
  explicit StopText(std::vector<std::string> stops);
  std::string push(const std::string& piece);
  std::string finish();  // the held-back tail (when not stopped)
  bool stopped() const { return stopped_; }
  size_t released() const { return released_; }  // bytes released so far

 private:
  std::vector<std::string> stops_;
  std::string text_;        // everything pushed
  size_t released_ = 0;
  bool stopped_ = false;
};

// One choice as its tokens come: text through a text::StreamDecoder (special tokens skipped, UTF-8 never split),
// cut at stop strings. Each push returns the text released and the tokens whose text is now wholly released
// (their log-probabilities go with it); at a stop, the tokens that began before the cut.
class ChoiceText {
 public:
  ChoiceText(const text::Tokenizer& tokenizer, std::vector<std::string> stops);
  struct Piece {
    std::string text;
    std::vector<decode::TokenEvent> tokens;
  };
  Piece push(const decode::TokenEvent& event);  // ignored once stopped()
  Piece finish();                               // what is held back, at the reply's end
  bool stopped() const { return stop_.stopped(); }
  int64_t tokens() const { return tokens_; }  // tokens pushed until the stop (the stop's own included)

 private:
  Piece release(std::string text);
  text::StreamDecoder decoder_;
  StopText stop_;
  size_t decoded_ = 0;  // bytes decoded so far
  struct Pending {
    size_t begin, end;  // the token's text in the decoded bytes
    decode::TokenEvent event;
  };
  std::vector<Pending> pending_;
  int64_t tokens_ = 0;
};

// "stop" for a stop id or string, "length" for max_tokens or the context's end; nullptr (JSON null) otherwise.
const char* finish_reason(decode::FinishReason finish, bool stopped_by_string);

// Chat format: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
json::Value chat_logprobs(const text::Tokenizer& tokenizer, const std::vector<decode::TokenEvent>& tokens);
// Completions' legacy format: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"};
// offsets count from `text_offset` (the bytes of the choice's text before these tokens).
json::Value legacy_logprobs(const text::Tokenizer& tokenizer, const std::vector<decode::TokenEvent>& tokens,
                            int64_t text_offset);

// llama-server's utility routes. /tokenize {"content": string, "add_special": bool (false)} -> {"tokens": [ids]};
// /detokenize {"tokens": [ids in [0, vocab_size)]} -> {"content": text}; /apply-template {"messages": [...]} ->
// {"prompt": the rendered chat with the generation prompt}. ApiError 400 on a wrong field.
json::Value tokenize(const json::Value& body, const text::Tokenizer& tokenizer);
json::Value detokenize(const json::Value& body, const text::Tokenizer& tokenizer);
json::Value apply_template(const json::Value& body, const models::LanguageModel& lm);

// A response's or chunk's header: {"id", "object", "created", "model"}.
json::Value response_head(const std::string& id, const char* object, int64_t created, const std::string& model);
json::Value usage(int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace qkv::serve
