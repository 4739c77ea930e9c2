// Pipeline cluster: a SkipPipe pipeline (train/pipeline_trainer.h) in virtual time over the emulated
// network: what `gossamer sim --pipeline` and `gossamer compare` with pipeline methods run.
//
// The real runtime runs: every node's PipelineNode, its receiving and sending threads, the stages'
// sync (an all-reduce or an outer optimizer) over emulated links, on the Scheduler's clock. Only the
// links and the compute are modelled:
//   - links: the table the scheduler plans on (pipeline.network: the reference's geo table, or a
//     uniform one) as per-pair links (sim/network.h), access links unlimited. The real model is
//     tiny, so a hop's bytes are scaled: each pair's bandwidth is multiplied by (the real fp32 hop's
//     bytes) / (pipeline.activation_mib MiB), and a hop takes what a full-size hop takes in the
//     table; every message also pays the scheduler's per-hop overhead as latency. The stages' sync
//     travels the same scaled links (its bytes scale with the model as the activations' do).
//   - compute: pipeline.forward_s per stage forward of a micro-batch, 1.5 of it per backward and a
//     quarter for the head and loss, charged to the clock by the node that computes.
// So the simulated makespan is the runtime's own under the scheduler's cost model, and
// predicted_makespan_s (the scheduler's event simulation) can be checked against it.
//
// A run without a lost node hosts every node in one trainer. With pipeline.crash_node, every node is
// a simulated process instead (sim/pipeline_processes.h), so the survivors go through the real
// agreement; the records and summary are the same, and the summary adds rejoin_s.
//
// Records (one per iteration, "worker" 0): step (the iteration), samples, train_loss, lr, time_s
// (virtual time at its end), makespan_s, sync_s, predicted_makespan_s, activation_bytes,
// sync_bytes, bytes_sent (per node so far, wire bytes, sync included), val_loss at train.eval_every
// and at the end. ClusterResult::pipeline holds the per-node totals (busy, idle, bytes, peak in
// flight), the makespans and the first iteration's timeline (which node computes which micro-batch
// when). Deterministic: the same config gives bit-identical records.
//
// Threading: run_pipeline_cluster blocks; `progress` is called from the simulation, one at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "sim/cluster.h"
#include "sim/network.h"
#include "train/config.h"
#include "train/run.h"

namespace gossamer::sim {

// The pipeline's emulated network: pair links from pipeline.network, their bandwidth scaled by
// `hop_scale` (the real model's fp32 hop against pipeline.activation_mib), with the per-hop overhead
// as latency.
NetworkSpec pipeline_network_spec(const train::RunConfig& config, double hop_scale);

// The pipeline variants as `gossamer compare` names them, and the pipeline.mode each runs:
// pipeline-full (full), skippipe-random (random: cost-blind skipping), skippipe-noca (noca: without
// TC2), skippipe-cbs (skippipe: CBS with TC2).
const std::vector<std::string>& pipeline_method_names();
// The mode of a pipeline method's name; nullopt for any other name.
std::optional<std::string> pipeline_method_mode(const std::string& name);
std::string pipeline_method_name(const std::string& mode);

using PipelineProgress = std::function<void(std::int64_t iteration, std::int64_t iterations)>;

[[nodiscard]] Result<ClusterResult> run_pipeline_cluster(const train::RunConfig& config, const train::Corpus& corpus,
                                                         const PipelineProgress& progress = {});

}  // namespace gossamer::sim
