// Peer: one peer of a multi-process run, in named parts, on the Host it is given (host.h: clock,
// gossip, links, reachability, pace), keeping what it leaves behind in a RunStore (run_store.h: spec,
// records, checkpoints, summary, a newcomer's arriving state). `gossamer peer` gives it the machine's
// (run_peer in peer.h: ZeroMQ, TCP, the process's clock, a run folder); the simulator emulated ones
// (sim/cluster.h: the virtual clock, the GossipFabric and TransportFabric, memory), so a simulated run
// goes through the very same membership, rounds and state transfer as a real one. Each part keeps its
// own statistics (peer_stats.h), which write their own keys of the records and the summary.
//
// The parts, in the order run() takes them:
//   learn_run      the run spec: this peer's own (the first peer, or a resume), else the one the
//                  peers it joined announce; its config, method and round schedule
//   link_up        the links' transport (the spec's hash is its run id), the state server, the
//                  group links, the round coordinator and the corpus
//   join_or_start  round 0's group when the run has not started, else a state transfer from the
//                  members; the Worker and its outer optimizer; a resumed checkpoint
//   rounds         the training loop; before the step after which a round's collective launches,
//                  regroup() agrees the round's group (asked ahead, retried after a failure); after a
//                  round, boundary() offers the shared state to newcomers and checkpoints when due
//   finish         a last agreement as a barrier, the final checkpoint, the outcome and summary
// Joining, in both roles (a newcomer's fetch, adoption and catch-up; a member's offer at each
// boundary, whose snapshot, kept updates and server are its DonorDuty, donor_duty.h), and
// join_or_start are in peer_join.cpp; the rest in peer_runtime.cpp.
// A pipeline run (pipeline.enabled) takes learn_run, then run_pipeline: the peers ready at the
// start become the pipeline's nodes (runtime/pipeline_process.h), and nobody joins later.
//
// Threading: run() blocks the calling thread (a simulated thread in a simulation); everything it
// starts runs on threads of the environment's clock and is joined before run() returns. Errors:
// kInvalidArgument for what the user must change, kAborted when stopped, others for network and
// I/O failures.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/hash.h"
#include "core/status.h"
#include "runtime/announcements.h"
#include "runtime/coordinator.h"
#include "runtime/donor_duty.h"
#include "runtime/host.h"
#include "runtime/peer.h"
#include "runtime/peer_links.h"
#include "runtime/peer_stats.h"
#include "runtime/pipeline_process.h"
#include "runtime/rounds.h"
#include "runtime/run_store.h"
#include "runtime/state_sync.h"
#include "runtime/update_log.h"
#include "train/checkpoint.h"
#include "train/outer.h"
#include "train/run.h"
#include "train/worker.h"
#include "transport/gossip.h"
#include "transport/transport.h"

namespace gossamer::runtime {

// What the caller knows before the runtime starts.
struct PeerPlan {
  std::optional<std::string> own_spec;            // the run this peer means to take part in (its config or checkpoint)
  bool first = false;                             // it defines the run (joined nobody)
  std::uint32_t wait_for = 1;                     // the first peer's: peers ready before training starts
  std::optional<train::CheckpointState> resumed;  // its own checkpoint, to resume from
  std::string resumed_from;                       // where that came from, for messages
  std::optional<transport::LinkProfile> shape;    // shape its group links
  Nanos dead_after = std::chrono::seconds(1);
  Nanos spec_timeout = std::chrono::seconds(60);
  std::optional<std::string> device;  // this machine's train.device, whatever the run's config says
  std::optional<optim::Poison> poison;  // a simulated poisoned worker's (sim.poison); never in real runs
  Nanos start_timeout = std::chrono::minutes(10);
  const std::atomic<bool>* stop = nullptr;  // checked between steps and while waiting
  // This machine accepts no connections (behind NAT), known beforehand: no dial-back check.
  bool outbound_only = false;
  // The run has a run key (--key): relays forward only links of a keyed run (transport/relay.h).
  bool keyed = false;
  // Fault drill (`gossamer peer --crash-mid-round`, sim.crash_mid_round): in this round's collective,
  // once this peer's own share of the average reached half the group, it dies (PeerEnvironment::
  // crash). 0: never.
  std::int64_t crash_mid_round = 0;
};

// What the runtime runs on, and where its results go.
struct PeerEnvironment {
  Host* host = nullptr;  // clock, gossip, links, reachability, pace (host.h); outlives the Peer
  std::string name;      // for the records: the peer's id in real runs, the worker in a simulation
  // Checks of the run's config against this environment, after validation (memory, Gloo's host).
  std::function<Status(const train::RunConfig&)> check_run;
  std::function<Result<std::shared_ptr<const train::Corpus>>(const train::RunConfig&)> corpus;
  // Where the spec, records, checkpoints, summary and a newcomer's arriving state go (run_store.h):
  // the run folder of a real peer. Absent: memory of this Peer's own, no checkpoints kept.
  std::shared_ptr<RunStore> store;
  // A simulation's: false before step `next` ends the run at once (a crash: no goodbye, no
  // checkpoint); the environment has cut its links and gossip already. (A real peer's fault drill
  // ends its process inside the call.)
  std::function<bool(std::int64_t next)> alive;
  // The fault drill's death (PeerPlan::crash_mid_round), called from inside a collective: a real
  // peer's process ends there; a simulation cuts the node's links and gossip and stops the peer.
  std::function<void()> crash;
  // A caller's own training (PeerRequest::external): the Worker is made over it, and no corpus is read.
  std::shared_ptr<train::ExternalTraining> external;
  bool evaluate = true;     // at eval_every and the end (a simulation lets one peer do it)
  bool set_threads = true;  // apply train.threads to LibTorch (the process's setting)
};

class Peer {
 public:
  Peer(PeerPlan plan, PeerEnvironment env);
  ~Peer();
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  [[nodiscard]] Result<PeerOutcome> run();
  // True when run() ended because alive() said the process died.
  bool crashed() const { return crashed_; }

