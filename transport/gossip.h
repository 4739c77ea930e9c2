// Gossip: membership, failure detection, peer sampling and small broadcasts over ZeroMQ.
//
// Each node binds one ROUTER socket (its gossip address) and keeps one DEALER per peer it talks to;
// all of them are owned by the node's gossip thread. Membership is SWIM (gossip_core.h): every
// `period` a node pings one member; unanswered, it asks a few others to ping it; still unanswered
// (suspect_after, longer on slow links), the member is suspect, and dead once the suspicion runs out
// (at least dead_after - suspect_after, longer in bigger runs) unless it refutes. Membership news
// rides on those messages; a node that leaves tells every live member at once. Its cost per member
// stays flat as the run grows. Broadcasts spread by rumor mongering: each node delivers a message once
// per (origin, sequence) and forwards it to `fanout` random peers at once and in each of the next few
// periods, up to `max_hops`. N nodes learn of each other in O(log N) periods. A direct message goes
// to one member only (a request, an answer, a vote to a leader): what grows with N is sent that way.
//
// Security: with a run key, CurveZMQ (see GossipOptions::key).
// Threading: every public method is thread-safe. Subscriber callbacks run on the gossip thread and
// must be quick. Errors: bad messages from the network are dropped, logged and counted
// (dropped_messages()); construction errors (cannot bind) are returned by make_gossip.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "core/clock.h"
#include "core/status.h"
#include "transport/ids.h"
#include "transport/link_profile.h"
#include "transport/secure_channel.h"

namespace gossamer::transport {

struct GossipOptions {
  std::string bind = "tcp://127.0.0.1:*";  // '*': an ephemeral port
  // The address other nodes are told to reach this one at ("tcp://HOST:PORT"), for a node behind a
  // port forward or known by a public name; empty: the bound address (a wildcard one is replaced by
  // the receivers with the IP the node's messages come from).
  std::string advertise;
  std::vector<std::string> seeds;           // gossip addresses of running nodes
  PeerId self;                              // zero: a random id
  Nanos period = std::chrono::milliseconds(100);
  int fanout = 3;
  // A probed member that has not answered for this long (directly or through others) is suspect;
  // more when the measured round trips or this node's own health call for it.
  Nanos suspect_after = std::chrono::milliseconds(500);
  // suspect_after plus the least a suspicion lasts before it becomes a death (member_table.h).
  Nanos dead_after = std::chrono::milliseconds(1000);
  int max_hops = 12;
  // The most members a node keeps: beyond it, a new member takes the place of a dead or departed one,
  // or is dropped and counted (rows from the network cannot grow the table without bound).
  std::size_t max_members = 16384;
  // The run key: gossip then runs over CurveZMQ with a keypair derived from it, and a ZAP check admits
  // only peers holding the same key; nodes without it are refused (logged on the refusing side; the
  // refused side warns when no peer answers). Without a key, gossip is insecure (local tests only).
  std::optional<RunKey> key;
  // This node accepts no connections (see Gossip::set_outbound_only).
  bool outbound_only = false;
  // Emulated distance (a real peer's --shape): what this node sends waits for its turn on a link of
  // the profile's bandwidth (its wire bytes, one message after another) and then its latency, jitter
  // and loss (retransmission) delay, by the model the shaped group links and the simulator use
  // (link_model.h).
  std::optional<LinkProfile> shape;
};

enum class MemberState : std::uint8_t { kAlive = 0, kSuspect = 1, kDead = 2, kLeft = 3 };

struct Member {
  PeerId id;
  std::string address;
  std::uint64_t incarnation = 0;  // raised only by the member itself, to refute a suspicion
  MemberState state = MemberState::kAlive;
  bool outbound_only = false;  // accepts no connections (behind NAT): reached only through the ones it opens
};

// What a dial-back check found (Gossip::check_reachable).
struct Reachability {
  bool reachable = false;            // every address given was reached
  std::string helper;                // the gossip address of the member that dialled back
  std::string observed_ip;           // the IP this node's connection to it came from (a NAT's public IP)
  std::vector<std::string> failed;     // "ADDRESS (why)" for each address it could not reach
  std::vector<std::string> unchecked;  // "ADDRESS (why)" for each it would not dial (counted as reachable)
};

class Gossip {
 public:
  virtual ~Gossip() = default;  // leaves gracefully (tells the live members), then stops the thread
  virtual PeerId self() const = 0;
  virtual std::string address() const = 0;
  // Every member this node knows of, itself excluded, with its current state.
  virtual std::vector<Member> members() const = 0;
  // A number that changes whenever members() would (a member came or went, or changed its state or
  // address), so a caller polling the view copies it only then; 0: not tracked, call members().
  virtual std::uint64_t members_version() const { return 0; }
  // Up to k distinct live members, uniformly at random.
  virtual std::vector<Member> sample(std::size_t k) = 0;
  // Sends a small message (<= 64 KiB) to every live node that subscribes to `topic`.
  [[nodiscard]] virtual Status broadcast(const std::string& topic, ByteView payload) = 0;
  // Sends a small message (<= 64 KiB) to member `to` alone, for its subscribers of `topic` (to this
  // node itself: delivered here; to a member behind NAT that is not connected to this one, through
  // two members that accept connections, so it may then arrive twice). Like a datagram it may be
  // lost; the caller repeats what matters. kNotFound when `to` is not a live member.
  [[nodiscard]] virtual Status send(PeerId to, const std::string& topic, ByteView payload) = 0;
  using Handler = std::function<void(PeerId origin, const Bytes& payload)>;
  virtual void subscribe(const std::string& topic, Handler handler) = 0;
  // Tells the live members this node is leaving, then goes quiet. Idempotent.
  virtual void leave() = 0;
  virtual std::uint64_t dropped_messages() const = 0;
  // Bytes of gossip messages this node sent and received so far (as encoded; transport overhead
  // not included).
  virtual std::pair<std::uint64_t, std::uint64_t> bytes() const = 0;
  // Of the bytes sent, those of membership itself (probes, news, digests, farewells), without the
  // broadcasts it carries for others (rounds, announcements). The default: all of them.
  virtual std::uint64_t membership_bytes_sent() const { return bytes().first; }
  // The smoothed round-trip time of this node's answered probes (RFC 6298's srtt), once it has one.
  virtual std::optional<Nanos> round_trip() const { return std::nullopt; }
  // A dial-back check: asks a live member that accepts connections to open a TCP connection to each
  // of `addresses` (HOST:PORT; a wildcard host means the IP this node's messages come from) and
  // say which it reached; asks up to three members at once (its seeds while it knows none).
  // kUnavailable when none answered in time; kAborted within 0.1 s of `stop` becoming true.
  [[nodiscard]] virtual Result<Reachability> check_reachable(const std::vector<std::string>& addresses, Deadline deadline,
                                                             const std::atomic<bool>* stop = nullptr) {
    (void)addresses;
    (void)deadline;
    (void)stop;
    return error(ErrorCode::kUnavailable, "this gossip cannot check reachability");
  }
  // Marks this node as accepting no connections (behind NAT): the others then send to it only
  // through the connections it opens to them, and never try to dial it.
  [[nodiscard]] virtual Status set_outbound_only(bool outbound_only) {
    (void)outbound_only;
    return error(ErrorCode::kUnavailable, "this gossip cannot run outbound-only");
  }
};

[[nodiscard]] Result<std::unique_ptr<Gossip>> make_gossip(const GossipOptions& options);

}  // namespace gossamer::transport
