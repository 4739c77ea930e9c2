// Cluster: many Workers in one process, in virtual time, over an emulated network: what `gossamer
// sim` and `gossamer compare` run.
//
// Each simulated worker is the real Worker with the real outer optimizer and codecs, driven by the
// same loop as a real peer (train/outer.h); only its Clock (the Scheduler) and its links (Network)
// are emulated. Compute time per inner step comes from a compute model: fixed, a device profile
// (6 x params x tokens / (peak FLOP/s x utilization)) or measured on this machine (the one
// non-deterministic choice). Scenarios: a worker that crashes at a given step (its links close;
// the others skip the failed round and go on over a re-formed group), a late joiner (absent until
// a given step; the first member to reach that step sends it its training state over the network,
// model, inner and outer optimizer state, while it trains on, and every member takes the newcomer in
// from that step: a round boundary joins cleanly; a round in flight then is abandoned and counted)
// and a straggler whose compute is k times slower.
//
// Determinism: with a fixed or device compute model, two runs with the same config give
// bit-identical metrics and parameters. Threading: run_cluster blocks; `progress` is called from
// simulated threads, one at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "sim/network.h"
#include "train/config.h"
#include "train/outer.h"
#include "train/run.h"

namespace gossamer::sim {

// The network a config describes: every worker's access link from sim.network (a preset or the
// custom keys), the last sim.slow_link_workers on slower links, in sim.sites sites (contiguous
// blocks of workers behind a shared link each) and behind one shared hub link when
// sim.shared_uplink_mbit > 0.
[[nodiscard]] Result<NetworkSpec> network_spec(const train::RunConfig& config);
// Seconds one inner step of worker `rank` counts as (before the straggler factor), for the fixed and
// device models; the measured model returns `measured_s`.
double step_seconds(const train::RunConfig& config, std::int64_t parameters, double measured_s);

struct ClusterResult {
  std::vector<nlohmann::json> records;          // every worker's metrics records, in virtual-time order
  std::vector<train::WorkerAccount> accounts;   // per worker
  std::vector<bool> crashed;                    // per worker, from the scenario
  double sim_time_s = 0;                        // virtual time at the end
  double wall_s = 0;                            // real time the simulation took
  double compute_wall_s = 0;                    // real time spent in model compute (inner steps, evaluation)
  std::int64_t parameters = 0;
  std::vector<at::Tensor> final_params;         // each worker's parameters at its end, flattened
};

using ClusterProgress = std::function<void(int worker, std::int64_t step, std::int64_t steps)>;

[[nodiscard]] Result<ClusterResult> run_cluster(const train::RunConfig& config, const train::Corpus& corpus,
                                                const ClusterProgress& progress = {});
// The same over the real peer runtime (peer_cluster.cpp).
[[nodiscard]] Result<ClusterResult> run_peer_cluster(const train::RunConfig& config, const train::Corpus& corpus,
                                                     const ClusterProgress& progress = {});

}  // namespace gossamer::sim
