// Module: the base of every layer with parameters. Parameters carry PyTorch's dotted names
// ("self_attn.in_proj_weight", "linear1.bias"), so a PyTorch state_dict loads with no renaming table.
#pragma once

#include <atomic>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "qkv/core/precision.h"
#include "qkv/core/tensor.h"
#include "qkv/ops/lowp.h"

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

  // The precision of this module's linear products and attention (qkv/core/precision.h), set recursively, and the
  // registered linear weights (nn::Linear's, MultiheadAttention's projections) prepared for it here, once, and again
  // by load_state_dict; never per call: converted (bf16, int8) and, where sgemm runs its own AVX-512 kernel, packed
  // (fp32 and bf16 weights as that kernel or vdpbf16ps reads them; the fp32 copy doubles the weights' memory).
  // kFloat32 is the float32 path bit for bit, prepared or not; a module whose precision was never set (the default,
  // fp32) prepares nothing and reads its weights live. kInt8 applies to the linear products; attention then stays
  // float32, and it is for inference: a forward that records a tape throws. fp32 and bf16 train: a forward that
  // records a tape runs on the live weights, and from then on this module's forwards without a tape (evaluation
  // between steps) read the live weights too, since an optimizer changes them in place; set_precision or
  // load_state_dict prepares them once again. Weights changed in place by other means need set_precision again.
  void set_precision(Precision p);
  Precision precision() const { return precision_; }
  // The attention precision for this module's precision: kBFloat16 for kBFloat16, else kFloat32.
  Precision attention_precision() const {
    return precision_ == Precision::kBFloat16 ? Precision::kBFloat16 : Precision::kFloat32;
  }
  // A registered linear weight of this module as prepared for precision() (std::invalid_argument if `weight` is
  // not one), and x·weightᵀ + bias through it: at kFloat32 exactly linear(x, weight, bias).
  const LinearWeight& linear_weight(const Tensor& weight) const;
  Tensor linear_at(const Tensor& x, const Tensor& weight, const Tensor& bias = {}) const;
  // Whether a forward reads the weights prepared by set_precision (false before any set_precision, and once a
  // forward recorded a tape: see set_precision). recording: this forward records a tape; kInt8 then
  // throws std::invalid_argument naming `op` and the input shape x.
  bool uses_prepared_weights(bool recording, const char* op, const Shape& x) const;

  // Inference on a weight as a file stores it (a GGUF's quantized blocks: LinearWeight::quantized): `weight`, one
  // of this module's registered linear weights, is released (undefined: no float32 copy, absent from state_dict)
  // and every forward reads `stored`. The module's precision becomes `precision` (kInt8 for the integer block
  // products; attention stays float32). From then on a forward that records a tape, set_precision to another
  // precision and load_state_dict throw std::invalid_argument: such a module is for inference.
  void use_stored_linear_weight(Tensor& weight, LinearWeight stored, Precision precision);
  bool has_stored_weights() const { return stored_; }

 protected:
  void register_parameter(const std::string& name, Tensor* param);
  // A registered parameter used as a linear weight (out, in): set_precision prepares it.
  void register_linear_weight(Tensor* weight);
  void register_module(const std::string& name, Module* child);

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>& out);
  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
  Precision precision_ = Precision::kFloat32;
  bool prepared_ = false;  // set_precision was called: the linear weights are prepared (packed, converted)
  bool stored_ = false;    // some linear weights are read as a file stores them (use_stored_linear_weight)
  std::vector<std::pair<const Tensor*, LinearWeight>> linear_weights_;
  mutable std::atomic<bool> weights_live_{false};  // a forward recorded a tape since the last preparation
  void prepare_linear_weights();  // every module below this one, at its own precision
};

}  // namespace qkv::nn
