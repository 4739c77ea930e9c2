// GossipCore: what gossip decides, without sockets or threads: SWIM membership (probes, suspicion,
// incarnations, piggybacked updates; member_table.h), a rare exchange of state digests that repairs
// what dissemination missed, rumor mongering for broadcasts, and the wire format of it all. Its owner
// drives it (a tick every period, each message received) and sends what it returns: ZmqGossip
// (gossip.cpp) over ZeroMQ in real time, the simulator over its emulated network in virtual time, so
// both run this very code. Time comes from the Clock, chance from a seeded generator: with a virtual
// clock and a fixed seed a run of it is deterministic.
//
// What a member costs does not grow with the run: each period it pings one member (round-robin over
// a shuffled list, so every member is probed within n periods), answers the pings it gets, pushes the
// updates it has news of to `fanout` members while it has any, and every kSyncPeriods periods offers
// one member a 32-bucket digest of its view (a full exchange of the buckets that differ follows only
// when they do). A ping unanswered within the direct timeout is retried through kIndirectProbes
// members (ping-req); unanswered by the round timeout, its target is suspected. Both timeouts follow
// the round trips measured (RFC 6298's srtt + 4 rttvar) and this node's local health (Lifeguard: it
// rises when its own probes go unanswered and no helper's nack comes back, or when it must refute a
// suspicion, and falls with each answered probe), as does the interval between its probes: a node
// whose own link or process is slow suspects others less. Suspicion timeouts: member_table.h.
//
// Wire (little-endian, through core/wire; varint: LEB128, text: length varint and bytes), version 4:
//   magic "GSGP" | version u8 | type u8 | sender id u64 | sender flags u8 (1: its address follows;
//   2: outbound-only) | sender address (member_table.h; in every message but kAck and kNack, which
//   answer a message sent to it) | sender incarnation varint | sender health u8 | sender rto varint (ms)
//   kPing:      seq u32 | target id u64 | updates
//   kBroadcast: origin u64 | sequence varint | hops u8 | topic text | payload text
//   kPingReq:   seq u32 | target id u64 | updates
//   kAck:       seq u32 | updates
//   kNack:      seq u32
//   kGossip:    updates
//   kSync:      mode u8 (0 offer, 1 rows and a reply wanted, 2 rows) | 32 x digest u64 | updates
//   kLeave:     (nothing: the sender leaves at its incarnation)
//   kDirect:    flags u8 (1: passed on, the origin follows) | [origin id u64] | addressee id u64 |
//               topic text | payload text (for the addressee alone; one to a member behind NAT that
//               the sender cannot reach goes through two members that accept connections, each of
//               which passes it on once)
//   updates:    count varint | count x update (member_table.h)
// A ping and its ack cost about 40 and 25 bytes with no news (version 3: 66 and 58).
// Every message's header is an alive of its sender, first-hand. Untrusted input: a malformed message,
// another version or an oversized one is dropped, counted and logged (a bounded number of lines,
// core/log.h); an older version is told to upgrade.
//
// Threading: every method is thread-safe. Handlers never run inside a call that queues them: the
// owner runs them with run_deliveries(), holding no lock, so a handler may call back into the core.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/gossip.h"
#include "transport/member_table.h"

namespace gossamer::transport {

struct GossipSend {
  std::string to;  // a gossip address, as members announce them
  Bytes message;
  // Nonzero: `to` cannot be dialled (an outbound-only member, behind NAT); send the message back
  // through the connection this member opened to us (ZeroMQ: the ROUTER's route to its DEALER).
  PeerId route;
};

class GossipCore {
 public:
  // The messages' version (docs/wire.md; the layout in gossip_messages.cpp).
  static constexpr std::uint8_t kWireVersion = 4;
  // `bound`: the address this node listens on; `clock` must outlive the core.
  GossipCore(GossipOptions options, std::string bound, const Clock& clock, std::uint64_t seed);

  PeerId self() const { return options_.self; }
  const std::string& bound() const { return bound_; }
  // What others are told to reach this node at: GossipOptions::advertise, else the bound address.
  const std::string& announced() const { return options_.advertise.empty() ? bound_ : options_.advertise; }
  const GossipOptions& options() const { return options_; }

  std::vector<Member> members() const;
  std::uint64_t members_version() const;  // see Gossip::members_version
  std::vector<Member> sample(std::size_t k);
  // Queues a broadcast: take_broadcasts() (or the next tick) sends it; it is delivered here too.
  [[nodiscard]] Status broadcast(const std::string& topic, ByteView payload);
  // Queues a message for member `to` alone (sent with the broadcasts; to itself, delivered here; to
  // a member behind NAT that has not opened a connection to this node, through two that accept
  // connections). kNotFound when `to` is not a live member. Like every gossip message it may be lost.
  [[nodiscard]] Status send(PeerId to, const std::string& topic, ByteView payload);
  void subscribe(const std::string& topic, Gossip::Handler handler);

