// StepBudget: which of a round's steps a member computes when members differ in speed
// (outer.round_budget = "time"; docs/methods.md, "Unequal peers").
//
// A round is `period` slots: the inner steps the group's fastest member takes in it. A member whose
// steps take longer computes only the steps that fit in the same time,
//   h = clamp(period x fastest / own, 1, period)
// (own: its seconds per step over the last round; fastest: the group's fastest member's, as the
// last token-weighted round exchanged it; a fractional h alternates between its neighbours from round
// to round), spread evenly over the round's slots; in the other slots it computes nothing
// (Worker::skip_step). Every member thus reaches
// each round's collective at about the same time, nobody idles waiting for the slowest, and the
// round's mean weighs each contribution by the steps behind it (optim/token_weights.h). Until the
// first weighted round has said who is fastest, every member computes every slot.
// Plain arithmetic; not thread-safe (the training thread's).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace gossamer::train {

class StepBudget {
 public:
  StepBudget() = default;  // off: every slot computes
  explicit StepBudget(std::int64_t period) : period_(period), steps_(period) {}
  bool enabled() const { return period_ > 0; }
  std::int64_t period() const { return period_; }
  std::int64_t steps_per_round() const { return steps_; }

  // Whether slot `step` (1-based: the step about to run) computes; counted as computed when it does.
  // A member computes when it is behind an even spread of the round's steps over its slots, so a
  // round whose steps changed mid-way (after the first step's timing) still computes about `steps`.
  bool take(std::int64_t step) {
    const std::int64_t j = period_ > 0 ? (step - 1) % period_ : 0;  // 0-based slot within its round
    if (j == 0) start_round();
    const bool compute = period_ <= 0 || steps_ >= period_ || done_ < (j + 1) * steps_ / period_;
    if (compute) ++done_;
    return compute;
  }

  // At a round's end (and after the run's first step): this member's seconds per computed step, and
  // the fastest member's (0: unknown). Sets the steps of the slots after.
  void observe(double own_step_s, double fastest_step_s) {
    if (period_ <= 0) return;
    if (!(own_step_s > 0) || !(fastest_step_s > 0) || !std::isfinite(own_step_s) || !std::isfinite(fastest_step_s)) return;
    fit_ = std::clamp(static_cast<double>(period_) * fastest_step_s / own_step_s, 1.0, static_cast<double>(period_));
    steps_ = std::clamp<std::int64_t>(std::llround(fit_), 1, period_);
  }

 private:
  // A round's whole steps, the fraction left over carried to the next rounds (12.5 a round: 12, 13,
  // 12, 13), so neither the member nor the others idle a rounding's worth every round.
  void start_round() {
    done_ = 0;
    if (fit_ <= 0) return;
    const double want = fit_ + carry_;
    steps_ = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::floor(want + 0.5)), 1, period_);
    carry_ = std::clamp(want - static_cast<double>(steps_), -1.0, 1.0);
  }

  std::int64_t period_ = 0;
  std::int64_t steps_ = 0;   // this round's
  std::int64_t done_ = 0;    // computed in the current round
  double fit_ = 0.0;         // steps a round at the last observed paces (0: not yet known)
  double carry_ = 0.0;       // rounding left over from earlier rounds
};

}  // namespace gossamer::train
