#include "sim/network_impl.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "transport/link_model.h"
#include "transport/protocol.h"

namespace gossamer::sim {

using network_detail::Delivery;
using network_detail::Flow;
using network_detail::Mailbox;
using network_detail::Path;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

Network::Impl::Impl(Scheduler& s, NetworkSpec sp) : sched(s), spec(std::move(sp)) {
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
  if (!spec.pairs.empty()) {
    GOSSAMER_CHECK(spec.pairs.size() == nn * nn, "Network: pairs must hold nodes x nodes entries");
    pairs = static_cast<int>(capacity.size());
    for (std::size_t i = 0; i < nn * nn; ++i) {
      const PairSpec& pr = spec.pairs[i];
      GOSSAMER_CHECK(i % (nn + 1) == 0 || (pr.bandwidth_bytes_per_s > 0 && pr.latency >= Nanos{0}),
                     "Network: a pair link needs a positive bandwidth and a latency >= 0");
      capacity.push_back(pr.bandwidth_bytes_per_s);
    }
  }
  last_delivery.assign(nn * nn, Nanos{0});
  rngs.resize(nn * nn);
  for (std::size_t i = 0; i < nn * nn; ++i) rngs[i].seed(spec.seed * 0x9E3779B97F4A7C15ull + i);
  datagram_rngs.resize(nn * nn);
  for (std::size_t i = 0; i < nn * nn; ++i) datagram_rngs[i].seed(spec.seed * 0xD1B54A32D192ED03ull + i + 1);
  dead.assign(nn, false);
  traffic.resize(nn);
}

Mailbox& Network::Impl::mailbox(int receiver, int sender, int epoch) {
  auto& m = mailboxes[{receiver, sender, epoch}];
  if (!m) {
    m = std::make_unique<Mailbox>();
    m->signal = sched.make_signal();
    m->closed = dead[static_cast<std::size_t>(receiver)] || dead[static_cast<std::size_t>(sender)];
  }
  return *m;
}

Path Network::Impl::path(int from, int to) const {
  Path p;
  p.push_back(2 * from);
  const int sf = spec.nodes[static_cast<std::size_t>(from)].site, st = spec.nodes[static_cast<std::size_t>(to)].site;
  if (sf != st) {
    if (sf >= 0) p.push_back(2 * n + 2 * sf);
    if (st >= 0) p.push_back(2 * n + 2 * st + 1);
  }
  if (hub >= 0) p.push_back(hub);
  if (pairs >= 0) p.push_back(pairs + static_cast<int>(pair(from, to)));
  p.push_back(2 * to + 1);
  return p;
}

Nanos Network::Impl::latency(int from, int to) const {
  const auto& a = spec.nodes[static_cast<std::size_t>(from)];
  const auto& b = spec.nodes[static_cast<std::size_t>(to)];
  Nanos l = (a.link.latency + b.link.latency) / 2;
  if (a.site != b.site) {
    if (a.site >= 0) l += spec.sites[static_cast<std::size_t>(a.site)].latency;
    if (b.site >= 0) l += spec.sites[static_cast<std::size_t>(b.site)].latency;
  }
  if (pairs >= 0) l += spec.pairs[pair(from, to)].latency;
  return l;
}

Nanos Network::Impl::draw_delay(int from, int to, std::size_t payload_bytes, bool datagram) {
  const auto& a = spec.nodes[static_cast<std::size_t>(from)].link;
  const auto& b = spec.nodes[static_cast<std::size_t>(to)].link;
  auto& rng = datagram ? datagram_rngs[pair(from, to)] : rngs[pair(from, to)];
  // The path's shape, made of its two ends as means, so that a path between two ends of one profile
  // has that profile: their mean latency (plus sites' and pairs'), the root mean square of their
  // jitters, the geometric mean of their packets' survival, the smaller MTU.
  transport::PathShape path;
  path.latency = latency(from, to);
  path.jitter_ns = std::sqrt((std::pow(static_cast<double>(a.jitter.count()), 2) + std::pow(static_cast<double>(b.jitter.count()), 2)) / 2);
  path.loss = 1.0 - std::sqrt((1.0 - a.loss) * (1.0 - b.loss));
  path.mtu_bytes = std::min(a.mtu_bytes, b.mtu_bytes);
  return transport::draw_propagation(path, payload_bytes + transport::kFrameHeaderBytes, rng);
}

void Network::Impl::recompute() {
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

void Network::Impl::advance() {
  const double dt = std::chrono::duration<double>(sched.now() - last_update).count();
  for (Flow* f : flows) {
    if (std::isinf(f->rate)) {
      f->remaining = 0;  // an unlimited path carries it in no time
    } else if (dt > 0) {
      f->remaining -= f->rate * dt;
    }
  }
  last_update = sched.now();
}

void Network::Impl::schedule_next() {
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

void Network::Impl::on_timer() {
  advance();
  std::vector<Flow*> finished;
  for (Flow* f : flows) {
    if (f->remaining <= kDoneBytes) finished.push_back(f);
  }
  for (Flow* f : finished) complete(f);
  rates_changed();
}

void Network::Impl::add(Flow* f) {
  advance();
  flows.push_back(f);
  rates_changed();
}

void Network::Impl::remove(Flow* f) {
  advance();
  flows.erase(std::remove(flows.begin(), flows.end(), f), flows.end());
  rates_changed();
}

void Network::Impl::rates_changed() {
  if (recompute_pending) return;
  recompute_pending = true;
  sched.call_at(sched.now(), [this] {
    recompute_pending = false;
    recompute();
    schedule_next();
  });
}

void Network::Impl::finish(Flow* f, Status st) {
  std::lock_guard<std::mutex> lock(f->mu);
  f->done = true;
  f->result = std::move(st);
  f->signal->notify_all();
}

void Network::Impl::complete(Flow* f) {
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

void Network::Impl::deliver(std::size_t slot) {
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

void Network::Impl::cut_flows(int a, int b, int epoch) {
  std::vector<Flow*> cut;
  for (Flow* f : flows) {
    if (f->epoch == epoch && ((f->from == a && f->to == b) || (f->from == b && f->to == a))) cut.push_back(f);
  }
  for (Flow* f : cut) {
    remove(f);
    finish(f, error(ErrorCode::kPeerLost, "link to node " + std::to_string(f->to) + " closed"));
  }
}

void Network::Impl::close_pair(int a, int b, int epoch) {
  for (auto [r, s] : {std::pair{a, b}, std::pair{b, a}}) {
    Mailbox& m = mailbox(r, s, epoch);
    std::lock_guard<std::mutex> lock(m.mu);
    m.closed = true;
    m.signal->notify_all();
  }
  cut_flows(a, b, epoch);
}

void Network::Impl::close_gracefully(int a, int b, int epoch) {
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

Bytes Network::Impl::take_buffer(std::size_t n) {
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

void Network::Impl::recycle(Bytes b) {
  if (pool.size() < kPoolBuffers && b.capacity() > 0) pool.push_back(std::move(b));
}

}  // namespace gossamer::sim
