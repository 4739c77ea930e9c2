// GossipCore: what gossip decides, without sockets or threads: the member table, heartbeats, the
// failure detector, rumor mongering and the wire format of gossip messages. Its owner drives it (a
// tick every period, each message received) and sends what it returns: ZmqGossip (gossip.cpp) over
// ZeroMQ in real time, the simulator over its emulated network in virtual time, so both run this
// very code. Time comes from the Clock, chance from a seeded generator: with a virtual clock and a
// fixed seed a run of it is deterministic.
//
// Wire (little-endian, through core/wire):
//   magic "GSGP" | version u8 | type u8 | sender id u64 | sender address str
//   kTable:     count u32 | count x (id u64, address str, heartbeat u64, flags u8: 1 left, 2 outbound-only)
//   kBroadcast: origin u64 | sequence u64 | hops u8 | topic str | payload blob
// Untrusted input: a malformed message, another version or an oversized one is dropped, counted
// and logged (a bounded number of lines, core/log.h).
//
// Threading: every method is thread-safe. Handlers never run inside a call that queues them: the
// owner runs them with run_deliveries(), holding no lock, so a handler may call back into the core.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/gossip.h"

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
  // `bound`: the address this node listens on; `clock` must outlive the core.
  GossipCore(GossipOptions options, std::string bound, const Clock& clock, std::uint64_t seed);

  PeerId self() const { return options_.self; }
  const std::string& bound() const { return bound_; }
  // What others are told to reach this node at: GossipOptions::advertise, else the bound address.
  const std::string& announced() const { return options_.advertise.empty() ? bound_ : options_.advertise; }
  const GossipOptions& options() const { return options_; }

  std::vector<Member> members() const;
  std::vector<Member> sample(std::size_t k);
  // Queues a broadcast: take_broadcasts() (or the next tick) sends it; it is delivered here too.
  [[nodiscard]] Status broadcast(const std::string& topic, ByteView payload);
  void subscribe(const std::string& topic, Gossip::Handler handler);

  // One period's work: a heartbeat, the member table to `fanout` live peers (the seeds while none
  // is known), the queued broadcasts and every live rumor again.
  std::vector<GossipSend> tick();
  // The broadcasts queued since the last call, each to `fanout` live peers now.
  std::vector<GossipSend> take_broadcasts();
  // A message received; `observed_ip` is the IP it came from (empty when unknown).
  std::vector<GossipSend> handle(ByteView data, const std::string& observed_ip);
  // Leaving: the broadcasts still queued, then a farewell to every live member (the higher heartbeat wins every merge); afterwards
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
  // Bytes of the messages it returned to send, and of those handed to handle().
  std::pair<std::uint64_t, std::uint64_t> bytes() const { return {bytes_sent_.load(), bytes_received_.load()}; }
  // Counts (and logs, bounded) a message dropped before it reached the core.
  void count_drop(const std::string& why);

 private:
  struct Entry {
    std::string address;
    std::uint64_t heartbeat = 0;
    bool left = false;
    bool outbound_only = false;  // accepts no connections: reached only through one it opened
    Nanos changed{0};            // when the heartbeat last rose
    Nanos heard = Nanos::min();  // when a message last came from it directly
  };
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
  };
  struct Delivery {
    Gossip::Handler handler;
    PeerId origin;
    Bytes payload;
  };
  enum class MsgType : std::uint8_t { kTable = 1, kBroadcast = 2 };
  static constexpr int kRumorRounds = 3;

  MemberState state_of(const Entry& e, Nanos now) const;
  void write_header(Writer& w, MsgType type) const;
  Bytes table_message(bool leaving) const;
  Bytes broadcast_message(std::uint64_t origin, std::uint64_t seq, std::uint8_t hops, const std::string& topic, ByteView payload) const;
  // Up to k live members to send to, at random: an outbound-only member only while it keeps a
  // connection to this node (heard from directly within suspect_after).
  std::vector<Target> random_live(std::size_t k, Nanos now);
  void send_to(std::vector<GossipSend>& sends, const std::vector<Target>& targets, const Bytes& message) const;
  void take_outbox_locked(std::vector<GossipSend>* sends, Nanos now);
  void deliver_locked(PeerId origin, const std::string& topic, const Bytes& payload);
  void merge_table_locked(Reader& r, std::uint64_t sender, const std::string& observed_ip, Nanos now);
  void handle_broadcast_locked(Reader& r, std::vector<GossipSend>& sends, Nanos now);
  bool evict_one_locked(Nanos now);  // makes room: drops one dead or departed member, if any

  GossipOptions options_;
  const std::string bound_;
  const Clock& clock_;
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::uint64_t> bytes_sent_{0}, bytes_received_{0};
  std::vector<GossipSend> counted(std::vector<GossipSend> sends);
  LogLimiter drop_log_{"gossip: dropped messages"};

  mutable std::mutex mu_;
  std::map<std::uint64_t, Entry> table_;
  std::uint64_t heartbeat_ = 0;
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
};

}  // namespace gossamer::transport
