// A real peer of a multi-process run: what `gossamer peer` does.
//
// The first peer defines the run from its config; it and every peer that holds the run spec repeat
// it over gossip (announcements.h).
// A joiner takes the spec it hears, checks the hash, and, if it was given a config of its own,
// refuses to start when the two differ. The spec's hash is the run id of the peer's links, so peers
// of another run are refused at the handshake. Training starts once `wait_for` peers are ready
// (round 0); each peer trains its own shard (its rank in that group) and synchronizes at every round
// over a group agreed through coordinator.h, with links per epoch (peer_links.h); when a method's
// rounds fall, and what a newcomer is given, is in rounds.h and docs/peer.md. The runtime itself, in
// named parts and on any clock, gossip and links, is peer_runtime.h; run_peer gives it the real ones. Every
// method but `local` runs; ddp over our all-reduce or Gloo (rendezvous over each group's links). A
// failed round is retried once without the peers that are gone, else skipped; all of it is logged
// and counted.
//
// The run folder (out_dir) holds: address (the gossip address to --join, then the links' address),
// config.toml, metrics.jsonl
// (one record per round and evaluation, with the peer id), checkpoint.bin (atomic; at the first
// round boundary after every train.checkpoint_every steps, and at the end) and summary.json.
//
// Threading: run_peer blocks the calling thread until the run ends, fails, or `stop` becomes true
// (checked between steps; the peer then leaves gracefully). Errors: kInvalidArgument for what the
// user must change (no config on the first peer, a config that differs from the run's, the `local`
// method), others for network and I/O failures.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/outer.h"
#include "train/worker.h"
#include "transport/link_profile.h"
#include "transport/secure_channel.h"

namespace gossamer::runtime {

struct PeerRequest {
  std::string listen = "127.0.0.1:0";  // host:port of this peer's gossip endpoint (port 0: ephemeral)
  std::vector<std::string> join;       // host:port of running peers
  // HOST or HOST:PORT others reach this peer's gossip at (a port forward, a public name); its links
  // are announced at HOST:(PORT + link port - gossip port). Empty: the listen address.
  std::string advertise;
  // The links' port; nullopt: the gossip port + 1 (ephemeral when the gossip port is).
  std::optional<std::uint16_t> link_port;
  // This machine accepts no connections (behind NAT), known beforehand: no dial-back check; it dials
  // the others and reaches other such peers through a relay. Otherwise a dial-back check decides.
  bool outbound_only = false;
  std::optional<train::RunConfig> config;
  std::optional<transport::RunKey> key;
  std::filesystem::path out_dir;
  // Restart from out_dir/checkpoint.bin (its stored config is the run's); the peer then catches up
  // with the members if the run went on without it.
  bool resume = false;
  // Restart from this state instead (the Python package's load_state_dict), in a new out_dir.
  std::optional<train::CheckpointState> resume_state;
  std::size_t wait_for = 1;  // peers that must be ready before training starts
  std::optional<transport::LinkProfile> shape;  // shape this peer's group links (emulating distance)
  // This peer's failure detector: a peer silent this long is dead and rounds go on without it; it is
  // suspect after half of it (still counted in rounds). At least 5 gossip periods (0.5 s).
  Nanos dead_after = std::chrono::seconds(1);
  // A fault drill: > 0, the process dies abruptly (std::_Exit, no goodbye) before this step.
  std::int64_t crash_at_step = 0;
  // A fault drill: > 0, the process dies abruptly in this round's collective, once its own share of
  // the average reached half the group (between the exchange and the commit).
  std::int64_t crash_mid_round = 0;
  // A drill for a slower machine: > 1, every inner step takes this many times as long (the peer
  // sleeps the difference after computing it, and counts the whole as compute).
  double throttle = 1.0;
  Nanos spec_timeout = std::chrono::seconds(60);
  std::optional<std::string> device;  // --device: this machine's train.device, overriding the run's
  Nanos start_timeout = std::chrono::minutes(10);
  const std::atomic<bool>* stop = nullptr;
  // A caller's own training (the Python package; model.kind = external): its model, data and inner
  // optimizer instead of a Worker over the run's corpus. Its evaluate callback, if any, evaluates.
  std::shared_ptr<train::ExternalTraining> external;
};

struct PeerOutcome {
  std::int64_t steps = 0;
  std::int64_t rounds = 0;
  std::int64_t skipped_rounds = 0;
  std::int64_t retries = 0;
  std::optional<double> final_val_loss;
  std::string params_digest;  // BLAKE2b-256 of the final parameters (hex)
  // BLAKE2b-256 of the state the members share (outer weights and momentum: OuterOptimizer::
  // save_shared; hex): the same at every member that finished with the run, whatever the method
  // (Streaming DiLoCo's members' own parameters differ by design). Empty where the peer stopped early.
  std::string shared_digest;
  bool finished = false;
  bool pipeline = false;  // a pipeline run (pipeline.enabled): steps are iterations, the digest is this node's stage
  train::WorkerAccount account;  // what the training loop counted
  at::Tensor final_params;       // flattened
};

// The run spec's wire form and hash, shared with tests.
std::string spec_hash_hex(const train::RunConfig& config);

[[nodiscard]] Result<PeerOutcome> run_peer(const PeerRequest& request);

}  // namespace gossamer::runtime
