// PyTorch weights in and out of qkv modules: a state_dict saved to safetensors (scripts/export_torch.py) loads here
// with no renaming table, because every qkv module registers its parameters under PyTorch's names.
#pragma once

#include <map>
#include <string>

#include "qkv/nn/module.h"

namespace qkv::nn {

// Throws std::invalid_argument "PREFIX NAME holds a non-finite value (nan) at flat index I of shape (..)" for the
// first tensor of `state` (in name order) with a NaN or an infinity; prefix is e.g. "[load_state_dict] ".
// Weights read from a file must never hold one: load_state_dict(module, path), the CLI's checkpoints and
// run-layer, and SentenceEncoder refuse them with this check. (Module::load_state_dict on tensors in memory accepts
// any values, as PyTorch's does.)
void check_finite(const StateDict& state, const std::string& prefix);

// Loads the safetensors file at `path` into `module` (strict by default: missing, unexpected or misshapen names
// throw std::invalid_argument listing them, and so does a NaN or infinite weight, naming it; nothing is changed on
// error). I/O errors throw std::system_error,
// malformed files std::invalid_argument "[safetensors] ...".
void load_state_dict(Module& module, const std::string& path, bool strict = true);

// Writes module.state_dict() to `path` atomically, with optional string metadata.
void save_state_dict(Module& module, const std::string& path,
                     const std::map<std::string, std::string>& metadata = {});

}  // namespace qkv::nn
