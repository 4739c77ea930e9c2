// CO2 (Sun et al., ICLR 2024; ALGORITHMS.md section 4): local updating with an asynchronous all-reduce
// of the parameters that overlaps the next round, so each outer update uses averages one round stale.
// At the end of round t (every `inner_steps`):
//   launch all-reduce(mean) of the local weights x_{t,tau}            (finishes during round t+1)
//   wait for the all-reduce launched at round t-1 -> xbar_{t-1}        (normally long done)
//   g <- x_{t-1,0} - xbar_{t-1}                                        (stale pseudo-gradient)
//   m <- beta m + g / Lambda                                           (Lambda: staleness penalty)
//   m <- clamp(m, -phi, +phi)  when clipping is on                     (it really clips, unlike the reference code)
//   x_{t+1,0} <- x_{t,0} - alpha m;  local weights <- x_{t+1,0}
// Round 1 has no previous average: it only launches. Defaults follow the reference code: alpha 1,
// beta 0.5, Lambda 1, clipping off (phi 1 when on).
//
// Ownership: borrows the parameters and an AsyncCollectives (the communication thread); owns the
// outer point x_{t,0}, x_{t-1,0}, the momentum and the pending Work. Errors: a failed or late average
// returns its Status and changes nothing (the launched one stays pending for the next round).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/bytes.h"
#include "core/status.h"
#include "optim/flat_params.h"
#include "optim/updates.h"
#include "optim/work.h"
#include "quant/format.h"

namespace gossamer::optim {

// What a staleness penalty sees at round t: the flat outer points and the stale pseudo-gradient, and
// where each layer (parameter block) lies in them.
struct StalenessInputs {
  std::int64_t round = 0;                         // t
  const at::Tensor& outer;                        // x_{t,0}
  const at::Tensor& previous_outer;               // x_{t-1,0}
  const at::Tensor& pseudo_gradient;              // g_t = x_{t-1,0} - xbar_{t-1}
  const std::vector<std::int64_t>& layer_offsets;  // layer l is [offsets[l], offsets[l+1]); the last is the length
};

// The staleness penalty Lambda_t the pseudo-gradient is divided by: one factor for the whole model,
// or one per layer (layer_offsets.size() - 1 of them); each finite and > 0. The reference code's
// constant is the default.
class StalenessPenalty {
 public:
  virtual ~StalenessPenalty() = default;
  virtual std::vector<double> lambda(const StalenessInputs& in) const = 0;
};

class ConstantPenalty final : public StalenessPenalty {
 public:
  explicit ConstantPenalty(double lambda) : lambda_(lambda) {}
  std::vector<double> lambda(const StalenessInputs&) const override { return {lambda_}; }

 private:
  double lambda_;
};

struct CO2Options {
  std::int64_t inner_steps = 48;  // tau
  double outer_lr = 1.0;          // alpha
  double outer_momentum = 0.5;    // beta
  double gap_penalty = 1.0;       // Lambda (ConstantPenalty) unless a StalenessPenalty is given
  bool clip = false;
  double clip_threshold = 1.0;    // phi
  quant::EncodeOptions codec;
  at::Device state_device = at::kCPU;  // where the outer state lives (the parameters may be elsewhere)
  Aggregation aggregation;  // how each chunk's owner combines the contributions (collectives.h)
  Nanos average_timeout = std::chrono::minutes(10);  // bound of each background all-reduce
};

class CO2 {
 public:
  // layer_sizes: how many values each layer (parameter block) holds, in the parameters' order; empty:
  // the whole model is one layer.
  CO2(std::vector<at::Tensor> params, AsyncCollectives& comm, CO2Options options, std::shared_ptr<const StalenessPenalty> penalty = nullptr,
      const std::vector<std::int64_t>& layer_sizes = {});

  [[nodiscard]] Result<bool> step(std::int64_t inner_steps_done, Deadline deadline);

  const at::Tensor& momentum() const { return momentum_; }
  std::int64_t rounds() const { return rounds_; }
  // A failed round is counted where it happens, once per average lost (see skipped_rounds()), so the
  // caller's skip adds nothing.
  void skip_round() {}
  // An average that is in stays (it is applied next round); one still in flight over the old group
  // is dropped (and counted), and the next round only launches. Call settle() first when the members
  // change without a failure, so that every member keeps the average alike.
  [[nodiscard]] Status regroup(Group group);
  // Averages lost: failed, dropped by a regroup, or never launched because their round failed.
  std::int64_t skipped_rounds() const { return skipped_rounds_; }
  CommStats comm() const { return stats_; }
  // Waits for the average in flight, so that save() holds it.
  [[nodiscard]] Status settle(Deadline deadline);
  // At the end of training: waits for the last round's average and applies it as the next round
  // would (x_{T+1,0} <- x_{T,0} - alpha m_{T+1}) and writes the outer point into the parameters, so
  // the final evaluation, checkpoint and export hold every average. Local steps taken since the last
  // round are replaced by that point. A failed average is counted lost and its Status returned.
  [[nodiscard]] Status finish(Deadline deadline);

  // The outer point, the previous one, the momentum and, when it is in, the average launched last
  // round (so a peer loading it applies that average next round, as the others do). An average still
  // in flight is not saved: after such a load, the next round only launches.
  Bytes save() const;
  [[nodiscard]] Status load(ByteView bytes);

  // Catch-up (updates.h): the update of round t (step t x tau) is its average xbar_t, handed out once
  // it is in (when round t+1 waits for it, or settle()). replay() does what round t's step() does to
  // a settled state: applies the average of round t-1 and holds xbar_t as the average in.
  void record_updates(UpdateSink sink) { sink_ = std::move(sink); }
  [[nodiscard]] Status replay(std::int64_t step, const at::Tensor& average);
  void take_shared_weights() { write_flat(params_, outer_); }

 private:
  std::vector<at::Tensor> params_;
  AsyncCollectives* comm_;
  CO2Options options_;
  std::shared_ptr<const StalenessPenalty> penalty_;
  std::vector<std::int64_t> layer_offsets_;
  at::Tensor outer_, previous_outer_, momentum_;
  void lost(std::int64_t round);  // counts the average of `round` as lost, once
  bool average_in() const;        // the pending average finished, and well
  // The outer step with the average launched in round - 1: m <- beta m + g / Lambda, clipped;
  // outer <- outer - alpha m.
  void apply(const at::Tensor& average, std::int64_t round);

  std::shared_ptr<Work> pending_;
  std::int64_t pending_round_ = 0;  // the round whose average pending_ is
  std::int64_t last_lost_ = 0;      // the last round whose average is accounted for: counted lost, or applied by finish()
  std::int64_t rounds_ = 0, skipped_rounds_ = 0;
  CommStats stats_;
  UpdateSink sink_;
  std::int64_t recorded_ = 0;  // the last round whose average went to sink_
  void record_pending();        // hands the average in to sink_, once
};

}  // namespace gossamer::optim
