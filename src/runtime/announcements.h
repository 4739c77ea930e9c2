// What peers tell each other about the run besides rounds, each message to one member (gossip's
// direct messages), never to everyone: the run spec (topic "gossamer.spec") and who wants the training
// state or offers it (topic "gossamer.state"). Nothing here is repeated by the members of a run on
// their own: a peer that wants something asks a few of them, and again a second later.
//
// Run spec: version u8 | kind u8, then
//   WANT (3):   nothing (a peer that has no spec, or wants to know the run's round, asks for it)
//   SPEC (2):   BLAKE2b-256 of the TOML u8[32] | TOML str | peers to wait for at the start u32 |
//               the furthest round the answering peer knows of i64 (-1: the run has not started)
//   (BEACON (1): the same without the TOML; read, no longer sent)
// A joiner sends WANT to 3 live members at random every second until a SPEC whose hash checks out
// arrives; every peer holding the spec answers, one answer per asker a second and 8 a second in all.
// State board: version u8 | kind u8 (1 JOIN, 2 OFFER, 3 ABSENT) | id u64, then for JOIN optionally the
// newcomer's link speed u64 (bytes/s; absent: unknown), for OFFER: round i64 | link address str. A
// newcomer sends JOIN every second while it waits to the same few members (the two lowest live ids,
// most likely the round's leader, and others at random: 8 at first, 8 more every 10 s without an
// offer, up to 32); members that snapshot their state after a round OFFER it to the newcomers that
// asked lately (state_sync.h serves it); a peer that is not in the run answers ABSENT at once, so
// that newcomers left among themselves after a run ended see it is over.
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
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/signal.h"
#include "core/status.h"
#include "runtime/state_sync.h"
#include "transport/gossip.h"

namespace gossamer::runtime {

inline constexpr std::size_t kMaxSpec = 60 * 1024;  // a gossip broadcast carries at most 64 KiB

struct Spec {
  std::string toml;
  std::uint32_t wait_for = 1;
};

// The two topics' messages (layouts above), as the handlers and the wire registry read and write them.
namespace announcement_wire {
inline constexpr std::uint8_t kSpecVersion = 2;   // run spec messages
inline constexpr std::uint8_t kBoardVersion = 1;  // join board messages
inline constexpr std::uint8_t kBeacon = 1, kFullSpec = 2, kWant = 3;
inline constexpr std::uint8_t kJoin = 1, kOffer = 2, kAbsent = 3;

struct SpecMessage {
  std::uint8_t kind = kWant;
  Spec spec;                   // SPEC: the TOML (checked against its hash) and the peers to wait for
  std::int64_t round = -1;     // SPEC and BEACON
};
Bytes encode_spec(const Spec& spec, std::int64_t round, bool full);
Bytes encode_want();
// Untrusted: another version, an unknown kind, a malformed body or a SPEC whose TOML does not match
// its hash is an error that says which; `from` names the sender in it.
[[nodiscard]] Result<SpecMessage> decode_spec(ByteView bytes, const std::string& from);

struct BoardMessage {
  std::uint8_t kind = kJoin;
  std::uint64_t id = 0;
  std::int64_t round = 0;   // OFFER
  std::string address;      // OFFER: the offering peer's links
  std::uint64_t link = 0;   // JOIN: the newcomer's link speed in bytes/s (0: unknown, not sent)
};
Bytes encode_board(const BoardMessage& m);
[[nodiscard]] Result<BoardMessage> decode_board(ByteView bytes, const std::string& from);
}  // namespace announcement_wire

struct AnnouncerState;

// Answers the peers that ask for the run spec (see above), with the furthest round `round` says this
// peer knows of; `round` is called on the gossip thread, never after the announcer is gone.
class SpecAnnouncer {
 public:
  SpecAnnouncer(transport::Gossip& gossip, Spec spec, std::function<std::int64_t()> round, Clock& clock);
  ~SpecAnnouncer();
  SpecAnnouncer(const SpecAnnouncer&) = delete;
  SpecAnnouncer& operator=(const SpecAnnouncer&) = delete;

