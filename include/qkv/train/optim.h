// Optimizers over a ad::ParameterSet with torch.optim's update formulas (SGD with momentum / Nesterov, Adam, AdamW with
// decoupled weight decay), their state as named tensors for checkpoints, and clipping by global gradient norm.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/nn/module.h"
#include "qkv/ops/autograd.h"

namespace qkv::train {

// Common base: step() updates every parameter that has a gradient (has_grad; others are skipped, as PyTorch skips
// grad None) in place through Parameter::value, so the module sees the new weights.
class Optimizer {
 public:
  explicit Optimizer(ad::ParameterSet& params) : params_(&params) {}
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  void zero_grad() { params_->zero_grad(); }

  // The learning rate of the next step(); schedules set it before each step.
  virtual double lr() const = 0;
  virtual void set_lr(double lr) = 0;

  // Per-parameter state as named tensors, "<param name>.<field>" (fields: "step", "exp_avg", "exp_avg_sq" for
  // Adam/AdamW; "momentum_buffer" for SGD with momentum). Parameters without state yet are absent. The step count
  // is stored as a float32 scalar of shape (1) (exact up to 2^24 steps).
  virtual nn::StateDict state_dict() const = 0;
  // Restores state written by state_dict(): every entry must name a parameter of this set and a known field with
  // the parameter's shape; throws invalid_argument ("[Adam.load_state_dict] ...") and changes nothing otherwise.
  virtual void load_state_dict(const nn::StateDict& state) = 0;

  ad::ParameterSet& params() { return *params_; }

 protected:
  ad::ParameterSet* params_;
};

struct SgdOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // L2: d_p = g + wd·p
  bool nesterov = false;      // needs momentum > 0 and dampening == 0, as PyTorch
};

// torch.optim.SGD (single-tensor path), every "add with alpha" a fused multiply-add as in PyTorch's vectorised
// kernels (bit-identical to torch.optim.SGD on AVX-512 CPUs):
//   d_p = g + wd·p;  buf = d_p (first step) | momentum·buf + (1 - dampening)·d_p;
//   d_p = nesterov ? d_p + momentum·buf : buf;  p -= lr·d_p
class SGD : public Optimizer {
 public:
  SGD(ad::ParameterSet& params, const SgdOptions& options);
  void step() override;
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override;
  nn::StateDict state_dict() const override;
  void load_state_dict(const nn::StateDict& state) override;
  const SgdOptions& options() const { return options_; }

 private:
  SgdOptions options_;
  std::vector<Tensor> momentum_;  // per parameter; undefined until its first step
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// torch.optim.Adam / AdamW (single-tensor path, amsgrad off), in PyTorch's float32 operation order, fused where its
// vectorised kernels fuse (lerp, addcmul):
//   AdamW: p *= 1 - lr·wd           Adam: g = g + wd·p
//   m = m + (1 - β1)·(g - m);  v = β2·v + (1 - β2)·g·g
//   p += -(lr / (1 - β1^t)) · m / (sqrt(v) / sqrt(1 - β2^t) + eps)
// with the bias corrections computed in double, as PyTorch's Python scalars. m and v come out bit-identical to
// torch.optim on AVX-512 CPUs; p differs by PyTorch's vectorised sqrt (±1 ulp on some elements).
class Adam : public Optimizer {
 public:
  // decoupled_weight_decay = true is AdamW.
  Adam(ad::ParameterSet& params, const AdamOptions& options, bool decoupled_weight_decay = false);
  void step() override;
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override;
  nn::StateDict state_dict() const override;
  void load_state_dict(const nn::StateDict& state) override;
  const AdamOptions& options() const { return options_; }
  bool decoupled() const { return decoupled_; }

 private:
  struct State {
    int64_t step = 0;
    Tensor exp_avg, exp_avg_sq;  // undefined until the first step
  };
  AdamOptions options_;
  bool decoupled_;
  std::vector<State> state_;
};

// torch.optim.AdamW: Adam with decoupled weight decay; PyTorch's default weight_decay is 0.01.
class AdamW : public Adam {
 public:
  static AdamOptions defaults() {
    AdamOptions o;
    o.weight_decay = 1e-2;
    return o;
  }
  explicit AdamW(ad::ParameterSet& params, const AdamOptions& options = defaults()) : Adam(params, options, true) {}
};

// torch.nn.utils.clip_grad_norm_: total = ‖(‖g_1‖, …, ‖g_n‖)‖ over the parameters with a gradient (norm_type 2, or
// infinity for the max-abs norm); every gradient is multiplied by min(1, max_norm / (total + 1e-6)).
// Returns the total norm before clipping. max_norm > 0; norm_type 2 or +inf.
double clip_grad_norm(ad::ParameterSet& params, double max_norm, double norm_type = 2.0);

}  // namespace qkv::train
