// `qkv chat --model PATH [--system TEXT] [--max-new-tokens N] [--temperature T --top-k K --top-p P --seed S]`: a
// conversation on stdin / stdout with a model's chat template. Each input line is a user turn; the whole history is
// encoded again every turn. /reset clears it, /exit or end of input quits; Ctrl-C stops a reply, or quits at the
// prompt. On a terminal a "> " marker asks for each line; piped input gets the replies only, one after each line.
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include "commands.h"
#include "lm_common.h"
#include "qkv/core/error.h"
#include "qkv/core/json.h"
#include "qkv/models/language_model.h"
#include "run_common.h"

namespace qkv::cli {
namespace {

struct ChatArgs {
  std::string model, system, precision, kv_cache;
  int64_t max_new_tokens = 256, page_size = 0, ctx = 0;
  decode::SamplingOptions sampling;
  bool top_k_given = false, top_p_given = false;
};

// Set by SIGINT: stops the reply being streamed (generate reads it before every step), or, at the prompt, ends
// the reading of the line (read() returns EINTR: the handler is installed without SA_RESTART).
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_sigint(int) { g_interrupted.store(true); }

// Installs on_sigint for the scope, and restores the previous action after.
class SigintScope {
 public:
  SigintScope() {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a read at the prompt returns EINTR
    ::sigaction(SIGINT, &sa, &old_);
  }
  ~SigintScope() { ::sigaction(SIGINT, &old_, nullptr); }
  SigintScope(const SigintScope&) = delete;
  SigintScope& operator=(const SigintScope&) = delete;

 private:
  struct sigaction old_ {};
};

// Lines from a file descriptor through ppoll(2) and read(2), so that Ctrl-C at the prompt is seen at once: SIGINT
// is blocked while the flag is checked and unblocked only inside ppoll, so none is lost between check and wait.
class LineReader {
 public:
  enum class Status { kLine, kEnd, kInterrupted };
  explicit LineReader(int fd) : fd_(fd) {}

  Status next(std::string& line) {
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return Status::kLine;
      }
      if (eof_) {
        if (buf_.empty()) return Status::kEnd;
        line = std::move(buf_);  // a last line without its newline
        buf_.clear();
        return Status::kLine;
      }
      sigset_t sigint, unblocked;
      sigemptyset(&sigint);
      sigaddset(&sigint, SIGINT);
      ::pthread_sigmask(SIG_BLOCK, &sigint, &unblocked);
      if (g_interrupted.load()) {
        ::pthread_sigmask(SIG_SETMASK, &unblocked, nullptr);
        return Status::kInterrupted;
      }
      struct pollfd p {};
      p.fd = fd_;
      p.events = POLLIN;
      const int ready = ::ppoll(&p, 1, nullptr, &unblocked);  // SIGINT can arrive only while waiting here
      const int poll_errno = errno;
      ::pthread_sigmask(SIG_SETMASK, &unblocked, nullptr);
      if (ready < 0) {
        if (poll_errno == EINTR) continue;  // the flag is read again above
        throw std::runtime_error(std::string("[chat] cannot wait for standard input: ") + std::strerror(poll_errno));
      }
      char chunk[4096];
      const ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n > 0) {
        buf_.append(chunk, static_cast<size_t>(n));
      } else if (n == 0) {
        eof_ = true;
      } else if (errno != EINTR && errno != EAGAIN) {
        throw std::runtime_error(std::string("[chat] cannot read standard input: ") + std::strerror(errno));
      }
    }
  }

 private:
  int fd_;
  std::string buf_;
  bool eof_ = false;
};

void note(const std::string& text) {  // one line on stderr, between turns
  std::fflush(stdout);
  std::fprintf(stderr, "qkv: %s\n", text.c_str());
  std::fflush(stderr);
}

json::Value message(const std::string& role, const std::string& content) {
  return json::Value::object().set("role", role).set("content", content);
}