 private:
  std::shared_ptr<AnnouncerState> state_;  // shared with the gossip handler
};

// What a peer hears of the run spec; shared with the gossip handler, which stays subscribed.
struct HeardSpec {
  Clock* clock = nullptr;  // the listener's
  std::mutex mu;
  std::unique_ptr<Signal> signal;  // a spec arrived
  std::optional<Spec> spec;
  std::int64_t latest_round = -1;  // the furthest round any answer named
  std::string last_problem;
  transport::Gossip* gossip = nullptr;  // to ask for the spec
  std::optional<Nanos> asked;           // when it last asked
};

std::shared_ptr<HeardSpec> listen_for_spec(transport::Gossip& gossip, Clock& clock);
// Asks a few live members for the spec (and so for the round the run is at), at most once a second;
// the answers update `heard`.
void ask_for_spec(HeardSpec& heard);

// Where peer `id` can be reached at `address`, one of its link addresses: a peer listening on a
// wildcard address (0.0.0.0, [::]) announces it as it is, and the host is taken from its gossip
// address as this peer knows it (the IP its gossip came from). Other addresses are returned as given.
std::string reachable_address(const transport::Gossip& gossip, transport::PeerId id, const std::string& address);
// Watches whether the run this peer wants to take part in is over: gossip knows peers, and none
// has been alive for `patience` (every one left or died), leaving aside those `outside` says are not
// in the run (other newcomers). Call it regularly from one thread.
class RunGoneWatch {
 public:
  RunGoneWatch(const transport::Gossip& gossip, const Clock& clock, Nanos patience, std::function<bool(transport::PeerId)> outside = {})
      : gossip_(gossip), clock_(clock), patience_(patience), outside_(std::move(outside)), since_(clock.now()) {}
  bool gone();

 private:
  const transport::Gossip& gossip_;
  const Clock& clock_;
  const Nanos patience_;
  const std::function<bool(transport::PeerId)> outside_;
  Nanos since_;  // the last time a peer was alive, or when watching began
  // The live members and whether any member is known, as of gossip's members_version (copied again
  // only when it changes).
  std::uint64_t version_ = 0;
  std::vector<transport::PeerId> live_;
  bool known_any_ = false;
};

// Waits for the run spec, asking for it every second (kTimeout, with what to check, when nobody
// announces one in time; kAborted within 0.1 s of `stop` becoming true).
[[nodiscard]] Result<Spec> receive_spec(HeardSpec& heard, Nanos timeout, const std::atomic<bool>* stop = nullptr);

class JoinBoard {
 public:
  static std::shared_ptr<JoinBoard> make(transport::Gossip& gossip, const Clock& clock);
  JoinBoard(transport::Gossip& gossip, const Clock& clock) : gossip_(gossip), clock_(clock), rng_(gossip.self().value) {}

  // link_bytes_per_s: this newcomer's own link where it knows it (0: unknown), so that the donors
  // can tell whether its state arrives within a round.
  void ask_to_join(double link_bytes_per_s = 0);
  void offer(std::int64_t round, const std::string& address);
  // The newcomers that asked for state in the last few seconds.
  std::vector<transport::PeerId> waiting() const;
  // The members that offered the state of `round`.
  std::vector<transport::PeerId> offerers(std::int64_t round) const;
  // Whether this peer takes part in the run (it then offers state; otherwise it answers a JOIN with
  // ABSENT at once). False until set.
  void set_member(bool member);
  // Whether peer `id` answered a JOIN of this peer with ABSENT within `within`.
  bool absent(transport::PeerId id, Nanos within) const;
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
  // A newcomer's side: the members it asks, how many, since when none offered.
  std::set<transport::PeerId> targets_;
  std::size_t target_count_ = kJoinTargets;
  std::optional<Nanos> asked_since_;
  // newest_offer()'s copy of the alive members, as of gossip's members_version.
  mutable std::set<transport::PeerId> alive_;
  mutable std::uint64_t alive_version_ = 0;
  std::map<transport::PeerId, Nanos> absent_;  // peers that said they are not in the run, and when
  bool member_ = false;
  std::mt19937_64 rng_;  // seeded by this peer's id: a simulation stays deterministic
  static constexpr std::size_t kJoinTargets = 8;  // members a newcomer first asks
};

}  // namespace gossamer::runtime
