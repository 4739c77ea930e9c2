// What peers announce to everyone over gossip besides rounds: the run spec (topic "gossamer.spec")
// and who wants the training state or offers it (topic "gossamer.state").
//
// Run spec: version u8 | kind u8, then
//   BEACON (1): BLAKE2b-256 of the TOML u8[32] | peers to wait for at the start u32 | the
//               announcer's current round i64 (-1 before the start)
//   SPEC (2):   the same digest | TOML str | peers to wait for u32 | round i64
//   WANT (3):   nothing (a peer that has no spec yet asks for it)
// A broadcast reaches every peer at a cost of a few messages per peer, so what is repeated must be
// small and come from few: every second, the (at most) three peers holding the spec with the lowest
// ids among the live ones they know send a BEACON (so that joiners see the run is under way), and a
// SPEC instead while some peer has asked for it in the last two seconds; a joiner repeats WANT every
// second until a SPEC whose hash checks out arrives.
// State board: version u8 | kind u8 (1 JOIN, 2 OFFER) | id u64, then for JOIN optionally the
// newcomer's link speed u64 (bytes/s; absent: unknown), for OFFER: round i64 | link address str. A
// newcomer repeats JOIN while it waits; members that snapshot their state after a round OFFER it
// (state_sync.h serves it).
//
// Untrusted input: malformed messages, other versions and specs whose hash does not match are
// dropped and logged (a repeated problem once). Threading: handlers run on the gossip thread; every
// method is thread-safe; the gossip handlers hold the board and the heard spec by shared or weak
// pointers, so either may go first.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/signal.h"
#include "core/status.h"
#include "run/state_sync.h"
#include "transport/gossip.h"

namespace gossamer::run {

inline constexpr std::size_t kMaxSpec = 60 * 1024;  // a gossip broadcast carries at most 64 KiB

struct Spec {
  std::string toml;
  std::uint32_t wait_for = 1;
};

struct AnnouncerState;

// Announces the run from a thread of its own (see above), with the round this peer is at.
class SpecAnnouncer {
 public:
  SpecAnnouncer(transport::Gossip& gossip, Spec spec, const std::atomic<std::int64_t>& round, Clock& clock = real_clock());
  ~SpecAnnouncer();
  SpecAnnouncer(const SpecAnnouncer&) = delete;
  SpecAnnouncer& operator=(const SpecAnnouncer&) = delete;

 private:
  transport::Gossip& gossip_;
  const Spec spec_;
  const std::atomic<std::int64_t>& round_;
  Clock& clock_;
  std::shared_ptr<AnnouncerState> state_;  // shared with the gossip handler
  std::unique_ptr<ClockThread> thread_;
};

// What a peer hears of the run spec; shared with the gossip handler, which stays subscribed.
struct HeardSpec {
  Clock* clock = nullptr;  // the listener's
  std::mutex mu;
  std::unique_ptr<Signal> signal;  // a spec arrived
  std::optional<Spec> spec;
  std::int64_t latest_round = -1;  // the furthest round any announcer was at
  std::string last_problem;
  transport::Gossip* gossip = nullptr;  // to ask for the spec
};

std::shared_ptr<HeardSpec> listen_for_spec(transport::Gossip& gossip, Clock& clock = real_clock());

// Where peer `id` can be reached at `address`, one of its link addresses: a peer listening on a
// wildcard address (0.0.0.0, [::]) announces it as it is, and the host is taken from its gossip
// address as this peer knows it (the IP its gossip came from). Other addresses are returned as given.
std::string reachable_address(const transport::Gossip& gossip, transport::PeerId id, const std::string& address);
// Watches whether the run this peer wants to take part in is over: gossip knows peers, and none
// has been alive for `patience` (every one left or died). Call it regularly from one thread.
class RunGoneWatch {
 public:
  RunGoneWatch(const transport::Gossip& gossip, const Clock& clock, Nanos patience)
      : gossip_(gossip), clock_(clock), patience_(patience), since_(clock.now()) {}
  bool gone();

 private:
  const transport::Gossip& gossip_;
  const Clock& clock_;
  const Nanos patience_;
  Nanos since_;  // the last time a peer was alive, or when watching began
};

// Waits for the run spec, asking for it every second (kTimeout, with what to check, when nobody
// announces one in time; kAborted within 0.1 s of `stop` becoming true).
[[nodiscard]] Result<Spec> receive_spec(HeardSpec& heard, Nanos timeout, const std::atomic<bool>* stop = nullptr);

class JoinBoard {
 public:
  static std::shared_ptr<JoinBoard> make(transport::Gossip& gossip, const Clock& clock = real_clock());
  JoinBoard(transport::Gossip& gossip, const Clock& clock) : gossip_(gossip), clock_(clock) {}

  // link_bytes_per_s: this newcomer's own link where it knows it (0: unknown), so that the donors
  // can tell whether its state arrives within a round.
  void ask_to_join(double link_bytes_per_s = 0);
  void offer(std::int64_t round, const std::string& address);
  // The newcomers that asked for state in the last few seconds.
  std::vector<transport::PeerId> waiting() const;
  // The link speed newcomer `id` gave when it asked (bytes/s), if it gave one.
  std::optional<double> link_of(transport::PeerId id) const;
  // The newest round offered for at least `settle` (so most donors of it are known), or by every peer
  // alive, with its donors.
  std::optional<std::pair<std::int64_t, std::vector<Donor>>> newest_offer(Nanos settle) const;
  // Drops the offers of `round` and older (they failed, so older ones are gone too).
  void forget(std::int64_t round);

 private:
  Bytes encode(std::uint8_t kind, std::int64_t round, const std::string& address, std::uint64_t link = 0) const;
  void on_message(transport::PeerId origin, const Bytes& payload);

  static constexpr std::size_t kKeptRounds = 8;  // offered rounds remembered (the newest)

  transport::Gossip& gossip_;
  const Clock& clock_;
  mutable std::mutex mu_;
  std::map<transport::PeerId, Nanos> wanted_until_;
  std::map<transport::PeerId, double> links_;  // of the newcomers in wanted_until_ that gave theirs
  std::map<std::int64_t, std::map<transport::PeerId, std::string>> offers_;
  std::map<std::int64_t, Nanos> first_seen_;
};

}  // namespace gossamer::run
