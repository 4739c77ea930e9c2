// A SkipPipe pipeline across processes: each process hosts one pipeline node (train/pipeline_trainer.h
// with PipelineEnvironment::local), over TCP links to every other node. What `gossamer pipeline
// --node K --addresses A0,A1,...` runs.
//
// Membership is fixed: node k listens at addresses[k]; it dials every node below it and accepts a
// link from every node above it, each link's peer checked (node j is ids[j], by default j + 1) and the run id
// the config's hash, so processes of another config are refused at the handshake. Every process
// plans the same schedule from the same config (the planner is deterministic) and the nodes confirm
// it: each sends its schedule's hash to every other and refuses to train on a different one. Nodes
// follow the planned timetable (pipeline.order), so the run's losses are those of the same config in
// one process (`gossamer pipeline`) and in the simulator, bit for bit.
//
// Evaluation (every train.eval_every iterations and at the end): each stage's holder (the node whose
// weights stand for it, PipelineTrainer::stage_holders) sends its stage's weights to stage 0's
// holder, which evaluates the assembled model (on copies, beside the next iterations; each record is
// passed on once its evaluation is done, in order); the others report no validation loss. A stage's
// weights that do not arrive (its holder lost) skip that evaluation, logged and counted; the next
// iteration finds out whether a node is gone.
//
// A lost node (its process dies, its links close): every node's iteration fails; each then links
// again with the nodes that answer within rejoin_timeout (a new epoch of connections), the nodes
// check they all reach the same ones and finished the same iterations, and they go on without the
// others: PipelineTrainer::exclude reschedules over the survivors and the iteration runs again. No
// weight moved in the failed iteration: before any AdamW step every node confirms to every other
// that it got through (stage_sync = ddp; with an outer method inside the stages a lost node ends
// the run). Nodes that disagree on who is left, or on how far they got, stop with an error that says
// so. Counted in the outcome (lost_nodes, retried_iterations) and each record's lost_nodes.
//
// Every wait, thread and compute charge is on the request's clock: processes give the real one, the
// simulator (sim/pipeline_processes.h) its virtual one with its transport, so a simulated node runs
// this very protocol, a lost node's agreement included; each outcome notes that agreement step by
// step (PipelineProcessOutcome::agreement), and a test holds a simulated run's against real ones.
//
// Threading: run_pipeline_process blocks until the run ends, fails, or `stop` becomes true (checked
// between iterations: the node then closes its links, and the others go on without it). Errors: a node that cannot be reached within
// connect_timeout (kUnavailable, naming it), another schedule (kInvalidArgument), a failed iteration
// (the node that failed first, and why).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/status.h"
#include "data/dataset.h"
#include "runtime/link_probe.h"
#include "train/config.h"
#include "train/pipeline_trainer.h"
#include "transport/link_profile.h"
#include "transport/transport.h"

