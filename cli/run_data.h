// The data of a `qkv train` run is the library's (qkv/train/run_data.h); these are the names the commands use.
#pragma once

#include "qkv/train/run_data.h"
#include "run_config.h"

namespace qkv::cli {
using train::file_hash;
using train::load_run_data;
using train::RunData;
using train::vocab_difference;
}  // namespace qkv::cli
