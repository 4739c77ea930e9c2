// PipelineTrainer: trains the GPT as a SkipPipe pipeline (docs/skippipe.md) with every node in this
// process: one PipelineNode per node on its own thread, in-memory links between them. It plans the
// schedule (GCMA and the pipeline.mode's paths), then per iteration each origin draws its
// micro-batches from its shard, the nodes run them, and each stage's replicas synchronise:
//   - pipeline.stage_sync = ddp: they average their gradients every iteration (over the stage's
//     visits), clip them per stage and take the same AdamW step;
//   - pipeline.stage_sync = diloco, streaming_diloco, noloco or co2: each replica takes its own AdamW
//     step on its own micro-batches' mean gradient, and the stage's replicas run that outer optimizer
//     (optim/) over the stage's group, on its own section's keys (diloco.inner_steps, ...): an outer
//     optimizer inside a stage. streaming_diloco cuts its fragments from the stage's own blocks.
// Nodes that the schedule gives no micro-batch (the full pipeline's idle stage-0 nodes) take no part.
// What it learns does not depend on time, so this is where convergence is measured; the time an
// iteration takes over a real network is the scheduler's simulation (plan().simulation).
//
// evaluate() assembles the model from the stages' first replicas and measures the validation loss,
// optionally with some stages left out (the paper's omission check: a model trained with skipping
// should lose less when stages are missing at inference). A model trained on paths that skip is
// assembled by stochastic depth's rule (pipeline.depth_scaling): each stage's residual branches are
// scaled by the share of micro-batches that visited it, so that the residual stream gets from every
// stage what it got on average in training.
//
// Where it runs (PipelineEnvironment): by default on the real clock over in-memory links; the
// simulator (sim/pipeline_cluster.h) gives its virtual clock, its emulated network's links and a
// compute model, and the same trainer then measures the iteration's makespan in virtual time.
//
// Threading: one caller thread (of the environment's clock); step() runs the nodes on threads that
// the clock starts.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/status.h"
#include "data/dataset.h"
#include "model/gpt.h"
#include "skippipe/planner.h"
#include "train/config.h"
#include "train/pipeline.h"

namespace gossamer::train {

// Plans made by trainers of one pipeline, shared where several trainers run in one process (the
// simulator's pipeline processes): every process plans the same schedules from the same config, so
// one plan each is enough. Keyed by what the plan is made of; thread-safe.
class PlanMemo {
 public:
  // The plan stored under `key`, or make()'s, stored.
  template <typename Make>
  Result<skippipe::Plan> get(const std::string& key, Make&& make) {
    {
      std::lock_guard lock(mu_);
      if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    }
    Result<skippipe::Plan> made = make();
    std::lock_guard lock(mu_);
    return plans_.emplace(key, std::move(made)).first->second;
  }

 private:
  std::mutex mu_;
  std::map<std::string, Result<skippipe::Plan>> plans_;
};

struct PipelineEnvironment {
  Clock* clock = &real_clock();  // outlives the trainer
  // The link node `from` uses to reach node `to`: channel 2e carries epoch e's activations, 2e + 1
  // its stage sync (a new epoch after each reschedule, exclude()). Null: in-memory links.
  std::function<std::shared_ptr<transport::Link>(int from, int to, int channel)> link;
  StageCompute compute;          // charged to the clock by every node
  // The nodes this process hosts (empty: every node). The others are reached over `link`: each
  // process of a pipeline plans the same schedule from the same config and hosts its share.
  std::vector<int> local;
  // What the nodes measured of their links and machines (pipeline.network = measured; every process
  // the same): the scheduler plans on these instead of pipeline.network's table and
  // pipeline.forward_s, with a hop of the run's real size (hop_bytes()) and no per-hop overhead.
  std::optional<skippipe::Network> network;
  std::optional<std::vector<double>> node_forward_s;
  // Null: each trainer plans for itself.
  std::shared_ptr<PlanMemo> plans;
};

struct PipelineRecord {
  std::int64_t iteration = 0;
  std::int64_t samples = 0;  // in all so far
  double train_loss = 0;     // mean over the iteration's micro-batches (those of this process's origins)
  std::int64_t losses = 0;   // how many micro-batches train_loss is the mean of
  std::vector<double> microbatch_losses;  // those micro-batches' losses, by node (in node order), each node's in its order
  std::int64_t lost_nodes = 0;  // nodes the pipeline went on without, so far (exclude())
  double lr = 0;
  double grad_norm = 0;      // stage 0's, after its sync
  std::uint64_t activation_bytes = 0;  // sent between nodes this iteration
  std::uint64_t sync_bytes = 0;        // sent by the stages' replicas to synchronise, this iteration
  std::int64_t sync_rounds = 0;        // stage_sync rounds that went through this iteration (over every stage)
  double seconds = 0;        // wall-clock of the iteration on this machine
  // In the environment's clock (virtual in a simulation):
  double makespan_s = 0;     // from the iteration's start until every node's part had ended
  double sync_s = 0;         // from then until every stage had synchronised and stepped
  double ended_s = 0;        // the clock's time (since its epoch) when the weights had stepped
  double predicted_makespan_s = 0;  // the scheduler's prediction for the schedule this iteration ran
  std::vector<double> node_busy_s;       // per node: its compute this iteration
  std::vector<int> node_peak_inflight;   // per node
  std::vector<std::uint64_t> node_bytes_sent;  // per node: activations and gradients
  std::vector<std::vector<WorkSpan>> timeline;  // per node: its compute, in seconds since the iteration's start
};

class PipelineTrainer {
 public:
  [[nodiscard]] static Result<std::unique_ptr<PipelineTrainer>> make(const RunConfig& config, const data::Dataset& data,
                                                                     PipelineEnvironment environment = {});
  ~PipelineTrainer();

