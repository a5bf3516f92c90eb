// SGD, Adam and AdamW step kernels in torch.optim's float32 operation order, their named-tensor state, and
// clip_grad_norm. Scalars PyTorch computes as Python floats (bias corrections) are doubles here, cast once.
#include "qkv/train/optim.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "qkv/core/error.h"
#include "qkv/kernels/adam.h"

namespace qkv::train {
using ad::Parameter;
using ad::ParameterSet;
using ad::Tape;
using ad::Var;

namespace {

constexpr int64_t kParallelMin = int64_t{1} << 17;  // parameter elements per OpenMP region

void check_lr(double lr, const char* op) {
  QKV_CHECK_ARG(std::isfinite(lr) && lr >= 0.0, "[", op, "] learning rate must be finite and >= 0, got ", lr);
}

// Splits "<param>.<field>" at the last dot.
bool split_key(const std::string& key, std::string& param, std::string& field) {
  const size_t dot = key.rfind('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == key.size()) return false;
  param = key.substr(0, dot);
  field = key.substr(dot + 1);
  return true;
}

// Looks up `key`'s parameter and checks the field tensor's shape; throws naming `op`.
size_t state_param(ParameterSet& params, const std::string& key, const Tensor& value, const Shape& want_shape_if_any,
                   bool scalar, const char* op, std::string& field) {
  std::string name;
  QKV_CHECK_ARG(split_key(key, name, field), "[", op, "] state key '", key, "' is not '<param>.<field>'");
  Parameter* p = params.find(name);
  QKV_CHECK_ARG(p != nullptr, "[", op, "] state key '", key, "' names no parameter of this optimizer");
  QKV_CHECK_ARG(value.defined(), "[", op, "] state '", key, "' is undefined");
  if (scalar) {
    QKV_CHECK_ARG(value.numel() == 1, "[", op, "] state '", key, "' must hold one value, got ", str(value.shape()));
  } else {
    QKV_CHECK_ARG(value.shape() == (want_shape_if_any.empty() ? p->value->shape() : want_shape_if_any), "[", op,
                  "] state '", key, "' has shape ", str(value.shape()), " but parameter '", name, "' is ",
                  str(p->value->shape()));
  }
  for (size_t i = 0; i < params.size(); ++i)
    if (&params[i] == p) return i;
  QKV_ASSERT(false);
  return 0;
}

Tensor step_tensor(int64_t step) {
  Tensor t = Tensor::empty({1});
  t.data()[0] = static_cast<float>(step);
  return t;
}

}  // namespace

// --- SGD ---------------------------------------------------------------------------------------------------------

SGD::SGD(ParameterSet& params, const SgdOptions& o) : Optimizer(params), options_(o), momentum_(params.size()) {
  check_lr(o.lr, "SGD");
  QKV_CHECK_ARG(o.momentum >= 0.0 && o.weight_decay >= 0.0 && std::isfinite(o.dampening), "[SGD] momentum ",
                o.momentum, " and weight_decay ", o.weight_decay, " must be >= 0");
  QKV_CHECK_ARG(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0),
                "[SGD] nesterov needs momentum > 0 and dampening 0");
}

void SGD::set_lr(double lr) {
  check_lr(lr, "SGD");
  options_.lr = lr;
}

void SGD::step() {
  QKV_CHECK_ARG(momentum_.size() == params_->size(), "[SGD] the parameter set changed size after construction");
  const float wd = static_cast<float>(options_.weight_decay);
  const float mom = static_cast<float>(options_.momentum);
  const float damp = static_cast<float>(1.0 - options_.dampening);
  const float neg_lr = static_cast<float>(-options_.lr);
  for (size_t i = 0; i < params_->size(); ++i) {
    Parameter& P = (*params_)[i];
    if (!P.has_grad) continue;
    Tensor& value = *P.value;
    QKV_CHECK_ARG(value.is_contiguous(), "[SGD] parameter '", P.name, "' must be contiguous");
    const int64_t n = value.numel();
    float* p = value.data();
    const float* g = P.grad.data();
    const bool first = options_.momentum != 0.0 && !momentum_[i].defined();
    if (first) momentum_[i] = Tensor::empty(value.shape());
    float* buf = options_.momentum != 0.0 ? momentum_[i].data() : nullptr;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t j = 0; j < n; ++j) {
      // PyTorch's add with alpha is one fused multiply-add (vec::fmadd), hence std::fma.
      float d = options_.weight_decay != 0.0 ? std::fma(p[j], wd, g[j]) : g[j];
      if (buf) {
        buf[j] = first ? d : std::fma(d, damp, buf[j] * mom);
        d = options_.nesterov ? std::fma(buf[j], mom, d) : buf[j];
      }
      p[j] = std::fma(d, neg_lr, p[j]);
    }
  }
}