  // One period's work: timeouts of probes and suspicions, the next probe (a sync to the seeds while
  // no member is known), news pushed to `fanout` members, now and then a digest offered, the queued
  // broadcasts and every live rumor again.
  std::vector<GossipSend> tick();
  // The broadcasts queued since the last call, each to `fanout` live peers now, and the direct messages.
  std::vector<GossipSend> take_broadcasts();
  // A message received; `observed_ip` is the IP it came from (empty when unknown).
  std::vector<GossipSend> handle(ByteView data, const std::string& observed_ip);
  // Leaving: the broadcasts still queued, then a farewell to every live member it can reach (left at
  // a raised incarnation, which overrides every other update of it); afterwards
  // broadcasts are refused and ticks send nothing.
  std::vector<GossipSend> farewell();
  bool left() const;
  // Runs the handlers of the messages delivered so far. Call with no lock held.
  void run_deliveries();

  bool knows_anyone() const;
  // This node accepts no connections (behind NAT, found by a dial-back check): it tells the others,
  // who then send to it only through the connections it opens to them.
  void set_outbound_only(bool outbound_only);
  bool outbound_only() const;
  std::uint64_t dropped() const { return dropped_.load(); }
  // What this node's failure detector did so far: members it suspected after its own probe failed,
  // suspicions of itself it refuted, and members it holds dead (its own verdicts and others').
  struct Stats {
    std::uint64_t suspected = 0;
    std::uint64_t refuted = 0;
    std::uint64_t declared_dead = 0;
  };
  Stats stats() const;
  // Lifeguard's local health multiplier: 0 healthy, up to kMaxHealth when its own probes fail.
  int local_health() const;
  // The smoothed round trip of its answered probes, once one was measured.
  std::optional<Nanos> round_trip() const;
  std::uint32_t incarnation() const;
  // Bytes of the messages it returned to send, and of those handed to handle().
  std::pair<std::uint64_t, std::uint64_t> bytes() const { return {bytes_sent_.load(), bytes_received_.load()}; }
  // Of the bytes sent, those of membership (probes, news, digests, farewells): all but broadcasts
  // and direct messages.
  std::uint64_t membership_bytes_sent() const { return membership_bytes_sent_.load(); }
  // Counts (and logs, bounded) a message dropped before it reached the core.
  void count_drop(const std::string& why);

 private:
  struct Target {
    std::string address;
    PeerId route;  // see GossipSend
  };
  struct Rumor {
    Bytes message;
    int rounds_left = 0;
  };
  struct Outgoing {
    std::string topic;
    Bytes payload;
    PeerId to;  // nonzero: a direct message
  };
  struct Delivery {
    Gossip::Handler handler;
    PeerId origin;
    Bytes payload;
  };
  struct Probe {
    std::uint64_t target = 0;
    std::uint32_t incarnation = 0;  // the target's when probed: a suspicion names it
    Nanos sent{0};
    bool indirect = false;
    int helpers = 0;
    int nacks = 0;
    std::uint32_t resend_seq = 0;  // the direct ping sent again has a sequence of its own (Karn's rule)
    Nanos resent{0};
  };
  struct Relay {  // a ping sent for another member's ping-req
    Target requester;
    std::uint32_t seq = 0;
    Nanos nack_at{0};
  };
  static constexpr char kMagic[4] = {'G', 'S', 'G', 'P'};
  // 3: SWIM membership (probes, incarnations, piggybacked updates, digests) in place of whole tables.
  // 4: compact: varints, an IPv4 address in 7 bytes, acks and nacks without the sender's address.
  static constexpr std::uint8_t kVersion = kWireVersion;
  static constexpr std::uint8_t kAddressFlag = 1, kOutboundFlag = 2;  // the header's sender flags
  static constexpr std::uint8_t kRelayedFlag = 1;  // kDirect's: passed on by a member, the origin follows
  enum class MsgType : std::uint8_t { kPing = 1, kBroadcast = 2, kPingReq = 3, kAck = 4, kNack = 5, kGossip = 6, kSync = 7, kLeave = 8, kDirect = 9 };
  static constexpr int kRumorRounds = 3;
  static constexpr std::uint8_t kSyncOffer = 0, kSyncRowsReply = 1, kSyncRows = 2;  // kSync's modes
  static constexpr int kIndirectProbes = 3;
  static constexpr int kMaxHealth = 8;
  static constexpr int kSyncPeriods = 100;
  static constexpr std::size_t kPiggybackBudget = 512;  // on probes, which go out every period
  static constexpr std::size_t kPushBudget = 8192;      // on news pushes, which go out only with fresh news
  static constexpr int kPushTimes = 2;  // news is pushed while it has been sent fewer times than this

