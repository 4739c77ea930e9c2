// Token-weighted rounds, for members of unequal speed (outer.round_budget = "time"; docs/methods.md,
// "Unequal peers"). Each member runs the inner steps it can in a round, and the round's mean weighs
// each member's contribution by the inner steps behind it (every member's batch has the same tokens,
// so steps stand for tokens), as Decoupled DiLoCo's token-weighted merge does:
//   mean = sum_i s_i Delta_i / sum_i s_i
// Before the round's collective the members exchange what stands behind their contributions: an
// fp32 all-reduce (mean) of 2N values over the round's own group and layout, rank i filling values i
// (its steps) and N + i (its seconds per step) and zeros elsewhere. Every member decodes the same
// bytes, so every member computes the same weights (RoundWeights) and the replicas stay
// bit-identical. Each then multiplies its contribution by scale(rank) = s_rank N / sum s before the
// method's collective, whose plain mean is then the weighted one; a round of equal steps has scales
// of exactly 1 and the method's own result, bit for bit.
//
// Untrusted: what a member claims is clamped to [0, max_steps] steps (what kMaxWeightedWindows of the round's slots allow:
// a hostile member weighs at most what a full-speed one does; its Delta is for outer.aggregation to
// judge), and seconds per step that are not finite or not positive count as unknown (0). A
// simulated poisoned worker (Group::poison) poisons its contribution, not this exchange.
//
// Costs one all-reduce of 8 N bytes per rank before each round: a round trip more per round.
// Threading: as the collectives (collectives.h). Errors: a lost or late peer, as allreduce_mean.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/clock.h"
#include "core/status.h"
#include "optim/collectives.h"
#include "transport/tags.h"

namespace gossamer::optim {

// What stands behind one member's contribution to a round.
struct Contribution {
  std::int64_t steps = 0;     // inner steps computed since its contribution last merged
  double step_seconds = 0.0;  // its seconds per inner step lately (0: unknown)
};

// Every member's Contribution, by rank, the same on every member.
class RoundWeights {
 public:
  RoundWeights() = default;
  explicit RoundWeights(std::vector<Contribution> members) : members_(std::move(members)) {}
  const std::vector<Contribution>& members() const { return members_; }
  std::int64_t total_steps() const;
  // s_rank N / sum s: what a member multiplies its contribution by (1 when nobody computed anything).
  double scale(int rank) const;
  // The fastest member's seconds per step (0: none known).
  double fastest_step_seconds() const;

 private:
  std::vector<Contribution> members_;
};

// The steps behind each member's contribution, by rank (what a leader's quorum counts).
std::vector<std::int64_t> steps_by_rank(const RoundWeights& weights);

// What this member computed since its contribution last merged. Threading: one thread (the training
// thread adds; a method reads it when it launches a round).
class WorkMeter {
 public:
  void add(double seconds) {
    ++steps_;
    seconds_ += seconds;
    last_ = seconds;
  }
  Contribution contribution() const;
  // The steps since the last merge, and the seconds of the latest one alone (calibrate()).
  Contribution latest() const { return Contribution{steps_, last_}; }
  // The contribution merged (or was handed over): counting starts again; the pace is remembered.
  void merged();
  // Only `fraction` of the work since the last merge rides on (a late contribution carried into a
  // later round at a weight below 1; 0: dropped). The pace is kept.
  void keep(double fraction);

 private:
  std::int64_t steps_ = 0;
  double seconds_ = 0.0;
  double last_step_seconds_ = 0.0;  // of the last window that had steps
  double last_ = 0.0;               // of the latest step
};

// What a member may claim, in windows of the round's steps (H): a member whose last rounds failed
// brings their steps too, up to this many windows' worth.
inline constexpr std::int64_t kMaxWeightedWindows = 4;

// The tag of the exchange before a collective tagged `collective`.
inline transport::Tag token_weights_tag(transport::Tag collective) { return transport::tags::kTokenWeights | (collective & 0xFFFFFFu); }

// The run's second inner step (kCalibrationStep; the first warms caches and allocators up and says
// little): members exchange how long it took them (an exchange like a round's, tagged
// kCalibrationTag: nothing else is exchanged then), so that even the first round runs on the time
// budget instead of waiting for the slowest member. Returns the fastest member's seconds per step; 0
// when the exchange failed (logged: the first round then runs in lockstep, later ones on the budget).
inline constexpr std::int64_t kCalibrationStep = 2;
inline constexpr transport::Tag kCalibrationTag = transport::tags::kTokenWeights | 0xFFFFFFu;
double calibrate(const Group& group, const WorkMeter& meter, std::int64_t max_steps, Deadline deadline, CommStats* stats = nullptr);

// A round's weighing: exchanges `mine`, then multiplies `contribution` by this rank's scale (left as
// it is when the scale is 1 or the tensor is undefined). The weights, or the exchange's error.
[[nodiscard]] Result<RoundWeights> weigh(const Group& group, const Contribution& mine, std::int64_t max_steps, transport::Tag collective,
                                         Deadline deadline, CommStats* stats, at::Tensor& contribution);

// Exchanges `mine` with the group (see above). `collective`: the tag of the round's collective.
[[nodiscard]] Result<RoundWeights> exchange_contributions(const Group& group, const Contribution& mine, std::int64_t max_steps,
                                                          transport::Tag collective, Deadline deadline, CommStats* stats = nullptr);

}  // namespace gossamer::optim
