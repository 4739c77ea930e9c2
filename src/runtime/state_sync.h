// State sync: how a newcomer gets the run's state from the members, in checksummed chunks, from
// several donors at once, and then catches up (docs/joining.md).
//
// When a newcomer asks to join, each member takes a Snapshot of the state it shares with the others
// at a round boundary (unless it offers one still young enough), offers it over gossip (round, the
// link address that serves it) and from then on keeps the updates it applies (update_log.h). The
// newcomer takes the newest round offered, asks every donor of it for the manifest (size, chunk
// size, one BLAKE2b-256 per chunk and one for the whole), keeps the donors that agree, and fetches
// the chunks spread over them. A chunk whose hash is wrong is asked again elsewhere and its donor
// dropped; a donor that fails or leaves mid-transfer only loses its chunks in flight to the others.
// Then it asks the donors which updates they hold after the snapshot's step and fetches each the
// same way (an update is an object with a manifest too), to replay them.
//
// Wire (on a link opened with epoch 0, see peer_links.h), little-endian through core/wire:
//   request  (kStateRequestTag):  version u8 | kind u8 | at i64 | chunk u32
//     kind 1 a snapshot's manifest (at: round), 2 one of its chunks,
//          3 an update's manifest (at: its step), 4 one of its chunks,
//          5 the index of updates after step `at` (chunk: at most this many entries)
//   response (kStateResponseTag): version u8 | ok u8 | body (a manifest, a chunk, an index, or a reason str)
//   manifest: round i64 | step i64 | shards u32 | total u64 | chunk bytes u32 | count u32 |
//             whole digest [32] | count x digest [32]
//   index:    complete_after i64 | count u32 | count x (step i64 | total u64 | chunk bytes u32 | whole digest [32])
//             (complete_after: the log holds every update applied after that step)
// Limits: a snapshot <= 1 TiB (and what its store has room for), an update <= 8 GiB, chunk <= 16 MiB,
// index <= 1024 entries; anything else is refused as malformed.
//
// Threading: StateServer serves each link from a thread it owns; offer() may be called from any
// thread. StateFetch's calls block the caller until done or their deadline. Errors: kUnavailable
// when no donor could finish a transfer, kDataLoss when every copy of some chunk failed its hash,
// kOutOfRange when no donor's log reaches back to the step asked for.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/bytes.h"
#include "core/clock.h"
#include "core/signal.h"
#include "core/hash.h"
#include "core/status.h"
#include "transport/transport.h"
#include "transport/tags.h"

namespace gossamer::runtime {

inline constexpr transport::Tag kStateRequestTag = transport::tags::kStateRequest;
inline constexpr transport::Tag kStateResponseTag = transport::tags::kStateResponse;

struct StateManifest {
  std::int64_t round = 0;
  std::int64_t step = 0;   // inner steps done at that round
  std::uint32_t shards = 1;  // the run's shard count (the newcomer picks its shard from it)
  std::uint64_t total = 0;
  std::uint32_t chunk_bytes = 0;
  Digest whole;
  std::vector<Digest> chunks;
  // Where chunk i starts, and how long it is.
  std::pair<std::uint64_t, std::size_t> range(std::size_t i) const;
  Bytes encode() const;
  [[nodiscard]] static Result<StateManifest> decode(ByteView bytes);
};

// What a donor's update log holds at one step.
struct UpdateInfo {
  std::int64_t step = 0;
  std::uint64_t total = 0;
  std::uint32_t chunk_bytes = 0;  // one chunk (total <= chunk_bytes): fetched without a manifest, its hash is the whole's
  Digest whole;
  friend bool operator==(const UpdateInfo&, const UpdateInfo&) = default;
};

// The state of one round (or one update), ready to be served.
struct Snapshot {
  StateManifest manifest;
  Bytes bytes;
  static std::shared_ptr<const Snapshot> make(std::int64_t round, std::int64_t step, std::uint32_t shards, Bytes bytes,
                                              std::uint32_t chunk_bytes = 1u << 20);
};

// The chunk size a snapshot of `total` bytes is served in: at least 16 chunks (a few donors share
// even a small state), 64 KiB to 1 MiB (a lost chunk costs little), larger only where a huge state
// would otherwise exceed the manifest's 2^18 chunks.
std::uint32_t snapshot_chunk_bytes(std::uint64_t total);

class UpdateLog;  // update_log.h

// The most entries one index answer holds.
inline constexpr std::uint32_t kMaxIndexEntries = 1024;

// A rate limit over whatever several threads send or ask for: each reserves its bytes' time in turn.
// Thread-safe.
class Pacer {
 public:
  void set_rate(double bytes_per_s);  // 0: unlimited
  double rate() const;
  // Waits on `clock` until `bytes` may go; false (at once) when `stop` becomes true meanwhile.
  bool wait_turn(Clock& clock, std::size_t bytes, const std::atomic<bool>* stop = nullptr);
  bool would_wait(Clock& clock) const;  // whether the next turn is still ahead
  double waited_s() const;  // all waits together

