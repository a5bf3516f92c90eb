// Learning-rate schedules as pure functions of the step number: warmup + inverse square root (Vaswani et al. 2017)
// and warmup + cosine decay. Steps count from 1 (the first optimizer step); set the rate before each step.
#pragma once

#include <cstdint>
#include <string>

namespace qkv::train {

// Vaswani: lr(step) = scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5).
// The peak, at step == warmup, is scale · (d_model · warmup)^-0.5. step >= 1, d_model >= 1, warmup >= 1, scale > 0.
double inverse_sqrt_lr(int64_t step, int64_t d_model, int64_t warmup, double scale = 1.0);

// Linear warmup from 0 to peak over `warmup` steps (lr(step) = peak · step / warmup), then cosine decay to min_lr
// at total_steps: min_lr + (peak - min_lr) · (1 + cos(π · (step - warmup) / (total_steps - warmup))) / 2;
// min_lr after total_steps. step >= 1, warmup >= 0, total_steps >= warmup, peak >= min_lr >= 0.
double warmup_cosine_lr(int64_t step, double peak, int64_t warmup, int64_t total_steps, double min_lr = 0.0);

// A schedule chosen by name, for configs and the CLI.
struct LrSchedule {
  enum class Kind { kConstant, kInverseSqrt, kWarmupCosine };
  Kind kind = Kind::kConstant;
  double lr = 1e-3;          // kConstant: the rate; kWarmupCosine: the peak; kInverseSqrt: the scale factor
  int64_t warmup = 0;        // kInverseSqrt needs >= 1
  int64_t d_model = 1;       // kInverseSqrt
  int64_t total_steps = 0;   // kWarmupCosine
  double min_lr = 0.0;       // kWarmupCosine

  // The rate for optimizer step `step` (>= 1). Throws invalid_argument ("[LrSchedule] ...") on bad settings.
  double at(int64_t step) const;
};

// "constant" | "inverse_sqrt" | "cosine"  ->  Kind; throws invalid_argument naming the choices otherwise.
LrSchedule::Kind schedule_kind_from_string(const std::string& name);

}  // namespace qkv::train
