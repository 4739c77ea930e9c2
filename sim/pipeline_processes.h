// Simulated pipeline processes: every node of a SkipPipe pipeline runs what `gossamer pipeline --node
// K` runs (runtime/pipeline_process.h: a trainer hosting that node alone; links per epoch; the schedule
// confirmed by hash; every iteration confirmed to every node before weights move; after a failed
// iteration the views, the catch-up and the reschedule without the nodes that did not answer within
// the rejoin timeout), each node in an actor of the simulator, over the simulator's transport
// (sim/transport_fabric.h) on the pipeline's emulated network (pipeline_network_spec), its compute
// charged to the virtual clock.
//
// run_pipeline_cluster takes this route when the config crashes a node (pipeline.crash_node: its
// network node dies half-way through pipeline.crash_at_iteration, as the scheduler expects that
// iteration to go), so the survivors go through the real agreement, rejoin timeout included; each
// node's notes of it (PipelineProcessOutcome::agreement) are those real processes make in the same
// fault, and a test holds them side by side. The records and summary are those of
// run_pipeline_cluster, merged over the nodes in node order (the losses summed as one trainer sums
// them), plus `rejoin_s` (the survivors' time from the failure to the new schedule).
//
// Threading: blocks until every simulated node has ended. Deterministic: the same config gives
// bit-identical records and notes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "runtime/pipeline_process.h"
#include "sim/cluster.h"
#include "sim/pipeline_cluster.h"
#include "train/run.h"

namespace gossamer::sim {

struct SimulatedNodesOptions {
  // Per node (empty: none): PipelineProcessRequest::crash_while_confirming, the processes' drill.
  std::vector<std::int64_t> crash_while_confirming;
  Nanos rejoin_timeout = runtime::kDefaultRejoinTimeout;
  PipelineProgress progress;  // as the last node alive reports each iteration
};

struct SimulatedNodes {
  std::vector<Result<runtime::PipelineProcessOutcome>> outcomes;  // per node
  ClusterResult result;                                       // as run_pipeline_cluster's
};

[[nodiscard]] Result<SimulatedNodes> simulate_pipeline_nodes(const train::RunConfig& config, const train::Corpus& corpus,
                                                             const SimulatedNodesOptions& options);

}  // namespace gossamer::sim
