// `qkv serve --model DIR|--run DIR [--port N]`: the viewer page on http://127.0.0.1:PORT/ (loopback only), backed by the model:
// POST /api/attention {"text", "second"?, "mask"?: [positions]} re-runs it and answers the page data as JSON.
// Only loopback Host names are answered and a POST from another origin is refused (no CSRF, no DNS rebinding).
// Built with Debian's cpp-httplib; without it the command says so and exits non-zero.
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "run_common.h"
#include "serve_openai.h"
#include "viz_llm.h"

#ifdef QKV_HAVE_HTTPLIB
#include <httplib.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <stdexcept>

#include "http_server.h"
#include "qkv/core/error.h"
#include "qkv/core/json.h"
#include "viz_page.h"
#include "viz_run.h"
#endif

namespace qkv::cli {

#ifdef QKV_HAVE_HTTPLIB
namespace {

struct ServeLimits {
  size_t max_body = 16 * 1024;  // bytes of one request body, whatever its Content-Type
  size_t max_text = 2000;       // bytes of each sentence
  int64_t max_tokens = 128;     // T, [CLS] and [SEP] included
  bool strict = false;          // --run: text outside the run's vocabulary is refused (else a note names it)
};

// A client mistake: answered with `status` and {"error": message}.
struct RequestError : std::runtime_error {
  int status;
  RequestError(int s, const std::string& m) : std::runtime_error(m), status(s) {}
};

void answer_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(json::Value::object().set("error", message).dump(0), "application/json");
}

// What the server runs: a BERT folder (--model) or a training run (--run).
struct Backend {
  std::unique_ptr<models::SentenceEncoder> bert;
  std::unique_ptr<RunViewer> run;
  std::string name;
};

json::Value page_data(Backend& backend, std::mutex& model_mutex, const ServeLimits& limits,
                            const std::string& text, const std::string* second, const std::vector<int64_t>& mask) {
  if (text.size() > limits.max_text || (second && second->size() > limits.max_text))
    throw RequestError(413, "[serve] a sentence has more than " + std::to_string(limits.max_text) + " bytes");
  int64_t t = 0;
  if (backend.bert) {
    auto count = [&](const std::string& s) {
      return static_cast<int64_t>(backend.bert->tokenizer().tokenize(s).size());
    };
    t = 2 + count(text) + (second ? 1 + count(*second) : 0);
  } else {
    if (second || !mask.empty())
      throw RequestError(400, "[serve] a training run takes one input: 'second' and 'mask' need a BERT model");
    t = backend.run->source_length(text);
  }
  std::vector<std::string> unknown;
  if (backend.run) {
    unknown = backend.run->vocab().unknown_tokens(text);
    if (limits.strict && !unknown.empty())
      throw RequestError(400, "[serve] " + std::to_string(unknown.size()) +
                                  " characters of the text are not in the run's vocabulary (--strict)");
  }
  if (t > limits.max_tokens)
    throw RequestError(413, "[serve] the input has " + std::to_string(t) + " tokens, more than the limit of " +
                                std::to_string(limits.max_tokens) + " (--max-tokens)");
  for (int64_t p : mask)
    if (p < 0 || p >= t)
      throw RequestError(400, "[serve] mask position " + std::to_string(p) + " is outside [0, " + std::to_string(t) +
                                  ")");
  VizSnapshot snap;
  {
    std::lock_guard<std::mutex> lock(model_mutex);
    snap = backend.bert ? bert_snapshot(*backend.bert, text, second, mask) : backend.run->snapshots(text, false).at(0);
  }
  json::Value data = viz_data({snap}, backend.name + " (live)");
  if (backend.bert) {
    const std::string note = truncation_note(*backend.bert, text, second);
    if (!note.empty()) data.set("note", note);
  } else if (!unknown.empty()) {
    std::string names;
    for (size_t i = 0; i < unknown.size() && i < 8; ++i) names += (i ? ", '" : "'") + unknown[i] + "'";
    data.set("note", std::to_string(unknown.size()) + " characters of the text are not in the run's vocabulary and "
                         "became <unk>: " + names + (unknown.size() > 8 ? ", ..." : ""));
  }
  json::Value live = json::Value::object();
  live.set("text", text);
  live.set("second", second ? *second : std::string());
  live.set("mask", std::vector<int64_t>(mask.begin(), mask.end()));
  live.set("maskable", backend.bert != nullptr);
  data.set("live", std::move(live));
  return data;
}

// Parses {"text": str, "second": str (optional), "mask": [int] (optional)}; anything else is a 400.
void parse_request(const std::string& body, std::string& text, std::string& second, bool& has_second,
                   std::vector<int64_t>& mask) {
  json::Value j;
  try {
    j = json::Value::parse(body, "[serve] request");
  } catch (const std::invalid_argument&) {
    throw RequestError(400, "[serve] the request body is not JSON");
  }
  if (!j.is_object()) throw RequestError(400, "[serve] the request must be a JSON object");
  for (const auto& [key, value] : j.members())
    if (key != "text" && key != "second" && key != "mask")
      throw RequestError(400, "[serve] unknown field '" + key + "' (expected text, second, mask)");
  const json::Value* t = j.find("text");
  if (!t || !t->is_string()) throw RequestError(400, "[serve] 'text' must be a string");
  text = t->as_string();
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) throw RequestError(400, "[serve] 'text' is empty");
  const json::Value* s = j.find("second");
  has_second = s && !s->is_null();
  if (has_second) {
    if (!s->is_string()) throw RequestError(400, "[serve] 'second' must be a string");
    second = s->as_string();
    if (second.find_first_not_of(" \t\r\n") == std::string::npos) has_second = false;
  }
  if (const json::Value* m = j.find("mask")) {
    if (!m->is_array()) throw RequestError(400, "[serve] 'mask' must be an array of token positions");
    for (const json::Value& p : m->items()) {
      if (!p.is_integer()) throw RequestError(400, "[serve] 'mask' must hold integers");
      mask.push_back(p.as_integer());
    }
  }
}

