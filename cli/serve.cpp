// `qkv serve --model DIR|--run DIR [--port N]`: the viewer page on http://127.0.0.1:PORT/ (loopback only), backed by the model:
// POST /api/attention {"text", "second"?, "mask"?: [positions]} re-runs it and answers the page data as JSON.
// Only loopback Host names are answered and a POST from another origin is refused (no CSRF, no DNS rebinding).
// Built with Debian's cpp-httplib; without it the command says so and exits non-zero.
#include <memory>
#include <string>
#include <vector>

#include "commands.h"

#ifdef QKV_HAVE_HTTPLIB
#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
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
  size_t max_body = 16 * 1024;  // bytes of one request body, whatever its Content-Type
  size_t max_text = 2000;       // bytes of each sentence
  int64_t max_tokens = 128;     // T, [CLS] and [SEP] included
  bool strict = false;          // --run: text outside the run's vocabulary is refused (else a note names it)
};

// Connections: enough workers that idle or half-open connections leave room for real requests, and short socket
// timeouts so that each such connection holds its worker for seconds, not the library's 5 s + 10 s per request.
constexpr size_t kWorkers = 32;
constexpr time_t kReadTimeoutSec = 3;       // each read of a request line, header or body chunk
constexpr time_t kKeepAliveTimeoutSec = 2;  // an idle connection waiting for its next request
constexpr size_t kKeepAliveMaxCount = 100;  // requests over one connection

// Whether `host` (a Host header: name[:port], IPv6 in brackets) names this machine's loopback.
bool is_loopback_host(const std::string& host) {
  std::string name = host;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  std::string port;
  if (!name.empty() && name[0] == '[') {
    const size_t end = name.find(']');
    if (end == std::string::npos) return false;
    port = name.substr(end + 1);
    name = name.substr(0, end + 1);
  } else if (const size_t colon = name.find(':'); colon != std::string::npos) {
    port = name.substr(colon);
    name = name.substr(0, colon);
  }
  if (!port.empty() && (port[0] != ':' || port.size() > 6 ||
                        port.find_first_not_of("0123456789", 1) != std::string::npos))
    return false;
  return name == "localhost" || name == "127.0.0.1" || name == "[::1]";
}

// "" when the request may be answered, else why it is refused (403): a Host other than loopback (DNS rebinding),
// or a POST whose Origin is not this page's own (a page on another site making the server compute).
std::string foreign_request(const httplib::Request& req) {
  const std::string host = req.get_header_value("Host");
  if (req.has_header("Host") && !is_loopback_host(host))
    return "[serve] refused: Host '" + host + "' is not a loopback name (localhost, 127.0.0.1, [::1])";
  if (req.method != "GET" && req.method != "HEAD" && req.has_header("Origin")) {
    std::string origin = req.get_header_value("Origin"), own = "http://" + host;
    auto lower = [](std::string& x) {
      std::transform(x.begin(), x.end(), x.begin(), [](unsigned char c) { return std::tolower(c); });
    };
    lower(origin);
    lower(own);
    if (!req.has_header("Host") || origin != own)
      return "[serve] refused: a " + req.method + " from origin '" + req.get_header_value("Origin") +
             "', not from this page (" + own + ")";
  }
  return "";
}

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
  // SIGINT / SIGTERM stop the server cleanly: blocked first (every thread started later, OpenMP's and the
  // server's, inherits the mask), then awaited by one thread that calls stop().
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  Backend backend;
  std::mutex model_mutex;
  std::string index;  // the first page, set before the server answers

  httplib::Server svr;
  const std::string too_large = "[serve] the request is too large: more than " + std::to_string(limits.max_body) +
                                " bytes (" + std::to_string(limits.max_body / 1024) + " kB)";
  svr.new_task_queue = [] { return new httplib::ThreadPool(kWorkers); };
  svr.set_payload_max_length(limits.max_body);
  svr.set_read_timeout(kReadTimeoutSec, 0);
  svr.set_write_timeout(10, 0);
  svr.set_keep_alive_timeout(kKeepAliveTimeoutSec);
  svr.set_keep_alive_max_count(kKeepAliveMaxCount);
  // Never SO_REUSEPORT (the library's default): a second server on a port in use must fail, not share it.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);  // restarts at once after a stop (TIME_WAIT)
  });
  // Before any body is read: foreign requests, and a Content-Length over the limit (answered at once; the library
  // would first read and drop that many bytes). Either answer tells the client to close the connection.
  auto declared_too_large = [&](const httplib::Request& req) {
    if (!req.has_header("Content-Length")) return false;
    const std::string n = req.get_header_value("Content-Length");
    return n.empty() || n.size() > 18 || n.find_first_not_of("0123456789") != std::string::npos ||
           std::stoull(n) > limits.max_body;
  };
  // 0, or the status of the error answered in `res`.
  auto refuse = [&](const httplib::Request& req, httplib::Response& res) {
    std::string refused = foreign_request(req);
    int status = 403;
    if (refused.empty() && declared_too_large(req)) {
      refused = too_large;
      status = 413;
    }
    if (refused.empty()) return 0;
    answer_error(res, status, refused);
    res.set_header("Connection", "close");
    return status;
  };
  svr.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
    return refuse(req, res) ? httplib::Server::HandlerResponse::Handled : httplib::Server::HandlerResponse::Unhandled;
  });
  svr.set_expect_100_continue_handler([&](const httplib::Request& req, httplib::Response& res) {
    const int status = refuse(req, res);
    return status ? status : 100;
  });
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
      bool over = false;
      const bool read = content([&](const char* data, size_t n) {
        if (body.size() + n > limits.max_body) {
          over = true;
          return false;
        }
        body.append(data, n);
        return true;
      });
      if (over) {
        res.set_header("Connection", "close");
        throw RequestError(413, too_large);
      }
      if (!read) throw RequestError(400, "[serve] the request body could not be read");
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

  errno = 0;
  const int bound = port == 0 ? svr.bind_to_any_port("127.0.0.1") : (svr.bind_to_port("127.0.0.1", port) ? port : -1);
  if (bound < 0) {
    const int err = errno;
    if (err == EADDRINUSE)
      throw std::runtime_error("[serve] 127.0.0.1:" + std::to_string(port) +
                               " is already in use (another server listens there); stop it or choose another --port");
    throw std::runtime_error("[serve] cannot listen on 127.0.0.1:" + std::to_string(port) +
                             (err ? std::string(": ") + std::strerror(err) : std::string()));
  }
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

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    svr.stop();
  });
  std::printf("serving %s on http://127.0.0.1:%d/ (Ctrl-C stops)\n", (run_dir.empty() ? model_dir : run_dir).c_str(),
              bound);
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
  auto strict = std::make_shared<bool>(false);
  cmd->add_flag("--strict", *strict, "With --run: refuse text with characters outside the run's vocabulary "
                                     "(without it they become <unk>, and the page says so)");
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
