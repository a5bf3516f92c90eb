// Module: the base of every layer with parameters. Parameters carry PyTorch's dotted names
// ("self_attn.in_proj_weight", "linear1.bias"), so a PyTorch state_dict loads with no renaming table.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "qkv/core/tensor.h"

namespace qkv::nn {

using StateDict = std::map<std::string, Tensor>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  // Parameters are registered by address: a module never moves or copies.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter, recursively, with its dotted name, in registration order.
  std::vector<std::pair<std::string, Tensor*>> named_parameters();
  std::vector<Tensor*> parameters();
  int64_t num_parameters();

  // Copies of the parameters (independent storage) under PyTorch's names.
  StateDict state_dict() const;
  // Copies values in. With strict, throws std::invalid_argument listing missing and unexpected names;
  // a shape mismatch always throws, naming the parameter and both shapes. Nothing is changed on error.
  void load_state_dict(const StateDict& state, bool strict = true);

  // Training mode switches dropout on; eval() switches it off. Applies recursively.
  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

 protected:
  void register_parameter(const std::string& name, Tensor* param);
  void register_module(const std::string& name, Module* child);

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>& out);
  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
};

}  // namespace qkv::nn