 private:
  mutable std::mutex mu_;
  double rate_ = 0;
  Nanos next_free_{0}, waited_{0};
};

class StateServer {
 public:
  // `log`: the updates this member keeps for catch-up (none: it serves snapshots only).
  explicit StateServer(Clock& clock, std::shared_ptr<const UpdateLog> log = nullptr) : clock_(clock), log_(std::move(log)) {}
  ~StateServer();  // closes the links being served and joins their threads
  StateServer(const StateServer&) = delete;
  StateServer& operator=(const StateServer&) = delete;

  // Serves `snapshot` from now on (the previous one stays available too, for a newcomer mid-way).
  void offer(std::shared_ptr<const Snapshot> snapshot);
  // Drops the snapshots it offers (no newcomer needs them any more).
  void withdraw();
  // Serves at most `bytes_per_s` (all links together) from now on; 0: as fast as the links go.
  void set_rate(double bytes_per_s);
  double rate() const;
  // The size of the newest snapshot offered (0: none).
  std::uint64_t offered_bytes() const;
  // Where this donor's training is (its inner steps done), said in every answer to an update index:
  // a newcomer caught up to the members' last round end learns how far into the next round they are.
  void set_progress(std::function<std::int64_t()> steps_done);
  // Answers the requests that arrive on `link` until it closes.
  void serve(std::shared_ptr<transport::Link> link);
  std::uint64_t bytes_served() const { return served_.load(); }
  std::uint64_t requests() const { return requests_.load(); }  // answered so far
  // Time spent waiting for the rate limit, in seconds (all links together).
  double throttled_s() const;

 private:
  std::shared_ptr<const Snapshot> find(std::int64_t round) const;
  Bytes answer_request(std::uint8_t kind, std::int64_t at, std::uint32_t chunk);
  Clock& clock_;
  std::shared_ptr<const UpdateLog> log_;
  mutable std::mutex mu_;
  std::shared_ptr<const Snapshot> current_, previous_;
  std::vector<std::shared_ptr<transport::Link>> links_;
  std::vector<std::unique_ptr<ClockThread>> threads_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> served_{0}, requests_{0};
  Pacer pacer_;
  std::function<std::int64_t()> progress_;  // (set before serving)
};

struct Donor {
  std::string address;  // where its links listen
  std::string name;     // for messages (its peer id)
};

class SnapshotStore;  // state_store.h

struct FetchResult {
  StateManifest manifest;
  std::shared_ptr<SnapshotStore> store;  // holds the snapshot
  ByteView bytes;                        // the snapshot, in `store`
  std::uint64_t bytes_received = 0;
  std::uint64_t bytes_resumed = 0;  // kept from an earlier transfer of the same snapshot
  int donors_used = 0;
  int donors_failed = 0;
};

// Opens a state link to `address` (epoch 0), as PeerLinks' acceptor expects.
[[nodiscard]] Result<std::shared_ptr<transport::Link>> open_state_link(transport::Transport& transport, const std::string& address,
                                                                      Deadline deadline);

// A newcomer's session with the donors of one round's snapshot: the links stay open for the updates
// after it. Destroying it closes them.
class StateFetch {
 public:
  // Opens a state link to every donor and asks each for the manifest of round `round`; keeps the
  // donors whose manifests agree with the most others (noloco's members differ: then one donor).
  // `wrap`, when given, makes each link what this peer uses (a shaped one, emulating distance).
  using LinkWrap = std::function<std::shared_ptr<transport::Link>(std::shared_ptr<transport::Link>)>;
  [[nodiscard]] static Result<std::unique_ptr<StateFetch>> open(transport::Transport& transport, const std::vector<Donor>& donors, std::int64_t round,
                                                                Deadline deadline, Clock& clock, const LinkWrap& wrap = {});
  ~StateFetch();
  StateFetch(const StateFetch&) = delete;
  StateFetch& operator=(const StateFetch&) = delete;