  // One iteration. `commit`, when given, runs once every local node has done its part and its
  // stage's sync, before (with stage_sync = ddp) any AdamW step: a failure there leaves the weights
  // as they were, so the iteration can be run again (processes agree that every node got that far).
  [[nodiscard]] Result<PipelineRecord> step(const std::function<Status()>& commit = {});
  // After `commit` failed: the iteration whose gradients are ready but whose weights did not move
  // (every local node got through it). A process that learns the others applied it (they heard its
  // confirmation, it did not hear all of theirs) catches up with apply_pending(); the next step()
  // or an exclude() drops it.
  bool pending() const;
  [[nodiscard]] Result<PipelineRecord> apply_pending();
  // Validation loss of the assembled model, stages in `omitted` left out (stage 0 cannot be). With
  // pipeline.depth_scaling, each non-zero stage's blocks have their residual branches scaled by
  // depth_scales(omitted), as stochastic depth does at inference; the stages' own weights are
  // untouched.
  // Each stage's weights are those of its first replica hosted here that takes part; a process
  // hosting no node of some stage cannot evaluate (ContractError; can_evaluate() says).
  double evaluate(const std::vector<int>& omitted = {});
  bool can_evaluate() const;
  // The same with each stage's parameters given (stage -> its parameters in model order) and the
  // factors its blocks' residual branches are scaled by (per stage; empty: none): a process hosting
  // only some stages evaluates with the others' sent to it. It reads nothing step() changes, so it
  // may run on another thread while the trainer steps (take depth_scales() on the trainer's).
  double evaluate_with(const std::map<int, std::vector<at::Tensor>>& stages, const std::vector<double>& scales,
                       const std::vector<int>& omitted = {}) const;
  // The weights evaluate() assembles: stage -> its representative's parameters (its first replica
  // hosted here that takes part), each stage hosted here (ContractError otherwise; can_evaluate()).
  std::map<int, std::vector<at::Tensor>> stage_weights() const;
  // The whole model from the stages' parameters (copied; stage -> its parameters in model order), each
  // stage's blocks' residual branches scaled by `scales` (empty: none), in evaluation mode: what
  // evaluate_with() measures, and what a pipeline run saves as its trained model. Reads nothing
  // step() changes.
  model::Gpt assemble(const std::map<int, std::vector<at::Tensor>>& stages, const std::vector<double>& scales) const;
  // What evaluate(omitted) scales each stage's residual branches by, with pipeline.depth_scaling
  // (else nothing, empty): the kept stages' shares, stretched so that together they add to the
  // residual stream as many stages' updates as a trained path did (the sum of every non-zero
  // stage's share: L - 1), none by more than 1. With every stage kept, stage_shares() itself
  // (stochastic depth's rule); with fewer stages than a path had, 1 (the weights as trained).
  std::vector<double> depth_scales(const std::vector<int>& omitted = {}) const;
  // Per stage, the share of the micro-batches trained so far that visited it (stage 0: 1; the full
  // pipeline: all 1; paths of L of S stages, balanced: (L - 1) / (S - 1)). Before the first
  // iteration, the schedule's. The same in every process of a pipeline (it follows the plans).
  std::vector<double> stage_shares() const;
  // The node whose weights stand for each stage, the same in every process: the stage's first replica
  // that takes part, else its first node. evaluate() uses these when every stage is hosted here.
  std::vector<int> stage_holders() const;
  // The parameters of a node hosted here (its stage's, in model order).
  std::vector<at::Tensor> node_parameters(int node) const;
  const skippipe::Plan& plan() const;
  // Goes on without `dead` (nodes lost; each stage must keep one): the survivors that took part keep
  // their stages and weights, the scheduler plans paths over them (pipeline.memory raised to the
  // least they can carry the micro-batches with; being one number, it is every node's bound on
  // micro-batches in flight from then on; a lost origin's micro-batches are not started any more),
  // and the next step() runs the new schedule over fresh links (PipelineEnvironment::link's next
  // epoch). Nodes that took no part (hold the initial weights) stay out of it.
  // Every process of a pipeline must exclude the same nodes. With an outer method inside the
  // stages, their outer optimizers start afresh over the new groups.
  [[nodiscard]] Status exclude(const std::vector<int>& dead);
  std::int64_t lost_nodes() const;
  // Each replica's parameters of `stage` (the nodes hosted here that take part), in node order.
  std::vector<std::vector<at::Tensor>> stage_replicas(int stage) const;
  std::int64_t iterations_done() const;
  std::int64_t samples_per_iteration() const;

