// State sync: how a newcomer gets the run's current outer state from the members, in checksummed
// chunks, from several donors at once.
//
// After a round every DiLoCo member holds the same bytes: the parameters and the outer optimizer's
// state. While a newcomer is waiting, each member keeps a Snapshot of them after each round and
// offers it over gossip (round, the link address that serves it, the hash). The newcomer takes the
// newest round offered, asks every donor of it for the manifest (size, chunk size, one BLAKE2b-256
// per chunk and one for the whole), checks that they agree, then asks for the chunks spread over the
// donors. A chunk whose hash is wrong is asked again elsewhere and its donor dropped; a donor that
// fails or leaves mid-transfer only loses its share to the others. The result is verified whole.
//
// Wire (on a link opened with epoch 0, see peer_links.h), little-endian through core/wire:
//   request  (kStateRequestTag):  version u8 | kind u8 (1 manifest, 2 chunk) | round i64 | chunk u32
//   response (kStateResponseTag): version u8 | ok u8 | body (a manifest, a chunk, or a reason str)
//   manifest: round i64 | step i64 | shards u32 | total u64 | chunk bytes u32 | count u32 |
//             whole digest [32] | count x digest [32]
// Limits: total <= 8 GiB, chunk <= 16 MiB; anything else is refused as malformed.
//
// Threading: StateServer serves each link from a thread it owns; offer() may be called from any
// thread. fetch_state blocks the caller until done or its deadline. Errors: kUnavailable when no
// donor could finish the transfer, kDataLoss when every copy of some chunk failed its hash.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "core/clock.h"
#include "core/signal.h"
#include "core/hash.h"
#include "core/status.h"
#include "transport/transport.h"
#include "transport/tags.h"

namespace gossamer::run {

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
  Bytes encode() const;
  [[nodiscard]] static Result<StateManifest> decode(ByteView bytes);
};

// The state of one round, ready to be served.
struct Snapshot {
  StateManifest manifest;
  Bytes bytes;
  static std::shared_ptr<const Snapshot> make(std::int64_t round, std::int64_t step, std::uint32_t shards, Bytes bytes,
                                              std::uint32_t chunk_bytes = 1u << 20);
};

class StateServer {
 public:
  explicit StateServer(Clock& clock = real_clock()) : clock_(clock) {}
  ~StateServer();  // closes the links being served and joins their threads
  StateServer(const StateServer&) = delete;
  StateServer& operator=(const StateServer&) = delete;

  // Serves `snapshot` from now on (the previous one stays available too, for a newcomer mid-way).
  void offer(std::shared_ptr<const Snapshot> snapshot);
  // Answers the requests that arrive on `link` until it closes.
  void serve(std::shared_ptr<transport::Link> link);
  std::uint64_t bytes_served() const { return served_.load(); }

 private:
  std::shared_ptr<const Snapshot> find(std::int64_t round) const;
  Clock& clock_;
  mutable std::mutex mu_;
  std::shared_ptr<const Snapshot> current_, previous_;
  std::vector<std::shared_ptr<transport::Link>> links_;
  std::vector<std::unique_ptr<ClockThread>> threads_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> served_{0};
};

struct Donor {
  std::string address;  // where its links listen
  std::string name;     // for messages (its peer id)
};

struct FetchResult {
  StateManifest manifest;
  Bytes bytes;
  std::uint64_t bytes_received = 0;
  int donors_used = 0;
  int donors_failed = 0;
};

// Opens a state link to `address` (epoch 0), as PeerLinks' acceptor expects.
[[nodiscard]] Result<std::shared_ptr<transport::Link>> open_state_link(transport::Transport& transport, const std::string& address,
                                                                      Deadline deadline);

[[nodiscard]] Result<FetchResult> fetch_state(transport::Transport& transport, const std::vector<Donor>& donors, std::int64_t round,
                                              Deadline deadline, Clock& clock = real_clock());

}  // namespace gossamer::run
