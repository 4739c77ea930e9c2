// Cluster: many peers in one process, in virtual time, over an emulated network: what `gossamer
// sim` and `gossamer compare` run.
//
// Each simulated worker is a real peer (runtime/peer_runtime.h): the real Worker, outer optimizer and
// codecs, and the real membership: gossip (GossipFabric), round agreement through the Coordinator,
// group links per epoch and state transfer to newcomers (StateServer, fetch_state) over a Transport
// of the emulated network (TransportFabric). Only its Clock (the Scheduler) and its network are
// emulated, and gossip's bytes are counted with the rest. Worker r is the peer with id r + 1 at
// 198.18.x.y (gossip on port 7000, links on 7001), so the starting group's ranks are the workers'
// order. Compute time per inner step comes from a compute model: fixed, a device profile
// (6 x params x tokens / (peak FLOP/s x utilization)) or measured on this machine (the one
// non-deterministic choice). Independent workers (`local`) have no peers and run alone.
//
// Scenarios: a worker that crashes at a given step (its process dies: links and gossip go silent;
// the others fail the round in flight and go on over a group re-formed without it), a late joiner
// (absent until some member reaches a given step; it then starts as a real newcomer does: learns
// the run over gossip, fetches the members' state from the donors that offer it at a round
// boundary and takes part from the next round), and a straggler whose compute is k times slower.
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
  std::vector<double> started_s;                // per worker: virtual time it first started (a late joiner's join; -1: never)
  double sim_time_s = 0;                        // virtual time at the end
  double wall_s = 0;                            // real time the simulation took
  double compute_wall_s = 0;                    // real time spent in model compute (inner steps, evaluation)
  std::int64_t parameters = 0;
  std::vector<at::Tensor> final_params;         // each worker's parameters at its end, flattened
  std::int64_t stalls = 0;                      // sim.stalls_per_minute's stalls
  std::vector<std::string> shared_digests;      // each worker's digest of the members' shared state at its end (PeerOutcome::shared_digest; empty: none)
  nlohmann::json pipeline;                      // a pipeline's run: makespans, per-node time, timeline (sim/pipeline_cluster.h); null otherwise
};

using ClusterProgress = std::function<void(int worker, std::int64_t step, std::int64_t steps)>;

[[nodiscard]] Result<ClusterResult> run_cluster(const train::RunConfig& config, const train::Corpus& corpus,
                                                const ClusterProgress& progress = {});

}  // namespace gossamer::sim
