// Tape, ParameterSet and Binder: gradient slots with copy-on-write accumulation, nodes run in reverse order,
// intermediate gradients released as soon as their node has run.
#include "qkv/ops/autograd.h"

#include <algorithm>
#include <unordered_map>

#include "qkv/kernels/grad.h"
#include "qkv/core/error.h"

namespace qkv::ad {


// --- ParameterSet ----------------------------------------------------------------------------------------------

void ParameterSet::add(const std::string& name, Tensor* value) {
  QKV_CHECK_ARG(value != nullptr && value->defined(), "[ParameterSet] parameter '", name, "' is undefined");
  QKV_CHECK_ARG(!by_name_.count(name), "[ParameterSet] duplicate parameter name '", name, "'");
  QKV_CHECK_ARG(!by_value_.count(value), "[ParameterSet] parameter '", name, "' is already in the set");
  auto p = std::make_unique<Parameter>();
  p->name = name;
  p->value = value;
  p->grad = Tensor::zeros(value->shape());
  by_value_[value] = params_.size();
  by_name_[name] = params_.size();
  params_.push_back(std::move(p));
}

Parameter* ParameterSet::find(const std::string& name) {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : params_[it->second].get();
}

Parameter* ParameterSet::find(const Tensor* value) {
  auto it = by_value_.find(value);
  return it == by_value_.end() ? nullptr : params_[it->second].get();
}

int64_t ParameterSet::index_of(const Tensor* value) const {
  auto it = by_value_.find(value);
  return it == by_value_.end() ? -1 : static_cast<int64_t>(it->second);
}

void ParameterSet::zero_grad() {
  for (auto& p : params_) p->has_grad = false;
}

int64_t ParameterSet::numel() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p->value->numel();
  return n;
}

// --- Var -------------------------------------------------------------------------------------------------------

Tensor Var::grad() const { return tape && slot >= 0 ? tape->grad(*this) : Tensor(); }

// --- Tape ------------------------------------------------------------------------------------------------------

int32_t Tape::new_slot(Parameter* p, bool keep) {
  QKV_CHECK_RUNTIME(slots_.size() < static_cast<size_t>(INT32_MAX), "[Tape] too many values on one tape");
  Slot s;
  s.param = p;
  s.keep = keep;
  slots_.push_back(std::move(s));
  return static_cast<int32_t>(slots_.size() - 1);
}

Tape::Slot& Tape::slot_of(const Var& v) {
  QKV_CHECK_ARG(v.tape == this && v.slot >= 0 && static_cast<size_t>(v.slot) < slots_.size(),
                "[Tape] the Var belongs to another tape or to a cleared one");
  return slots_[static_cast<size_t>(v.slot)];
}

Var Tape::leaf(const Tensor& value) {
  QKV_CHECK_ARG(value.defined(), "[Tape] leaf value is undefined");
  return Var(value, this, new_slot(nullptr, true));
}

Var Tape::param(Parameter& p) {
  QKV_CHECK_ARG(p.value && p.value->defined(), "[Tape] parameter '", p.name, "' is undefined");
  QKV_CHECK_ARG(p.grad.shape() == p.value->shape(), "[Tape] parameter '", p.name, "' changed shape from ",
                str(p.grad.shape()), " to ", str(p.value->shape()));
  return Var(*p.value, this, new_slot(&p, true));
}

// The node about to be recorded reads v: the first such node of a parameter slot is remembered.
void Tape::note_inputs(const Var* v) {
  if (v == nullptr || v->slot < 0) return;
  Slot& s = slots_[static_cast<size_t>(v->slot)];
  if (s.param != nullptr && s.first_use < 0) s.first_use = static_cast<int32_t>(nodes_.size());
}

void Tape::check_not_final(const Slot& s) const {
  QKV_CHECK_RUNTIME(s.ready_node <= running_node_ || running_node_ < 0, "[Tape.backward] node ", running_node_,
                    " adds to the gradient of parameter '", s.param->name, "' after it was reported final (after node ",
                    s.ready_node, "): its closure writes to a Var it did not record as an input");
}

