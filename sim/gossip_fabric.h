// GossipFabric: the real gossip (transport/gossip_core.h: SWIM membership, failure detector, rumors)
// over the simulator's network, in virtual time. A simulated peer gets a transport::Gossip from it
// and cannot tell it from the ZeroMQ one: same messages, same timing rules, with the Scheduler as
// its Clock.
//
// Each node is named by its gossip address ("tcp://HOST:PORT", as a real peer's) and sits on a
// Network node; its messages are the Network's datagrams (network.h: latency, jitter and loss of
// the path, serialization on the access links, wire bytes counted in the node's traffic). A node
// ticks every GossipOptions::period from a scheduler callback; received messages and its own
// broadcasts are handled in callbacks too, so subscribers' handlers run there (they must not wait,
// as on the real gossip thread they must be quick).
//
// Determinism: every choice is drawn from the node's seeded generator and every event is ordered by
// the Scheduler, so a run is repeatable bit for bit. crash(): the node goes silent at once, without
// a farewell (others detect it); destroying a node's Gossip leaves gracefully.
//
// Ownership: the fabric must outlive the Gossip objects it made. Threading: the Scheduler's actors
// and callbacks only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "sim/network.h"
#include "sim/scheduler.h"
#include "transport/gossip.h"

namespace gossamer::sim {

class GossipFabric {
 public:
  GossipFabric(Scheduler& scheduler, Network& network);
  ~GossipFabric();
  GossipFabric(const GossipFabric&) = delete;
  GossipFabric& operator=(const GossipFabric&) = delete;

  // A gossip node on network node `node`, reached at options.bind (no wildcard, no '*'); its seeds
  // are other nodes' bind addresses. `seed` seeds its choices; options.self must be set.
  [[nodiscard]] Result<std::unique_ptr<transport::Gossip>> make(int node, const transport::GossipOptions& options, std::uint64_t seed);
  // The node at `address` goes silent now: it neither sends nor receives, and says no goodbye.
  void crash(const std::string& address);

  struct Node;

 private:
  friend class SimGossip;
  void route(int from, const std::string& to, Bytes message);
  Scheduler& scheduler_;
  Network& network_;
  std::map<std::string, std::shared_ptr<Node>> nodes_;  // by gossip address: the live ones
  std::vector<std::string> ips_;                        // by network node: the host of its last address
};

}  // namespace gossamer::sim
