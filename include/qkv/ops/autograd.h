// Reverse-mode autograd: a Tape records one node per differentiable op (its saved tensors live in a backward
// closure); a Var is a cheap handle {value, tape, slot}. Parameters are leaves bound to module tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <type_traits>
#include <vector>

#include "qkv/core/error.h"
#include "qkv/core/tensor.h"

namespace qkv::ad {

class Tape;

// A trainable tensor. `value` points at a module's tensor (optimizers update it in place, so the module sees the
// new weights); `grad` has value's shape and is allocated once. After zero_grad() the gradient is absent
// (has_grad false, PyTorch's `grad is None`): the first backward contribution overwrites the buffer, so no memset
// is needed, and optimizers skip parameters that received no gradient, as torch.optim does.
struct Parameter {
  std::string name;
  Tensor* value = nullptr;
  Tensor grad;
  bool has_grad = false;
};

// The parameters one optimizer trains, in a fixed order (a module's registration order = PyTorch's state_dict
// order). Parameters never move once added (tapes hold pointers to them).
class ParameterSet {
 public:
  ParameterSet() = default;
  // Every named parameter of `module` (an nn::Module, or anything with named_parameters() giving
  // (dotted PyTorch name, Tensor*) pairs), in registration order.
  template <class M, class = decltype(std::declval<M&>().named_parameters())>
  explicit ParameterSet(M& module) {
    for (auto& [name, t] : module.named_parameters()) add(name, t);
  }
  ParameterSet(const ParameterSet&) = delete;
  ParameterSet& operator=(const ParameterSet&) = delete;

  // value: a defined tensor that outlives this set; names and tensors must be unique.
  void add(const std::string& name, Tensor* value);

  size_t size() const { return params_.size(); }
  Parameter& operator[](size_t i) { return *params_[i]; }
  const Parameter& operator[](size_t i) const { return *params_[i]; }
  // nullptr when absent.
  Parameter* find(const std::string& name);
  Parameter* find(const Tensor* value);
  // Index of the parameter bound to `value`, or -1.
  int64_t index_of(const Tensor* value) const;

  // Marks every gradient absent (no memset). Call once per step, before the forward.
  void zero_grad();
  int64_t numel() const;  // total number of trainable scalars

 private:
  std::vector<std::unique_ptr<Parameter>> params_;
  std::unordered_map<const Tensor*, size_t> by_value_;
  std::unordered_map<std::string, size_t> by_name_;
};

// A value on a tape. Copying a Var copies a handle (the tensor shares storage). A Var built from a Tensor (the
// implicit constructor) is a constant: no gradient flows to it. Ops whose inputs are all constants record
// nothing and return constants, so a forward pass without a tape costs no bookkeeping.
struct Var {
  Tensor value;
  Tape* tape = nullptr;
  int32_t slot = -1;  // gradient slot on `tape`; -1 for a constant

  Var() = default;
  Var(const Tensor& t) : value(t) {}  // NOLINT(google-explicit-constructor): a constant
  Var(const Tensor& t, Tape* tp, int32_t s) : value(t), tape(tp), slot(s) {}

  bool defined() const { return value.defined(); }
  bool requires_grad() const { return slot >= 0; }
  const Shape& shape() const { return value.shape(); }
  int64_t dim() const { return value.dim(); }
  int64_t size(int64_t axis) const { return value.size(axis); }
  int64_t numel() const { return value.numel(); }
  // The accumulated gradient after Tape::backward (undefined when none reached this Var or it is not a leaf
  // made with Tape::leaf / Tape::param; intermediate gradients are released as backward proceeds).
  Tensor grad() const;
};

// Records differentiable ops in execution order and runs their backward halves in reverse.
// Typical step (see nn/context.h, train/loss.h, train/optim.h):
//   ParameterSet params(model);  AdamW opt(params);  Tape tape;  Rng dropout_rng(seed);
//   for each batch:
//     params.zero_grad();  tape.clear();
//     nn::Context c(tape, params, &dropout_rng);
//     Var loss = cross_entropy(model.forward(c, ids), targets);
//     tape.backward(loss);  clip_grad_norm(params, 1.0);  opt.set_lr(schedule.at(step));  opt.step();
// Single-threaded bookkeeping; the ops themselves use OpenMP.
class Tape {
 public:
  // A backward closure: `dout[i]` is the gradient of the node's i-th output, undefined when none reached it
  // (for a single-output node the closure only runs when its output has a gradient). It adds its inputs'
  // gradients with accumulate() / accumulator().
  using Backward = std::function<void(Tape& tape, std::span<const Tensor> dout)>;
  // Called during backward once a parameter's gradient is final: right after the closure of the earliest-recorded
  // node that reads the parameter ran (or was skipped because no gradient reached it), since only the nodes that
  // read a parameter add to its gradient, and they run in reverse order. `nodes_left`: the nodes whose backward has
  // yet to run. Each parameter some node read is reported once per backward; one that no node read is never.
  using ParamReady = std::function<void(Parameter& p, size_t nodes_left)>;

  Tape() = default;
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  // --- leaves -----------------------------------------------------------------------------------------------
  // A leaf whose gradient is kept and read with v.grad() after backward (inputs of gradient checks).
  Var leaf(const Tensor& value);
  // A parameter leaf: its gradient accumulates into p.grad (see Parameter).
  Var param(Parameter& p);

  // --- recording (for op authors) -----------------------------------------------------------------------------
  // Records a node with one output. `inputs` only decides whether the output needs a gradient: when no input
  // does, nothing is recorded and a constant is returned (fn is dropped).
  Var record(const Tensor& value, std::initializer_list<const Var*> inputs, Backward fn);
  // Same with several outputs (split, LSTM cell (h, c)): fn sees one dout per output.
  std::vector<Var> record(const std::vector<Tensor>& values, std::initializer_list<const Var*> inputs,
                          Backward fn);
  std::vector<Var> record(const std::vector<Tensor>& values, const std::vector<const Var*>& inputs, Backward fn);