Var Tape::record(const Tensor& value, std::initializer_list<const Var*> inputs, Backward fn) {
  bool any = false;
  for (const Var* v : inputs) {
    if (v && v->slot >= 0) {
      QKV_CHECK_ARG(v->tape == this, "[Tape] an op mixes Vars of two tapes");
      any = true;
    }
  }
  if (!any) return Var(value);
  for (const Var* v : inputs) note_inputs(v);
  const int32_t s = new_slot(nullptr, false);
  nodes_.push_back(Node{std::move(fn), s, 1});
  return Var(value, this, s);
}

std::vector<Var> Tape::record(const std::vector<Tensor>& values, std::initializer_list<const Var*> inputs,
                              Backward fn) {
  return record(values, std::vector<const Var*>(inputs), std::move(fn));
}

std::vector<Var> Tape::record(const std::vector<Tensor>& values, const std::vector<const Var*>& inputs,
                              Backward fn) {
  bool any = false;
  for (const Var* v : inputs) {
    if (v && v->slot >= 0) {
      QKV_CHECK_ARG(v->tape == this, "[Tape] an op mixes Vars of two tapes");
      any = true;
    }
  }
  std::vector<Var> out;
  out.reserve(values.size());
  if (!any || values.empty()) {
    for (const Tensor& t : values) out.emplace_back(t);
    return out;
  }
  for (const Var* v : inputs) note_inputs(v);
  const int32_t first = static_cast<int32_t>(slots_.size());
  for (const Tensor& t : values) out.emplace_back(t, this, new_slot(nullptr, false));
  nodes_.push_back(Node{std::move(fn), first, static_cast<int32_t>(values.size())});
  return out;
}

void Tape::accumulate(const Var& v, const Tensor& g) {
  if (v.slot < 0 || !g.defined()) return;
  Slot& s = slot_of(v);
  QKV_CHECK_ARG(g.shape() == v.value.shape(), "[Tape] gradient ", str(g.shape()), " does not match its value ",
                str(v.value.shape()));
  if (s.param) {
    check_not_final(s);
    kernels::add_into(s.param->grad, g, !s.param->has_grad);
    s.param->has_grad = true;
    return;
  }
  if (!s.grad.defined()) {
    s.grad = g;  // shared until someone needs to write
    s.owned = false;
    return;
  }
  if (!s.owned) {  // the shared gradient so far and g, summed into a private buffer in one pass
    s.grad = kernels::sum_of(s.grad, g);
    s.owned = true;
    return;
  }
  kernels::add_into(s.grad, g);
}

void Tape::accumulate_owned(const Var& v, const Tensor& g) {
  if (v.slot < 0 || !g.defined()) return;
  Slot& s = slot_of(v);
  if (s.param || !g.is_contiguous()) {
    accumulate(v, g);
    return;
  }
  QKV_CHECK_ARG(g.shape() == v.value.shape(), "[Tape] gradient ", str(g.shape()), " does not match its value ",
                str(v.value.shape()));
  if (s.grad.defined() && s.owned) {
    kernels::add_into(s.grad, g);
    return;
  }
  Tensor mine = g;
  if (s.grad.defined()) kernels::add_into(mine, s.grad);  // the shared gradient so far joins the private buffer
  s.grad = mine;
  s.owned = true;
}

Tensor Tape::accumulator(const Var& v, bool& fresh) {
  fresh = false;
  if (v.slot < 0) return Tensor();
  Slot& s = slot_of(v);
  if (s.param) {
    check_not_final(s);
    fresh = !s.param->has_grad;
    s.param->has_grad = true;
    return s.param->grad;
  }
  if (!s.grad.defined()) {
    s.grad = Tensor::empty(v.value.shape());
    s.owned = true;
    fresh = true;
  } else if (!s.owned || !s.grad.is_contiguous()) {
    s.grad = s.grad.clone();
    s.owned = true;
  }
  return s.grad;
}

Tensor Tape::accumulator_or_base(const Var& v, bool& fresh, Tensor& base) {
  base = Tensor();
  if (v.slot >= 0) {
    Slot& s = slot_of(v);
    if (!s.param && s.grad.defined() && !s.owned) {
      base = s.grad.contiguous();
      s.grad = Tensor::empty(v.value.shape());
      s.owned = true;
      fresh = true;
      return s.grad;
    }
  }
  return accumulator(v, fresh);
}

