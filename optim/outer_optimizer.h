// OuterOptimizer: the one shape every method has (the torch::optim shape: options, step(), save and
// load), selected by name: ddp, diloco, streaming_diloco, noloco, co2, local, sparseloco, muloco.
//
// The training thread calls step() after every inner step with the number of inner steps done; the
// method communicates when due. Errors from peers are values: a failed step changes no optimizer
// state, so the caller can retry it or skip_round() (counted). GradientSync is the separate, optional
// capability of methods that average gradients before the inner step (ddp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/bytes.h"
#include "core/status.h"
#include "optim/co2.h"
#include "optim/collectives.h"
#include "optim/diloco.h"
#include "optim/fragments.h"
#include "optim/gloo_options.h"
#include "optim/noloco.h"
#include "optim/sparseloco.h"
#include "optim/streaming_diloco.h"
#include "optim/updates.h"
#include "optim/work.h"
#include "optim/method.h"

namespace gossamer::optim {

class OuterOptimizer {
 public:
  virtual ~OuterOptimizer() = default;
  virtual std::string_view name() const = 0;
  // True when this step applied communicated state (a round or a fragment).
  [[nodiscard]] virtual Result<bool> step(std::int64_t inner_steps_done, Deadline deadline) = 0;
  virtual void skip_round() = 0;
  // Members of unequal speed (outer.round_budget = "time"): an inner step this member computed, and
  // its seconds on the run's clock; methods with token-weighted rounds (token_weights.h) weigh each
  // contribution by the steps behind it. The others ignore it.
  virtual void count_step(double /*seconds*/) {}
  // The seconds per step of the group's fastest member, as its last weighted round said (0: unknown,
  // or a method without weighted rounds): what a member's budget of steps per round follows.
  virtual double fastest_step_seconds() const { return 0.0; }
  // The inner steps behind each member's contribution (by rank) to the last weighted round this
  // member applied; empty: none yet, or a method without weighted rounds.
  virtual std::vector<std::int64_t> round_steps() const { return {}; }
  // This member was left out of a round and caught up: only `fraction` of its work since its last
  // merge rides on into its next contribution (a late contribution merged by age, 0: dropped).
  virtual void keep_work(double /*fraction*/) {}
  // The members changed (a peer left or joined): later rounds run over `group`. Outer state is kept;
  // a round in flight over the old group is abandoned. Fails for engines that cannot change members.
  [[nodiscard]] virtual Status regroup(Group group) = 0;
  virtual std::int64_t rounds() const = 0;
  virtual std::int64_t skipped_rounds() const = 0;
  virtual CommStats comm() const = 0;
  virtual Bytes save() const = 0;
  // What of save() every member holds alike, for newcomers (load() takes it): all of it, except
  // SparseLoCo's error accumulator, which is the replica's own (saved as zeros here).
  virtual Bytes save_shared() const { return save(); }
  [[nodiscard]] virtual Status load(ByteView state) = 0;
  // Called after load() of another member's state (a newcomer's or a catching-up member's state
  // transfer): drops what belongs to the donor's replica alone (SparseLoCo's error accumulator, which
  // this one would otherwise send a second time). Other methods keep everything.
  virtual void drop_replica_state() {}
  // Waits for communication in flight whose outcome is part of the state (CO2's average), so that
  // save() then captures it whole; other methods have none.
  [[nodiscard]] virtual Status settle(Deadline) { return Status(); }
  // Called once after the last inner step, before the final evaluation and checkpoint: applies what
  // is still in flight (CO2's last average; co2.h). No communication of its own, so members need not
  // call it together. A failure is counted as a skipped round and returned.
  [[nodiscard]] virtual Status finish(Deadline) { return Status(); }
  // Runs `evaluate` with the weights this method evaluates and exports in the model's parameters:
  // DiLoCo's outer weights, Streaming DiLoCo's (each fragment as last synchronized; ALGORITHMS.md
  // 2.3); the live model for the other methods. The model's own weights are back in place after.
  virtual double evaluate_outer(const std::function<double()>& evaluate) { return evaluate(); }

  // Catch-up (optim/updates.h). From now on every update this member applies to its shared state
  // goes to `sink` (an empty sink stops it). ddp hands out the averaged gradients of each step; the
  // Worker replays those (train/worker.h), not this.
  virtual void record_updates(UpdateSink sink) = 0;
  // Applies an update a member recorded at `step` to this state, which must be the state of the
  // update before it (or of a snapshot taken there), and writes the weights every member shares into
  // the model. The update is untrusted: a size that does not fit, non-finite values or a step that
  // is none of this method's rounds are kMalformed, and change nothing.
  [[nodiscard]] virtual Status replay(std::int64_t step, const at::Tensor& update) = 0;
  // Writes the weights every member shares into the model's parameters: what a newcomer trains
  // from once it has loaded a member's state (DiLoCo's outer weights, each Streaming DiLoCo
  // fragment's; the parameters are the state for ddp, which writes nothing).
  virtual void take_shared_weights() = 0;
};

// Averages gradients across the group before each inner step (ddp).
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // `step` numbers the inner step (the same on every member): it tags the round on the wire.
  [[nodiscard]] virtual Status sync_gradients(const std::vector<at::Tensor>& params, std::int64_t step, Deadline deadline) = 0;
};

struct OuterConfig {
  Method method = Method::kDiLoCo;
  DiLoCoOptions diloco;
  StreamingDiLoCoOptions streaming;
  FragmentOptions fragments;
  NoLoCoOptions noloco;
  CO2Options co2;
  SparseLoCoOptions sparseloco;
  DiLoCoOptions muloco;  // DiLoCo with error feedback on a low-bit codec (the Worker steps with Muon)
  std::shared_ptr<const StalenessPenalty> co2_penalty;  // null: ConstantPenalty(co2.gap_penalty)
  quant::EncodeOptions ddp_codec;
  Aggregation ddp_aggregation;  // links engine only
  // ddp's engine: kLinks (allreduce_mean over the group's Links, any codec), kGloo or kNccl (c10d's
  // ProcessGroupGloo or ProcessGroupNCCL, fp32, rendezvous per `gloo`; the links carry only that).
  enum class DdpEngine : std::uint8_t { kLinks, kGloo, kNccl };
  DdpEngine ddp_engine = DdpEngine::kLinks;
  GlooOptions gloo;
};

struct OuterSetup {
  std::unique_ptr<AsyncCollectives> comm;  // the communication thread, for methods that overlap
  std::unique_ptr<OuterOptimizer> outer;
  GradientSync* gradient_sync = nullptr;   // set for ddp; points into `outer`
};

// The method names, in the table's order (optim/method.h).
std::vector<std::string> outer_methods();
// blocks: the model's parameters by block (embedding, transformer blocks, final), in order.
[[nodiscard]] Result<OuterSetup> make_outer_optimizer(const OuterConfig& config, const std::vector<ParamBlock>& blocks, Group group);

}  // namespace gossamer::optim
