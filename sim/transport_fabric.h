// TransportFabric: transport::Transport over the simulator's network, so that code written for TCP
// links (PeerLinks, state transfer) runs unchanged in virtual time.
//
// A transport listens at an address ("HOST:PORT", as a real one) on a Network node. connect() to
// an address opens a fresh connection (its own mailboxes, as a new TCP connection is) after one
// round trip (the handshake), and the listener's accept() hands out the other end. Nobody listening
// there: the connection is refused after a round trip (kUnavailable), as a TCP reset would say. A
// crashed listener's pending connections fail like the rest of its links (Network::crash), and a
// crashed node dials nobody.
//
// Ownership: the fabric must outlive the transports it made. Threading: the Scheduler's actors and
// callbacks only.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "core/status.h"
#include "sim/network.h"
#include "sim/scheduler.h"
#include "transport/transport.h"

namespace gossamer::sim {

class TransportFabric {
 public:
  TransportFabric(Scheduler& scheduler, Network& network);
  ~TransportFabric();
  TransportFabric(const TransportFabric&) = delete;
  TransportFabric& operator=(const TransportFabric&) = delete;

  // A transport of process `self` on network node `node`, listening at `address`.
  [[nodiscard]] Result<std::unique_ptr<transport::Transport>> make(int node, const std::string& address, transport::PeerId self);

  struct Listener;

 private:
  friend class SimTransport;
  Scheduler& scheduler_;
  Network& network_;
  std::map<std::string, Listener*> listeners_;  // by address
  int next_connection_ = 1;                     // the Network epochs that name connections
};

}  // namespace gossamer::sim
