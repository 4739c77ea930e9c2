// When a real run's rounds fall, and what its members share after one: the parts of the peer
// runtime (peer_runtime.h) that are plain arithmetic and encoding, testable alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/bytes.h"
#include "core/status.h"
#include "optim/collectives.h"
#include "optim/outer_optimizer.h"
#include "train/config.h"
#include "train/outer.h"

namespace gossamer::runtime {

// When a method's rounds fall. Round r's group is agreed just before step r * period - lead runs
// (the step after which the round's collective launches: Streaming DiLoCo launches a fragment `lead`
// = tau steps before it completes). Once step r * period is done the round is over, with nothing of
// it in flight (CO2's average aside, which is part of its state): there members offer their state to
// newcomers, checkpoint, and ask for the next round's group ahead of time. ddp averages every step;
// its rounds only say when members may change (a lost member is dropped at once, by a retry), and
// its round r is agreed right after step r * period (lead -1): its members hold identical state
// there, so a newcomer given that state takes part in that very round (the members wait for it).
struct RoundSchedule {
  std::int64_t period = 1;
  std::int64_t lead = 0;
  // The round whose group is needed before `step` runs, if any.
  std::optional<std::int64_t> agreed_before(std::int64_t step) const {
    if ((step + lead) % period != 0) return std::nullopt;
    return (step + lead) / period;
  }
  // Rounds over once `step` is done.
  std::int64_t rounds_over(std::int64_t step) const { return step / period; }
  bool ends_round(std::int64_t step) const { return step > 0 && step % period == 0; }
  // The first round whose group is agreed after `step` is done.
  std::int64_t first_round_after(std::int64_t step) const { return (step + lead) / period + 1; }
  // The last round a run of `steps` agrees on.
  std::int64_t last_round(std::int64_t steps) const { return (steps + lead) / period; }
};

// kInvalidArgument for `local`, which needs no peers.
[[nodiscard]] Result<RoundSchedule> round_schedule(const train::RunConfig& config, const optim::OuterConfig& outer);

// The mid-round crash drill (`gossamer peer --crash-mid-round`, sim.crash_mid_round, named by
// `option`) set to a round the run never reaches, or for a method without Gossamer's collective
// (noloco, ddp on Gloo) or a pipeline: kInvalidArgument saying so, since a drill that cannot fire
// rehearses nothing. `round` 0 (off) is fine.
[[nodiscard]] Status check_round_drill(const train::RunConfig& config, std::int64_t round, const std::string& option);

// A group of this peer alone (a round applied on its own).
optim::Group solo_group(Clock& clock);

// The bytes of a contiguous fp32 tensor (a view: the tensor must outlive it).
ByteView bytes_of(const at::Tensor& flat);

// The state members share after a round: the outer optimizer's state and, for ddp, whose members
// hold identical parameters and inner optimizers, the parameters (fp32) and the inner state too (a
// LibTorch archive of model and AdamW): u64 length + params | u64 length + outer | u64 length + inner, the first and the last
// empty for the other methods (a newcomer's model takes the outer weights, OuterOptimizer::
// take_shared_weights, and its inner optimizer is its own). So every member offers the same bytes,
// Streaming DiLoCo's too, whose members' own weights differ.
Bytes encode_shared_state(const std::vector<at::Tensor>& params, const optim::OuterOptimizer& outer, ByteView inner, bool with_params);
// Loads the outer state and the parameters (the outer weights when it holds none); returns the
// inner state (a view into `bytes`). Untrusted: sizes are checked against this model, non-finite
// parameters refused.
[[nodiscard]] Result<ByteView> load_shared_state(ByteView bytes, std::vector<at::Tensor> params, optim::OuterOptimizer& outer);

}  // namespace gossamer::runtime
