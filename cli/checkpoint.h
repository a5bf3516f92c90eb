// The checkpoints of a training run are the library's store (qkv/train/checkpoint.h); these are the names the
// commands use.
#pragma once

#include "qkv/train/checkpoint.h"

namespace qkv::cli {
using train::latest_checkpoint;
using train::load_checkpoint;
using train::load_latest_checkpoint;
using train::LoadedCheckpoint;
using train::TrainerState;
}  // namespace qkv::cli
