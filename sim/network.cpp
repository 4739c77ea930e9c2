#include "sim/network.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <tuple>

#include "core/check.h"
#include "core/signal.h"
#include "transport/protocol.h"

namespace gossamer::sim {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

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
// receiver's site's downlink, the hub, the receiver's downlink; at most five, kept inline.
struct Path {
  std::array<int, 5> r{};
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

}  // namespace

struct Network::Impl {
  Impl(Scheduler& s, NetworkSpec sp) : sched(s), spec(std::move(sp)) {
    n = static_cast<int>(spec.nodes.size());
    for (const auto& node : spec.nodes) {
      GOSSAMER_CHECK(node.link.validate().ok(), "Network: " + node.link.validate().message());
      GOSSAMER_CHECK(node.site < static_cast<int>(spec.sites.size()), "Network: a node names a site that does not exist");
      capacity.push_back(node.link.bandwidth_bytes_per_s);  // uplink
      capacity.push_back(node.link.bandwidth_bytes_per_s);  // downlink
    }
    for (const auto& site : spec.sites) {
      GOSSAMER_CHECK(site.bandwidth_bytes_per_s > 0, "Network: site '" + site.name + "' needs a positive bandwidth");
      capacity.push_back(site.bandwidth_bytes_per_s);
      capacity.push_back(site.bandwidth_bytes_per_s);
    }
    hub = spec.hub_bytes_per_s > 0 ? static_cast<int>(capacity.size()) : -1;
    if (hub >= 0) capacity.push_back(spec.hub_bytes_per_s);
    const auto nn = static_cast<std::size_t>(n);
    last_delivery.assign(nn * nn, Nanos{0});
    rngs.resize(nn * nn);
    for (std::size_t i = 0; i < nn * nn; ++i) rngs[i].seed(spec.seed * 0x9E3779B97F4A7C15ull + i);
    datagram_rngs.resize(nn * nn);
    for (std::size_t i = 0; i < nn * nn; ++i) datagram_rngs[i].seed(spec.seed * 0xD1B54A32D192ED03ull + i + 1);
    dead.assign(nn, false);
    traffic.resize(nn);
  }

  std::size_t pair(int a, int b) const { return static_cast<std::size_t>(a) * static_cast<std::size_t>(n) + static_cast<std::size_t>(b); }
  Mailbox& mailbox(int receiver, int sender, int epoch) {
    auto& m = mailboxes[{receiver, sender, epoch}];
    if (!m) {
      m = std::make_unique<Mailbox>();
      m->signal = sched.make_signal();
      m->closed = dead[static_cast<std::size_t>(receiver)] || dead[static_cast<std::size_t>(sender)];
    }
    return *m;
  }

  Path path(int from, int to) const {
    Path p;
    p.push_back(2 * from);
    const int sf = spec.nodes[static_cast<std::size_t>(from)].site, st = spec.nodes[static_cast<std::size_t>(to)].site;
    if (sf != st) {
      if (sf >= 0) p.push_back(2 * n + 2 * sf);
      if (st >= 0) p.push_back(2 * n + 2 * st + 1);
    }
    if (hub >= 0) p.push_back(hub);
    p.push_back(2 * to + 1);
    return p;
  }

  Nanos latency(int from, int to) const {
    const auto& a = spec.nodes[static_cast<std::size_t>(from)];
    const auto& b = spec.nodes[static_cast<std::size_t>(to)];
    Nanos l = (a.link.latency + b.link.latency) / 2;
    if (a.site != b.site) {
      if (a.site >= 0) l += spec.sites[static_cast<std::size_t>(a.site)].latency;
      if (b.site >= 0) l += spec.sites[static_cast<std::size_t>(b.site)].latency;
    }
    return l;
  }

  // Latency plus a seeded jitter and loss draw for one message of `payload_bytes` (datagrams draw
  // from generators of their own, so adding them leaves the links' draws as they were).
  Nanos draw_delay(int from, int to, std::size_t payload_bytes, bool datagram = false) {
    const auto& a = spec.nodes[static_cast<std::size_t>(from)].link;
    const auto& b = spec.nodes[static_cast<std::size_t>(to)].link;
    auto& rng = datagram ? datagram_rngs[pair(from, to)] : rngs[pair(from, to)];
    const Nanos base = latency(from, to);
    double extra_ns = 0;
    const double jitter_ns = std::sqrt((std::pow(static_cast<double>(a.jitter.count()), 2) + std::pow(static_cast<double>(b.jitter.count()), 2)) / 2);
    if (jitter_ns > 0) extra_ns += std::normal_distribution<double>(0.0, jitter_ns)(rng);
    const double loss = 1.0 - (1.0 - a.loss) * (1.0 - b.loss);
    if (loss > 0) {
      const std::size_t mss = std::min(a.mtu_bytes, b.mtu_bytes) - 52;
      const auto packets = static_cast<std::int64_t>((payload_bytes + transport::kFrameHeaderBytes + mss - 1) / mss);
      const std::int64_t lost = std::binomial_distribution<std::int64_t>(packets, loss)(rng);
      extra_ns += static_cast<double>(lost) * 2.0 * static_cast<double>(base.count());  // one round trip per lost packet
    }
    const double total = std::max(0.0, static_cast<double>(base.count()) + extra_ns);
    return Nanos(static_cast<std::int64_t>(std::llround(total)));
  }