namespace gossamer::runtime {

// The default of how long the nodes try to link again after a failed iteration
// (PipelineProcessRequest::rejoin_timeout; `gossamer pipeline --rejoin-timeout`).
inline constexpr Nanos kDefaultRejoinTimeout = std::chrono::seconds(10);

struct PipelineProcessRequest {
  train::RunConfig config;
  // Required: the clock of every wait and thread of the node (real_clock() for a process).
  Clock* clock = nullptr;
  // What a stage's compute costs on `clock` (the simulator's compute model; zero for processes,
  // whose compute takes real time).
  train::StageCompute compute;
  // Plans shared with the other nodes' trainers in this process (the simulator's; null for a process).
  std::shared_ptr<train::PlanMemo> plans;
  int node = 0;                        // the node this process hosts
  std::vector<std::string> addresses;  // every node's links' host:port, in node order (pipeline.nodes of them)
  // Every node's transport peer id, in node order; empty: node k is peer k + 1 (`gossamer pipeline
  // --node`). `gossamer peer` gives its members' gossip ids.
  std::vector<transport::PeerId> ids;
  Nanos connect_timeout = std::chrono::minutes(2);
  // Shape what this node sends on every link (transport/shaped_link.h): processes on one machine
  // then behave as if far apart.
  std::optional<transport::LinkProfile> shape;
  // After a failed iteration, how long the nodes try to link again before going on without those
  // that did not answer.
  Nanos rejoin_timeout = kDefaultRejoinTimeout;
  const std::atomic<bool>* stop = nullptr;
  // Fault drill (tests): at this iteration (> 0) the node confirms it to the nodes below it only,
  // then drops every link and fails, as a process dying in the middle of its confirmations would.
  std::int64_t crash_while_confirming = 0;
  // After each iteration: its record, and the validation loss when this node evaluated.
  std::function<void(const train::PipelineRecord&, std::optional<double>)> on_iteration;
  // Before each attempt at an iteration: its number and the scheduler's prediction of its makespan
  // (the simulator times a crash half-way through by it).
  std::function<void(std::int64_t iteration, double predicted_makespan_s)> on_iteration_start;
  // The evaluator also measures, at the end, the omission check (train::default_omitted_stages left
  // out) and both without depth scaling (PipelineProcessOutcome::end).
  bool omission_check = false;
};

// The evaluator's figures at the end with omission_check: the model as evaluated, with the default
// stages left out, and both with the weights as trained (no depth scaling).


struct PipelineProcessOutcome {
  int stage = 0;
  std::int64_t iterations = 0;
  std::optional<double> final_val_loss;  // stage 0's holder only
  std::string schedule_hash;             // hex (of the schedule in force at the end)
  bool stopped = false;                  // `stop` ended it
  std::int64_t lost_nodes = 0;           // nodes the pipeline went on without
  std::int64_t retried_iterations = 0;   // iterations that failed and were run again without them
  std::int64_t skipped_evaluations = 0;  // the evaluator's: a stage's weights did not arrive
  std::string params_digest;             // BLAKE2b-256 (hex) of this node's weights at the end, flattened in model order
  // The evaluator's (stage 0's holder): the whole model as it evaluated it after the last iteration
  // (depth-scaled as pipeline.depth_scaling says), to save; null on the other nodes, when that
  // evaluation was skipped, or when the run stopped early.
  std::shared_ptr<model::Gpt> model;
  // pipeline.network = measured: what the nodes measured at the start, and planned on.
  std::optional<MeasuredNetwork> measured;
  // The agreement as this node took part in it, one line per step, in order: "linked E: 0,1,2"
  // (epoch E's links, this node included), "schedule H" (the first 16 hex digits of the hash all
  // confirmed), "confirmed I", "view E: done D, reaching 0,1,2", "caught up I", "without 3",
  // "goodbye".
  std::vector<std::string> agreement;
  // On the request's clock: in iterations that failed, from their start until the failure showed,
  // and from then until the nodes left had linked again and agreed (both summed over failures).
  double retried_s = 0;
  double rejoin_s = 0;
  // The schedule planned at the start and the one in force at the end (after any reschedule).
  std::optional<skippipe::Plan> first_plan, last_plan;
  std::optional<train::EndEvaluations> end;  // the evaluator's, with omission_check
};

// A pipeline process's records, as metrics.jsonl holds them: one per iteration (with its validation
// loss when this node evaluated), and the summary at the end.
nlohmann::json pipeline_record_json(int node, const train::PipelineRecord& record, std::optional<double> val_loss);
nlohmann::json pipeline_summary_json(int node, const PipelineProcessOutcome& outcome);

// The run id of a config's processes: the first 16 bytes of the BLAKE2b-256 of its TOML.
transport::RunId pipeline_run_id(const train::RunConfig& config);

// `transport` listens at request.addresses[request.node] with id node + 1 and run pipeline_run_id().
[[nodiscard]] Result<PipelineProcessOutcome> run_pipeline_process(const PipelineProcessRequest& request, transport::Transport& transport,
                                                                  const data::Dataset& data);

}  // namespace gossamer::runtime
