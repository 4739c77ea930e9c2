#include "sim/network.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <mutex>
#include <set>

#include "core/check.h"
#include "core/signal.h"
#include "sim/network_impl.h"
#include "transport/protocol.h"

namespace gossamer::sim {

using network_detail::Flow;
using network_detail::Mailbox;

namespace {

class SimLink final : public transport::Link {
 public:
  SimLink(Network::Impl& net, int self, int peer, int epoch, transport::PeerId peer_id = {}, std::string peer_address = {}, bool graceful = false)
      : graceful_(graceful),
        net_(net),
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
    const auto wire = static_cast<std::uint64_t>(f.remaining);
    if (net_.spec.byte_weight) f.remaining *= net_.spec.byte_weight(tag);
    f.payload = net_.take_buffer(size);
    for (ByteView p : parts) f.payload.insert(f.payload.end(), p.begin(), p.end());
    f.delay = net_.draw_delay(self_, peer_, size);
    f.inbox = &outbox_;
    f.signal = sent_.get();
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

  void close() override {
    if (graceful_) {
      net_.close_gracefully(self_, peer_, epoch_);
    } else {
      net_.close_pair(self_, peer_, epoch_);
    }
  }
  void recycle(Bytes buffer) override { net_.recycle(std::move(buffer)); }
  transport::LinkStats stats() const override { return stats_; }

 private:
  Status lost() const { return error(ErrorCode::kPeerLost, "node " + std::to_string(peer_) + " is gone (link closed)"); }

  const bool graceful_;  // a connection's close, as TCP's: what was sent still arrives
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
  l = std::make_shared<SimLink>(*impl_, from, to, epoch, peer, std::move(peer_address), /*graceful=*/true);
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
  double rate = std::min(a.bandwidth_bytes_per_s, b.bandwidth_bytes_per_s);
  if (im.pairs >= 0) rate = std::min(rate, im.spec.pairs[im.pair(from, to)].bandwidth_bytes_per_s);
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