  // Max-min fair rates by progressive filling over the links the flows cross. Every link whose fair
  // share is the smallest saturates at once (their flows all get that share), so flows that share
  // nothing, as in an all-reduce's exchanges, are settled in one pass.
  void recompute() {
    // Scratch kept between calls: this runs once per instant that flows change.
    std::vector<double>& cap = scratch_cap;
    std::vector<int>& count = scratch_count;
    std::vector<char>& tight = scratch_tight;
    std::vector<Flow*>& open = scratch_open;
    std::vector<Flow*>& rest = scratch_rest;
    cap = capacity;
    count.assign(cap.size(), 0);
    open.assign(flows.begin(), flows.end());
    for (Flow* f : flows) {
      for (int r : f->path) ++count[static_cast<std::size_t>(r)];
    }
    std::vector<double>& shares = scratch_shares;
    shares.resize(cap.size());
    while (!open.empty()) {
      double share = kInf;
      for (std::size_t r = 0; r < cap.size(); ++r) {
        shares[r] = count[r] == 0 || std::isinf(cap[r]) ? kInf : std::max(0.0, cap[r]) / count[r];
        share = std::min(share, shares[r]);
      }
      tight.assign(cap.size(), 0);
      if (!std::isinf(share)) {
        for (std::size_t r = 0; r < cap.size(); ++r) tight[r] = shares[r] == share ? 1 : 0;
      }
      rest.clear();
      for (Flow* f : open) {
        const bool through = std::isinf(share) || std::any_of(f->path.begin(), f->path.end(), [&](int r) { return tight[static_cast<std::size_t>(r)] != 0; });
        if (!through) {
          rest.push_back(f);
          continue;
        }
        f->rate = share;
        for (int r : f->path) {
          cap[static_cast<std::size_t>(r)] -= share;
          --count[static_cast<std::size_t>(r)];
        }
      }
      open.swap(rest);
    }
  }

  void advance() {
    const double dt = std::chrono::duration<double>(sched.now() - last_update).count();
    if (dt > 0) {
      for (Flow* f : flows) f->remaining -= std::isinf(f->rate) ? f->remaining : f->rate * dt;
    }
    last_update = sched.now();
  }

  void schedule_next() {
    ++generation;
    Nanos next = Nanos::max();
    for (Flow* f : flows) {
      Nanos t = sched.now();
      if (!std::isinf(f->rate) && f->remaining > kDoneBytes) {
        if (f->rate <= 0) continue;
        const double ns = f->remaining / f->rate * 1e9;
        t += Nanos(static_cast<std::int64_t>(std::ceil(ns - 1e-3)));
      }
      next = std::min(next, t);
    }
    if (next == Nanos::max()) return;
    sched.call_at(next, [this, g = generation] {
      if (g == generation) on_timer();
    });
  }

  void on_timer() {
    advance();
    std::vector<Flow*> finished;
    for (Flow* f : flows) {
      if (f->remaining <= kDoneBytes) finished.push_back(f);
    }
    for (Flow* f : finished) complete(f);
    rates_changed();
  }

  void add(Flow* f) {
    advance();
    flows.push_back(f);
    rates_changed();
  }

  void remove(Flow* f) {
    advance();
    flows.erase(std::remove(flows.begin(), flows.end(), f), flows.end());
    rates_changed();
  }

  // The set of flows changed: rates are recomputed once for every change made at this instant (many
  // flows often start together, as in an all-reduce), before virtual time moves on.
  void rates_changed() {
    if (recompute_pending) return;
    recompute_pending = true;
    sched.call_at(sched.now(), [this] {
      recompute_pending = false;
      recompute();
      schedule_next();
    });
  }

  void finish(Flow* f, Status st) {
    std::lock_guard<std::mutex> lock(f->mu);
    f->done = true;
    f->result = std::move(st);
    f->signal->notify_all();
  }

