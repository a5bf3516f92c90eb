// The live viewer of `qkv serve --model`: GET / (and /viz) serves the viewer page in live mode; POST /viz/generate
// answers a chat prompt's attention maps, then its greedy reply token by token, each new token with its attention
// row of every layer x head and its logit lens, as server-sent events that the page draws as they come.
// A generation runs its own recording forward (the scheduler records no attention), one at a time: see docs/SERVE.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qkv/core/json.h"
#include "qkv/models/language_model.h"
#include "qkv/decode/recording.h"
#include "qkv/serve/openai.h"

namespace qkv::cli {

struct LiveVizLimits {
  int64_t max_prompt_tokens = 256;  // the chat-templated prompt's tokens
  int64_t max_tokens = 128;         // a request's max_tokens, at most
  int64_t default_max_tokens = 32;  // when the request gives none
  int64_t default_lens_top = 5;     // the logit lens's tokens per layer (0: no lens)
  int64_t max_lens_top = 20;
};

class LiveViz {
 public:
  // lm must outlive this. context: positions of one request (prompt and reply, as /v1/chat/completions);
  // page_size: the scheduler's KV page (the same paged step as the scheduler's, hence the same greedy tokens);
  // threads: OpenMP threads of its forwards (a new thread does not inherit the caller's setting); kv_cache: the
  // scheduler's KV storage (the same step again).
  LiveViz(const models::LanguageModel& lm, int64_t context, int64_t page_size, int threads, LiveVizLimits limits = {},
          Precision kv_cache = Precision::kFloat32);

  // The page of GET / and /viz: the viewer with no maps yet, in live mode.
  static std::string page(const std::string& model_name, const LiveVizLimits& limits = {});

  class Stream;
  // A POST /viz/generate body {"messages": [...] as /v1/chat/completions, "max_tokens": 1..limit, "lens_top":
  // 0..20} checked, its prompt templated, and the one generation slot taken. serve::ApiError 400 for a wrong field
  // or a prompt over the limit or the context, 503 while another generation runs.
  std::unique_ptr<Stream> start(const json::Value& body);

 private:
  const models::LanguageModel& lm_;
  int64_t context_, page_size_;
  int threads_;
  LiveVizLimits limits_;
  Precision kv_cache_;
  std::shared_ptr<std::atomic<bool>> busy_;
};

// One generation, advanced one event at a time by the HTTP thread that writes it (so a client that hangs up stops
// it at the next write). Events, each "data: {json}\n\n":
//   {"event": "prompt", "prompt_tokens": P, "max_tokens": N, "page": the page data of the prompt's maps (group
//     "prompt", L x H maps of (P, P)) with the logit lens at its last position}
//   {"event": "token", "index": i, "id", "token": as the page shows it, "text": the reply's text it releases,
//     "position": P + i, "stop": whether it is the end-of-turn token (drawn, not part of the text),
//     "attention": one group of the page data (dtype "u8", tq 1, tk P + i + 1: its row over every key, per layer
//     and head), "lens": the logit lens at its position}
//   {"event": "done", "finish_reason": "stop" | "length", "text": the text held back until the end,
//     "usage": {"prompt_tokens", "completion_tokens"}}
//   {"error": {"code", "message", "type"}} in place of the rest when the forward fails or the server stops.
class LiveViz::Stream {
 public:
  Stream(const LiveViz& viz, std::vector<int64_t> prompt, int64_t max_tokens, int64_t lens_top,
         std::shared_ptr<std::atomic<bool>> slot);
  ~Stream();  // frees the slot
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // The next event into `event`; false when it was the last one. stopping: the server stops (an error event ends
  // the stream).
  bool next(std::string& event, bool stopping);

 private:
  std::string prompt_event();
  std::string token_event();
  std::string done_event();

  const LiveViz& viz_;
  std::vector<int64_t> prompt_;
  int64_t max_tokens_, lens_top_;
  std::shared_ptr<std::atomic<bool>> slot_;
  std::unique_ptr<decode::RecordingDecoder> decoder_;  // made by the prompt's event
  serve::ChoiceText text_;
  std::vector<std::string> tokens_;  // prompt and reply so far, as the page shows them
  int64_t generated_ = 0;            // reply tokens given (the end-of-turn token not counted)
  int64_t next_id_ = -1;             // the greedy choice at the last position
  enum class Phase { kPrompt, kTokens, kDone, kOver } phase_ = Phase::kPrompt;
  const char* finish_ = "length";
};

}  // namespace qkv::cli