  // The messages (gossip_messages.cpp).
  void write_header(Writer& w, MsgType type) const;
  void write_updates(Writer& w, std::size_t budget);
  Bytes broadcast_message(std::uint64_t origin, std::uint64_t seq, std::uint8_t hops, const std::string& topic, ByteView payload) const;
  Bytes sync_message(std::uint8_t mode, std::uint32_t mask) const;
  // A ping of `target` under `seq`, with the updates it carries (each counted as sent).
  Bytes ping_message(std::uint32_t seq, std::uint64_t target);
  // News of one update, sent first-hand (to a suspect, or to a member held dead that still talks).
  Bytes news_message(const MemberUpdate& u) const;
  // An ack or nack of `seq`; an ack carries updates.
  Bytes seq_message(MsgType type, std::uint32_t seq, bool with_updates);
  // The messages of a probe (gossip_probes.cpp), after the header; false when the message was
  // malformed and already counted as dropped.
  // The sender's header of a message of `type` (untrusted): who, where, its incarnation and health.
  static Result<MemberUpdate> read_sender(Reader& r, std::uint8_t type);
  bool handle_probe_locked(MsgType msg, Reader& r, std::uint64_t sender, const Target& reply, std::vector<GossipSend>& sends, Nanos now);
  // Up to k live members to send to, at random: an outbound-only member only once it has opened a
  // connection to this node (heard from directly).
  std::vector<Target> random_live(std::size_t k, Nanos now, std::uint64_t except = 0);
  std::optional<Target> target_of(std::uint64_t id) const;
  void send_to(std::vector<GossipSend>& sends, const std::vector<Target>& targets, const Bytes& message) const;
  // The queued broadcasts become rumors (sent to `fanout` members at once when broadcasts_now) and
  // the direct messages go to their addressees.
  void take_outbox_locked(std::vector<GossipSend>& sends, Nanos now, bool broadcasts_now);
  void deliver_locked(PeerId origin, const std::string& topic, const Bytes& payload);
  void handle_broadcast_locked(Reader& r, std::vector<GossipSend>& sends, Nanos now);
  void handle_direct_locked(Reader& r, std::uint64_t sender, std::vector<GossipSend>& sends);
  Bytes direct_message(std::uint64_t origin, std::uint64_t to, const std::string& topic, ByteView payload) const;
  static constexpr std::size_t kDirectRelays = 2;
  // Reads and applies a message's updates; false (and counted) when malformed.
  bool read_updates_locked(Reader& r, Nanos now, bool quiet);
  void apply_locked(MemberUpdate u, Nanos now, bool quiet, const std::string& observed_ip, bool first_hand);
  void handle_sync_locked(Reader& r, const Target& reply, std::vector<GossipSend>& sends, Nanos now);
  void probe_locked(std::vector<GossipSend>& sends, Nanos now);
  void check_probes_locked(std::vector<GossipSend>& sends, Nanos now);
  // This node's own timeouts, and those for one target: stretched by how late it says it answers.
  Nanos own_rto() const;
  Nanos direct_timeout() const;
  Nanos round_timeout() const;
  Nanos direct_timeout(std::uint64_t target) const;
  Nanos round_timeout(std::uint64_t target) const;
  std::uint16_t rto_ms() const;
  void rtt_sample(Nanos rtt);
  void set_health(int h);

  GossipOptions options_;
  const std::string bound_;
  const Clock& clock_;
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::uint64_t> bytes_sent_{0}, bytes_received_{0}, membership_bytes_sent_{0};
  std::vector<GossipSend> counted(std::vector<GossipSend> sends);
  LogLimiter drop_log_{"gossip: dropped messages"};

  mutable std::mutex mu_;
  MemberTable table_;
  std::uint64_t broadcast_seq_ = 0;
  // Broadcasts delivered, by (origin, sequence), with when: a rumor stops circulating within
  // (rounds + 1) x max_hops periods, so entries much older than that are dropped.
  std::map<std::pair<std::uint64_t, std::uint64_t>, Nanos> seen_;
  Nanos seen_pruned_{0};
  std::deque<Outgoing> outbox_;
  std::vector<Rumor> rumors_;
  std::map<std::string, std::vector<Gossip::Handler>> handlers_;
  std::vector<Delivery> deliveries_;
  std::mt19937_64 rng_;
  bool left_ = false;
  bool outbound_only_ = false;
  // SWIM
  std::map<std::uint32_t, Probe> probes_;  // by the ping's sequence number
  std::map<std::uint32_t, Relay> relays_;  // by the sequence of the ping sent for a ping-req
  // Probes given up on, kept a while: an answer that comes late still measures the round trip.
  std::map<std::uint32_t, Probe> late_;
  std::map<std::uint32_t, std::uint32_t> resends_;  // a resent ping's sequence -> its probe's
  int sync_replies_ = 0;                            // this period's: a few per period at most
  static constexpr int kMaxSyncReplies = 64;
  std::uint32_t probe_seq_ = 0;
  std::vector<std::uint64_t> probe_order_;
  std::size_t probe_next_ = 0;
  std::uint64_t ticks_ = 0;
  std::uint64_t last_probe_tick_ = 0;
  std::uint64_t sync_phase_ = 0;
  std::uint64_t joined_tick_ = 0;  // the tick it first knew a live member (0: not yet)
  int health_ = 0;
  Stats stats_;
  bool rtt_known_ = false;
  double srtt_s_ = 0, rttvar_s_ = 0;
};

}  // namespace gossamer::transport