  // The last byte left: the sender is free, and the message lands after its delay. The delivery
  // waits in a slot, so the timer's callback carries only its index.
  void complete(Flow* f) {
    flows.erase(std::remove(flows.begin(), flows.end(), f), flows.end());
    const int from = f->from, to = f->to;
    Nanos at = std::max(sched.now() + f->delay, last_delivery[pair(from, to)]);
    last_delivery[pair(from, to)] = at;
    std::size_t slot = deliveries.size();
    if (!free_slots.empty()) {
      slot = free_slots.back();
      free_slots.pop_back();
    } else {
      deliveries.emplace_back();
    }
    deliveries[slot] = Delivery{f->inbox, from, to, f->tag, std::move(f->payload)};
    sched.call_at(at, [this, slot] { deliver(slot); });
    finish(f, Status());
  }

  void deliver(std::size_t slot) {
    Delivery d = std::move(deliveries[slot]);
    free_slots.push_back(slot);
    Mailbox& m = *d.inbox;
    std::lock_guard<std::mutex> lock(m.mu);
    if (dead[static_cast<std::size_t>(d.to)] || dead[static_cast<std::size_t>(d.from)] || m.closed) {
      recycle(std::move(d.payload));
      return;
    }
    m.queue(d.tag).push_back(std::move(d.payload));
    m.signal->notify_all();
  }

  // Fails every message still leaving between a and b on that epoch, either way.
  void cut_flows(int a, int b, int epoch) {
    std::vector<Flow*> cut;
    for (Flow* f : flows) {
      if (f->epoch == epoch && ((f->from == a && f->to == b) || (f->from == b && f->to == a))) cut.push_back(f);
    }
    for (Flow* f : cut) {
      remove(f);
      finish(f, error(ErrorCode::kPeerLost, "link to node " + std::to_string(f->to) + " closed"));
    }
  }

  void close_pair(int a, int b, int epoch) {
    for (auto [r, s] : {std::pair{a, b}, std::pair{b, a}}) {
      Mailbox& m = mailbox(r, s, epoch);
      std::lock_guard<std::mutex> lock(m.mu);
      m.closed = true;
      m.signal->notify_all();
    }
    cut_flows(a, b, epoch);
  }

  // a hangs up as TCP does with a FIN: it stops reading now (b's messages to it, in flight or not,
  // are dropped and b's sends fail), while a's messages already sent still reach b, which sees the
  // link closed only after the last of them, one path latency from now at the earliest.
  void close_gracefully(int a, int b, int epoch) {
    {
      Mailbox& m = mailbox(a, b, epoch);
      std::lock_guard<std::mutex> lock(m.mu);
      if (m.closed) return;
      m.closed = true;
      m.signal->notify_all();
    }
    cut_flows(a, b, epoch);
    const Nanos at = std::max(sched.now() + latency(a, b), last_delivery[pair(a, b)]);
    last_delivery[pair(a, b)] = at;
    sched.call_at(at, [this, a, b, epoch] {
      Mailbox& m = mailbox(b, a, epoch);
      std::lock_guard<std::mutex> lock(m.mu);
      m.closed = true;
      m.signal->notify_all();
    });
  }

  // A payload buffer of at least n bytes' capacity, empty: a recycled one when there is one.
  Bytes take_buffer(std::size_t n) {
    std::size_t best = pool.size();
    for (std::size_t i = 0; i < pool.size(); ++i) {
      if (pool[i].capacity() >= n && (best == pool.size() || pool[i].capacity() < pool[best].capacity())) best = i;
    }
    Bytes b;
    if (best < pool.size()) {
      b = std::move(pool[best]);
      pool[best] = std::move(pool.back());
      pool.pop_back();
      b.clear();
    } else {
      b.reserve(n);
    }
    return b;
  }
  void recycle(Bytes b) {
    if (pool.size() < kPoolBuffers && b.capacity() > 0) pool.push_back(std::move(b));
  }

