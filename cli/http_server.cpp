// The HTTP set-up of `qkv serve` (both modes): workers, timeouts, early refusals, body reading, stop signals.
#ifdef QKV_HAVE_HTTPLIB
#include "http_server.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace qkv::cli {

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

void configure_server(httplib::Server& svr, const HttpOptions& options, ErrorWriter answer, PreCheck pre) {
  const size_t workers = options.workers;
  svr.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  svr.set_payload_max_length(options.max_body);
  svr.set_read_timeout(options.read_timeout_sec, 0);
  svr.set_write_timeout(options.write_timeout_sec, 0);
  svr.set_keep_alive_timeout(options.keep_alive_timeout_sec);
  svr.set_keep_alive_max_count(options.keep_alive_max_count);
  // Never SO_REUSEPORT (the library's default): a second server on a port in use must fail, not share it.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);  // restarts at once after a stop (TIME_WAIT)
  });
  const size_t max_body = options.max_body;
  const bool loopback_only = options.loopback_only;
  const std::string too_large = "[serve] the request is too large: more than " + std::to_string(max_body) +
                                " bytes (" + std::to_string(max_body / 1024) + " kB)";
  // Before any body is read: foreign requests, and a Content-Length over the limit (answered at once; the library
  // would first read and drop that many bytes). Either answer tells the client to close the connection.
  auto declared_too_large = [max_body](const httplib::Request& req) {
    if (!req.has_header("Content-Length")) return false;
    const std::string n = req.get_header_value("Content-Length");
    return n.empty() || n.size() > 18 || n.find_first_not_of("0123456789") != std::string::npos ||
           std::stoull(n) > max_body;
  };
  // 0, or the status of the error answered in `res`.
  auto refuse = [=](const httplib::Request& req, httplib::Response& res) {
    std::string refused = loopback_only ? foreign_request(req) : std::string();
    int status = 403;
    if (refused.empty() && declared_too_large(req)) {
      refused = too_large;
      status = 413;
    }
    if (refused.empty() && req.headers.size() > kMaxHeaderFields) {
      refused = "[serve] the request has " + std::to_string(req.headers.size()) + " header fields, more than " +
                std::to_string(kMaxHeaderFields);
      status = 431;
    }
    if (refused.empty()) return 0;
    answer(res, status, refused);
    res.set_header("Connection", "close");
    return status;
  };
  svr.set_pre_routing_handler([=](const httplib::Request& req, httplib::Response& res) {
    if (refuse(req, res) || (pre && pre(req, res))) return httplib::Server::HandlerResponse::Handled;
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr.set_expect_100_continue_handler([=](const httplib::Request& req, httplib::Response& res) {
    const int status = refuse(req, res);
    return status ? status : 100;
  });
  // A handler's unexpected exception: 500 with its message, never a dropped connection.
  svr.set_exception_handler([answer](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string m = "[serve] internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      m += std::string(": ") + e.what();
    } catch (...) {
    }
    answer(res, 500, m);
  });
}

int bind_server(httplib::Server& svr, const std::string& host, int port) {
  if (port < 0 || port > 65535)
    throw std::invalid_argument("[serve] --port must be in [0, 65535], got " + std::to_string(port));
  errno = 0;
  const int bound = port == 0 ? svr.bind_to_any_port(host.c_str()) : (svr.bind_to_port(host.c_str(), port) ? port : -1);
  if (bound < 0) {
    const int err = errno;
    if (err == EADDRINUSE)
      throw std::runtime_error("[serve] " + host + ":" + std::to_string(port) +
                               " is already in use (another server listens there); stop it or choose another --port");
    throw std::runtime_error("[serve] cannot listen on " + host + ":" + std::to_string(port) +
                             (err ? std::string(": ") + std::strerror(err) : std::string()));
  }
  return bound;
}

namespace {
// The numeric host and the port of a socket address, as cpp-httplib writes a request's (getnameinfo, NI_NUMERICHOST).
bool host_and_port(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
  char name[NI_MAXHOST];
  char service[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, name, sizeof name, service, sizeof service,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = name;
  port = std::atoi(service);
  return true;
}
}  // namespace

ClientConnection::ClientConnection(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  const int own = dirfd(dir);
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    if (fd == own) continue;
    sockaddr_storage local{}, remote{};
    socklen_t local_len = sizeof local, remote_len = sizeof remote;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &remote_len) != 0)
      continue;  // not a socket, or not a connected one (the listener)
    std::string local_host, remote_host;
    int local_port = -1, remote_port = -1;
    if (host_and_port(local, local_len, local_host, local_port) && local_port == req.local_port &&
        host_and_port(remote, remote_len, remote_host, remote_port) && remote_port == req.remote_port &&
        local_host == req.local_addr && remote_host == req.remote_addr) {
      fd_ = fd;
      break;
    }
  }
  closedir(dir);
}

bool ClientConnection::closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;  // nothing to read: still open
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  char c = 0;
  const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

BodyRead read_body(const httplib::ContentReader& content, size_t max_body, std::string& body) {
  bool over = false;
  const bool read = content([&](const char* data, size_t n) {
    if (body.size() + n > max_body) {
      over = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (over) return BodyRead::kTooLarge;
  return read ? BodyRead::kOk : BodyRead::kFailed;
}

namespace {
std::atomic<bool> g_quiet_stop{false};  // set by ~StopSignals: the wake-up is not a stop request
}

StopSignals::StopSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
}

void StopSignals::start(std::function<void()> on_stop) {
  g_quiet_stop.store(false);
  waiter_ = std::thread([this, on_stop = std::move(on_stop)] {
    int sig = 0;
    sigwait(&signals_, &sig);
    if (!g_quiet_stop.load()) on_stop();
  });
}

StopSignals::~StopSignals() { join(); }

void StopSignals::join() {
  if (waiter_.joinable()) {
    g_quiet_stop.store(true);
    pthread_kill(waiter_.native_handle(), SIGTERM);  // wakes sigwait when no signal came
    waiter_.join();
  }
}

}  // namespace qkv::cli
#endif
