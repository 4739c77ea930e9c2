// Network::Impl: the state of the emulated network (paths, per-pair latency, jitter and loss, the
// max-min fair sharing of link bandwidth among flows, deliveries to mailboxes) and the small types it
// works on. Internal header: used only by network.cpp and network_impl.cpp, not part of the public
// API (that is network.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "core/signal.h"
#include "sim/network.h"

namespace gossamer::sim {

namespace network_detail {

// Messages from one sender on one epoch, queued by tag. A link carries few tags at a time (a
// collective's phases) but a new set every round, so a queue that runs empty is handed to the next
// new tag instead of being kept under its old one.
struct Mailbox {
  std::mutex mu;
  std::unique_ptr<Signal> signal;
  std::vector<std::pair<transport::Tag, std::deque<Bytes>>> queues;
  bool closed = false;

  std::deque<Bytes>* find(transport::Tag tag) {
    for (auto& [t, q] : queues) {
      if (t == tag && !q.empty()) return &q;
    }
    return nullptr;
  }
  std::deque<Bytes>& queue(transport::Tag tag) {
    if (std::deque<Bytes>* q = find(tag); q != nullptr) return *q;
    for (auto& [t, q] : queues) {
      if (q.empty()) {
        t = tag;
        return q;
      }
    }
    return queues.emplace_back(tag, std::deque<Bytes>()).second;
  }
};

// The links a message crosses (resource indices): the sender's uplink, its site's uplink, the
// receiver's site's downlink, the hub, the pair's own link, the receiver's downlink; at most six,
// kept inline.
struct Path {
  std::array<int, 6> r{};
  int size = 0;
  void push_back(int x) { r[static_cast<std::size_t>(size++)] = x; }
  const int* begin() const { return r.data(); }
  const int* end() const { return r.data() + size; }
};

struct Flow {
  int from = 0, to = 0, epoch = 0;
  Path path;
  double remaining = 0;   // bytes on the wire still to send
  double rate = 0;        // bytes per second, from the last fair-share computation
  Nanos delay{0};         // latency + jitter + loss, drawn at send time
  Bytes payload;
  transport::Tag tag = 0;
  Mailbox* inbox = nullptr;  // the receiver's mailbox for this sender and epoch
  std::mutex mu;
  Signal* signal = nullptr;  // the sending link's: notified when the flow is done
  bool done = false;
  Status result;
};

// A message whose last byte has left, on its way to the receiver's mailbox.
struct Delivery {
  Mailbox* inbox = nullptr;
  int from = 0, to = 0;
  transport::Tag tag = 0;
  Bytes payload;
};

}  // namespace network_detail

struct Network::Impl {
  Impl(Scheduler& s, NetworkSpec sp);

  std::size_t pair(int a, int b) const { return static_cast<std::size_t>(a) * static_cast<std::size_t>(n) + static_cast<std::size_t>(b); }
  network_detail::Mailbox& mailbox(int receiver, int sender, int epoch);
  network_detail::Path path(int from, int to) const;
  Nanos latency(int from, int to) const;

  // Latency plus a seeded jitter and loss draw for one message of `payload_bytes` (datagrams draw
  // from generators of their own, so adding them leaves the links' draws as they were).
  Nanos draw_delay(int from, int to, std::size_t payload_bytes, bool datagram = false);

  // Max-min fair rates by progressive filling over the links the flows cross. Every link whose fair
  // share is the smallest saturates at once (their flows all get that share), so flows that share
  // nothing, as in an all-reduce's exchanges, are settled in one pass.
  void recompute();

  void advance();
  void schedule_next();
  void on_timer();
  void add(network_detail::Flow* f);
  void remove(network_detail::Flow* f);

  // The set of flows changed: rates are recomputed once for every change made at this instant (many
  // flows often start together, as in an all-reduce), before virtual time moves on.
  void rates_changed();

  void finish(network_detail::Flow* f, Status st);

  // The last byte left: the sender is free, and the message lands after its delay. The delivery
  // waits in a slot, so the timer's callback carries only its index.
  void complete(network_detail::Flow* f);
  void deliver(std::size_t slot);

  // Fails every message still leaving between a and b on that epoch, either way.
  void cut_flows(int a, int b, int epoch);
  void close_pair(int a, int b, int epoch);

  // a hangs up as TCP does with a FIN: it stops reading now (b's messages to it, in flight or not,
  // are dropped and b's sends fail), while a's messages already sent still reach b, which sees the
  // link closed only after the last of them, one path latency from now at the earliest.
  void close_gracefully(int a, int b, int epoch);

  // A payload buffer of at least n bytes' capacity, empty: a recycled one when there is one.
  Bytes take_buffer(std::size_t n);
  void recycle(Bytes b);

  static constexpr double kDoneBytes = 1e-3;
  static constexpr std::size_t kPoolBuffers = 256;
  bool recompute_pending = false;
  std::vector<Bytes> pool;  // recycled payload buffers
  std::vector<double> scratch_cap;
  std::vector<int> scratch_count;
  std::vector<char> scratch_tight;
  std::vector<double> scratch_shares;
  std::vector<network_detail::Delivery> deliveries;  // messages on their way, by slot
  std::vector<std::size_t> free_slots;
  std::vector<network_detail::Flow*> scratch_open, scratch_rest;
  Scheduler& sched;
  NetworkSpec spec;
  int n = 0;
  int hub = -1;  // resource index of the hub's link, or -1
  int pairs = -1;  // resource index of pair (0, 0)'s link, or -1 (no pair links)
  std::vector<double> capacity;
  std::vector<network_detail::Flow*> flows;
  Nanos last_update{0};
  std::uint64_t generation = 0;
  std::map<std::tuple<int, int, int>, std::unique_ptr<network_detail::Mailbox>> mailboxes;  // (receiver, sender, epoch)
  std::map<std::tuple<int, int, int>, std::shared_ptr<transport::Link>> links;  // (from, to, epoch)
  std::vector<Nanos> last_delivery;
  std::vector<std::mt19937_64> rngs;
  std::vector<std::mt19937_64> datagram_rngs;
  std::vector<bool> dead;
  std::vector<NodeTraffic> traffic;
};

}  // namespace gossamer::sim
