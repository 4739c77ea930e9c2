#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace gossamer::train {

double learning_rate(const ScheduleOptions& o, std::int64_t step) {
  if (step < o.warmup_steps) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  const double min_lr = o.lr * o.min_lr_ratio;
  const std::int64_t decay_steps = std::max<std::int64_t>(1, o.total_steps - o.warmup_steps - 1);
  const double progress = std::clamp(static_cast<double>(step - o.warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  return min_lr + 0.5 * (o.lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace gossamer::train