void run_chat(const ChatArgs& a) {
  const std::optional<Precision> precision = parse_model_precision(a.precision);
  check_sampling_given(a.sampling, a.top_k_given, a.top_p_given, "chat");
  const models::LanguageModel lm = models::LanguageModel::load(a.model, precision);
  QKV_CHECK_ARG(lm.chat_template.has_value(), "[chat] ", a.model,
                " has no chat template (tokenizer.chat_template, chat_template.jinja or tokenizer_config.json): use "
                "qkv generate --prompt for plain text completion");
  const int64_t context = context_of(lm, a.ctx);
  const bool tty = ::isatty(STDIN_FILENO) != 0;
  if (tty)
    std::fprintf(stderr,
                 "qkv chat: %s (context %lld tokens). /reset clears the conversation, /exit or Ctrl-D quits, Ctrl-C "
                 "stops a reply.\n",
                 a.model.c_str(), static_cast<long long>(context));

  std::vector<std::pair<std::string, std::string>> history;  // (role, content) after the system message
  const auto conversation = [&]() {
    json::Value messages = json::Value::array();
    if (!a.system.empty()) messages.push(message("system", a.system));
    for (const auto& [role, content] : history) messages.push(message(role, content));
    return messages;
  };
  const std::string context_text = "the context of " + std::to_string(context) + " tokens";

  SigintScope sigint;
  LineReader reader(STDIN_FILENO);
  for (;;) {
    g_interrupted.store(false);  // before the marker: a Ctrl-C once it shows ends the program
    if (tty) {
      std::printf("> ");
      flush_stdout("chat");
    }
    std::string line;
    const LineReader::Status status = reader.next(line);
    if (status != LineReader::Status::kLine) {
      if (tty) std::printf("\n");
      if (status == LineReader::Status::kInterrupted) throw ExitStatus{130};  // Ctrl-C at the prompt
      return;                                                                 // end of input
    }
    const size_t b = line.find_first_not_of(" \t"), e = line.find_last_not_of(" \t");
    const std::string command = b == std::string::npos ? "" : line.substr(b, e - b + 1);
    if (command.empty()) continue;
    if (command == "/exit") return;
    if (command == "/reset") {
      history.clear();
      if (tty) note("the conversation is cleared");
      continue;
    }

    history.emplace_back("user", line);
    std::vector<int64_t> prompt;
    try {
      prompt = lm.encode_chat(conversation(), /*add_generation_prompt=*/true);
    } catch (const std::invalid_argument& err) {  // text that is not UTF-8, a template that raises: drop the turn
      history.pop_back();
      note("error: " + one_line(err.what()));
      continue;
    }
    if (static_cast<int64_t>(prompt.size()) >= context) {
      history.pop_back();
      note("the conversation no longer fits " + context_text + " (" + std::to_string(prompt.size()) +
           " tokens with this message): /reset starts a new one");
      continue;
    }
    decode::GenerateOptions o;
    o.max_new_tokens = a.max_new_tokens;
    o.sampling = a.sampling;
    o.page_size = a.page_size;
    o.kv_cache = kv_cache_precision(a.kv_cache);
    o.stop_ids = lm.stop_ids;
    o.cancel = &g_interrupted;
    const Reply reply = stream_reply(lm, prompt, o, context, /*print_ids=*/false, "chat");
    std::printf("\n");
    flush_stdout("chat");
    // The reply as the user saw it, cut or not, is the assistant's turn.
    history.emplace_back("assistant", reply.text);
    if (reply.generation.finish == decode::FinishReason::kCancelled) {
      note("reply stopped");
    } else if (reply.generation.finish == decode::FinishReason::kContext) {
      note("the reply was cut at the end of " + context_text + ": /reset starts a new conversation");
    }
  }
}

}  // namespace

void add_chat(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "Talk with a language model (a .gguf file or a model folder) on the terminal");
  auto a = std::make_shared<ChatArgs>();
  cmd->add_option("--model", a->model,
                  "A .gguf file, or transformers' save_pretrained folder (config.json, model.safetensors, "
                  "tokenizer.json, a chat template)")
      ->required();
  cmd->add_option("--system", a->system, "A system message at the start of the conversation");
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "Most tokens of one reply")
      ->capture_default_str()
      ->check(at_least(0));
  const SamplingFlags sampling = add_sampling_options(cmd, a->sampling);
  cmd->add_option("--page-size", a->page_size,
                  "KV cache in pages of this many positions, read in place by the attention (0: contiguous)")
      ->capture_default_str()
      ->check(at_least(0));
  add_kv_cache_option(cmd, a->kv_cache);
  add_model_precision_option(cmd, a->precision);
  add_ctx_option(cmd, a->ctx);
  cmd->callback([a, sampling]() {
    a->top_k_given = sampling.top_k->count() > 0;
    a->top_p_given = sampling.top_p->count() > 0;
    run_chat(*a);
  });
}

}  // namespace qkv::cli