  const StateManifest& manifest() const { return manifest_; }
  // Paces what this newcomer asks for to at most `bytes_per_s` (its own link); 0: no pacing.
  void set_rate(double bytes_per_s) { pacer_.set_rate(bytes_per_s); }
  // While this session lives, `ping` is called every `every` on a thread of its own: the newcomer
  // tells the members it still needs them (over a slow link its requests may come rounds apart).
  void keep_alive(std::function<void()> ping, Nanos every);
  // Updates larger than `bytes` are refused when listed (before anything is set aside for them): a
  // donor that lists one is dropped. By default only the wire's bound (8 GiB) applies.
  void set_update_limit(std::uint64_t bytes) { update_limit_ = bytes; }
  // When `stop` becomes true, a transfer of chunks, an index or an update's manifest under way ends
  // within a fraction of a second (kAborted),
  // keeping what it stored (a stopped or killed newcomer resumes from it).
  void set_stop(const std::atomic<bool>* stop) { stop_ = stop; }
  // The snapshot into `store`, its chunks fetched from every donor at once (but those the store still
  // holds from an earlier transfer), verified whole.
  [[nodiscard]] Status snapshot(SnapshotStore& store, Deadline deadline);
  // The updates the donors hold after `step`, oldest first: the donors that list another update for
  // some step than the most others do are dropped. kOutOfRange when no donor's log reaches back to
  // `step` (the newcomer fell too far behind: a newer snapshot is needed).
  [[nodiscard]] Result<std::vector<UpdateInfo>> updates_after(std::int64_t step, Deadline deadline);
  // The furthest inner step the donors that answered the last updates_after() said they are at (-1:
  // none said). Untrusted: a newcomer uses it only within the round it is in.
  std::int64_t donors_step() const { return donors_step_; }
  // Updates listed by updates_after(), in that order, fetched like the snapshot (the chunks of all of
  // them at once, a few requests in flight per donor) and each verified against its hash: the first
  // ones, as many as some donors hold in common and at most 2 GiB together (at least one, or an
  // error).
  [[nodiscard]] Result<std::vector<Bytes>> updates(const std::vector<UpdateInfo>& infos, Deadline deadline);

  // What a transfer of the snapshot into `store` gave, as fetch_state reports it.
  [[nodiscard]] Result<FetchResult> result(std::shared_ptr<SnapshotStore> store) const;
  std::uint64_t bytes_received() const { return received_; }
  int donors_used() const;  // donors that served something
  int donors_failed() const { return failed_; }
  int donors_left() const;  // still in the session

 private:
  struct Source;
  explicit StateFetch(Clock& clock);
  // One chunk to fetch: what to ask for, where it goes, what it must hash to.
  struct Piece {
    std::uint8_t kind = 0;
    std::int64_t at = 0;
    std::uint32_t chunk = 0;
    Bytes* out = nullptr;           // where it goes: memory,
    SnapshotStore* store = nullptr;  // or a store
    std::uint64_t offset = 0;
    std::size_t size = 0;
    Digest digest;
  };
  static void add_pieces(std::vector<Piece>& pieces, std::uint8_t kind, std::int64_t at, const StateManifest& manifest, Bytes& out);
  // Fetches `pieces` from `sources` at once, up to kWindow requests in flight per donor; a donor
  // that fails one is dropped and its pieces go to the others.
  Status fetch_pieces(const std::vector<Piece>& pieces, const std::vector<std::size_t>& sources, Deadline deadline);
  struct PieceQueue;  // the pieces still to fetch, shared by the donors' threads
  // One donor's thread of fetch_pieces: it takes pieces from `q` until none is left or it fails one.
  void fetch_from(std::size_t source, const std::vector<Piece>& pieces, Deadline deadline, PieceQueue& q);
  void drop(std::size_t source, const std::string& why);
  bool stopped() const { return stop_ != nullptr && stop_->load(); }
  // The next answer on `link`, read in short waits so that a stop is heard (kAborted).
  Result<Bytes> read_answer_or_stop(transport::Link& link, Deadline deadline);
  // A request and its answer, the answer read as read_answer_or_stop does.
  Result<Bytes> ask_or_stop(transport::Link& link, std::uint8_t kind, std::int64_t at, std::uint32_t chunk, Deadline deadline);

  Clock& clock_;
  std::vector<std::unique_ptr<Source>> sources_;
  StateManifest manifest_;
  std::map<std::int64_t, std::vector<std::size_t>> holders_;  // update step -> sources that listed it alike
  std::uint64_t received_ = 0, resumed_ = 0;
  int failed_ = 0;
  Pacer pacer_;
  const std::atomic<bool>* stop_ = nullptr;
  std::uint64_t update_limit_ = std::uint64_t{8} << 30;
  std::int64_t donors_step_ = -1;
  std::atomic<bool> closing_{false};
  std::unique_ptr<ClockThread> keepalive_;
};

// One snapshot from `donors` (StateFetch::open, then snapshot() into memory).
[[nodiscard]] Result<FetchResult> fetch_state(transport::Transport& transport, const std::vector<Donor>& donors, std::int64_t round,
                                              Deadline deadline, Clock& clock);

}  // namespace gossamer::runtime
