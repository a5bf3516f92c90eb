// Module parameter registry and PyTorch-named state dicts with strict, all-or-nothing loading.
#include "qkv/nn/module.h"

#include <cmath>
#include <set>

#include "qkv/core/error.h"
#include "qkv/nn/serialize.h"
#include "qkv/ops/matmul.h"

namespace qkv::nn {

void Module::register_parameter(const std::string& name, Tensor* param) {
  QKV_ASSERT(param != nullptr);
  params_.emplace_back(name, param);
}

void Module::register_module(const std::string& name, Module* child) {
  QKV_ASSERT(child != nullptr);
  children_.emplace_back(name, child);
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>& out) {
  for (auto& [name, p] : params_)
    if (p->defined()) out.emplace_back(prefix + name, p);
  for (auto& [name, m] : children_) m->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor*>> Module::named_parameters() {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", out);
  return out;
}

std::vector<Tensor*> Module::parameters() {
  std::vector<Tensor*> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

int64_t Module::num_parameters() {
  int64_t n = 0;
  for (Tensor* p : parameters()) n += p->numel();
  return n;
}

StateDict Module::state_dict() const {
  StateDict out;
  for (auto& [name, p] : const_cast<Module*>(this)->named_parameters()) out[name] = p->clone();
  return out;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  QKV_CHECK_ARG(!stored_, "[load_state_dict] this module reads weights as their file stores them (quantized); "
                "load the model again instead");
  auto params = named_parameters();
  std::set<std::string> known;
  std::string missing, unexpected;
  for (auto& [name, p] : params) {
    known.insert(name);
    auto it = state.find(name);
    if (it == state.end()) {
      missing += (missing.empty() ? "" : ", ") + name;
      continue;
    }
    QKV_CHECK_ARG(it->second.defined() && it->second.shape() == p->shape(), "[load_state_dict] ",
                  name, " has shape ",
                  it->second.defined() ? str(it->second.shape()) : std::string("(undefined)"),
                  " but the module expects ", str(p->shape()));
  }
  for (auto& [name, t] : state)
    if (!known.count(name)) unexpected += (unexpected.empty() ? "" : ", ") + name;
  QKV_CHECK_ARG(!strict || (missing.empty() && unexpected.empty()), "[load_state_dict] ",
                missing.empty() ? "" : "missing: " + missing,
                (!missing.empty() && !unexpected.empty()) ? "; " : "",
                unexpected.empty() ? "" : "unexpected: " + unexpected);
  for (auto& [name, p] : params) {
    auto it = state.find(name);
    if (it != state.end()) p->copy_from(it->second);
  }
  prepare_linear_weights();
}

void Module::register_linear_weight(Tensor* weight) {
  QKV_ASSERT(weight != nullptr);
  linear_weights_.emplace_back(weight, LinearWeight());
}

void Module::prepare_linear_weights() {
  for (auto& [w, prepared] : linear_weights_) {
    if (stored_ && !w->defined() && prepared.defined()) continue;  // read as the file stores it
    prepared = !prepared_ || !w->defined() ? LinearWeight() : LinearWeight(*w, precision_);
  }
  weights_live_.store(false, std::memory_order_relaxed);
  for (auto& [name, m] : children_) m->prepare_linear_weights();
}

void Module::use_stored_linear_weight(Tensor& weight, LinearWeight stored, Precision precision) {
  QKV_CHECK_ARG(stored.defined() && weight.defined() && stored.out_features() == weight.size(0) &&
                    stored.in_features() == weight.size(1),
                "[Module] a stored weight (", stored.out_features(), ", ", stored.in_features(),
                ") for the linear weight ", weight.defined() ? str(weight.shape()) : std::string("(undefined)"));
  for (auto& [w, prepared] : linear_weights_)
    if (w == &weight) {
      prepared = std::move(stored);
      weight = Tensor();
      stored_ = prepared_ = true;
      precision_ = precision;
      weights_live_.store(false, std::memory_order_relaxed);
      return;
    }
  QKV_CHECK_ARG(false, "[Module] the tensor ", str(weight.shape()), " is not a registered linear weight of this module");
}

void Module::set_precision(Precision p) {
  std::vector<Module*> stack{this};
  while (!stack.empty()) {  // a module reading stored weights keeps their precision
    const Module* m = stack.back();
    stack.pop_back();
    QKV_CHECK_ARG(!m->stored_ || m->precision_ == p, "[Module] precision ", precision_name(p),
                  ": this model reads its weights as its file stores them (", precision_name(m->precision_),
                  " products); load it again at ", precision_name(p), " instead");
    for (auto& [name, child] : m->children_) stack.push_back(child);
  }
  stack.push_back(this);
  while (!stack.empty()) {
    Module* m = stack.back();
    stack.pop_back();
    m->precision_ = p;
    m->prepared_ = true;
    for (auto& [name, child] : m->children_) stack.push_back(child);
  }
  prepare_linear_weights();
}

const LinearWeight& Module::linear_weight(const Tensor& weight) const {
  for (const auto& [w, prepared] : linear_weights_)
    if (w == &weight) {
      QKV_CHECK_ARG(prepared.defined() || !prepared_, "[Module] linear weight ",
                    str(weight.shape()), " was not prepared for ", precision_name(precision_));
      return prepared;
    }
  QKV_CHECK_ARG(false, "[Module] the tensor ", str(weight.shape()), " is not a registered linear weight of this module");
  static const LinearWeight none;
  return none;
}

Tensor Module::linear_at(const Tensor& x, const Tensor& weight, const Tensor& bias) const {
  const bool live = !prepared_ || weights_live_.load(std::memory_order_relaxed);
  if (live && precision_ == Precision::kFloat32) return qkv::linear(x, weight, bias);
  if (live) return qkv::linear(x, LinearWeight(weight, precision_), bias);
  return qkv::linear(x, linear_weight(weight), bias);
}

bool Module::uses_prepared_weights(bool recording, const char* op, const Shape& x) const {
  if (!prepared_) return false;
  if (recording) {
    QKV_CHECK_ARG(!stored_, "[", op, "] weights read as their file stores them (quantized) are for inference; "
                  "load the model at fp32 or bf16 to train (input ", str(x), ")");
    QKV_CHECK_ARG(precision_ != Precision::kInt8, "[", op, "] precision ", precision_name(precision_),
                  " is for inference; train in fp32 or bf16 (input ", str(x), ")");
    weights_live_.store(true, std::memory_order_relaxed);
    return false;
  }
  return !weights_live_.load(std::memory_order_relaxed);
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, m] : children_) m->train(on);
}

}  // namespace qkv::nn
