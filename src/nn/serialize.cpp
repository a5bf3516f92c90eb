// load_state_dict / save_state_dict through safetensors for any Module with PyTorch parameter names.
#include "qkv/nn/serialize.h"

#include "qkv/core/safetensors.h"

namespace qkv::nn {

void load_state_dict(Module& module, const std::string& path, bool strict) {
  const SafeTensorsFile file = load_safetensors(path);
  check_finite(file.tensors, "[load_state_dict] " + path + ": ");
  module.load_state_dict(file.tensors, strict);
}

void save_state_dict(Module& module, const std::string& path, const std::map<std::string, std::string>& metadata) {
  save_safetensors(path, module.state_dict(), metadata);
}

}  // namespace qkv::nn
