// From a RunConfig to the outer optimizer it asks for, and the loop that drives one Worker with it.
//
// run_worker_loop is the one training loop of every multi-worker run (the simulator's workers, and
// real peers): inner step, gradient averaging for ddp, outer step when due, evaluation, and the
// per-worker accounting (bytes sent and received, time computing, time blocked on communication).
// It does not know whether its Clock and links are real or simulated.
//
// Threading: one thread drives a loop. Errors: a failed round (a peer lost or late) is logged,
// skipped (counted) and training goes on; other failures return their Status.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/status.h"
#include "model/language_model.h"
#include "optim/outer_optimizer.h"
#include "train/config.h"
#include "train/step_budget.h"
#include "train/worker.h"

namespace gossamer::train {

// kInvalidArgument (naming the keys) for combinations the method refuses, e.g. a fragment count that
// does not divide H.
[[nodiscard]] Result<optim::OuterConfig> outer_config(const RunConfig& config);
// Settings that are legitimate but probably not what was meant, one sentence each (the commands
// print them as warnings).
std::vector<std::string> config_warnings(const RunConfig& config);
// LoopOptions::budget_period for the config: the method's inner steps under outer.round_budget =
// "time" (diloco, streaming_diloco, sparseloco), else 0.
std::int64_t budget_period(const RunConfig& config);
// SparseLoCo's H: sparseloco.inner_steps, or when it is 0 the rule (docs/methods.md): Covenant-72B's
// deployed 30, shortened so that the run has at least three times the rounds an accumulator takes to
// drain (chunk / topk rounds: a round sends topk of every chunk values),
// min(30, train.steps / (3 x ceil(chunk / topk))), at least 1.
std::int64_t sparseloco_period(const RunConfig& config);
std::vector<optim::ParamBlock> param_blocks(const model::LanguageModel& model);

// What one worker spent and sent so far.
struct WorkerAccount {
  std::int64_t steps = 0;
  std::int64_t tokens = 0;
  std::int64_t rounds = 0;          // synchronizations applied
  std::int64_t skipped_rounds = 0;  // failed and skipped
  std::uint64_t bytes_sent = 0;     // payloads plus frame headers, state transfers to newcomers included
  std::uint64_t bytes_received = 0;
  std::uint64_t state_bytes_sent = 0;      // training state sent to newcomers (part of bytes_sent)
  std::uint64_t state_bytes_received = 0;  // training state fetched when joining (part of bytes_received)
  std::uint64_t gossip_bytes_sent = 0;     // membership, rounds, announcements (part of bytes_sent)
  std::uint64_t gossip_bytes_received = 0;
  std::uint64_t membership_bytes_sent = 0;  // of gossip_bytes_sent: membership itself (not rounds, announcements)
  std::uint64_t left_out = 0;       // contributions this worker, as a chunk's owner, left out (outer.aggregation)
  std::int64_t computed_steps = 0;  // steps computed (fewer than `steps` for a member slower than the group's fastest under a time budget)
  std::int64_t computed_tokens = 0; // tokens of the steps computed in this loop (`tokens` is the worker's count, a joiner's taken from its donor)
  std::int64_t merged_tokens = 0;
  // Of a worker left behind (LoopHooks::left_behind): tokens carried into its next contribution at
  // their age's weight (the weighted share; they count as merged when that merges), and tokens lost.
  std::int64_t late_tokens_carried = 0;
  std::int64_t late_tokens_lost = 0;   // of those, the tokens whose contribution reached the shared model (goodput's numerator)
  double compute_s = 0.0;           // inner steps (as the pace hook counts them)
  double blocked_s = 0.0;           // waiting on communication
  double loop_s = 0.0;              // time in the loop, on its clock (goodput's denominator: what it trains alone in it)
  double eval_wall_s = 0.0;         // real time spent evaluating (not in the metrics: not deterministic)
  double step_wall_s = 0.0;         // real time spent in inner steps (forward, backward, update), gradient
                                    // averaging excluded (not in the metrics either)
  nlohmann::json to_json() const;
};

// Goodput of one worker (docs/methods.md): the tokens of its steps that reached the shared model over
// the tokens it trains alone, at the pace its own steps took, in its time in the loop; 0 before it
// computed anything.
double goodput(const WorkerAccount& account);

struct LoopOptions {
  std::int64_t steps = 0;                // run until this many inner steps are done
  std::int64_t eval_every = 0;           // 0: never
  bool evaluate = false;                 // this worker evaluates (at eval_every and the end)
  Nanos round_timeout = std::chrono::minutes(10);
  // outer.round_budget = "time": the inner steps of a round of the group's fastest member; this
  // member computes the ones that fit (train/step_budget.h). 0: every step computes.
  std::int64_t budget_period = 0;
};

// What became of a left-behind worker's work since its last merge, as shares of its tokens:
// `merged` reached the shared model already (the round went through for the others with its
// contribution in), `carried` rides on into its next contribution (a late contribution merged at its
// age's weight); the rest is lost.
struct LeftBehind {
  double merged = 0.0;
  double carried = 0.0;
};

struct LoopHooks {
  // After the compute of each inner step, with its measured seconds: waits out the step's modelled
  // time (simulation) and returns the seconds it counts as. Default: the measured time.
  std::function<double(double measured_s)> pace;
  // Before each step: false stops this worker now (a crash in a scenario).
  std::function<bool(std::int64_t next_step)> keep_going;
  // A metrics record at every applied round, evaluation and the last step (the caller adds who wrote
  // it and writes it out).
  std::function<void(const nlohmann::json&)> record;
  // Asked before every step and after a failed round, with the step the group is for (the step about
  // to run, or the failed round's step): the new group when the members for that step differ from
  // the last call's (membership comes from outside: gossip in real runs, the scenario in
  // simulation). After a failed round whose group changed, the round is retried once over the new
  // group.
  std::function<std::optional<optim::Group>(std::int64_t step)> regroup;
  // After a round's collective went through and its outer step was applied, at step `step`.
  std::function<void(std::int64_t step)> applied;
  // After each regroup: when this worker was left behind since the last call (it took the members'
  // state), what became of what it computed since its last merge (LeftBehind); nothing otherwise.
  std::function<std::optional<LeftBehind>()> left_behind;
  // Bytes this worker sent to and received from newcomers moving training state so far (first:
  // sent, second: received); counted into bytes_sent and bytes_received.
  std::function<std::pair<std::uint64_t, std::uint64_t>()> state_traffic;
  // Likewise for gossip's messages (membership, round agreement, announcements) so far.
  std::function<std::pair<std::uint64_t, std::uint64_t>()> gossip_traffic;
  std::function<std::uint64_t()> membership_traffic;  // bytes sent by membership itself
};

[[nodiscard]] Result<WorkerAccount> run_worker_loop(Worker& worker, optim::OuterSetup& outer, Clock& clock, const LoopOptions& options,
                                                    const LoopHooks& hooks);

}  // namespace gossamer::train