int run_serve(const std::string& model_dir, const std::string& run_dir, int port, const std::string& text,
              const ServeLimits& limits) {
  QKV_CHECK_ARG(port >= 0 && port <= 65535, "[serve] --port must be in [0, 65535], got ", port);
  // SIGINT / SIGTERM stop the server cleanly (blocked before any other thread starts, which inherits the mask).
  StopSignals signals;
  Backend backend;
  std::mutex model_mutex;
  std::string index;  // the first page, set before the server answers

  httplib::Server svr;
  const std::string too_large = "[serve] the request is too large: more than " + std::to_string(limits.max_body) +
                                " bytes (" + std::to_string(limits.max_body / 1024) + " kB)";
  HttpOptions http;
  http.max_body = limits.max_body;
  configure_server(svr, http, answer_error);
  svr.Get("/", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(index, "text/html; charset=utf-8");
  });
  // The body is read here, with the one limit for every Content-Type (the library's own reading would cap
  // form-encoded bodies, what `curl -d` sends, at 8 kB).
  svr.Post("/api/attention", [&](const httplib::Request& req, httplib::Response& res,
                                 const httplib::ContentReader& content) {
    try {
      if (req.is_multipart_form_data())
        throw RequestError(415, "[serve] send the request as JSON (Content-Type: application/json), not a form");
      std::string body;
      const BodyRead read = read_body(content, limits.max_body, body);
      if (read == BodyRead::kTooLarge) {
        res.set_header("Connection", "close");
        throw RequestError(413, too_large);
      }
      if (read != BodyRead::kOk) throw RequestError(400, "[serve] the request body could not be read");
      std::string t, second;
      bool has_second = false;
      std::vector<int64_t> mask;
      parse_request(body, t, second, has_second, mask);
      res.set_content(page_data(backend, model_mutex, limits, t, has_second ? &second : nullptr, mask).dump(0),
                      "application/json");
    } catch (const RequestError& e) {
      answer_error(res, e.status, e.what());
    } catch (const std::invalid_argument& e) {
      answer_error(res, 400, e.what());
    } catch (const std::exception& e) {
      answer_error(res, 500, std::string("[serve] ") + e.what());
    }
  });
  svr.set_error_handler([too_large](const httplib::Request&, httplib::Response& res) {
    if (res.body.empty()) {
      const std::string m = res.status == 413   ? too_large
                            : res.status == 404 ? "[serve] not found: GET / or POST /api/attention"
                            : res.status == 403 ? "[serve] refused"
                                                : "[serve] bad request";
      res.set_content(json::Value::object().set("error", m).dump(0), "application/json");
    }
  });

  const int bound = bind_server(svr, "127.0.0.1", port);
  // The port is taken before the model loads, so that a port in use fails at once.
  if (!run_dir.empty()) {
    backend.run = std::make_unique<RunViewer>(run_dir, "serve");
    backend.name = std::filesystem::path(run_dir).lexically_normal().filename().string();
  } else {
    backend.bert = load_viewer_encoder(model_dir, "serve");
    backend.name = short_model_name(model_dir);
  }
  // The first page carries the answer for the default text, so it draws at once.
  index = viz_page(page_data(backend, model_mutex, limits, text, nullptr, {}));

  signals.start([&] { svr.stop(); });
  std::printf("serving %s on http://127.0.0.1:%d/ (Ctrl-C stops)\n", (run_dir.empty() ? model_dir : run_dir).c_str(),
              bound);
  std::fflush(stdout);
  const bool ok = svr.listen_after_bind();
  signals.join();
  return ok ? 0 : 1;
}

}  // namespace
#endif

