// `qkv serve --model PATH` on a language model: the OpenAI API (as llama-server serves it) over continuous batching.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "qkv/core/precision.h"

namespace qkv::cli {

struct OpenAIServeArgs {
  std::string model;                // a .gguf file or a model folder
  std::string host = "127.0.0.1";   // a loopback host also refuses foreign Host names and cross-origin POSTs
  int port = 8080;
  int64_t ctx = 0;                  // positions of one request's context (0: the model's, at most kDefaultCtx)
  int64_t parallel = 4;             // sequences decoding at once
  int64_t max_queued = 64;          // requests waiting for a place; more get 503
  std::string api_key;              // non-empty: every route but /health and /v1/models needs "Bearer KEY"
  size_t max_body = 1 << 20;        // bytes of one request body
  Precision kv_cache = Precision::kFloat32;  // the KV pool's storage (--kv-cache)
};
constexpr int64_t kDefaultCtx = 4096;

// Listens, loads the model (GET /health answers 503 meanwhile), serves until SIGINT / SIGTERM, then cancels the
// requests still running and returns 0.
int run_serve_openai(const OpenAIServeArgs& args);

}  // namespace qkv::cli