  // The parts run() takes in order. Each may be taken alone (tests do), once the ones before it
  // succeeded; the accessors below say what a part settled.
  [[nodiscard]] Status learn_run();
  [[nodiscard]] Status link_up();
  [[nodiscard]] Status join_or_start();
  [[nodiscard]] Result<train::WorkerAccount> rounds();
  [[nodiscard]] Result<PeerOutcome> finish(const train::WorkerAccount& account);
  // Instead of link_up .. finish when the run is a pipeline (pipeline.enabled; peer_pipeline.cpp):
  // round 0's group is the pipeline's nodes, in id order, and run_pipeline_process trains it.
  [[nodiscard]] Result<PeerOutcome> run_pipeline();
  // The pipeline over round 0's group: this peer's node, every node's id and address to dial.
  [[nodiscard]] Result<PipelineProcessRequest> pipeline_request(const GroupView& group);

  const train::RunConfig& config() const { return config_; }        // learn_run
  const RoundSchedule& schedule() const { return schedule_; }       // learn_run
  int shard() const { return rank_; }                               // join_or_start
  int shards() const { return world_; }                             // join_or_start
  const std::vector<MemberInfo>& members() const { return members_; }  // join_or_start, then each regroup
  std::int64_t steps_done() const { return worker_ ? worker_->steps_done() : 0; }

 private:
  class Pending;  // a group asked for from a thread of its own

  // too_late (checked while waiting): true ends the wait as if the run had started without this peer.
  [[nodiscard]] Result<std::optional<GroupView>> wait_for_start(const std::function<bool()>& too_late = {});
  [[nodiscard]] Result<FetchResult> fetch_newest(Deadline deadline);
  [[nodiscard]] Status adopt(const FetchResult& fetched);
  // After adopt(): replays the updates the donors applied since the snapshot (catch-up), then tells
  // the members which round this peer takes part in. kOutOfRange when the donors no longer keep them.
  // slack: it was not in time for the round it named before; it names the round after the next.
  [[nodiscard]] Status catch_up(Deadline deadline, bool slack = false);
  // catch_up()'s parts: whether, before its first batch, the pace its snapshot came at shows it will
  // not gain on the members over `index`; and, caught up at step `at`, where it starts and the round
  // it takes part in (`intended`: the one it named, if any).
  bool foresee_no_gain(const std::vector<UpdateInfo>& index) const;
  void take_part_after(std::int64_t at, std::optional<std::int64_t> intended, std::int64_t replayed);
  // A newcomer's whole join: a snapshot (a newer one when it fell too far behind), then catch_up().
  // `slack`: as catch_up()'s (a member left out of a round, joining again).
  [[nodiscard]] Status join(Deadline deadline, bool slack = false);
  // A newcomer's update, recorded by a member (optim/updates.h), replayed on this peer's state.
  [[nodiscard]] Status replay(std::int64_t step, ByteView update);
  // Newcomers waiting at a boundary with a fresh snapshot offered: awaited at the next round (as
  // leader, for a while) where their state should arrive well within a round.
  void await_newcomers(const std::vector<transport::PeerId>& newcomers, std::int64_t done_step);
  // The whole training state now (the in-flight average settled first), as a checkpoint holds it.
  train::CheckpointState checkpoint_state();
  void settle_for_checkpoint();
  [[nodiscard]] Status save_checkpoint();
  void boundary(std::int64_t done_step);
  void ask_ahead(std::int64_t step);
  std::optional<optim::Group> regroup(std::int64_t step);
  // `merged`: the round went through for the others with this peer's contribution in it; otherwise
  // what it computed since its last merge is carried into its next contribution at its age's weight
  // (outer.late_work = "merge") or dropped.
  std::optional<optim::Group> left_out(std::int64_t round, const Status& why, bool merged = false);
  bool stop_requested() const { return plan_.stop != nullptr && plan_.stop->load(); }
  // Whether the others can open connections to `address` of this peer (`what`: "gossip", "links")
  // by a dial-back check; when they cannot, the peer becomes outbound-only from then on.
  void check_reachable(const std::string& address, const std::string& what);
  // An outbound-only peer with no live member that accepts connections can reach nobody: the error
  // saying so, or ok.
  Status check_not_stranded() const;
  // An outbound-only peer in a run without a key can link with the members that accept connections
  // only (a relay needs the key): kInvalidArgument, with what to do, where another outbound-only
  // member is in the run before it (already there when the run is under way; at the start, the one
  // with the smallest id stays). Called before this peer takes part, so the others go on.
  Status check_relay_needs_key();
  // This peer's link speed where it is known (a simulation's access link, --shape).
  std::optional<double> own_link_bytes_per_s() const;
  // The layout of a group of `members` (CoordinatorOptions::layout): optim::choose_width on the
  // method's payload, gossip's round trip and this peer's link; the codec of the method's
  // all-reduce, or null when its collective needs every link.
  std::uint32_t layout_for(std::size_t members);
  const quant::EncodeOptions* layout_codec() const;
  // This peer's link speed under --shape (what it paces its own downloads to).
  std::optional<double> shaped_link_bytes_per_s() const;
  // A state link as this peer uses it: shaped like its group links under --shape.
  std::shared_ptr<transport::Link> shape_state_link(std::shared_ptr<transport::Link> link);
  std::atomic<std::uint64_t> state_links_shaped_{0};  // seeds the shapers' loss draws
  Deadline after(Nanos d) const { return Deadline::after(clock_, d); }
  // Whether a newcomer fetches the members' parameters and inner optimizer besides the outer state
  // (the method table's `newcomer` trait; ddp's members step one AdamW together).
  bool newcomer_takes_inner_state() const {
    return optim::method_info(outer_config_.method).newcomer == optim::NewcomerNeeds::kOptimizerState;
  }
  static constexpr Nanos kLinkTimeout = std::chrono::seconds(30);  // to link up a group's members