 private:
  struct Impl;
  explicit PipelineTrainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What the scheduler assumes of the nodes' links (pipeline.network: the geo table or a uniform one)
// and of the work (pipeline.forward_s, pipeline.activation_mib, the reference's per-hop overhead).
skippipe::Network pipeline_network(const RunConfig& config);
// What a pipeline needs of the model and its keys, checked before anything starts: the built-in GPT
// (model.kind = gpt), model.layers a multiple of pipeline.stages, pipeline.path_length at most
// pipeline.stages. kInvalidArgument naming the keys and what to set.
[[nodiscard]] Status check_pipeline_shape(const RunConfig& config);
// pipeline.network = measured needs links between processes to measure: refused (with what to use
// instead) where every node is in one process or simulated.
[[nodiscard]] Status check_network_in_one_process(const RunConfig& config);
// One hop's message: a micro-batch's activations (train.batch_size x model.context x model.width
// values in pipeline.activation_codec) with their header.
std::size_t hop_bytes(const RunConfig& config);
// This machine's time for one stage's forward of one micro-batch: the median of `runs` after a
// warm-up, on the CPU as the pipeline's nodes compute.
double measure_stage_forward_s(const RunConfig& config, int runs = 5);
skippipe::Costs pipeline_costs(const RunConfig& config);

// The omission check's stages by default: the second half, stages max(1, S/2) .. S-1 (for 6 stages:
// 3, 4 and 5, so stage 0 and two others remain, the paper's "half the model").
std::vector<int> default_omitted_stages(std::int64_t stages);

// A pipeline run's closing figures (the omission check): the validation loss of the assembled model
// as evaluated (depth-scaled, pipeline.depth_scaling) and with `omitted` stages left out, both again
// as trained (unscaled), and the stages' visit shares.
struct EndEvaluations {
  std::vector<int> omitted;
  std::vector<double> stage_shares;
  double val_loss = 0, omitted_val_loss = 0, val_loss_as_trained = 0, omitted_val_loss_as_trained = 0;
};
// Taken in two parts, so that the measuring may run on another thread while the trainer steps: what
// the trainer holds now (the shares and both scalings), on the trainer's thread; then the four losses
// of the stages' weights `stages` (`val_loss`: the first, where already measured).
class EndEvaluation {
 public:
  EndEvaluation(const PipelineTrainer& trainer, std::vector<int> omitted);
  EndEvaluations measure(const PipelineTrainer& trainer, const std::map<int, std::vector<at::Tensor>>& stages,
                         std::optional<double> val_loss = std::nullopt) const;

 private:
  EndEvaluations figures_;
  std::vector<double> scales_, omitted_scales_;
};

// pipeline.mode's name to the scheduler's mode.
skippipe::Mode pipeline_mode(PipelineMode mode);

}  // namespace gossamer::train
