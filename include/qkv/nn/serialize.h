// PyTorch weights in and out of qkv modules: a state_dict saved to safetensors (scripts/export_torch.py) loads here
// with no renaming table, because every qkv module registers its parameters under PyTorch's names.
#pragma once

#include <map>
#include <string>

#include "qkv/nn/module.h"

namespace qkv::nn {

// Throws std::invalid_argument "PREFIX NAME holds a non-finite value (nan) at flat index I of shape (..)" for the
// first tensor of `state` (in name order) with a NaN or an infinity; prefix is e.g. "[load_state_dict] ".
// Weights and optimizer states must never hold one: Module::load_state_dict refuses them with this check.
void check_finite(const StateDict& state, const std::string& prefix);

// Loads the safetensors file at `path` into `module` (strict by default: missing, unexpected or misshapen names
// throw std::invalid_argument listing them; nothing is changed on error). I/O errors throw std::system_error,
// malformed files std::invalid_argument "[safetensors] ...".
void load_state_dict(Module& module, const std::string& path, bool strict = true);

// Writes module.state_dict() to `path` atomically, with optional string metadata.
void save_state_dict(Module& module, const std::string& path,
                     const std::map<std::string, std::string>& metadata = {});

}  // namespace qkv::nn