void add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "Serve a language model's OpenAI API (a .gguf file or a model folder), or "
                                           "the viewer on 127.0.0.1 re-running a BERT model or a run on each sentence");
  auto model = std::make_shared<std::string>();
  auto run = std::make_shared<std::string>();
  auto port = std::make_shared<int>(-1);
  auto text = std::make_shared<std::string>("The cat sat on the mat because it was tired.");
  auto max_tokens = std::make_shared<int64_t>(128);
  auto* model_opt = cmd->add_option("--model", *model,
                                    "A language model (a .gguf file or a transformers folder): the OpenAI API "
                                    "(docs/SERVE.md); a sentence-transformers BERT folder (e.g. all-MiniLM-L6-v2): "
                                    "the viewer");
  auto* run_opt = cmd->add_option("--run", *run, "A `qkv train --out` directory (rnn-attn, transformer, decoder)");
  model_opt->excludes(run_opt);
  run_opt->excludes(model_opt);
  cmd->add_option("--port", *port, "Port (0: any free port; default 8080 for a language model, 8765 for the viewer)")
      ->check(CLI::Range(0, 65535));
  auto lm = std::make_shared<OpenAIServeArgs>();
  auto* host_opt = cmd->add_option("--host", lm->host,
                                   "Language model: the address to listen on (a non-loopback address answers other "
                                   "machines: give --api-key)")
                       ->capture_default_str();
  auto* ctx_opt = cmd->add_option("--ctx", lm->ctx,
                                  "Language model: context of each request in tokens (0: the model's, at most 4096)")
                      ->capture_default_str()
                      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  auto* parallel_opt = cmd->add_option("--parallel", lm->parallel, "Language model: requests decoded at once")
                           ->capture_default_str()
                           ->check(CLI::Range(int64_t{1}, int64_t{256}));
  auto* key_opt = cmd->add_option("--api-key", lm->api_key,
                                  "Language model: require 'Authorization: Bearer KEY' (all routes but /health and "
                                  "/v1/models)");
  auto kv_cache = std::make_shared<std::string>();
  add_kv_cache_option(cmd, *kv_cache);
  auto* kv_opt = cmd->get_option("--kv-cache");
  // Hidden: a testing knob (requests waiting beyond it get 503).
  auto* queued_opt = cmd->add_option("--max-queued", lm->max_queued, "Requests waiting for a place (more get 503)")
                         ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
                         ->group("");
  auto* text_opt = cmd->add_option("--text", *text, "The sentence of the first page (required with --run)")
                       ->capture_default_str();
  auto strict = std::make_shared<bool>(false);
  auto* strict_opt = cmd->add_flag("--strict", *strict,
                                   "With --run: refuse text with characters outside the run's vocabulary (without "
                                   "it they become <unk>, and the page says so)");
  auto* max_tokens_opt = cmd->add_option("--max-tokens", *max_tokens, "Viewer: longest input accepted, in tokens")
                             ->capture_default_str()
                             ->check(CLI::Range(int64_t{2}, int64_t{512}));
  cmd->callback([=]() {
    if (model->empty() && run->empty()) throw CLI::ValidationError("serve", "give --model PATH or --run DIR");
    if (run->empty() && is_language_model(*model)) {
      for (const CLI::Option* o : {text_opt, max_tokens_opt, strict_opt})
        if (o->count() > 0)
          throw CLI::ValidationError("serve", o->get_name() + " is the viewer's; a language model serves the "
                                              "OpenAI API (docs/SERVE.md)");
      lm->model = *model;
      lm->port = *port >= 0 ? *port : 8080;
      lm->kv_cache = kv_cache_precision(*kv_cache);
      const int rc = run_serve_openai(*lm);
      if (rc != 0) throw CLI::RuntimeError(rc);
      return;
    }
    for (const CLI::Option* o : {host_opt, ctx_opt, parallel_opt, key_opt, queued_opt, kv_opt})
      if (o->count() > 0)
        throw CLI::ValidationError("serve", o->get_name() + " is for a language model (a .gguf file or a "
                                            "transformers folder); the viewer listens on 127.0.0.1");
    if (*port < 0) *port = 8765;
    if (!run->empty() && text_opt->count() == 0)
      throw CLI::ValidationError("serve", "--run needs --text, an input in the run's vocabulary");
#ifdef QKV_HAVE_HTTPLIB
    ServeLimits limits;
    limits.max_tokens = *max_tokens;
    limits.strict = *strict;
    const int rc = run_serve(*model, *run, *port, *text, limits);
    if (rc != 0) throw CLI::RuntimeError(rc);
#else
    throw std::runtime_error("[serve] this qkv was built without cpp-httplib (install libcpp-httplib-dev, then "
                             "rebuild)");
#endif
  });
}

}  // namespace qkv::cli
