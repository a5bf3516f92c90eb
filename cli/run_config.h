// The run configuration of `qkv train`, `qkv eval` and `qkv translate` is the library's train::RunConfig
// (qkv/train/run_config.h); these are the names the commands use for it.
#pragma once

#include "qkv/train/run_config.h"

namespace qkv::cli {
using train::format_double;
using train::load_run_config;
using train::parse_flat_json;
using train::RunConfig;
}  // namespace qkv::cli
