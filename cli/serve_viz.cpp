// The live viewer of `qkv serve --model` (see serve_viz.h): a chat prompt through the model with every layer's
// attention probabilities and hidden states recorded, then one recording step per greedy token, both on the
// scheduler's decoding step (decode::RecordingDecoder, LlamaForCausalLM::forward's CausalLMOutput); the maps and the
// logit lens written by the offline page's writers (viz_llm.h, plot::viz_data).
#include "serve_viz.h"

#include <omp.h>

#include <algorithm>
#include <utility>

#include "qkv/core/error.h"
#include "qkv/core/rng.h"
#include "qkv/decode/sampling.h"
#include "qkv/plot/viewer_data.h"
#include "viz_llm.h"
#include "viz_page.h"

namespace qkv::cli {
namespace {

using serve::ApiError;

std::string sse(const json::Value& data) { return "data: " + data.dump(0) + "\n\n"; }

// A member of the body that must be an integer in [lo, hi]; `fallback` when absent.
int64_t integer_field(const json::Value& body, const char* key, int64_t lo, int64_t hi, int64_t fallback) {
  const json::Value* v = body.find(key);
  if (!v || v->is_null()) return fallback;
  if (!v->is_integer() || v->as_integer() < lo || v->as_integer() > hi)
    throw ApiError(400, "invalid_request_error",
                   std::string("[viz] '") + key + "' must be an integer in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
  return v->as_integer();
}

// The greedy choice (argmax, lowest id on ties) of the last position's logits (1, T, V): the scheduler's choice at
// temperature 0.
int64_t greedy(const Tensor& logits) {
  const Tensor l = logits.contiguous();
  const int64_t v = l.size(2);
  Rng unused(0);
  return decode::sample_token(l.data() + (l.size(1) - 1) * v, v, decode::SamplingOptions{}, unused);
}

}  // namespace

LiveViz::LiveViz(const models::LanguageModel& lm, int64_t context, int64_t page_size, int threads,
                 LiveVizLimits limits, Precision kv_cache)
    : lm_(lm), context_(context), page_size_(page_size), threads_(std::max(1, threads)), limits_(limits),
      kv_cache_(kv_cache), busy_(std::make_shared<std::atomic<bool>>(false)) {
  QKV_CHECK_ARG(context >= 2 && page_size >= 1, "[viz] context ", context, " and page_size ", page_size,
                " must be >= 2 and >= 1");
}

std::string LiveViz::page(const std::string& model_name, const LiveVizLimits& limits) {
  json::Value data = json::Value::object();
  data.set("format", "qkv-attention-1");
  data.set("title", model_name);
  data.set("lang", "en");
  data.set("snapshots", json::Value::array());
  data.set("live_llm", json::Value::object()
                           .set("model", model_name)
                           .set("max_tokens", limits.default_max_tokens)
                           .set("max_tokens_limit", limits.max_tokens)
                           .set("max_prompt_tokens", limits.max_prompt_tokens)
                           .set("text", "What is attention in a transformer?"));
  return viz_page(data);
}

std::unique_ptr<LiveViz::Stream> LiveViz::start(const json::Value& body) {
  for (const auto& [key, value] : body.members())
    if (key != "messages" && key != "max_tokens" && key != "lens_top" && key != "model")
      throw ApiError(400, "invalid_request_error",
                     "[viz] unknown field '" + key + "' (this route reads messages, max_tokens and lens_top)");
  const int64_t max_tokens =
      integer_field(body, "max_tokens", 1, limits_.max_tokens, std::min(limits_.default_max_tokens, limits_.max_tokens));
  const int64_t lens_top = integer_field(body, "lens_top", 0, limits_.max_lens_top, limits_.default_lens_top);
  std::vector<int64_t> prompt = serve::prompt_ids(body, serve::Endpoint::kChat, lm_, context_);
  const auto p = static_cast<int64_t>(prompt.size());
  if (p > limits_.max_prompt_tokens)
    throw ApiError(400, "invalid_request_error",
                   "[viz] the prompt has " + std::to_string(p) + " tokens; the live viewer draws at most " +
                       std::to_string(limits_.max_prompt_tokens));
  bool idle = false;
  if (!busy_->compare_exchange_strong(idle, true))
    throw ApiError(503, "unavailable_error",
                   "[viz] the viewer is generating for another page (one at a time): retry when it ends");
  // The context's end stops a reply as it stops a /v1/chat/completions one (P + n == context).
  return std::make_unique<Stream>(*this, std::move(prompt), std::min(max_tokens, context_ - p), lens_top, busy_);
}

LiveViz::Stream::Stream(const LiveViz& viz, std::vector<int64_t> prompt, int64_t max_tokens, int64_t lens_top,
                        std::shared_ptr<std::atomic<bool>> slot)
    : viz_(viz), prompt_(std::move(prompt)), max_tokens_(max_tokens), lens_top_(lens_top), slot_(std::move(slot)),
      text_(*viz.lm_.tokenizer, {}) {}

LiveViz::Stream::~Stream() { slot_->store(false); }

bool LiveViz::Stream::next(std::string& event, bool stopping) {
  event.clear();
  if (phase_ == Phase::kOver) return false;
  omp_set_num_threads(viz_.threads_);  // this HTTP thread's own setting
  try {
    if (stopping) throw ApiError(503, "unavailable_error", "the server is stopping; the reply was cut");
    switch (phase_) {
      case Phase::kPrompt: event = prompt_event(); break;
      case Phase::kTokens: event = token_event(); break;
      default: event = done_event(); break;
    }
  } catch (const ApiError& e) {
    event = sse(serve::error_body(e));
    phase_ = Phase::kOver;
  } catch (const std::exception& e) {
    event = sse(serve::error_body(500, "server_error", std::string("[viz] ") + e.what()));
    phase_ = Phase::kOver;
  }
  return phase_ != Phase::kOver;
}

std::string LiveViz::Stream::prompt_event() {
  const models::LlamaForCausalLM& model = *viz_.lm_.model;
  const auto p = static_cast<int64_t>(prompt_.size());
  // The scheduler's decoding step: the same paged caches and kernels, so the same greedy tokens as
  // /v1/chat/completions.
  decoder_ = std::make_unique<decode::RecordingDecoder>(model, viz_.page_size_, p + max_tokens_, viz_.kv_cache_);
  models::ForwardOptions fo;
  fo.output_attentions = fo.output_hidden_states = true;
  models::CausalLMOutput out = decoder_->prefill(prompt_, fo);
  tokens_ = page_tokens(*viz_.lm_.tokenizer, prompt_);
  json::Value page = llm_page_data(out.attentions, tokens_, p, short_model_name(viz_.lm_.path));
  out.attentions.clear();
  if (lens_top_ > 0) {
    json::Value lens = logit_lens(model, *viz_.lm_.tokenizer, out.hidden_states, {p - 1}, 0, lens_top_);
    lens.set("text_tokens", json::Value(tokens_));
    page.set("lens", std::move(lens));
  }
  next_id_ = greedy(out.logits);
  phase_ = max_tokens_ > 0 ? Phase::kTokens : Phase::kDone;
  return sse(json::Value::object()
                 .set("event", "prompt")
                 .set("prompt_tokens", p)
                 .set("max_tokens", max_tokens_)
                 .set("page", std::move(page)));
}

std::string LiveViz::Stream::token_event() {
  const models::LlamaForCausalLM& model = *viz_.lm_.model;
  const text::Tokenizer& tok = *viz_.lm_.tokenizer;
  const int64_t id = next_id_, position = static_cast<int64_t>(tokens_.size());
  const bool stop = std::find(viz_.lm_.stop_ids.begin(), viz_.lm_.stop_ids.end(), id) != viz_.lm_.stop_ids.end();
  models::ForwardOptions fo;
  fo.output_attentions = fo.output_hidden_states = true;
  models::CausalLMOutput out = decoder_->step(id, fo);
  tokens_.push_back(page_tokens(tok, {id})[0]);
  std::string piece;
  if (!stop) {
    decode::TokenEvent e;
    e.id = id;
    piece = text_.push(e).text;
  }
  // Its row over every key: one group of the page data in the offline page's uint8 encoding.
  plot::VizGroup row;
  row.name = "reply";
  row.causal = true;
  row.q_tokens = {tokens_.back()};
  row.k_tokens = tokens_;
  for (const Tensor& a : out.attentions) row.layers.push_back(a.select(0, 0));  // (H, 1, T_keys)
  plot::VizSnapshot snap;
  snap.groups.push_back(std::move(row));
  json::Value attention = plot::viz_data({snap}, "", plot::VizDtype::kU8).at("snapshots").items()[0].at("groups").items()[0];
  out.attentions.clear();
  json::Value ev = json::Value::object()
                       .set("event", "token")
                       .set("index", generated_)
                       .set("id", id)
                       .set("token", tokens_.back())
                       .set("text", piece)
                       .set("position", position)
                       .set("stop", stop)
                       .set("attention", std::move(attention));
  if (lens_top_ > 0) {
    json::Value lens = logit_lens(model, tok, out.hidden_states, {0}, position, lens_top_);
    lens.set("text_tokens", json::Value::array().push(tokens_.back()));
    ev.set("lens", std::move(lens));
  }
  if (stop) {
    finish_ = "stop";
    phase_ = Phase::kDone;
  } else {
    ++generated_;
    next_id_ = greedy(out.logits);
    if (generated_ == max_tokens_) phase_ = Phase::kDone;
  }
  return sse(ev);
}

std::string LiveViz::Stream::done_event() {
  phase_ = Phase::kOver;
  return sse(json::Value::object()
                 .set("event", "done")
                 .set("finish_reason", finish_)
                 .set("text", text_.finish().text)
                 .set("usage", serve::usage(static_cast<int64_t>(prompt_.size()), generated_)));
}

}  // namespace qkv::cli
