// `qkv serve --model PATH` on a language model: the OpenAI API as llama.cpp's llama-server serves it (chat and text
// completions, streamed as server-sent events or not, models, health, tokenize / detokenize / apply-template), each
// request one or more requests of the continuous-batching decode::Scheduler; and the live viewer page (GET /,
// POST /viz/generate: serve_viz.h). The protocol objects are
// qkv/serve/openai.h; this file is the HTTP plumbing: routes, the API key, streams, hang-ups and stopping.
#include "serve_openai.h"

#include <filesystem>
#include <stdexcept>

#ifdef QKV_HAVE_HTTPLIB
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <memory>
#include <mutex>
#include <omp.h>
#include <random>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "http_server.h"
#include "qkv/decode/scheduler.h"
#include "qkv/models/language_model.h"
#include "qkv/serve/openai.h"
#include "serve_viz.h"
#endif

namespace qkv::cli {

#ifdef QKV_HAVE_HTTPLIB
namespace {

using serve::ApiError;
using serve::Endpoint;

// One HTTP request's scheduler requests (one per choice), filled by the scheduler's callbacks and read by the
// HTTP thread. Shared: a client that hangs up leaves it to the callbacks still to come.
struct Job {
  struct Choice {
    uint64_t id = 0;
    std::deque<decode::TokenEvent> events;
    bool done = false;
    decode::RequestResult result;
  };
  std::mutex m;
  std::condition_variable cv;
  std::vector<Choice> choices;
  std::atomic<bool> cancelled{false};  // the client is gone: on_token answers false
};

struct State {
  const OpenAIServeArgs* args = nullptr;
  std::unique_ptr<models::LanguageModel> lm;
  std::unique_ptr<decode::Scheduler> scheduler;
  std::unique_ptr<LiveViz> viz;  // the live viewer's generations (one at a time, beside the scheduler)
  std::mutex scheduler_mutex;  // creation against a stop signal
  std::atomic<bool> ready{false}, stopping{false};
  std::atomic<int64_t> active{0};  // requests being answered
  int64_t context = 0;
  std::string model_name;
  int64_t created = 0;
};

// Counts a request as active for its lifetime (a stop waits, briefly, for the answers to go out).
struct Active {
  explicit Active(State& s) : state(s) { ++state.active; }
  ~Active() { --state.active; }
  State& state;
};

const char* error_type(int status) {
  switch (status) {
    case 400: case 413: case 415: case 431: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 503: return "unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

void answer(httplib::Response& res, const json::Value& body, int status = 200) {
  res.status = status;
  res.set_content(body.dump(0), "application/json; charset=utf-8");
}

void answer_error(httplib::Response& res, int status, const std::string& message) {
  answer(res, serve::error_body(status, error_type(status), message), status);
}

std::string random_id(const char* prefix) {
  static std::mutex m;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(m);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return std::string(prefix) + buf;
}

// Queues one scheduler request per choice. QueueFull -> 503; a refusal of the scheduler -> 400. On either, the
// choices already queued are cancelled.
std::shared_ptr<Job> submit(State& st, const std::vector<int64_t>& prompt, const serve::CompletionOptions& o) {
  auto job = std::make_shared<Job>();
  job->choices.resize(static_cast<size_t>(o.n));
  std::vector<uint64_t> ids;
  auto undo = [&] {
    job->cancelled = true;
    for (uint64_t id : ids) st.scheduler->cancel(id);
  };
  for (int64_t i = 0; i < o.n; ++i) {
    const decode::RequestOptions ro =
        serve::request_options(o, *st.lm, static_cast<int64_t>(prompt.size()), st.context, i);
    Job* j = job.get();
    const auto k = static_cast<size_t>(i);
    try {
      const uint64_t id = st.scheduler->submit(
          prompt, ro,
          [job, j, k](const decode::TokenEvent& e) {
            std::lock_guard<std::mutex> lock(j->m);
            j->choices[k].events.push_back(e);
            j->cv.notify_all();
            return !j->cancelled.load();
          },
          [job, j, k](const decode::RequestResult& r) {
            std::lock_guard<std::mutex> lock(j->m);
            j->choices[k].done = true;
            j->choices[k].result = r;
            j->cv.notify_all();
          });
      ids.push_back(id);
      std::lock_guard<std::mutex> lock(job->m);
      job->choices[k].id = id;
    } catch (const decode::QueueFull& e) {
      undo();
      throw ApiError(503, "unavailable_error", std::string("the server is busy (the queue is full), retry later: ") +
                                                   e.what());
    } catch (const std::invalid_argument& e) {
      undo();
      throw ApiError(400, "invalid_request_error", e.what());
    } catch (const std::runtime_error& e) {  // after shutdown
      undo();
      throw ApiError(503, "unavailable_error", std::string("the server is stopping: ") + e.what());
    }
  }
  return job;
}

// The HTTP side of one request: each choice's text (cut at stop strings), what was sent, how it ended.
class Reply {
 public:
  Reply(State& st, std::shared_ptr<Job> job, Endpoint endpoint, serve::CompletionOptions options, int64_t prompt_tokens)
      : st_(st), job_(std::move(job)), endpoint_(endpoint), options_(std::move(options)), prompt_tokens_(prompt_tokens),
        id_(random_id(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-")), created_(std::time(nullptr)) {
    for (int64_t i = 0; i < options_.n; ++i) choices_.emplace_back(*st_.lm->tokenizer, options_.stop);
  }

  struct Update {
    int64_t index;
    serve::ChoiceText::Piece piece;
    int64_t text_offset;         // bytes of the choice's text before this piece
    const char* finish = nullptr;  // set on the choice's last update
  };

  // Waits up to `wait` for news, then turns every event that came into updates. finished(): every choice ended.
  std::vector<Update> poll(std::chrono::milliseconds wait) {
    std::vector<std::deque<decode::TokenEvent>> events(choices_.size());
    std::vector<bool> done(choices_.size(), false);
    std::vector<decode::RequestResult> results(choices_.size());
    {
      std::unique_lock<std::mutex> lock(job_->m);
      auto news = [&] {
        for (size_t i = 0; i < choices_.size(); ++i)
          if (!choices_[i].ended && (!job_->choices[i].events.empty() || job_->choices[i].done)) return true;
        return false;
      };
      job_->cv.wait_for(lock, wait, news);
      for (size_t i = 0; i < choices_.size(); ++i) {
        events[i].swap(job_->choices[i].events);
        done[i] = job_->choices[i].done;
        if (done[i]) results[i] = job_->choices[i].result;
      }
    }
    std::vector<Update> out;
    for (size_t i = 0; i < choices_.size(); ++i) {
      ChoiceState& c = choices_[i];
      if (c.ended) continue;
      for (const decode::TokenEvent& e : events[i]) {
        Update u{static_cast<int64_t>(i), c.text.push(e), c.bytes};
        c.bytes += static_cast<int64_t>(u.piece.text.size());
        if (c.text.stopped()) {
          // A stop string: the reply ends here; the scheduler's request is ended at its next step.
          c.ended = true;
          c.finish = "stop";
          u.finish = c.finish;
          st_.scheduler->cancel(job_->choices[i].id);
          out.push_back(std::move(u));
          break;
        }
        if (!u.piece.text.empty() || !u.piece.tokens.empty()) out.push_back(std::move(u));
      }
      if (!c.ended && done[i]) {
        c.ended = true;
        c.result = results[i];
        if (results[i].generation.finish == decode::FinishReason::kCancelled) {
          c.cancelled = true;  // the server stops (a client that hung up reads nothing more)
          continue;
        }
        Update u{static_cast<int64_t>(i), c.text.finish(), c.bytes};
        c.bytes += static_cast<int64_t>(u.piece.text.size());
        c.finish = serve::finish_reason(results[i].generation.finish, false);
        u.finish = c.finish;
        out.push_back(std::move(u));
      }
    }
    return out;
  }

  bool finished() const {
    for (const ChoiceState& c : choices_)
      if (!c.ended) return false;
    return true;
  }
  bool cancelled() const {
    for (const ChoiceState& c : choices_)
      if (c.cancelled) return true;
    return false;
  }
  int64_t completion_tokens() const {
    int64_t n = 0;
    for (const ChoiceState& c : choices_) n += c.text.tokens();
    return n;
  }
  // The client is gone: every choice is cancelled (its pages freed at the scheduler's next step).
  void abandon() {
    job_->cancelled = true;
    std::vector<uint64_t> ids;
    {
      std::lock_guard<std::mutex> lock(job_->m);
      for (const Job::Choice& c : job_->choices) ids.push_back(c.id);
    }
    for (uint64_t id : ids) st_.scheduler->cancel(id);
  }

  json::Value head(bool chunk) const {
    const char* object = endpoint_ == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                      : "text_completion";
    return serve::response_head(id_, object, created_, st_.model_name);
  }
  json::Value logprobs(const std::vector<decode::TokenEvent>& tokens, int64_t offset) const {
    if (options_.logprobs < 0) return json::Value();
    return endpoint_ == Endpoint::kChat ? serve::chat_logprobs(*st_.lm->tokenizer, tokens)
                                        : serve::legacy_logprobs(*st_.lm->tokenizer, tokens, offset);
  }
  json::Value usage() const { return serve::usage(prompt_tokens_, completion_tokens()); }

  // One stream chunk of one update.
  json::Value chunk(const Update& u) const {
    json::Value choice = json::Value::object().set("index", u.index);
    if (endpoint_ == Endpoint::kChat) {
      json::Value delta = json::Value::object();
      if (!u.piece.text.empty() || !u.finish) delta.set("content", u.piece.text);
      choice.set("delta", std::move(delta));
    } else {
      choice.set("text", u.piece.text);
    }
    choice.set("logprobs", u.piece.tokens.empty() ? json::Value() : logprobs(u.piece.tokens, u.text_offset));
    choice.set("finish_reason", u.finish ? json::Value(u.finish) : json::Value());
    return head(true).set("choices", json::Value::array().push(std::move(choice)));
  }

  // The whole answer of a request that was not streamed, from every update of its life.
  json::Value response(const std::vector<Update>& updates) const {
    std::vector<std::string> texts(choices_.size());
    std::vector<std::vector<decode::TokenEvent>> tokens(choices_.size());
    for (const Update& u : updates) {
      texts[static_cast<size_t>(u.index)] += u.piece.text;
      auto& t = tokens[static_cast<size_t>(u.index)];
      t.insert(t.end(), u.piece.tokens.begin(), u.piece.tokens.end());
    }
    json::Value list = json::Value::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      json::Value choice = json::Value::object().set("index", static_cast<int64_t>(i));
      if (endpoint_ == Endpoint::kChat)
        choice.set("message", json::Value::object().set("role", "assistant").set("content", texts[i]));
      else
        choice.set("text", texts[i]);
      choice.set("logprobs", logprobs(tokens[i], 0));
      choice.set("finish_reason", choices_[i].finish ? json::Value(choices_[i].finish) : json::Value());
      list.push(std::move(choice));
    }
    return head(false).set("choices", std::move(list)).set("usage", usage());
  }

  Endpoint endpoint() const { return endpoint_; }
  const serve::CompletionOptions& options() const { return options_; }

 private:
  struct ChoiceState {
    ChoiceState(const text::Tokenizer& tokenizer, std::vector<std::string> stops) : text(tokenizer, std::move(stops)) {}
    serve::ChoiceText text;
    int64_t bytes = 0;
    bool ended = false, cancelled = false;
    const char* finish = nullptr;
    decode::RequestResult result;
  };
  State& st_;
  std::shared_ptr<Job> job_;
  Endpoint endpoint_;
  serve::CompletionOptions options_;
  int64_t prompt_tokens_;
  std::string id_;
  int64_t created_;
  std::vector<ChoiceState> choices_;
};

std::string sse(const json::Value& data) { return "data: " + data.dump(0) + "\n\n"; }

// The stream of one request, written by cpp-httplib's worker through the chunked content provider.
struct Stream {
  Stream(State& st, std::unique_ptr<Reply> r) : active(st), reply(std::move(r)) {}
  Active active;
  std::unique_ptr<Reply> reply;
  bool started = false, over = false;

  bool write(httplib::DataSink& sink, const std::string& s) { return sink.write(s.data(), s.size()); }

  // false: the client is gone (the releaser cancels).
  bool step(httplib::DataSink& sink) {
    if (!started) {
      started = true;
      if (reply->endpoint() == Endpoint::kChat)
        for (int64_t i = 0; i < reply->options().n; ++i) {
          json::Value choice = json::Value::object()
                                   .set("index", i)
                                   .set("delta", json::Value::object().set("role", "assistant").set("content", ""))
                                   .set("logprobs", json::Value())
                                   .set("finish_reason", json::Value());
          if (!write(sink, sse(reply->head(true).set("choices", json::Value::array().push(std::move(choice))))))
            return false;
        }
    }
    for (Reply::Update& u : reply->poll(std::chrono::milliseconds(200))) {
      if (u.finish && (!u.piece.text.empty() || !u.piece.tokens.empty())) {
        // The last text and the finish reason go in two chunks, the finish with an empty delta (as OpenAI's).
        const char* finish = u.finish;
        u.finish = nullptr;
        if (!write(sink, sse(reply->chunk(u)))) return false;
        u.piece = {};
        u.finish = finish;
      }
      if (!write(sink, sse(reply->chunk(u)))) return false;
    }
    if (!reply->finished()) return true;
    if (reply->cancelled()) {
      write(sink, sse(serve::error_body(503, "unavailable_error", "the server is stopping; the reply was cut")));
    } else if (reply->options().include_usage) {
      if (!write(sink, sse(reply->head(true).set("choices", json::Value::array()).set("usage", reply->usage()))))
        return false;
    }
    if (!write(sink, "data: [DONE]\n\n")) return false;
    over = true;
    sink.done();
    return true;
  }
};

std::string request_body(const httplib::Request& req, const httplib::ContentReader& content, size_t max_body,
                         httplib::Response& res) {
  if (req.is_multipart_form_data())
    throw ApiError(415, "invalid_request_error", "send the request as JSON (Content-Type: application/json)");
  std::string body;
  const BodyRead read = read_body(content, max_body, body);
  if (read == BodyRead::kTooLarge) {
    res.set_header("Connection", "close");
    throw ApiError(413, "invalid_request_error",
                   "the request is too large: more than " + std::to_string(max_body) + " bytes");
  }
  if (read != BodyRead::kOk) throw ApiError(400, "invalid_request_error", "the request body could not be read");
  return body;
}

void completion(State& st, Endpoint endpoint, const std::string& text, const httplib::Request& req,
                httplib::Response& res) {
  const json::Value body = serve::parse_body(text);
  serve::CompletionOptions options = serve::parse_options(body, endpoint);
  const std::vector<int64_t> prompt = serve::prompt_ids(body, endpoint, *st.lm, st.context);
  std::shared_ptr<Job> job = submit(st, prompt, options);
  auto reply = std::make_unique<Reply>(st, job, endpoint, options, static_cast<int64_t>(prompt.size()));
  if (options.stream) {
    auto stream = std::make_shared<Stream>(st, std::move(reply));
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [stream](size_t, httplib::DataSink& sink) { return stream->step(sink); },
        [stream](bool) {
          if (!stream->over) stream->reply->abandon();  // hung up, or the server stopped mid-stream
        });
    return;
  }
  Active active(st);
  const ClientConnection client(req);  // a client that hangs up has its choices cancelled
  std::vector<Reply::Update> updates;
  while (!reply->finished()) {
    std::vector<Reply::Update> u = reply->poll(std::chrono::milliseconds(100));
    updates.insert(updates.end(), std::make_move_iterator(u.begin()), std::make_move_iterator(u.end()));
    if (client.closed()) {
      reply->abandon();
      res.set_header("Connection", "close");
      return;  // nobody reads the answer
    }
  }
  if (reply->cancelled())
    throw ApiError(503, "unavailable_error", "the server is stopping; the request was cancelled");
  answer(res, reply->response(updates));
}

}  // namespace

int run_serve_openai(const OpenAIServeArgs& a) {
  if (a.parallel < 1) throw std::invalid_argument("[serve] --parallel must be >= 1, got " + std::to_string(a.parallel));
  if (a.ctx < 0) throw std::invalid_argument("[serve] --ctx must be >= 0, got " + std::to_string(a.ctx));
  StopSignals signals;  // first: every thread started later inherits the blocked signals
  State st;
  st.args = &a;
  st.model_name = std::filesystem::path(a.model).lexically_normal().filename().string();
  if (st.model_name.empty()) st.model_name = a.model;
  st.created = std::time(nullptr);

  httplib::Server svr;
  HttpOptions http;
  http.max_body = a.max_body;
  http.workers = 64;
  http.read_timeout_sec = 10;
  const bool loopback = a.host == "127.0.0.1" || a.host == "localhost" || a.host == "::1";
  http.loopback_only = loopback;
  const std::string key = a.api_key;
  configure_server(svr, http, answer_error, [key](const httplib::Request& req, httplib::Response& res) {
    if (key.empty() || req.path == "/health" || req.path == "/v1/health" || req.path == "/v1/models" ||
        req.path == "/models" || (req.method == "GET" && (req.path == "/" || req.path == "/viz")))
      return false;
    if (req.get_header_value("Authorization") == "Bearer " + key) return false;
    answer(res, serve::error_body(401, "authentication_error", "Invalid API Key"), 401);
    return true;
  });

  // Every route but /health answers 503 until the model is loaded.
  auto guarded = [&st](auto handler) {
    return [&st, handler](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& content) {
      try {
        if (!st.ready) throw ApiError(503, "unavailable_error", "Loading model");
        handler(req, res, content);
      } catch (const ApiError& e) {
        answer(res, serve::error_body(e), e.status());
      } catch (const std::invalid_argument& e) {
        answer_error(res, 400, e.what());
      } catch (const std::exception& e) {
        answer_error(res, 500, std::string("[serve] ") + e.what());
      }
    };
  };
  auto body_of = [&a](const httplib::Request& req, const httplib::ContentReader& content, httplib::Response& res) {
    return request_body(req, content, a.max_body, res);
  };
  for (const char* path : {"/health", "/v1/health"})
    svr.Get(path, [&st](const httplib::Request&, httplib::Response& res) {
      if (st.ready) {
        // llama-server's older slot counts, and the scheduler's (kv pages include the prefix cache's).
        const decode::SchedulerStats s = st.scheduler->stats();
        answer(res, json::Value::object()
                        .set("status", "ok")
                        .set("slots_idle", std::max<int64_t>(0, st.args->parallel - s.running))
                        .set("slots_processing", s.running)
                        .set("requests_queued", s.queued)
                        .set("kv_pages_used", s.kv_pages_used)
                        .set("kv_pages_total", s.kv_pages_total)
                        .set("tokens_generated", s.tokens));
      } else {
        answer(res, serve::error_body(503, "unavailable_error", "Loading model"), 503);
      }
    });
  for (const char* path : {"/v1/models", "/models"})
    svr.Get(path, [&st](const httplib::Request&, httplib::Response& res) {
      if (!st.ready) return answer(res, serve::error_body(503, "unavailable_error", "Loading model"), 503);
      json::Value model = json::Value::object()
                              .set("id", st.model_name)
                              .set("object", "model")
                              .set("created", st.created)
                              .set("owned_by", "qkv")
                              .set("meta", json::Value::object()
                                               .set("n_ctx", st.context)
                                               .set("n_vocab", st.lm->tokenizer->vocab_size()));
      answer(res, json::Value::object().set("object", "list").set("data", json::Value::array().push(model)));
    });
  for (const char* path : {"/v1/chat/completions", "/chat/completions"})
    svr.Post(path, guarded([&](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& c) {
               completion(st, Endpoint::kChat, body_of(req, c, res), req, res);
             }));
  for (const char* path : {"/v1/completions", "/completions"})
    svr.Post(path, guarded([&](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& c) {
               completion(st, Endpoint::kCompletion, body_of(req, c, res), req, res);
             }));
  svr.Post("/tokenize", guarded([&](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& c) {
             answer(res, serve::tokenize(serve::parse_body(body_of(req, c, res)), *st.lm->tokenizer));
           }));
  svr.Post("/detokenize",
           guarded([&](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& c) {
             answer(res, serve::detokenize(serve::parse_body(body_of(req, c, res)), *st.lm->tokenizer));
           }));
  svr.Post("/apply-template",
           guarded([&](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& c) {
             answer(res, serve::apply_template(serve::parse_body(body_of(req, c, res)), *st.lm));
           }));
  // The live viewer: the page (static, served while loading too) and its stream of one generation.
  const std::string viz_page_html = LiveViz::page(st.model_name);
  for (const char* path : {"/", "/viz"})
    svr.Get(path, [&viz_page_html](const httplib::Request&, httplib::Response& res) {
      res.set_content(viz_page_html, "text/html; charset=utf-8");
    });
  svr.Post("/viz/generate",
           guarded([&](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& c) {
             struct VizStream {
               VizStream(State& s, std::unique_ptr<LiveViz::Stream> g) : active(s), stream(std::move(g)) {}
               Active active;
               std::unique_ptr<LiveViz::Stream> stream;
             };
             auto vs = std::make_shared<VizStream>(st, st.viz->start(serve::parse_body(body_of(req, c, res))));
             res.set_header("Cache-Control", "no-cache");
             // One event a call on this worker; a failed write (the client left) ends it, and the generation with it.
             res.set_chunked_content_provider(
                 "text/event-stream",
                 [vs, &st](size_t, httplib::DataSink& sink) {
                   std::string event;
                   const bool more = vs->stream->next(event, st.stopping.load());
                   if (!event.empty() && !sink.write(event.data(), event.size())) return false;
                   if (!more) sink.done();
                   return true;
                 },
                 [vs](bool) { vs->stream.reset(); });
           }));
  svr.set_error_handler([&a](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string m = res.status == 404   ? "not found: " + req.method + " " + req.path
                          : res.status == 413 ? "the request is too large: more than " + std::to_string(a.max_body) +
                                                    " bytes"
                                              : "bad request";
    answer_error(res, res.status, m);
  });

  const int bound = bind_server(svr, a.host, a.port);
  const std::string url = "http://" + (a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host) + ":" +
                          std::to_string(bound) + "/";
  // A stop signal: no new requests; the running ones are cancelled, their streams end, then the server closes.
  signals.start([&] {
    decode::Scheduler* scheduler = nullptr;
    {
      std::lock_guard<std::mutex> lock(st.scheduler_mutex);
      st.stopping = true;
      scheduler = st.scheduler.get();
    }
    if (scheduler) scheduler->shutdown(/*finish_running=*/false);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (st.active.load() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    svr.stop();
  });
  std::atomic<bool> listened{true}, listen_returned{false};
  std::thread listener([&] {
    listened = svr.listen_after_bind();
    listen_returned = true;
  });
  // Loading starts once the server answers (a stop before it listens would be lost).
  while (!svr.is_running() && !listen_returned) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::printf("qkv serve: listening on %s (loading %s)\n", url.c_str(), a.model.c_str());
  std::fflush(stdout);
  try {
    st.lm = std::make_unique<models::LanguageModel>(models::LanguageModel::load(a.model));
    const int64_t model_ctx = st.lm->model->config().max_position_embeddings;
    st.context = a.ctx > 0 ? std::min(a.ctx, model_ctx) : std::min(model_ctx, kDefaultCtx);
    decode::SchedulerOptions so;
    so.max_batch = a.parallel;
    so.kv_tokens = a.parallel * st.context;
    so.max_queued = a.max_queued;
    so.kv_cache = a.kv_cache;
    st.viz = std::make_unique<LiveViz>(*st.lm, st.context, so.page_size, omp_get_max_threads(), LiveVizLimits{},
                                     a.kv_cache);
    std::lock_guard<std::mutex> lock(st.scheduler_mutex);
    if (!st.stopping) {
      st.scheduler = std::make_unique<decode::Scheduler>(*st.lm->model, so);
      st.ready = true;
    }
  } catch (...) {
    svr.stop();
    listener.join();
    throw;
  }
  if (st.ready) {
    std::printf("qkv serve: ready: %s, context %lld tokens, %lld in parallel (Ctrl-C stops)\n", st.model_name.c_str(),
                static_cast<long long>(st.context), static_cast<long long>(a.parallel));
    std::fflush(stdout);
  }
  listener.join();
  signals.join();
  if (st.scheduler) st.scheduler->shutdown(false);
  return listened ? 0 : 1;
}
#else
int run_serve_openai(const OpenAIServeArgs&) {
  throw std::runtime_error("[serve] this qkv was built without cpp-httplib (install libcpp-httplib-dev, then rebuild)");
}
#endif

}  // namespace qkv::cli