nn::StateDict SGD::state_dict() const {
  nn::StateDict s;
  for (size_t i = 0; i < params_->size(); ++i)
    if (momentum_[i].defined()) s[(*params_)[i].name + ".momentum_buffer"] = momentum_[i].clone();
  return s;
}

void SGD::load_state_dict(const nn::StateDict& state) {
  std::vector<Tensor> next(params_->size());
  for (const auto& [key, value] : state) {
    std::string field;
    const size_t i = state_param(*params_, key, value, {}, false, "SGD.load_state_dict", field);
    QKV_CHECK_ARG(field == "momentum_buffer", "[SGD.load_state_dict] unknown state field '", field, "' in '", key,
                  "'");
    next[i] = value.clone();
  }
  momentum_ = std::move(next);
}

// --- Adam / AdamW -----------------------------------------------------------------------------------------------

Adam::Adam(ParameterSet& params, const AdamOptions& o, bool decoupled)
    : Optimizer(params), options_(o), decoupled_(decoupled), state_(params.size()) {
  const char* op = decoupled ? "AdamW" : "Adam";
  check_lr(o.lr, op);
  QKV_CHECK_ARG(o.beta1 >= 0.0 && o.beta1 < 1.0 && o.beta2 >= 0.0 && o.beta2 < 1.0, "[", op, "] betas (", o.beta1,
                ", ", o.beta2, ") must be in [0, 1)");
  QKV_CHECK_ARG(o.eps >= 0.0 && std::isfinite(o.eps), "[", op, "] eps must be finite and >= 0, got ", o.eps);
  QKV_CHECK_ARG(o.weight_decay >= 0.0 && std::isfinite(o.weight_decay), "[", op,
                "] weight_decay must be finite and >= 0, got ", o.weight_decay);
}

void Adam::set_lr(double lr) {
  check_lr(lr, decoupled_ ? "AdamW" : "Adam");
  options_.lr = lr;
}

void Adam::step() {
  QKV_CHECK_ARG(state_.size() == params_->size(), "[Adam] the parameter set changed size after construction");
  const AdamOptions& o = options_;
  const float decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
  const float wd = static_cast<float>(o.weight_decay);
  const float w1 = static_cast<float>(1.0 - o.beta1);
  const float b2 = static_cast<float>(o.beta2);
  const float w2 = static_cast<float>(1.0 - o.beta2);
  const float eps = static_cast<float>(o.eps);
  for (size_t i = 0; i < params_->size(); ++i) {
    Parameter& P = (*params_)[i];
    if (!P.has_grad) continue;
    Tensor& value = *P.value;
    QKV_CHECK_ARG(value.is_contiguous(), "[Adam] parameter '", P.name, "' must be contiguous");
    State& s = state_[i];
    if (!s.exp_avg.defined()) {
      s.exp_avg = Tensor::zeros(value.shape());
      s.exp_avg_sq = Tensor::zeros(value.shape());
    }
    ++s.step;
    const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(s.step));
    const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(s.step));
    const float neg_step_size = static_cast<float>(-(o.lr / bc1));
    const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    const int64_t n = value.numel();
    float* p = value.data();
    const float* g = P.grad.data();
    float* m = s.exp_avg.data();
    float* v = s.exp_avg_sq.data();
    const kernels::AdamScalars c{decay, wd, w1, b2, w2, eps, neg_step_size, bc2_sqrt, o.weight_decay != 0.0,
                                 decoupled_};
    kernels::adam_update(c, n, p, g, m, v);
  }
}

