// Learning-rate schedule: linear warm-up from 0 to the peak, then cosine decay to lr * min_lr_ratio
// at the last step. Pure function.
#pragma once

#include <cstdint>

namespace gossamer::train {

struct ScheduleOptions {
  double lr = 3e-3;
  double min_lr_ratio = 0.1;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;
};

// Learning rate for the step with 0-based index `step`.
double learning_rate(const ScheduleOptions& o, std::int64_t step);

}  // namespace gossamer::train
