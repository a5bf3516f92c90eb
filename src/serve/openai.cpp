// The OpenAI request and response objects as llama-server speaks them (qkv/serve/openai.h): checked request fields,
// prompts, stop strings over streamed text, log-probabilities and error objects.
#include "qkv/serve/openai.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

namespace qkv::serve {
namespace {

ApiError bad(const std::string& message) { return ApiError(400, "invalid_request_error", message); }

// The member `key` when present and not null.
const json::Value* field(const json::Value& body, const char* key) {
  const json::Value* v = body.find(key);
  return v && !v->is_null() ? v : nullptr;
}

std::string got(const json::Value& v) { return std::string(", got ") + json::type_name(v.type()); }

bool get_bool(const json::Value& body, const char* key, bool fallback) {
  const json::Value* v = field(body, key);
  if (!v) return fallback;
  if (!v->is_bool()) throw bad(std::string("'") + key + "' must be a boolean" + got(*v));
  return v->as_bool();
}

// An integer member in [lo, hi] (a number with no fraction is taken, as 5.0 from some clients).
int64_t get_int(const json::Value& body, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  const json::Value* v = field(body, key);
  if (!v) return fallback;
  if (!v->is_number() || (!v->is_integer() && (v->as_number() != std::floor(v->as_number()) ||
                                               std::fabs(v->as_number()) > 9.0e15)))
    throw bad(std::string("'") + key + "' must be an integer" + got(*v));
  const int64_t x = v->as_integer();
  if (x < lo || x > hi)
    throw bad(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
              std::to_string(x));
  return x;
}

double get_number(const json::Value& body, const char* key, double fallback) {
  const json::Value* v = field(body, key);
  if (!v) return fallback;
  if (!v->is_number() || !std::isfinite(v->as_number()))
    throw bad(std::string("'") + key + "' must be a number" + got(*v));
  return v->as_number();
}

std::string json_number(double x) { return json::Value(x).dump(0); }

}  // namespace

ApiError::ApiError(int status, std::string type, const std::string& message, json::Value extra)
    : std::invalid_argument(message), status_(status), type_(std::move(type)), extra_(std::move(extra)) {}

json::Value error_body(int status, const std::string& type, const std::string& message, const json::Value& extra) {
  json::Value e = json::Value::object();
  e.set("code", status).set("message", message).set("type", type);
  for (const auto& [key, value] : extra.members()) e.set(key, value);
  return json::Value::object().set("error", std::move(e));
}

json::Value error_body(const ApiError& e) { return error_body(e.status(), e.type(), e.what(), e.extra()); }

json::Value parse_body(const std::string& body) {
  json::Value j;
  try {
    j = json::Value::parse(body, "[serve] request body");
  } catch (const std::invalid_argument& e) {
    throw bad(std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw bad("the request body must be a JSON object" + got(j));
  return j;
}

CompletionOptions parse_options(const json::Value& body, Endpoint endpoint) {
  CompletionOptions o;
  // max_completion_tokens is the newer name of max_tokens (chat); it wins when both are given.
  o.max_tokens = get_int(body, "max_tokens", -1, -1, INT64_MAX);
  o.max_tokens = get_int(body, "max_completion_tokens", o.max_tokens, -1, INT64_MAX);
  const double temperature = get_number(body, "temperature", 1.0);  // OpenAI's default
  if (temperature < 0.0) throw bad("'temperature' must be >= 0, got " + json_number(temperature));
  o.sampling.temperature = static_cast<float>(temperature);
  const double top_p = get_number(body, "top_p", 1.0);
  if (!(top_p > 0.0 && top_p <= 1.0)) throw bad("'top_p' must be in (0, 1], got " + json_number(top_p));
  o.sampling.top_p = static_cast<float>(top_p);
  o.sampling.top_k = get_int(body, "top_k", 0, 0, INT64_MAX);
  if (field(body, "seed")) {
    o.sampling.seed = static_cast<uint64_t>(get_int(body, "seed", 0, INT64_MIN, INT64_MAX));
    o.seeded = true;
  }
  if (const json::Value* s = field(body, "stop")) {
    if (s->is_string()) {
      o.stop.push_back(s->as_string());
    } else if (s->is_array()) {
      for (const json::Value& x : s->items()) {
        if (!x.is_string()) throw bad("'stop' must be a string or a list of strings, it holds " +
                                      std::string(json::type_name(x.type())));
        o.stop.push_back(x.as_string());
      }
    } else {
      throw bad("'stop' must be a string or a list of strings" + got(*s));
    }
    if (o.stop.size() > kMaxStops)
      throw bad("'stop' holds " + std::to_string(o.stop.size()) + " strings, more than " + std::to_string(kMaxStops));
    for (const std::string& x : o.stop)
      if (x.empty()) throw bad("'stop' holds an empty string");
  }
  o.n = get_int(body, "n", 1, 1, kMaxChoices);
  o.stream = get_bool(body, "stream", false);
  if (const json::Value* so = field(body, "stream_options")) {
    if (!so->is_object()) throw bad("'stream_options' must be an object" + got(*so));
    if (!o.stream) throw bad("'stream_options' is only allowed with 'stream': true");
    o.include_usage = get_bool(*so, "include_usage", false);
  }
  if (endpoint == Endpoint::kChat) {
    const bool logprobs = get_bool(body, "logprobs", false);
    const int64_t top = get_int(body, "top_logprobs", -1, 0, kMaxTopLogprobs);
    if (top >= 0 && !logprobs) throw bad("'top_logprobs' needs 'logprobs': true");
    o.logprobs = logprobs ? std::max<int64_t>(top, 0) : -1;
  } else {
    o.logprobs = get_int(body, "logprobs", -1, 0, kMaxTopLogprobs);
    if (get_bool(body, "echo", false)) throw bad("'echo' is not supported");
    if (const json::Value* s = field(body, "suffix"); s && !(s->is_string() && s->as_string().empty()))
      throw bad("'suffix' is not supported");
    if (get_int(body, "best_of", 1, 1, kMaxChoices) != 1) throw bad("'best_of' other than 1 is not supported");
  }
  for (const char* key : {"frequency_penalty", "presence_penalty"})
    if (get_number(body, key, 0.0) != 0.0) throw bad(std::string("'") + key + "' other than 0 is not supported");
  for (const char* key : {"tools", "functions"})
    if (const json::Value* t = field(body, key); t && !(t->is_array() && t->size() == 0))
      throw bad(std::string("'") + key + "' (tool calls) is not supported");
  if (const json::Value* rf = field(body, "response_format")) {
    const json::Value* type = rf->is_object() ? rf->find("type") : nullptr;
    if (!type || !type->is_string() || type->as_string() != "text")
      throw bad("'response_format' other than {\"type\": \"text\"} is not supported");
  }
  if (o.sampling.temperature > 0.0f && !o.seeded) o.sampling.seed = std::random_device{}();
  return o;
}

json::Value chat_messages(const json::Value& body) {
  const json::Value* m = body.find("messages");
  if (!m) throw bad("'messages' is required");
  if (!m->is_array()) throw bad("'messages' must be a list" + got(*m));
  if (m->size() == 0) throw bad("'messages' is empty");
  json::Value out = json::Value::array();
  for (size_t i = 0; i < m->size(); ++i) {
    const json::Value& msg = m->items()[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) throw bad("'" + at + "' must be an object" + got(msg));
    const json::Value* role = msg.find("role");
    if (!role || !role->is_string()) throw bad("'" + at + ".role' must be a string");
    std::string r = role->as_string();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      throw bad("'" + at + ".role' is '" + role->as_string() +
                "': expected system, developer, user, assistant or tool");
    const json::Value* content = msg.find("content");
    std::string text;
    if (content && content->is_string()) {
      text = content->as_string();
    } else if (content && content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const json::Value& part = content->items()[k];
        const json::Value* type = part.is_object() ? part.find("type") : nullptr;
        const json::Value* t = part.is_object() ? part.find("text") : nullptr;
        if (!type || !type->is_string() || type->as_string() != "text" || !t || !t->is_string())
          throw bad("'" + at + ".content[" + std::to_string(k) +
                    "]' must be {\"type\": \"text\", \"text\": string} (this server reads text only)");
        text += t->as_string();
      }
    } else if (!(r == "assistant" && (!content || content->is_null()))) {
      throw bad("'" + at + ".content' must be a string or a list of text parts" +
                (content ? got(*content) : std::string(", it is missing")));
    }
    out.push(json::Value::object().set("role", r).set("content", text));
  }
  return out;
}

std::vector<int64_t> prompt_ids(const json::Value& body, Endpoint endpoint, const models::LanguageModel& lm,
                                int64_t context) {
  std::vector<int64_t> ids;
  if (endpoint == Endpoint::kChat) {
    const json::Value messages = chat_messages(body);
    if (!lm.chat_template) throw bad("the model has no chat template: use /v1/completions");
    try {
      ids = lm.encode_chat(messages, /*add_generation_prompt=*/true);
    } catch (const std::invalid_argument& e) {
      throw bad(std::string("the chat template refused the messages: ") + e.what());
    }
  } else {
    const json::Value* p = body.find("prompt");
    if (!p) throw bad("'prompt' is required");
    const json::Value* text = p->is_string() ? p : nullptr;
    if (p->is_array() && p->size() == 1 && p->items()[0].is_string()) text = &p->items()[0];
    if (text) {
      try {
        ids = lm.tokenizer->encode(text->as_string(), /*add_special_tokens=*/true);
      } catch (const std::invalid_argument& e) {
        throw bad(std::string("the prompt cannot be tokenized: ") + e.what());
      }
    } else if (p->is_array()) {
      const int64_t vocab = lm.tokenizer->vocab_size();
      for (const json::Value& x : p->items()) {
        if (!x.is_integer())
          throw bad("'prompt' must be a string, a list of one string or a list of token ids; it holds " +
                    std::string(json::type_name(x.type())));
        if (x.as_integer() < 0 || x.as_integer() >= vocab)
          throw bad("'prompt' holds the id " + std::to_string(x.as_integer()) + ", outside [0, " +
                    std::to_string(vocab) + ")");
        ids.push_back(x.as_integer());
      }
    } else {
      throw bad("'prompt' must be a string, a list of one string or a list of token ids" + got(*p));
    }
  }
  if (ids.empty()) throw bad("the prompt is empty (no token)");
  const auto n = static_cast<int64_t>(ids.size());
  if (n >= context)
    throw ApiError(400, "exceed_context_size_error",
                   "the request exceeds the available context size: the prompt has " + std::to_string(n) +
                       " tokens and the context " + std::to_string(context) +
                       " (one more is needed for the reply), try increasing it",
                   json::Value::object().set("n_prompt_tokens", n).set("n_ctx", context));
  return ids;
}

decode::RequestOptions request_options(const CompletionOptions& options, const models::LanguageModel& lm,
                                       int64_t prompt_tokens, int64_t context, int64_t index) {
  decode::RequestOptions r;
  const int64_t room = context - prompt_tokens;
  r.max_new_tokens = options.max_tokens < 0 ? room : std::min(options.max_tokens, room);
  r.sampling = options.sampling;
  r.sampling.seed = options.sampling.seed + static_cast<uint64_t>(index);
  r.stop_ids = lm.stop_ids;
  r.top_logprobs = options.logprobs;
  return r;
}

StopText::StopText(std::vector<std::string> stops) : stops_(std::move(stops)) {}

std::string StopText::push(const std::string& piece) {
  if (stopped_) return "";
  text_ += piece;
  // A stop cannot begin before released_: every suffix that could begin one was held back.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, text_.find(s, released_));
  if (first != std::string::npos) {
    std::string out = text_.substr(released_, first - released_);
    released_ = first;
    stopped_ = true;
    return out;
  }
  size_t hold = 0;  // the longest tail that is a proper prefix of a stop
  const size_t open = text_.size() - released_;
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, open); k > hold; --k)
      if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  const size_t safe = text_.size() - hold;
  std::string out = text_.substr(released_, safe - released_);
  released_ = safe;
  return out;
}

