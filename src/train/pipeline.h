// A node of a SkipPipe pipeline (docs/skippipe.md): it hosts one stage of the GPT and, for each
// iteration, runs the forwards and backwards of the micro-batches the schedule routes through it,
// exchanging activations and their gradients with the other nodes over transport Links
// (pipeline_wire.h). A stage-0 node (an origin) also holds its micro-batches' data: it embeds them,
// runs stage 0's blocks, and when a micro-batch comes back computes the head and the loss and starts
// its backward, which retraces the path.
//
// Stages: the model's L blocks cut into S stages of L / S consecutive blocks; stage 0 also holds the
// embeddings, the final LayerNorm and the tied head. Every node builds the whole model from one
// seed, so stage replicas start identical and a stage's blocks equal the single-process model's.
//
// Order: when the schedule carries a timetable (skippipe/schedule.h), a node does its work in the
// timetable's order, whatever order the messages arrive in (one that arrives early waits for its
// turn): its gradients then add up in the same order on every run, so a run is deterministic,
// bit for bit, on any clock and any network, and the memory bound holds because it held in the
// timetable. Without one, the rules of skippipe/simulate.h, first come first served: a non-zero
// node holds at most `memory` micro-batches' activations (a forward that finds it full waits,
// backwards first); an origin keeps at most `memory` of its micro-batches in flight, launching
// them in the schedule's order.
//
// Gradients: after run_iteration() the stage's parameters hold the sum of the gradients of the
// micro-batches that went through this node (each micro-batch's loss is its mean token cross-
// entropy). sync_stage() turns them into the stage's mean over every micro-batch that visited the
// stage (any replica): each replica scales its sum by replicas / visits and the replicas all-reduce
// the mean (optim/collectives.h), so every replica ends with bit-identical gradients.
//
// Time: everything waits through the node's Clock (core/clock.h): the real one, or the simulator's
// virtual one, under which the node charges its compute to the clock (StageCompute: a forward, 1.5
// forwards per backward, a quarter for the head and loss) and the emulated links charge the
// transfers, so an iteration's virtual makespan is the runtime's own, not a model of it.
//
// Threading: run_iteration() is called from one thread (of the clock's); for the iteration it runs
// one receiving thread per link with something to come and one sending thread per link with
// something to go (a node computes while its activations are on the wire), all through the Clock.
// Errors: a link that fails, a message that does not decode or does not belong to the
// iteration, or the deadline: the iteration fails with the Status, and this node closes its links (the others then fail
// at once too): a failed iteration ends the pipeline's run.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/clock.h"
#include "core/status.h"
#include "model/gpt.h"
#include "optim/collectives.h"
#include "optim/fragments.h"
#include "quant/format.h"
#include "skippipe/schedule.h"
#include "transport/link.h"

namespace gossamer::train {

// Micro-batches that visit each node per iteration (an origin counts its own).
std::vector<int> node_visits(const skippipe::Schedule& schedule);

// Blocks [first, last) of stage `stage`; throws ContractError when layers % stages != 0.
std::pair<std::int64_t, std::int64_t> stage_blocks(std::int64_t stage, std::int64_t stages, std::int64_t layers);

struct MicroBatchData {
  at::Tensor tokens;   // (B, T) int64
  at::Tensor targets;  // (B, T) int64
};

// Compute a node charges to its clock per micro-batch: a simulation's compute model. Zero (the
// default) charges nothing: on real hardware the compute takes its own time.
struct StageCompute {
  double forward_s = 0;          // one stage's forward of one micro-batch
  double backward_factor = 1.5;  // a backward costs this many forwards
  double head_factor = 0.25;     // the head and loss at the origin, in forwards
};

// One piece of a node's compute, in its clock's seconds since the iteration started.
enum class WorkKind : std::uint8_t { kForward = 0, kBackward = 1, kHead = 2 };
struct WorkSpan {
  std::uint32_t microbatch = 0;  // the schedule's numbering (agents in order, each one's micro-batches in turn)
  WorkKind kind = WorkKind::kForward;
  double start_s = 0, end_s = 0;
};

struct IterationStats {
  std::vector<double> losses;         // this origin's micro-batches, in launch order
  int forwards = 0, backwards = 0;    // of this node's stage
  int peak_inflight = 0;              // the most micro-batches' activations held at once
  std::uint64_t messages_sent = 0, bytes_sent = 0;
  std::vector<WorkSpan> work;         // in the order it was done
  double busy_s = 0;                  // the spans' total
  double finished_s = 0;              // when the node's part ended (its last message had left)
};

struct PipelineNodeOptions {
  quant::EncodeOptions codec;              // activations and their gradients (fp32 by default)
  std::int64_t max_batch = 1 << 16;        // the largest batch a message may carry
  Clock* clock = &real_clock();            // outlives the node
  StageCompute compute;
};

namespace pipeline_detail {
class PipelineIteration;  // pipeline_iteration.h
}

class PipelineNode {
 public:
  // links[j]: a link to node j (null for this node and nodes it never talks to).
  PipelineNode(int node, skippipe::Schedule schedule, model::Gpt model, std::vector<std::shared_ptr<transport::Link>> links,
               PipelineNodeOptions options = {});

  int stage() const { return stage_; }
  // The parameters of this node's stage, in model order.
  const std::vector<at::Tensor>& stage_parameters() const { return params_; }
  // The same by block ("embed", "block.i", "final"), for an outer optimizer inside the stage.
  const std::vector<optim::ParamBlock>& stage_param_blocks() const { return param_blocks_; }
  // Micro-batches that visit this node, and that visit its stage (any replica), per iteration.
  int visits() const { return visits_; }
  int stage_visits() const { return stage_visits_; }

  // One iteration: `data` holds this node's own micro-batches (an origin's, in the order of its
  // agents and their micro-batches; empty for other nodes).
  [[nodiscard]] Result<IterationStats> run_iteration(std::uint64_t iteration, const std::vector<MicroBatchData>& data, Deadline deadline);

  // Another schedule over the same nodes (this node keeping its stage) and fresh links: a pipeline
  // rescheduled around a lost node. The stage's weights stay as they are.
  void reschedule(skippipe::Schedule schedule, std::vector<std::shared_ptr<transport::Link>> links);

  // The stage's gradient mean over its replicas (group: this stage's nodes, ranks in node order).
  [[nodiscard]] Status sync_stage(const optim::Group& group, std::uint64_t iteration, Deadline deadline, optim::CommStats* stats = nullptr);

 private:
  friend class pipeline_detail::PipelineIteration;
  const int node_;
  skippipe::Schedule schedule_;
  model::Gpt model_;
  std::vector<std::shared_ptr<transport::Link>> links_;
  const PipelineNodeOptions options_;
  int stage_ = 0;
  std::pair<std::int64_t, std::int64_t> blocks_;
  std::vector<at::Tensor> params_;
  std::vector<optim::ParamBlock> param_blocks_;
  int visits_ = 0, stage_visits_ = 0;
  // With a timetable: this node's work in the order the schedule's simulation did it.
  enum class Step : std::uint8_t { kLaunch, kForward, kHead, kBackward };
  struct OrderItem {
    std::uint32_t microbatch = 0;
    Step step = Step::kLaunch;
    int hop = 0;
  };
  std::vector<OrderItem> order_;
  void plan_work();  // order_ and the visits, from schedule_
};

}  // namespace gossamer::train
