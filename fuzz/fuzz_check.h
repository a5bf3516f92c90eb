// Shared by the libFuzzer targets: an always-on invariant check that aborts (so libFuzzer records a crash), and
// the rule every reader follows: a malformed input throws std::invalid_argument whose message starts with `prefix`.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define FUZZ_CHECK(cond)                                                                      \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

// True when `what` starts with `prefix`; prints the message otherwise so a failing input is easy to read.
inline bool fuzz_message_starts_with(const char* what, const char* prefix) {
  if (std::strncmp(what, prefix, std::strlen(prefix)) == 0) return true;
  std::fprintf(stderr, "error message without the '%s' prefix: %s\n", prefix, what);
  return false;
}
