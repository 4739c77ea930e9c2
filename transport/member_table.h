// MemberTable: SWIM's view of the membership, without messages or time of its own. GossipCore
// (gossip_core.h) drives it: it applies the updates that arrive (alive, suspect, dead, left, each with
// the member's incarnation), asks it which suspicions have run out, and sends the updates it queued
// piggybacked on its probes.
//
// The rules (SWIM, with Lifeguard's refinements):
//   - alive(i) overrides a member known at a lower incarnation; suspect(i) overrides alive(j <= i);
//     dead(i) and left(i) override alive and suspect at j <= i; left is final for its incarnation.
//   - Only a member raises its own incarnation: suspected or declared dead, it refutes with alive(i+1)
//     (a claim at the largest incarnation is ignored: it could not be refuted).
//   - A suspicion runs out after a timeout that starts long and shrinks to its minimum as independent
//     members confirm it (Lifeguard); the minimum grows with log10 of the membership and with the
//     suspect's own reported health (how late its messages run, by its own measure). Only members
//     that can reach this one count as possible confirmers (outbound-only members it never heard
//     from first-hand cannot).
//   - Every update that is news is queued and sent a bounded number of times (kRetransmitMult x
//     ceil(log10(n + 1)); half that for the news of a member first heard of), fewest-sent first, on
//     the messages the core sends anyway.
//   - A digest of 32 bucket hashes (members by id, at their incarnation; dead and departed ones left
//     out) lets two members find in one small message whether their views differ, and where.
//
// Wire of one update (little-endian, core/wire; varint: LEB128):
//   kind u8 (0 alive, 1 suspect, 2 dead, 3 left) | id u64 | incarnation varint |
//   alive: flags u8 (2: outbound-only) | address | health u8 | rto varint (ms)
//   left: flags u8 | address;   suspect: accuser id u64
//   address: as transport/endpoint.h writes it (7 bytes for an IPv4 address and port)
//
// Threading: none; the owner (GossipCore) holds its lock around every call. Not copyable.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "core/clock.h"
#include "core/wire.h"
#include "transport/gossip.h"

namespace gossamer::transport {

enum class UpdateKind : std::uint8_t { kAlive = 0, kSuspect = 1, kDead = 2, kLeft = 3 };
static_assert(static_cast<int>(UpdateKind::kLeft) == 3, "update kinds travel on the wire: never renumber");

struct MemberUpdate {
  UpdateKind kind = UpdateKind::kAlive;
  std::uint64_t id = 0;
  std::uint32_t incarnation = 0;
  bool outbound_only = false;  // alive, left
  std::string address;         // alive, left
  std::uint64_t accuser = 0;   // suspect: who suspects it
  // alive: the member's own local health and the time its probes take to be answered (srtt + 4
  // rttvar, ms): how late its messages run, by its own measure. Others wait that much longer for it.
  std::uint8_t health = 0;
  std::uint16_t rto_ms = 0;
};

void write_update(Writer& w, const MemberUpdate& u);
// Reads one update; check r.ok() afterwards. An unknown kind fails the reader.
MemberUpdate read_update(Reader& r);

// Alive or suspect: still a member (a suspect may refute).
inline bool is_live(MemberState s) { return s == MemberState::kAlive || s == MemberState::kSuspect; }

inline constexpr std::size_t kDigestBuckets = 32;
using Digest = std::array<std::uint64_t, kDigestBuckets>;
std::size_t digest_bucket(std::uint64_t id);

struct MemberTableOptions {
  std::uint64_t self = 0;
  std::size_t max_members = 16384;
  Nanos period{std::chrono::milliseconds(100)};
  // The least time a suspicion takes to become a death, before scaling by the membership's size.
  Nanos suspicion_min{std::chrono::milliseconds(500)};
};

class MemberTable {
 public:
  struct Entry {
    std::string address;
    std::uint32_t incarnation = 0;
    MemberState state = MemberState::kAlive;
    bool outbound_only = false;
    std::uint8_t health = 0;         // its own local health (Lifeguard), from its messages
    Nanos rto{0};                    // how late its answers run, by its own measure
    Nanos changed{0};                // when its state last changed
    Nanos heard = Nanos::min();      // when a message last came from it directly (min: never)
    std::vector<std::uint64_t> accusers;  // distinct members suspecting it, while suspect
  };
  // What apply() did with an update.
  enum class Applied { kIgnored, kNews, kFull, kRefuted };

  explicit MemberTable(MemberTableOptions options);

