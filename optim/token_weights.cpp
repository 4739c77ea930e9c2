#include "optim/token_weights.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

namespace gossamer::optim {

std::int64_t RoundWeights::total_steps() const {
  std::int64_t total = 0;
  for (const auto& m : members_) total += m.steps;
  return total;
}

double RoundWeights::scale(int rank) const {
  const std::int64_t total = total_steps();
  if (total <= 0 || rank < 0 || static_cast<std::size_t>(rank) >= members_.size()) return 1.0;
  return static_cast<double>(members_[static_cast<std::size_t>(rank)].steps) * static_cast<double>(members_.size()) /
         static_cast<double>(total);
}

double RoundWeights::fastest_step_seconds() const {
  double best = 0.0;
  for (const auto& m : members_) {
    if (m.step_seconds > 0 && (best == 0.0 || m.step_seconds < best)) best = m.step_seconds;
  }
  return best;
}

Contribution WorkMeter::contribution() const {
  Contribution c;
  c.steps = steps_;
  c.step_seconds = steps_ > 0 ? seconds_ / static_cast<double>(steps_) : last_step_seconds_;
  return c;
}

void WorkMeter::keep(double fraction) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  if (steps_ > 0) last_step_seconds_ = seconds_ / static_cast<double>(steps_);
  steps_ = std::llround(static_cast<double>(steps_) * fraction);
  seconds_ = static_cast<double>(steps_) * last_step_seconds_;
}

std::vector<std::int64_t> steps_by_rank(const RoundWeights& weights) {
  std::vector<std::int64_t> steps;
  for (const auto& m : weights.members()) steps.push_back(m.steps);
  return steps;
}

void WorkMeter::merged() {
  if (steps_ > 0) last_step_seconds_ = seconds_ / static_cast<double>(steps_);
  steps_ = 0;
  seconds_ = 0.0;
}

Result<RoundWeights> exchange_contributions(const Group& group, const Contribution& mine, std::int64_t max_steps, transport::Tag collective,
                                            Deadline deadline, CommStats* stats) {
  const int n = group.size;
  const auto clamp_steps = [&](double v) {
    if (!std::isfinite(v) || v <= 0) return std::int64_t{0};
    return std::min<std::int64_t>(max_steps, std::llround(v));
  };
  const auto clean_seconds = [](double v) { return std::isfinite(v) && v > 0 ? v : 0.0; };
  if (n <= 1) return RoundWeights({Contribution{clamp_steps(static_cast<double>(mine.steps)), clean_seconds(mine.step_seconds)}});
  at::Tensor t = torch::zeros({2 * static_cast<std::int64_t>(n)}, torch::kFloat);
  auto* v = t.data_ptr<float>();
  v[group.rank] = static_cast<float>(clamp_steps(static_cast<double>(mine.steps)));
  v[n + group.rank] = static_cast<float>(clean_seconds(mine.step_seconds));
  Group plain = group;  // the exchange is not a contribution: nothing poisons or records it
  plain.poison.reset();
  plain.mean_tap.reset();
  if (Status st = allreduce_mean(plain, t, quant::EncodeOptions{}, token_weights_tag(collective), deadline, stats); !st.ok()) {
    return st.with_context("exchanging token weights");
  }
  std::vector<Contribution> members(static_cast<std::size_t>(n));
  const double size = static_cast<double>(n);
  for (int i = 0; i < n; ++i) {
    members[static_cast<std::size_t>(i)].steps = clamp_steps(static_cast<double>(v[i]) * size);
    members[static_cast<std::size_t>(i)].step_seconds = clean_seconds(static_cast<double>(v[n + i]) * size);
  }
  return RoundWeights(std::move(members));
}

Result<RoundWeights> weigh(const Group& group, const Contribution& mine, std::int64_t max_steps, transport::Tag collective, Deadline deadline,
                           CommStats* stats, at::Tensor& contribution) {
  auto w = exchange_contributions(group, mine, max_steps, collective, deadline, stats);
  if (!w.ok()) return w.status();
  if (const double scale = w->scale(group.rank); scale != 1.0 && contribution.defined()) contribution.mul_(scale);
  return w;
}

double calibrate(const Group& group, const WorkMeter& meter, std::int64_t max_steps, Deadline deadline, CommStats* stats) {
  auto w = exchange_contributions(group, meter.latest(), max_steps, kCalibrationTag, deadline, stats);
  if (!w.ok()) {
    spdlog::warn("the members' first step times were not exchanged ({}): the first round runs in lockstep", w.status().to_string());
    return 0.0;
  }
  return w->fastest_step_seconds();
}

}  // namespace gossamer::optim