Tensor Tape::accumulator_zeroed(const Var& v) {
  bool fresh = false;
  Tensor g = accumulator(v, fresh);
  if (fresh) g.fill(0.0f);
  return g;
}

void Tape::backward(const Var& out) {
  QKV_CHECK_ARG(out.defined() && out.numel() == 1, "[Tape.backward] needs a scalar output (numel 1), got ",
                str(out.shape()), "; pass an upstream gradient otherwise");
  backward(out, Tensor::full(out.shape(), 1.0f));
}

void Tape::backward(const Var& out, const Tensor& dout) {
  QKV_CHECK_ARG(out.tape == this && out.slot >= 0, "[Tape.backward] the output does not depend on anything "
                "recorded on this tape (a constant)");
  QKV_CHECK_ARG(dout.defined() && dout.shape() == out.shape(), "[Tape.backward] upstream gradient ",
                str(dout.shape()), " must have the output's shape ", str(out.shape()));
  QKV_CHECK_ARG(!ran_, "[Tape.backward] already ran on this tape: clear() it and record the forward again");
  ran_ = true;
  accumulate(out, dout);
  const bool hook = static_cast<bool>(on_param_ready_);
  size_t next_ready = 0;
  if (hook) plan_param_ready();
  std::vector<Tensor> douts;
  for (size_t n = nodes_.size(); n-- > 0;) {
    Node& node = nodes_[n];
    douts.assign(static_cast<size_t>(node.num_out), Tensor());
    bool any = false;
    for (int32_t i = 0; i < node.num_out; ++i) {
      Slot& s = slots_[static_cast<size_t>(node.first_out + i)];
      douts[static_cast<size_t>(i)] = s.grad;
      any = any || s.grad.defined();
      if (!s.keep) s.grad = Tensor();  // released once consumed
    }
    if (hook) running_node_ = static_cast<int64_t>(n);
    if (any) node.fn(*this, std::span<const Tensor>(douts));
    node.fn = nullptr;  // saved tensors go now, not at clear()
    if (hook) {
      running_node_ = -1;
      for (; next_ready < ready_.size() && ready_[next_ready].first == static_cast<int32_t>(n); ++next_ready)
        on_param_ready_(*ready_[next_ready].second, n);
    }
  }
}

void Tape::plan_param_ready() {
  std::unordered_map<Parameter*, int32_t> first;  // per parameter, the earliest node that reads any of its slots
  for (const Slot& s : slots_)
    if (s.param != nullptr && s.first_use >= 0) {
      auto [it, added] = first.emplace(s.param, s.first_use);
      if (!added) it->second = std::min(it->second, s.first_use);
    }
  for (Slot& s : slots_)
    if (s.param != nullptr) {
      auto it = first.find(s.param);
      s.ready_node = it == first.end() ? -1 : it->second;
    }
  ready_.clear();
  for (const auto& [p, node] : first) ready_.emplace_back(node, p);
  // Latest node first (the order backward reaches them); parameters final after the same node by name, so that
  // every process reports them in the same order.
  std::sort(ready_.begin(), ready_.end(), [this](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second->name < b.second->name;
  });
}

Tensor Tape::grad(const Var& v) const {
  if (v.tape != this || v.slot < 0 || static_cast<size_t>(v.slot) >= slots_.size()) return Tensor();
  const Slot& s = slots_[static_cast<size_t>(v.slot)];
  if (s.param) return s.param->has_grad ? s.param->grad : Tensor();
  return s.grad;
}

void Tape::clear() {
  ran_ = false;
  slots_.clear();
  nodes_.clear();
}

// --- Binder ----------------------------------------------------------------------------------------------------

Binder::Binder(Tape& tape, ParameterSet& params) : tape_(&tape), params_(&params) {
  vars_.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) vars_.push_back(tape.param(params[i]));
}

Var Binder::operator()(const Tensor& module_tensor) const {
  if (!module_tensor.defined()) return Var();
  const int64_t i = params_->index_of(&module_tensor);
  if (i < 0) return Var(module_tensor);  // not trained: a constant
  return vars_[static_cast<size_t>(i)];
}

}  // namespace qkv::ad