  PeerPlan plan_;
  PeerEnvironment env_;
  Clock& clock_;
  transport::Gossip& gossip_;

  // learn_run
  std::shared_ptr<HeardSpec> heard_;
  std::shared_ptr<JoinBoard> board_;
  Spec spec_;
  Digest spec_hash_;
  train::RunConfig config_;
  optim::OuterConfig outer_config_;
  RoundSchedule schedule_;
  bool ddp_ = false;
  Nanos round_timeout_{0};
  std::atomic<std::int64_t> current_round_{-1};
  std::atomic<std::int64_t> progress_{-1};  // inner steps done, as the state server tells newcomers (-1: not training)
  std::unique_ptr<SpecAnnouncer> announcer_;

  // link_up (declared so that they go in the right order: links and server before the transport)
  OpenedLinks opened_;
  bool outbound_only_ = false;  // this peer accepts no connections: it dials, or goes through a relay
  std::unique_ptr<DonorDuty> donor_;  // its part in newcomers' joins: the snapshot offered, the updates kept
  std::unique_ptr<PeerLinks> links_;
  std::shared_ptr<Coordinator> coordinator_;
  std::mutex layout_mu_;
  std::map<std::size_t, std::uint32_t> layouts_;  // group size -> width, once the payload is known
  std::atomic<double> layout_payload_{0};          // bytes of one all-reduce; 0 until the model is built
  std::shared_ptr<const train::Corpus> corpus_;

  // join_or_start
  std::optional<GroupView> start_;
  std::optional<FetchResult> fetched_;
  std::unique_ptr<StateFetch> session_;  // a newcomer's donors, until it takes part in a round
  Nanos join_started_{0};
  std::int64_t snapshot_round_ = 0;            // of the snapshot this peer joined from
  JoinStats join_stats_;
  int rank_ = 0, world_ = 1;
  std::unique_ptr<train::Worker> worker_;
  optim::OuterSetup setup_;

  // rounds: the state of the round in effect
  std::int64_t agreed_round_ = 0;
  std::uint64_t epoch_ = 0;
  std::vector<MemberInfo> members_;
  std::size_t start_size_ = 0;  // group sizes other than this one are logged
  std::int64_t last_asked_ = -1;
  std::unique_ptr<Pending> ahead_;
  GroupKeepingStats group_stats_;
  std::int64_t last_checkpoint_ = 0;
  // Left out of a round since the loop last asked: what became of its work (LoopHooks::left_behind).
  std::optional<train::LeftBehind> left_behind_;
  std::atomic<bool> drilled_{false};  // the crash drill fired (PeerPlan::crash_mid_round)
  Nanos last_boundary_{0}, round_length_{0};  // when the last round ended, and how long a round takes
  std::int64_t last_boundary_step_ = 0;
  std::optional<double> final_val_;
  bool stopped_ = false, crashed_ = false;
  Status failure_;
};

}  // namespace gossamer::runtime