  static constexpr double kDoneBytes = 1e-3;
  static constexpr std::size_t kPoolBuffers = 256;
  bool recompute_pending = false;
  std::vector<Bytes> pool;  // recycled payload buffers
  std::vector<double> scratch_cap;
  std::vector<int> scratch_count;
  std::vector<char> scratch_tight;
  std::vector<double> scratch_shares;
  std::vector<Delivery> deliveries;  // messages on their way, by slot
  std::vector<std::size_t> free_slots;
  std::vector<Flow*> scratch_open, scratch_rest;
  Scheduler& sched;
  NetworkSpec spec;
  int n = 0;
  int hub = -1;  // resource index of the hub's link, or -1
  std::vector<double> capacity;
  std::vector<Flow*> flows;
  Nanos last_update{0};
  std::uint64_t generation = 0;
  std::map<std::tuple<int, int, int>, std::unique_ptr<Mailbox>> mailboxes;  // (receiver, sender, epoch)
  std::map<std::tuple<int, int, int>, std::shared_ptr<transport::Link>> links;  // (from, to, epoch)
  std::vector<Nanos> last_delivery;
  std::vector<std::mt19937_64> rngs;
  std::vector<std::mt19937_64> datagram_rngs;
  std::vector<bool> dead;
  std::vector<NodeTraffic> traffic;
};

namespace {

class SimLink final : public transport::Link {
 public:
  SimLink(Network::Impl& net, int self, int peer, int epoch, transport::PeerId peer_id = {}, std::string peer_address = {})
      : net_(net),
        self_(self),
        peer_(peer),
        epoch_(epoch),
        peer_id_(peer_id.value != 0 ? peer_id : transport::PeerId{static_cast<std::uint64_t>(peer) + 1}),
        peer_address_(!peer_address.empty() ? std::move(peer_address) : "sim://node-" + std::to_string(peer)),
        inbox_(net.mailbox(self, peer, epoch)),
        outbox_(net.mailbox(peer, self, epoch)),
        sent_(net.sched.make_signal()) {}
  transport::PeerId peer() const override { return peer_id_; }
  std::string remote_address() const override { return peer_address_; }

  Status send(transport::Tag tag, ByteView payload, Deadline deadline) override {
    const std::array<ByteView, 1> parts = {payload};
    return send_parts(tag, parts, deadline);
  }

  // The message is copied once, into the flow that carries it.
  Status send_parts(transport::Tag tag, std::span<const ByteView> parts, Deadline deadline) override {
    if (net_.dead[static_cast<std::size_t>(self_)] || net_.dead[static_cast<std::size_t>(peer_)] || outbox_.closed || inbox_.closed) {
      return lost();
    }
    Flow f;
    f.from = self_;
    f.to = peer_;
    f.epoch = epoch_;
    f.tag = tag;
    f.path = net_.path(self_, peer_);
    const auto& profile = net_.spec.nodes[static_cast<std::size_t>(self_)].link;
    std::size_t size = 0;
    for (ByteView p : parts) size += p.size();
    f.remaining = profile.wire_bytes(size + transport::kFrameHeaderBytes);
    f.payload = net_.take_buffer(size);
    for (ByteView p : parts) f.payload.insert(f.payload.end(), p.begin(), p.end());
    f.delay = net_.draw_delay(self_, peer_, size);
    f.inbox = &outbox_;
    f.signal = sent_.get();
    const auto wire = static_cast<std::uint64_t>(f.remaining);
    net_.add(&f);
    std::unique_lock<std::mutex> lock(f.mu);
    if (!f.signal->wait(lock, deadline, [&] { return f.done; })) {
      lock.unlock();
      net_.remove(&f);
      close();  // a partial message is on the wire: the link is unusable, as with TCP
      return error(ErrorCode::kTimeout, "sending to node " + std::to_string(peer_) + " did not finish before the deadline");
    }
    if (f.result.ok()) {
      stats_.bytes_sent += wire;
      stats_.messages_sent += 1;
      net_.traffic[static_cast<std::size_t>(self_)].wire_bytes_sent += wire;
      net_.traffic[static_cast<std::size_t>(self_)].messages_sent += 1;
      net_.traffic[static_cast<std::size_t>(peer_)].wire_bytes_received += wire;
    }
    return f.result;
  }

  Result<Bytes> recv(transport::Tag tag, Deadline deadline) override {
    Mailbox& m = inbox_;
    std::unique_lock<std::mutex> lock(m.mu);
    auto has = [&] {
      return m.closed || m.find(tag) != nullptr;
    };
    if (!m.signal->wait(lock, deadline, has)) {
      return error(ErrorCode::kTimeout, "no message from node " + std::to_string(peer_) + " before the deadline");
    }
    std::deque<Bytes>* q = m.find(tag);
    if (q == nullptr) return lost();
    Bytes out = std::move(q->front());
    q->pop_front();
    stats_.bytes_received += out.size() + transport::kFrameHeaderBytes;
    stats_.messages_received += 1;
    return out;
  }

  void close() override { net_.close_pair(self_, peer_, epoch_); }
  void recycle(Bytes buffer) override { net_.recycle(std::move(buffer)); }
  transport::LinkStats stats() const override { return stats_; }

