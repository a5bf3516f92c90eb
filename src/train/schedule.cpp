// Learning-rate schedules: Vaswani's warmup + inverse square root and warmup + cosine, computed in double.
#include "qkv/train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "qkv/core/error.h"

namespace qkv::train {


double inverse_sqrt_lr(int64_t step, int64_t d_model, int64_t warmup, double scale) {
  QKV_CHECK_ARG(step >= 1 && d_model >= 1 && warmup >= 1, "[inverse_sqrt_lr] step (", step, "), d_model (", d_model,
                ") and warmup (", warmup, ") must be >= 1");
  QKV_CHECK_ARG(scale > 0.0 && std::isfinite(scale), "[inverse_sqrt_lr] scale must be finite and > 0, got ", scale);
  const double s = static_cast<double>(step), w = static_cast<double>(warmup);
  return scale / std::sqrt(static_cast<double>(d_model)) * std::min(1.0 / std::sqrt(s), s * std::pow(w, -1.5));
}

double warmup_cosine_lr(int64_t step, double peak, int64_t warmup, int64_t total_steps, double min_lr) {
  QKV_CHECK_ARG(step >= 1 && warmup >= 0 && total_steps >= warmup, "[warmup_cosine_lr] need step (", step,
                ") >= 1, warmup (", warmup, ") >= 0 and total_steps (", total_steps, ") >= warmup");
  QKV_CHECK_ARG(std::isfinite(peak) && min_lr >= 0.0 && peak >= min_lr, "[warmup_cosine_lr] need peak (", peak,
                ") >= min_lr (", min_lr, ") >= 0");
  if (step < warmup) return peak * static_cast<double>(step) / static_cast<double>(warmup);
  if (step >= total_steps || total_steps == warmup) return step >= total_steps ? min_lr : peak;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(total_steps - warmup);
  return min_lr + (peak - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

double LrSchedule::at(int64_t step) const {
  QKV_CHECK_ARG(step >= 1, "[LrSchedule] step must be >= 1, got ", step);
  switch (kind) {
    case Kind::kConstant:
      QKV_CHECK_ARG(lr >= 0.0 && std::isfinite(lr), "[LrSchedule] lr must be finite and >= 0, got ", lr);
      return lr;
    case Kind::kInverseSqrt:
      return inverse_sqrt_lr(step, d_model, warmup, lr);
    case Kind::kWarmupCosine:
      return warmup_cosine_lr(step, lr, warmup, total_steps, min_lr);
  }
  QKV_CHECK_ARG(false, "[LrSchedule] unknown kind");
  return 0.0;
}

LrSchedule::Kind schedule_kind_from_string(const std::string& name) {
  if (name == "constant") return LrSchedule::Kind::kConstant;
  if (name == "inverse_sqrt") return LrSchedule::Kind::kInverseSqrt;
  if (name == "cosine") return LrSchedule::Kind::kWarmupCosine;
  QKV_CHECK_ARG(false, "[LrSchedule] unknown schedule '", name, "': choose constant, inverse_sqrt or cosine");
  return LrSchedule::Kind::kConstant;
}

}  // namespace qkv::train
