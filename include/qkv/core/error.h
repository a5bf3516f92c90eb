// Error helpers: one style for every caller mistake and every internal invariant.
// Messages start with "[op]" and show the shapes involved; checks stay on in release builds.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace qkv::detail {

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

}  // namespace qkv::detail

// Caller mistake: throws std::invalid_argument with the concatenated message.
//   QKV_CHECK_ARG(q.dim() >= 2, "[attention] q ", str(q.shape()), " must have rank >= 2");
#define QKV_CHECK_ARG(cond, ...)                                           \
  do {                                                                     \
    if (!(cond)) throw std::invalid_argument(::qkv::detail::concat(__VA_ARGS__)); \
  } while (0)

// Unsupported case or I/O failure: throws std::runtime_error.
#define QKV_CHECK_RUNTIME(cond, ...)                                       \
  do {                                                                     \
    if (!(cond)) throw std::runtime_error(::qkv::detail::concat(__VA_ARGS__)); \
  } while (0)

// Internal invariant. Never compiled out (unlike assert under NDEBUG).
#define QKV_ASSERT(cond)                                                   \
  do {                                                                     \
    if (!(cond))                                                           \
      throw std::logic_error(::qkv::detail::concat(                        \
          "[qkv internal] invariant failed: ", #cond, " at ", __FILE__, ":", __LINE__)); \
  } while (0)
