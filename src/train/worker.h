// Worker: one training replica = model (the built-in GPT or a TorchScript module) + its data shard + inner optimizer (AdamW, or Muon for the weight matrices beside AdamW: train.optimizer) + schedule, timed
// by a Clock. The same Worker will run under the real clock and the simulator's virtual clock; it does
// not know which. Outer optimizers (optim/) will drive Workers between inner steps.
//
// Ownership: a Worker owns its model and optimizer; it borrows the Dataset and the Clock, which must
// outlive it. Threading: one thread drives a Worker. Errors: checkpoint I/O returns Status; misuse
// throws ContractError.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/clock.h"
#include "core/status.h"
#include "data/dataset.h"
#include "model/gpt.h"
#include "model/language_model.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace gossamer::train {

struct StepResult {
  std::int64_t step = 0;     // steps completed after this one
  double loss = 0.0;         // training loss of this step's batch (nats per token)
  double grad_norm = 0.0;    // global gradient norm before clipping
  double lr = 0.0;
  std::int64_t tokens = 0;   // tokens in this step's batch
  double seconds = 0.0;      // time the step took on the Worker's Clock
  Status sync;               // what the gradient hook returned (ok when there is none)
  bool replaced = false;     // the hook replaced the whole state (restore()): no update was made
};

// Called between backward and the update with the model's parameters (their gradients filled in):
// data parallelism averages the gradients here. If it fails, the step goes on with the local
// gradients and StepResult::sync carries the error. If it restores the Worker (a peer left behind
// takes the members' state), the step's update is dropped and the step ends at the restored one.
using GradientHook = std::function<Status(const std::vector<at::Tensor>& params)>;

// A model trained by its caller (the Python package): the caller computes each inner step with its
// own module, data and inner optimizer; the Worker holds the module's trainable parameters (sharing
// their storage) and asks the caller for what only it can do. Every callback runs on the thread
// that drives the Worker, while the caller waits.
struct ExternalTraining {
  std::vector<model::NamedParameter> parameters;  // trainable, in the module's order
  std::string block_pattern;                      // cuts them into blocks (model/external_model.h)
  // One inner step: returns once the caller made it (its loss, tokens, learning rate; `seconds`, the
  // time the caller took). `between` is called after the caller's gradients are in and before it goes
  // on; with a gradient hook (ddp) it averages them and steps the caller's optimizer, which the
  // caller then does not do itself.
  // `next` is the step about to be made (1 for a run's first).
  std::function<StepResult(std::int64_t next, const std::function<void()>& between)> step;
  std::function<Status()> update;                 // the caller's optimizer steps with the gradients in place
  std::function<Result<Bytes>()> save_optimizer;  // the caller's optimizer state, as bytes the same state always gives
  std::function<Status(ByteView)> load_optimizer; // such bytes (untrusted)
  std::function<double()> evaluate;               // validation loss; absent: the caller does not evaluate
  // Set by the runtime that drives the Worker, for the caller's use from inside `step` (on the
  // runtime's thread, between two steps): the whole training state now, as a checkpoint holds it.
  std::function<Result<CheckpointState>()> snapshot;
  int shard = 0, shards = 1;  // set by the runtime before the first step: the caller's share of its data
  // Set by the caller's side when it stopped during a step (Ctrl-C in its own code): its parameters hold
  // part of a step no one was told of, so the runtime writes no checkpoint of them (the last one stands).
  bool stopped_mid_step = false;
};

// The model of a config, for worker `rank` (which seeds its dropout).
model::GptConfig gpt_config(const RunConfig& config, int rank);
// The model a config asks for (model.kind), initialised as every worker's is. A TorchScript file that
// cannot be read or does not fit the run is a kInvalidArgument Status naming it and the fix.
[[nodiscard]] Result<std::unique_ptr<model::LanguageModel>> make_model(const RunConfig& config, int rank);

class Worker {
 public:
  Worker(const RunConfig& config, const data::Dataset& dataset, int rank, int world, Clock& clock);
  // A worker over a caller's own training (model.kind = external). ContractError for parameters an
  // ExternalModel refuses (the caller checks them first).
  Worker(const RunConfig& config, std::shared_ptr<ExternalTraining> external, Clock& clock);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // One inner step on the next batch of this worker's shard.
  StepResult step(const GradientHook& before_update = {});
  // A slot of the round's time in which this worker computes nothing (a member slower than the
  // group's fastest under outer.round_budget = "time"): the step count moves on, the data position,
  // the model and the inner optimizer do not.
  void skip_step();
  // Catch-up for ddp (optim/updates.h): step `step` (the next one) made with the members' averaged
  // gradients `flat` instead of its own, as step() makes it after the hook: clipped, then the inner
  // optimizer's update at that step's learning rate. No data is read and no token counted. The
  // gradients are untrusted: another step, another size or non-finite values are kMalformed.
  [[nodiscard]] Status replay_gradients(std::int64_t step, const at::Tensor& flat);
  // A newcomer that replayed the outer updates up to `step` goes on from there: its step count and
  // data position move to `step` (the model and optimizer are left as they are).
  void move_to(std::int64_t step);
  // Mean validation loss (nats per token) over the fixed evaluation set.
  double evaluate();

  std::int64_t steps_done() const;
  std::int64_t tokens_seen() const;
  model::LanguageModel& model();

  // Captures / restores the whole training state (model, optimizer, RNG, data position, step).
  CheckpointState checkpoint_state(const std::string& config_toml) const;
  [[nodiscard]] Status restore(const CheckpointState& state);
  std::uint64_t restores() const;  // how many restore() calls succeeded
  // The inner optimizer's state alone (AdamW's step and moments per parameter, in model order) as
  // plain little-endian values, so members that hold the same state hold the same bytes (a LibTorch
  // archive names parameters by their addresses: ddp's donors could not offer one state):
  //   magic "GSAW" | version u8 | parameters u32 | per parameter: a flag u8, then for flag 1
  //   (AdamW's) step i64, values u64, exp_avg f32 x values, exp_avg_sq f32 x values; for flag 2
  //   (Muon's, train.optimizer = muon) values u64, momentum f32 x values; for flag 0 nothing.
  static constexpr std::uint8_t kOptimizerStateVersion = 1;
  Bytes optimizer_state() const;
  // Loads such bytes (untrusted: counts and sizes checked against the model's parameters).
  [[nodiscard]] Status load_optimizer_state(ByteView bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gossamer::train
