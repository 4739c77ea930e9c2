#include "sim/gossip_fabric.h"

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "transport/endpoint.h"
#include "transport/gossip_core.h"

namespace gossamer::sim {

struct GossipFabric::Node {
  Node(GossipFabric& f, int n, const transport::GossipOptions& o, std::uint64_t seed)
      : fabric(f), node(n), core(o, o.bind, f.scheduler_, seed) {}
  GossipFabric& fabric;
  const int node;
  transport::GossipCore core;
  std::string ip;  // the host of its address: what receivers observe its messages coming from
  bool silent = false;  // crashed or left

  void send(const std::vector<transport::GossipSend>& sends) {
    for (const auto& s : sends) fabric.route(node, s.to, s.message);
  }
};

namespace {

// Runs `fn` on the node at `when`, unless it has gone since.
void at(Scheduler& s, Nanos when, const std::weak_ptr<GossipFabric::Node>& weak, std::function<void(GossipFabric::Node&)> fn) {
  s.call_at(when, [weak, fn = std::move(fn)] {
    if (auto n = weak.lock(); n && !n->silent) fn(*n);
  });
}

void schedule_tick(Scheduler& s, const std::weak_ptr<GossipFabric::Node>& weak, Nanos when) {
  at(s, when, weak, [&s, weak](GossipFabric::Node& n) {
    n.send(n.core.tick());
    n.core.run_deliveries();
    schedule_tick(s, weak, s.now() + n.core.options().period);
  });
}

}  // namespace

class SimGossip final : public transport::Gossip {
 public:
  SimGossip(GossipFabric& fabric, std::shared_ptr<GossipFabric::Node> node) : fabric_(fabric), node_(std::move(node)) {}
  ~SimGossip() override { leave(); }

  transport::PeerId self() const override { return node_->core.self(); }
  std::string address() const override { return node_->core.bound(); }
  std::vector<transport::Member> members() const override { return node_->core.members(); }
  std::uint64_t members_version() const override { return node_->core.members_version(); }
  std::vector<transport::Member> sample(std::size_t k) override { return node_->core.sample(k); }
  Status broadcast(const std::string& topic, ByteView payload) override {
    if (node_->silent) return error(ErrorCode::kAborted, "this node has left the gossip");
    if (Status st = node_->core.broadcast(topic, payload); !st.ok()) return st;
    flush_soon();
    return Status();
  }
  Status send(transport::PeerId to, const std::string& topic, ByteView payload) override {
    if (node_->silent) return error(ErrorCode::kAborted, "this node has left the gossip");
    if (Status st = node_->core.send(to, topic, payload); !st.ok()) return st;
    flush_soon();
    return Status();
  }
  void subscribe(const std::string& topic, Handler handler) override { node_->core.subscribe(topic, std::move(handler)); }
  void leave() override {
    if (node_->silent) return;
    node_->send(node_->core.farewell());
    node_->silent = true;
    auto it = fabric_.nodes_.find(node_->core.bound());
    if (it != fabric_.nodes_.end() && it->second == node_) fabric_.nodes_.erase(it);
  }
  std::uint64_t dropped_messages() const override { return node_->core.dropped(); }
  std::pair<std::uint64_t, std::uint64_t> bytes() const override { return node_->core.bytes(); }
  std::uint64_t membership_bytes_sent() const override { return node_->core.membership_bytes_sent(); }
  std::optional<Nanos> round_trip() const override { return node_->core.round_trip(); }
  Status set_outbound_only(bool outbound_only) override {
    node_->core.set_outbound_only(outbound_only);
    return Status();
  }

 private:
  // What was queued is sent at once (delivered here too) from a callback: the caller may hold its own lock.
  void flush_soon() {
    at(fabric_.scheduler_, fabric_.scheduler_.now(), node_, [](GossipFabric::Node& n) {
      n.send(n.core.take_broadcasts());
      n.core.run_deliveries();
    });
  }

  GossipFabric& fabric_;
  std::shared_ptr<GossipFabric::Node> node_;
};

GossipFabric::GossipFabric(Scheduler& scheduler, Network& network)
    : scheduler_(scheduler), network_(network), ips_(static_cast<std::size_t>(network.size())) {}
GossipFabric::~GossipFabric() = default;

Result<std::unique_ptr<transport::Gossip>> GossipFabric::make(int node, const transport::GossipOptions& options, std::uint64_t seed) {
  GOSSAMER_CHECK(node >= 0 && node < network_.size(), "GossipFabric::make: no such network node");
  GOSSAMER_CHECK(options.self.value != 0, "GossipFabric::make: give the node an id");
  auto ep = transport::parse_endpoint(options.bind, transport::EndpointUse::kDial, "simulated gossip address");
  if (!ep.ok()) return ep.status();
  auto it = nodes_.find(options.bind);
  if (it != nodes_.end() && !it->second->silent) return error(ErrorCode::kInvalidArgument, "simulated gossip address " + options.bind + " is in use");
  auto n = std::make_shared<Node>(*this, node, options, seed);
  n->ip = ep->host;
  ips_[static_cast<std::size_t>(node)] = ep->host;
  nodes_[options.bind] = n;
  schedule_tick(scheduler_, n, scheduler_.now());
  return std::unique_ptr<transport::Gossip>(std::make_unique<SimGossip>(*this, std::move(n)));
}

void GossipFabric::crash(const std::string& address) {
  auto it = nodes_.find(address);
  if (it == nodes_.end()) return;
  it->second->silent = true;
  nodes_.erase(it);
}

void GossipFabric::route(int from, const std::string& to, Bytes message) {
  auto it = nodes_.find(to);
  if (it == nodes_.end()) return;  // nobody listens there: lost, as a datagram to a dead host
  const int dest = it->second->node;
  if (dest == from) return;
  const std::string& ip = ips_[static_cast<std::size_t>(from)];
  network_.post(from, dest, std::move(message), [this, to, ip](Bytes m) {
    auto there = nodes_.find(to);
    if (there == nodes_.end() || there->second->silent) return;
    auto& n = *there->second;
    n.send(n.core.handle(m, ip));
    n.core.run_deliveries();
  });
}

}  // namespace gossamer::sim