std::string StopText::finish() {
  if (stopped_) return "";
  std::string out = text_.substr(released_);
  released_ = text_.size();
  return out;
}

ChoiceText::ChoiceText(const text::Tokenizer& tokenizer, std::vector<std::string> stops)
    : decoder_(tokenizer, /*skip_special_tokens=*/true), stop_(std::move(stops)) {}

ChoiceText::Piece ChoiceText::push(const decode::TokenEvent& event) {
  if (stop_.stopped()) return {};
  ++tokens_;
  const std::string s = decoder_.push(event.id);
  pending_.push_back({decoded_, decoded_ + s.size(), event});
  decoded_ += s.size();
  return release(stop_.push(s));
}

ChoiceText::Piece ChoiceText::finish() {
  if (stop_.stopped()) return {};
  const std::string rest = decoder_.flush();
  if (!pending_.empty()) pending_.back().end += rest.size();
  decoded_ += rest.size();
  std::string out = stop_.push(rest);
  out += stop_.finish();
  Piece p = release(std::move(out));
  if (!stop_.stopped())
    for (Pending& t : pending_) p.tokens.push_back(std::move(t.event));
  pending_.clear();
  return p;
}

ChoiceText::Piece ChoiceText::release(std::string text) {
  Piece p;
  p.text = std::move(text);
  const size_t released = stop_.released();
  size_t k = 0;
  if (stop_.stopped()) {
    while (k < pending_.size() && pending_[k].begin < released) p.tokens.push_back(std::move(pending_[k++].event));
    pending_.clear();
    return p;
  }
  while (k < pending_.size() && pending_[k].end <= released) p.tokens.push_back(std::move(pending_[k++].event));
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(k));
  return p;
}