 private:
  Status lost() const { return error(ErrorCode::kPeerLost, "node " + std::to_string(peer_) + " is gone (link closed)"); }

  Network::Impl& net_;
  int self_, peer_, epoch_;
  const transport::PeerId peer_id_;
  const std::string peer_address_;
  Mailbox& inbox_;   // what the peer sends us (mailboxes live as long as the Network)
  Mailbox& outbox_;  // what we send the peer
  std::unique_ptr<Signal> sent_;  // notified as this link's sends finish (each waits for its own)
  transport::LinkStats stats_;
};

}  // namespace

Network::Network(Scheduler& scheduler, NetworkSpec spec) : impl_(std::make_unique<Impl>(scheduler, std::move(spec))) {}
Network::~Network() = default;

int Network::size() const { return impl_->n; }

std::shared_ptr<transport::Link> Network::link(int from, int to, int epoch) {
  GOSSAMER_CHECK(from >= 0 && to >= 0 && from < impl_->n && to < impl_->n && from != to, "Network::link: no such pair of nodes");
  auto& l = impl_->links[{from, to, epoch}];
  if (!l) l = std::make_shared<SimLink>(*impl_, from, to, epoch);
  return l;
}

std::shared_ptr<transport::Link> Network::connection(int from, int to, int epoch, transport::PeerId peer, std::string peer_address) {
  GOSSAMER_CHECK(from >= 0 && to >= 0 && from < impl_->n && to < impl_->n && from != to, "Network::connection: no such pair of nodes");
  auto& l = impl_->links[{from, to, epoch}];
  GOSSAMER_CHECK(!l, "Network::connection: that connection exists already");
  l = std::make_shared<SimLink>(*impl_, from, to, epoch, peer, std::move(peer_address));
  return l;
}

void Network::close(int a, int b, int epoch) { impl_->close_gracefully(a, b, epoch); }

void Network::crash(int node) {
  GOSSAMER_CHECK(node >= 0 && node < impl_->n, "Network::crash: no such node");
  impl_->dead[static_cast<std::size_t>(node)] = true;
  std::set<std::pair<int, int>> pairs;  // (other node, epoch) of every connection the node has had
  for (const auto& [key, m] : impl_->mailboxes) {
    const auto [r, s, e] = key;
    if (r == node) pairs.insert({s, e});
    if (s == node) pairs.insert({r, e});
  }
  for (auto [other, epoch] : pairs) impl_->close_pair(node, other, epoch);
}

void Network::revive(int node) {
  GOSSAMER_CHECK(node >= 0 && node < impl_->n, "Network::revive: no such node");
  impl_->dead[static_cast<std::size_t>(node)] = false;
}

void Network::post(int from, int to, Bytes message, std::function<void(Bytes)> on_arrival) {
  GOSSAMER_CHECK(from >= 0 && to >= 0 && from < impl_->n && to < impl_->n && from != to, "Network::post: no such pair of nodes");
  auto& im = *impl_;
  if (im.dead[static_cast<std::size_t>(from)] || im.dead[static_cast<std::size_t>(to)]) return;
  const auto& a = im.spec.nodes[static_cast<std::size_t>(from)].link;
  const auto& b = im.spec.nodes[static_cast<std::size_t>(to)].link;
  const double wire = a.wire_bytes(message.size() + transport::kFrameHeaderBytes);
  const double rate = std::min(a.bandwidth_bytes_per_s, b.bandwidth_bytes_per_s);
  const Nanos serialization = std::isinf(rate) ? Nanos{0} : Nanos(static_cast<std::int64_t>(std::ceil(wire / rate * 1e9)));
  const Nanos at = im.sched.now() + im.draw_delay(from, to, message.size(), /*datagram=*/true) + serialization;
  im.traffic[static_cast<std::size_t>(from)].datagram_bytes_sent += static_cast<std::uint64_t>(wire);
  im.sched.call_at(at, [&im, to, wire, message = std::move(message), on_arrival = std::move(on_arrival)]() mutable {
    if (im.dead[static_cast<std::size_t>(to)]) return;
    im.traffic[static_cast<std::size_t>(to)].datagram_bytes_received += static_cast<std::uint64_t>(wire);
    on_arrival(std::move(message));
  });
}

bool Network::crashed(int node) const { return impl_->dead[static_cast<std::size_t>(node)]; }
NodeTraffic Network::traffic(int node) const { return impl_->traffic[static_cast<std::size_t>(node)]; }
Nanos Network::path_latency(int from, int to) const { return impl_->latency(from, to); }

}  // namespace gossamer::sim
