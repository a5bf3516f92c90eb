// `qkv serve --model DIR|--run DIR [--port N]`: the viewer page on http://127.0.0.1:PORT/ (loopback only), backed by the model:
// POST /api/attention {"text", "second"?, "mask"?: [positions]} re-runs it and answers the page data as JSON.
// Built with Debian's cpp-httplib; without it the command says so and exits non-zero.
#include <memory>
#include <string>
#include <vector>

#include "commands.h"

#ifdef QKV_HAVE_HTTPLIB
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <filesystem>

#include "qkv/core/error.h"
#include "qkv/core/json.h"
#include "viz_page.h"
#include "viz_run.h"
#endif

namespace qkv::cli {

#ifdef QKV_HAVE_HTTPLIB
namespace {

struct ServeLimits {
  size_t max_body = 16 * 1024;  // bytes of one request
  size_t max_text = 2000;       // bytes of each sentence
  int64_t max_tokens = 128;     // T, [CLS] and [SEP] included
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
  // SIGINT / SIGTERM stop the server cleanly: blocked first (every thread started later, OpenMP's and the
  // server's, inherits the mask), then awaited by one thread that calls stop().
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  Backend backend;
  if (!run_dir.empty()) {
    backend.run = std::make_unique<RunViewer>(run_dir, "serve");
    backend.name = std::filesystem::path(run_dir).lexically_normal().filename().string();
  } else {
    backend.bert = std::make_unique<models::SentenceEncoder>(model_dir);
    backend.name = short_model_name(model_dir);
  }
  std::mutex model_mutex;
  // The first page carries the answer for the default text, so it draws at once.
  const std::string index = viz_page(page_data(backend, model_mutex, limits, text, nullptr, {}));

  httplib::Server svr;
  svr.set_payload_max_length(limits.max_body);
  svr.set_read_timeout(10, 0);
  svr.set_write_timeout(10, 0);
  svr.Get("/", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(index, "text/html; charset=utf-8");
  });
  svr.Post("/api/attention", [&](const httplib::Request& req, httplib::Response& res) {
    try {
      if (req.body.size() > limits.max_body) throw RequestError(413, "[serve] the request is larger than 16 kB");
      std::string t, second;
      bool has_second = false;
      std::vector<int64_t> mask;
      parse_request(req.body, t, second, has_second, mask);
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
  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.body.empty()) {
      const std::string m = res.status == 413   ? "[serve] the request is too large"
                            : res.status == 404 ? "[serve] not found: GET / or POST /api/attention"
                                                : "[serve] bad request";
      res.set_content(json::Value::object().set("error", m).dump(0), "application/json");
    }
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string m = "[serve] internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      m += std::string(": ") + e.what();
    } catch (...) {
    }
    answer_error(res, 500, m);
  });

  const int bound = port == 0 ? svr.bind_to_any_port("127.0.0.1") : (svr.bind_to_port("127.0.0.1", port) ? port : -1);
  if (bound < 0) throw std::runtime_error("[serve] cannot listen on 127.0.0.1:" + std::to_string(port));
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    svr.stop();
  });
  std::printf("serving %s on http://127.0.0.1:%d/ (Ctrl-C stops)\n", model_dir.c_str(), bound);
  std::fflush(stdout);
  const bool ok = svr.listen_after_bind();
  if (waiter.joinable()) {
    pthread_kill(waiter.native_handle(), SIGTERM);  // wakes sigwait when listen ended on its own
    waiter.join();
  }
  return ok ? 0 : 1;
}

}  // namespace
#endif

void add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "Serve the viewer on 127.0.0.1 and re-run the model on each sentence");
  auto model = std::make_shared<std::string>();
  auto run = std::make_shared<std::string>();
  auto port = std::make_shared<int>(8765);
  auto text = std::make_shared<std::string>("The cat sat on the mat because it was tired.");
  auto max_tokens = std::make_shared<int64_t>(128);
  auto* model_opt = cmd->add_option("--model", *model, "sentence-transformers BERT folder (e.g. all-MiniLM-L6-v2)");
  auto* run_opt = cmd->add_option("--run", *run, "A `qkv train --out` directory (rnn-attn, transformer, decoder)");
  model_opt->excludes(run_opt);
  run_opt->excludes(model_opt);
  cmd->add_option("--port", *port, "Port on 127.0.0.1 (0: any free port)")->capture_default_str();
  auto* text_opt = cmd->add_option("--text", *text, "The sentence of the first page (required with --run)")
                       ->capture_default_str();
  cmd->add_option("--max-tokens", *max_tokens, "Longest input accepted, in tokens")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{512}));
  cmd->callback([=]() {
    if (model->empty() && run->empty()) throw CLI::ValidationError("serve", "give --model DIR or --run DIR");
    if (!run->empty() && text_opt->count() == 0)
      throw CLI::ValidationError("serve", "--run needs --text, an input in the run's vocabulary");
#ifdef QKV_HAVE_HTTPLIB
    ServeLimits limits;
    limits.max_tokens = *max_tokens;
    const int rc = run_serve(*model, *run, *port, *text, limits);
    if (rc != 0) throw CLI::RuntimeError(rc);
#else
    throw std::runtime_error("[serve] this qkv was built without cpp-httplib (install libcpp-httplib-dev, then "
                             "rebuild)");
#endif
  });
}

}  // namespace qkv::cli
