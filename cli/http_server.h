// The HTTP set-up both `qkv serve` modes share (the viewer's and the OpenAI API's): cpp-httplib's server with a
// fixed pool of workers, short socket timeouts, no SO_REUSEPORT, refusals before any body is read (foreign Host or
// Origin: 403; a declared Content-Length over the limit: 413; a header flood: 431), bodies read under one limit, a
// request's connection watched for its client hanging up, and SIGINT / SIGTERM turned into a callback on a thread of
// their own.
#pragma once

#ifdef QKV_HAVE_HTTPLIB
#include <httplib.h>
#include <signal.h>

#include <ctime>
#include <functional>
#include <string>
#include <thread>

namespace qkv::cli {

// Whether `host` (a Host header: name[:port], IPv6 in brackets) names this machine's loopback.
bool is_loopback_host(const std::string& host);

// "" when the request may be answered, else why it is refused (403): a Host other than loopback (DNS rebinding),
// or a POST whose Origin is not this page's own (a page on another site making the server compute).
std::string foreign_request(const httplib::Request& req);

// More header fields than this are refused (431) before routing: cpp-httplib 0.11 bounds each line, not their count.
constexpr size_t kMaxHeaderFields = 100;

struct HttpOptions {
  size_t max_body = 16 * 1024;     // bytes of one request body, whatever its Content-Type
  size_t workers = 32;             // connections served at once
  time_t read_timeout_sec = 3;     // each read of a request line, header or body chunk
  time_t write_timeout_sec = 10;   // each write (a reader that stalls longer loses its connection)
  time_t keep_alive_timeout_sec = 2;
  size_t keep_alive_max_count = 100;
  bool loopback_only = true;       // refuse foreign Host names and cross-origin POSTs (403)
};

// Writes an error answer: status and a body in the mode's format.
using ErrorWriter = std::function<void(httplib::Response& res, int status, const std::string& message)>;
// Another check before routing (the API key): true when it answered `res` itself.
using PreCheck = std::function<bool(const httplib::Request& req, httplib::Response& res)>;

// Workers, timeouts, socket options and the refusals before routing (then `pre`, when given).
void configure_server(httplib::Server& svr, const HttpOptions& options, ErrorWriter answer, PreCheck pre = {});

// Binds host:port (port 0: any free one) and returns the port; std::runtime_error naming the address when it is in
// use or cannot be bound.
int bind_server(httplib::Server& svr, const std::string& host, int port);

// The connection a request came on, to see whether its client is still there while a long answer is computed
// (a request that is not streamed writes nothing until its end). cpp-httplib 0.11 gives a handler no socket, so it
// is found once among the process's sockets by the request's four addresses and ports (one TCP connection has one
// such tuple); it stays open while the handler runs on the connection's worker.
class ClientConnection {
 public:
  explicit ClientConnection(const httplib::Request& req);
  bool found() const { return fd_ >= 0; }
  // true once the client has closed or reset the connection (its socket reads end-of-file or fails); false while
  // it is open, while it has sent more (a pipelined request), or when the socket was not found.
  bool closed() const;

 private:
  int fd_ = -1;
};

enum class BodyRead { kOk, kTooLarge, kFailed };
BodyRead read_body(const httplib::ContentReader& content, size_t max_body, std::string& body);

// SIGINT and SIGTERM for the scope: blocked from construction on (threads started later inherit the mask, so
// construct it first), then awaited by one thread that calls on_stop. The destructor wakes that thread if no
// signal came and joins it.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  void start(std::function<void()> on_stop);
  // Ends the waiting thread without calling on_stop (when no signal came) and joins it; the destructor does it too.
  void join();

 private:
  sigset_t signals_{};
  std::thread waiter_;
};

}  // namespace qkv::cli
#endif
