// What a simulated pipeline's records and summary hold (sim/pipeline_cluster.h), summed over its
// iterations, whichever way the nodes ran: one trainer hosting every node, or one simulated process
// per node (sim/pipeline_processes.h). Internal to the simulator.
// Threading: one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/cluster.h"
#include "sim/network.h"
#include "skippipe/planner.h"
#include "train/config.h"
#include "train/pipeline_trainer.h"

namespace gossamer::sim {

// The real model's fp32 hop on the wire over the table's full-size one (pipeline.activation_mib):
// what the emulated links' bandwidth and the reported bytes are scaled by.
double hop_scale(const train::RunConfig& config);
// The bytes a node has sent so far, on average over the network's `nodes`.
double bytes_sent_per_node(const Network& network, std::size_t nodes);

// How the run ended: what the summary says beside the sums.
struct PipelineEnd {
  std::int64_t lost_nodes = 0;
  std::int64_t retried_iterations = 0;
  double retried_s = 0;                // the failed attempts, until the failure showed
  std::optional<double> rejoin_s;      // from then until the survivors had agreed (simulated processes)
  double final_predicted_makespan_s = 0;
  train::EndEvaluations evaluations;  // the omission check
  std::int64_t stage_replicas = 0;     // nodes taking part in a stage at the end (stage sync rounds per replica)
};

class PipelineTotals {
 public:
  PipelineTotals(const train::RunConfig& config, const skippipe::Plan& first_plan, double hop_bytes_scale);

  // One iteration as the pipeline ran it: its record over every node, the micro-batches each node
  // started as an origin, when it ended (virtual seconds), the bytes a node had sent by then on
  // average, and its validation loss. Returns its metrics record.
  nlohmann::json add(const train::PipelineRecord& rec, const std::vector<std::int64_t>& started, double time_s, double bytes_sent_per_node,
                     std::optional<double> val_loss);

  // The summary (ClusterResult::pipeline) and each node's account, at virtual time sim_time_s.
  void finish(const PipelineEnd& end, const Network& network, double sim_time_s, ClusterResult& result) const;

 private:
  const train::RunConfig& config_;
  const skippipe::Plan plan_;  // the first
  const double hop_bytes_scale_;
  std::vector<std::int64_t> launched_;
  std::vector<double> busy_;
  std::vector<int> peak_;
  double pipeline_time_ = 0, sync_time_ = 0, first_makespan_ = 0;
  std::uint64_t activation_bytes_ = 0, sync_bytes_ = 0;
  std::int64_t sync_rounds_ = 0, iterations_ = 0;
  nlohmann::json timeline_;
};

}  // namespace gossamer::sim
