#include "sim/transport_fabric.h"

#include <mutex>

#include "core/check.h"
#include "core/signal.h"
#include "transport/endpoint.h"

namespace gossamer::sim {

struct TransportFabric::Listener {
  int node = 0;
  transport::PeerId id;
  std::string address;
  std::mutex mu;
  std::unique_ptr<Signal> arrived;
  std::deque<std::shared_ptr<transport::Link>> pending;
  bool closed = false;
};

class SimTransport final : public transport::Transport {
 public:
  SimTransport(TransportFabric& fabric, int node, std::string address, transport::PeerId self) : fabric_(fabric) {
    listener_.node = node;
    listener_.id = self;
    listener_.address = std::move(address);
    listener_.arrived = fabric.scheduler_.make_signal();
    fabric_.listeners_[listener_.address] = &listener_;
  }
  ~SimTransport() override {
    auto it = fabric_.listeners_.find(listener_.address);
    if (it != fabric_.listeners_.end() && it->second == &listener_) fabric_.listeners_.erase(it);
    std::lock_guard lock(listener_.mu);
    for (auto& l : listener_.pending) l->close();
  }

  transport::PeerId self() const override { return listener_.id; }
  const transport::RunId& run() const override { return run_; }
  std::string address() const override { return listener_.address; }

  Result<std::shared_ptr<transport::Link>> connect(const std::string& address, Deadline deadline) override {
    Scheduler& s = fabric_.scheduler_;
    Network& net = fabric_.network_;
    auto it = fabric_.listeners_.find(address);
    const int to = it != fabric_.listeners_.end() ? it->second->node : -1;
    const Nanos rtt = to >= 0 && to != listener_.node ? 2 * net.path_latency(listener_.node, to) : Nanos{0};
    if (to < 0 || net.crashed(to)) {
      // Nothing there: a crashed host does not answer at all, an empty port refuses.
      const Nanos wait = to < 0 ? Nanos(std::chrono::milliseconds(1)) : deadline.remaining(s);
      s.sleep_until(std::min(deadline.time(), s.now() + wait));
      return error(to < 0 ? ErrorCode::kUnavailable : ErrorCode::kTimeout, "connecting to " + address + ": " + (to < 0 ? "refused" : "no answer"));
    }
    if (to == listener_.node) return error(ErrorCode::kInvalidArgument, "connecting to " + address + ": that is this node");
    if (net.crashed(listener_.node)) return error(ErrorCode::kUnavailable, "connecting to " + address + ": this node is down");
    if (deadline.time() < s.now() + rtt) {
      s.sleep_until(deadline.time());
      return error(ErrorCode::kTimeout, "connecting to " + address + ": the handshake did not finish before the deadline");
    }
    s.sleep_for(rtt);
    auto there = fabric_.listeners_.find(address);  // it may have gone during the handshake
    if (there == fabric_.listeners_.end() || net.crashed(to)) return error(ErrorCode::kPeerLost, "connecting to " + address + ": the peer went away");
    TransportFabric::Listener& l = *there->second;
    const int c = fabric_.next_connection_++;
    auto mine = net.connection(listener_.node, to, c, l.id, address);
    auto theirs = net.connection(to, listener_.node, c, listener_.id, listener_.address);
    {
      std::lock_guard lock(l.mu);
      l.pending.push_back(std::move(theirs));
    }
    l.arrived->notify_all();
    return mine;
  }

  Result<std::shared_ptr<transport::Link>> accept(Deadline deadline) override {
    std::unique_lock lock(listener_.mu);
    if (!listener_.arrived->wait(lock, deadline, [&] { return !listener_.pending.empty(); })) {
      return error(ErrorCode::kTimeout, "no incoming connection before the deadline");
    }
    auto link = std::move(listener_.pending.front());
    listener_.pending.pop_front();
    return link;
  }

 private:
  TransportFabric& fabric_;
  TransportFabric::Listener listener_;
  transport::RunId run_{};
};

TransportFabric::TransportFabric(Scheduler& scheduler, Network& network) : scheduler_(scheduler), network_(network) {}
TransportFabric::~TransportFabric() = default;

Result<std::unique_ptr<transport::Transport>> TransportFabric::make(int node, const std::string& address, transport::PeerId self) {
  GOSSAMER_CHECK(node >= 0 && node < network_.size(), "TransportFabric::make: no such network node");
  auto ep = transport::parse_endpoint(address, transport::EndpointUse::kDial, "simulated link address");
  if (!ep.ok()) return ep.status();
  if (listeners_.count(address) == 1) return error(ErrorCode::kInvalidArgument, "simulated link address " + address + " is in use");
  return std::unique_ptr<transport::Transport>(std::make_unique<SimTransport>(*this, node, address, self));
}

}  // namespace gossamer::sim