  // --- gradient accumulation (inside backward closures) -------------------------------------------------------
  // True when v takes a gradient (a non-constant Var of this tape).
  bool needs(const Var& v) const { return v.slot >= 0; }
  // grad(v) += g. g must have v's shape (any strides). The first contribution to an intermediate is kept
  // without a copy (shared, copy-on-write); a parameter's first contribution is copied into p.grad.
  void accumulate(const Var& v, const Tensor& g);
  // Same, for a g that nothing else references (a fresh result of the backward): the tape may keep it and write
  // into it, which saves a copy when v already holds a shared gradient.
  void accumulate_owned(const Var& v, const Tensor& g);
  // A contiguous, writable buffer holding grad(v), for kernels that accumulate in place (sgemm with beta).
  // fresh == true: the buffer's contents are undefined and the caller must overwrite all of it (beta = 0);
  // otherwise it holds the gradient so far and the caller adds. Returns an undefined Tensor when !needs(v).
  Tensor accumulator(const Var& v, bool& fresh);
  // Like accumulator(), for kernels that can write out = base + contribution: when the gradient so far is a
  // shared buffer (which accumulator() would copy first), returns a fresh buffer and sets `base` to that gradient
  // (contiguous) instead. base undefined: fresh says whether to overwrite (true) or add in place (false).
  Tensor accumulator_or_base(const Var& v, bool& fresh, Tensor& base);
  // Same, but a fresh buffer is zero-filled first (for partial writes: slices, scatter-adds).
  Tensor accumulator_zeroed(const Var& v);

  // --- running ----------------------------------------------------------------------------------------------
  // Backward from a scalar (numel 1) with d(out) = 1.
  void backward(const Var& out);
  // Backward with an explicit upstream gradient of out's shape.
  void backward(const Var& out, const Tensor& dout);
  // The hook of every later backward (an empty function: none, the default, which costs nothing). A parameter's
  // gradient is written again after its report only by a closure that adds to a Var it did not record as an
  // input, which throws std::logic_error.
  void set_on_param_ready(ParamReady hook) { on_param_ready_ = std::move(hook); }
  // Gradient of a leaf (or of any slot still alive); undefined when none.
  Tensor grad(const Var& v) const;
  // Drops every node, saved tensor and gradient slot (parameter gradients stay in their Parameter).
  // Keeps capacity, so the next step allocates no bookkeeping.
  void clear();

  size_t num_nodes() const { return nodes_.size(); }

 private:
  struct Slot {
    Tensor grad;
    Parameter* param = nullptr;
    bool owned = false;  // grad is a private buffer that may be written in place
    bool keep = false;   // leaf: keep after backward
    int32_t first_use = -1;   // parameter slot: the first node that read this slot (-1: none)
    int32_t ready_node = -1;  // parameter slot, during a backward with a hook: the node after which it is final
  };
  struct Node {
    Backward fn;
    int32_t first_out;
    int32_t num_out;
  };
  int32_t new_slot(Parameter* p, bool keep);
  Slot& slot_of(const Var& v);
  void note_inputs(const Var* v);
  // The parameters in the order their gradients become final (only while a hook is set).
  void plan_param_ready();
  void check_not_final(const Slot& s) const;

  std::vector<Slot> slots_;
  std::vector<Node> nodes_;
  ParamReady on_param_ready_;
  std::vector<std::pair<int32_t, Parameter*>> ready_;  // (node after which it is final, parameter), node descending
  int64_t running_node_ = -1;                            // the node whose closure runs (during backward)
  bool ran_ = false;
};

// The Vars of a ParameterSet bound to one tape, looked up by the module tensor they stand for:
//   Binder P(tape, params);  Var w = P(linear.weight);
// A tensor that is not in the set (a frozen parameter) comes back as a constant.
class Binder {
 public:
  Binder(Tape& tape, ParameterSet& params);
  Var operator()(const Tensor& module_tensor) const;
  Tape& tape() const { return *tape_; }

 private:
  Tape* tape_;
  ParameterSet* params_;
  std::vector<Var> vars_;
};

// For op authors in any layer (ops' differentiable functions, nn's fused RNN cells, train's cross-entropy).
namespace detail {

// The tape of the first input that needs a gradient; nullptr when none does.
inline Tape* tape_of(std::initializer_list<const Var*> inputs) {
  for (const Var* v : inputs)
    if (v && v->slot >= 0) return v->tape;
  return nullptr;
}

// Records `fn` (a callable (Tape&, std::span<const Tensor>)) as the backward of `value` when any input needs
// a gradient; otherwise returns `value` as a constant without building the closure's std::function. `fn` may also
// be a callable of no arguments that returns that closure (`[&] { return [x](Tape& t, Douts d) {...}; }`): the
// closure's captures are then copied only when something is recorded. Inference builds none: a decoding step's
// ops had copied every captured Var (its shape and strides: two allocations each) only to drop it.
template <class F>
Var record(const Tensor& value, std::initializer_list<const Var*> inputs, F&& fn) {
  Tape* t = tape_of(inputs);
  if (!t) return Var(value);
  if constexpr (std::is_invocable_v<F&>)
    return t->record(value, inputs, Tape::Backward(fn()));
  else
    return t->record(value, inputs, Tape::Backward(std::forward<F>(fn)));
}

inline void check_defined(const Var& v, const char* op, const char* name) {
  QKV_CHECK_ARG(v.defined(), "[", op, "] ", name, " is undefined");
}

}  // namespace detail
}  // namespace qkv::ad