const char* finish_reason(decode::FinishReason finish, bool stopped_by_string) {
  if (stopped_by_string) return "stop";
  switch (finish) {
    case decode::FinishReason::kStop: return "stop";
    case decode::FinishReason::kLength:
    case decode::FinishReason::kContext: return "length";
    case decode::FinishReason::kCancelled: return nullptr;
  }
  return nullptr;
}

namespace {

json::Value token_entry(const text::Tokenizer& tokenizer, int64_t id, float logprob) {
  const std::string raw = tokenizer.decode_bytes({id});
  std::vector<int64_t> bytes;
  for (unsigned char c : raw) bytes.push_back(c);
  return json::Value::object()
      .set("id", id)
      .set("token", tokenizer.decode({id}))
      .set("logprob", logprob)
      .set("bytes", bytes);
}

}  // namespace

json::Value chat_logprobs(const text::Tokenizer& tokenizer, const std::vector<decode::TokenEvent>& tokens) {
  json::Value content = json::Value::array();
  for (const decode::TokenEvent& e : tokens) {
    json::Value entry = token_entry(tokenizer, e.id, e.logprob);
    json::Value top = json::Value::array();
    for (const auto& [id, lp] : e.top) top.push(token_entry(tokenizer, id, lp));
    entry.set("top_logprobs", std::move(top));
    content.push(std::move(entry));
  }
  return json::Value::object().set("content", std::move(content));
}