  // Applies an update; kNews queues it for dissemination unless `quiet` (learned from a full-state
  // exchange, or a farewell everyone got first-hand). About this node itself: a suspicion or death at
  // its incarnation or above is refuted (kRefuted: incarnation raised, alive queued).
  Applied apply(const MemberUpdate& u, Nanos now, bool quiet = false);
  // Suspicions that ran out become deaths (queued); returns the ids declared dead.
  std::vector<std::uint64_t> expire_suspicions(Nanos now);
  Nanos suspicion_timeout(std::uint64_t id, const Entry& e) const;

  // Up to `budget` bytes of queued updates, fewest-sent first; each counts as one transmission.
  std::vector<Bytes> take_piggyback(std::size_t budget);
  bool has_queued() const { return !queue_.empty(); }
  // An update other than a join's news, queued and sent fewer than `times` times (news worth pushing).
  bool has_fresh(int times) const;
  // Queues this node's own alive (after a refutation or a change of its flags).
  void queue_self();

  Digest digest() const;
  // Every entry in the buckets of `mask` (bit b: bucket b), this node's own row included, as updates.
  std::vector<MemberUpdate> rows_in(std::uint32_t mask) const;

  std::uint32_t incarnation() const { return incarnation_; }
  void bump_incarnation() { ++incarnation_; }
  void set_self_row(std::string address, bool outbound_only) {
    self_address_ = std::move(address);
    self_outbound_ = outbound_only;
  }
  void set_self_health(std::uint8_t health, std::uint16_t rto_ms) {
    self_health_ = health;
    self_rto_ms_ = rto_ms;
  }
  // Live (alive or suspect) members, this node included: the n of log n. Cached.
  std::size_t live_count() const;
  // The ids of the members in state alive (in the order of their changes: deterministic, not sorted).
  const std::vector<std::uint64_t>& alive_ids() const;

  const std::map<std::uint64_t, Entry>& entries() const { return table_; }
  // Changes whenever a member comes, goes or changes state or address (starts at 1).
  std::uint64_t version() const { return version_; }
  Entry* find(std::uint64_t id);
  const Entry* find(std::uint64_t id) const;
  std::uint64_t full_drops() const { return full_drops_; }

  static constexpr int kRetransmitMult = 4;
  // The news of a member first heard of (a join) is sent half as many times: it is not urgent (the
  // newcomer's own messages tell whoever it talks to first-hand, and the digest exchanges repair what
  // is missed), and when hundreds join at once it would be most of what members send.
  static constexpr int kJoinRetransmitMult = 2;
  static constexpr int kSuspicionMaxMult = 6;     // the longest suspicion, in minimum timeouts
  static constexpr int kConfirmations = 3;        // independent accusers that bring it to the minimum
  static constexpr std::size_t kMaxAccusers = 8;
  static constexpr std::size_t kMaxQueued = 4096;  // updates waiting to be sent; beyond, the most sent go
  // What a member says of its own lateness counts up to this many minimum suspicions (4 s at the
  // defaults): a member near death cannot stretch its own verdict without bound.
  static constexpr int kMaxRemoteRto = 8;
  Nanos remote_rto(const Entry& e) const { return std::min(e.rto, kMaxRemoteRto * options_.suspicion_min); }

 private:
  struct Queued {
    std::uint64_t id;
    Bytes encoded;
    int transmits = 0;
    std::uint64_t order = 0;  // newer first among equals
    int mult = kRetransmitMult;  // sent mult x ceil(log10(n + 1)) times
  };
  void enqueue(const MemberUpdate& u, int mult);
  // Every change of a member's state goes through here (and sets its `changed`), so the counts, the
  // alive list, the suspects and the departed stay right.
  void set_state(std::uint64_t id, Entry& e, MemberState state, Nanos now);
  bool evict_one(Nanos now);
  MemberUpdate self_row() const;

  MemberTableOptions options_;
  std::map<std::uint64_t, Entry> table_;
  std::map<std::uint64_t, Queued> queue_;  // by member: the latest update about each
  std::uint64_t queued_ = 0;
  std::uint32_t incarnation_ = 0;
  std::string self_address_;
  bool self_outbound_ = false;
  std::uint8_t self_health_ = 0;
  std::uint16_t self_rto_ms_ = 0;
  std::uint64_t full_drops_ = 0;
  std::uint64_t version_ = 1;
  std::set<std::uint64_t> suspects_;
  std::size_t live_count_ = 1;                        // this node included
  std::vector<std::uint64_t> alive_ids_;              // in no particular order
  std::map<std::uint64_t, std::size_t> alive_index_;  // id -> its place in alive_ids_
  std::set<std::pair<Nanos, std::uint64_t>> gone_;    // dead and departed, by when: evicted oldest first
};

}  // namespace gossamer::transport
