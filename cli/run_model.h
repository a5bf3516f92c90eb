// The model of a `qkv train` run and its evaluation are the library's (qkv/train/run_model.h); these are the names
// the commands use.
#pragma once

#include "qkv/train/run_model.h"
#include "run_config.h"

namespace qkv::cli {
using train::decode_all;
using train::DecodeSettings;
using train::evaluate;
using train::EvalResult;
using train::make_run_model;
using train::text_model_config;
}  // namespace qkv::cli