json::Value legacy_logprobs(const text::Tokenizer& tokenizer, const std::vector<decode::TokenEvent>& tokens,
                            int64_t text_offset) {
  json::Value names = json::Value::array(), values = json::Value::array(), tops = json::Value::array(),
              offsets = json::Value::array();
  for (const decode::TokenEvent& e : tokens) {
    const std::string piece = tokenizer.decode({e.id}, /*skip_special_tokens=*/true);
    names.push(tokenizer.decode({e.id}));
    values.push(e.logprob);
    json::Value top = json::Value::object();
    for (const auto& [id, lp] : e.top) top.set(tokenizer.decode({id}), lp);
    tops.push(std::move(top));
    offsets.push(text_offset);
    text_offset += static_cast<int64_t>(piece.size());
  }
  return json::Value::object()
      .set("tokens", std::move(names))
      .set("token_logprobs", std::move(values))
      .set("top_logprobs", std::move(tops))
      .set("text_offset", std::move(offsets));
}

json::Value tokenize(const json::Value& body, const text::Tokenizer& tokenizer) {
  const json::Value* c = body.find("content");
  if (!c || !c->is_string()) throw bad("'content' must be a string" + (c ? got(*c) : std::string(", it is missing")));
  const bool add_special = get_bool(body, "add_special", false);
  try {
    return json::Value::object().set("tokens", tokenizer.encode(c->as_string(), add_special));
  } catch (const std::invalid_argument& e) {
    throw bad(std::string("'content' cannot be tokenized: ") + e.what());
  }
}

json::Value detokenize(const json::Value& body, const text::Tokenizer& tokenizer) {
  const json::Value* t = body.find("tokens");
  if (!t || !t->is_array()) throw bad("'tokens' must be a list of token ids" + (t ? got(*t) : std::string(", it is missing")));
  std::vector<int64_t> ids;
  for (const json::Value& x : t->items()) {
    if (!x.is_integer()) throw bad("'tokens' must hold integers, it holds " + std::string(json::type_name(x.type())));
    if (x.as_integer() < 0 || x.as_integer() >= tokenizer.vocab_size())
      throw bad("'tokens' holds the id " + std::to_string(x.as_integer()) + ", outside [0, " +
                std::to_string(tokenizer.vocab_size()) + ")");
    ids.push_back(x.as_integer());
  }
  return json::Value::object().set("content", tokenizer.decode(ids));
}

json::Value apply_template(const json::Value& body, const models::LanguageModel& lm) {
  const json::Value messages = chat_messages(body);
  if (!lm.chat_template) throw bad("the model has no chat template");
  try {
    return json::Value::object().set("prompt", lm.apply_chat_template(messages, /*add_generation_prompt=*/true));
  } catch (const std::invalid_argument& e) {
    throw bad(std::string("the chat template refused the messages: ") + e.what());
  }
}

json::Value response_head(const std::string& id, const char* object, int64_t created, const std::string& model) {
  return json::Value::object().set("id", id).set("object", object).set("created", created).set("model", model);
}

json::Value usage(int64_t prompt_tokens, int64_t completion_tokens) {
  return json::Value::object()
      .set("prompt_tokens", prompt_tokens)
      .set("completion_tokens", completion_tokens)
      .set("total_tokens", prompt_tokens + completion_tokens);
}

}  // namespace qkv::serve