nn::StateDict Adam::state_dict() const {
  nn::StateDict out;
  for (size_t i = 0; i < params_->size(); ++i) {
    const State& s = state_[i];
    if (!s.exp_avg.defined()) continue;
    const std::string& name = (*params_)[i].name;
    out[name + ".step"] = step_tensor(s.step);
    out[name + ".exp_avg"] = s.exp_avg.clone();
    out[name + ".exp_avg_sq"] = s.exp_avg_sq.clone();
  }
  return out;
}

void Adam::load_state_dict(const nn::StateDict& state) {
  const char* op = decoupled_ ? "AdamW.load_state_dict" : "Adam.load_state_dict";
  std::vector<State> next(params_->size());
  std::vector<int> seen(params_->size(), 0);
  for (const auto& [key, value] : state) {
    std::string field;
    const bool scalar = key.size() > 5 && key.compare(key.size() - 5, 5, ".step") == 0;
    const size_t i = state_param(*params_, key, value, {}, scalar, op, field);
    if (field == "step") {
      const float f = value.contiguous().data()[0];
      QKV_CHECK_ARG(f >= 0.0f && f <= 16777216.0f && std::floor(f) == f, "[", op, "] '", key,
                    "' must be a whole step count in [0, 2^24], got ", f);
      next[i].step = static_cast<int64_t>(f);
      seen[i] |= 1;
    } else if (field == "exp_avg") {
      next[i].exp_avg = value.clone();
      seen[i] |= 2;
    } else if (field == "exp_avg_sq") {
      next[i].exp_avg_sq = value.clone();
      seen[i] |= 4;
    } else {
      QKV_CHECK_ARG(false, "[", op, "] unknown state field '", field, "' in '", key, "'");
    }
  }
  for (size_t i = 0; i < seen.size(); ++i)
    QKV_CHECK_ARG(seen[i] == 0 || seen[i] == 7, "[", op, "] parameter '", (*params_)[i].name,
                  "' needs all of step, exp_avg and exp_avg_sq");
  state_ = std::move(next);
}

// --- clipping -------------------------------------------------------------------------------------------------

double clip_grad_norm(ParameterSet& params, double max_norm, double norm_type) {
  QKV_CHECK_ARG(max_norm > 0.0 && std::isfinite(max_norm), "[clip_grad_norm] max_norm must be finite and > 0, got ",
                max_norm);
  const bool inf = std::isinf(norm_type) && norm_type > 0;
  QKV_CHECK_ARG(inf || norm_type == 2.0, "[clip_grad_norm] norm_type must be 2 or +inf, got ", norm_type);
  double total = 0.0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = params[i];
    if (!p.has_grad) continue;
    const float* g = p.grad.data();
    const int64_t n = p.grad.numel();
    double acc = 0.0;
    if (inf) {
      for (int64_t j = 0; j < n; ++j) acc = std::max(acc, static_cast<double>(std::fabs(g[j])));
      total = std::max(total, acc);
    } else {
      for (int64_t j = 0; j < n; ++j) acc += static_cast<double>(g[j]) * g[j];
      total += acc;
    }
  }
  if (!inf) total = std::sqrt(total);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    const float c = static_cast<float>(coef);
    for (size_t i = 0; i < params.size(); ++i) {
      Parameter& p = params[i];
      if (!p.has_grad) continue;
      float* g = p.grad.data();
      const int64_t n = p.grad.numel();
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
      for (int64_t j = 0; j < n; ++j) g[j] *= c;
    }
  }
  return total;
}

}  // namespace qkv::train
