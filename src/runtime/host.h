// Host: what a Peer (peer_runtime.h) runs on: its clock, its gossip, the links' transport it opens
// once the run is known, the dial-back check of its addresses, the pace of its inner steps and the
// speed of its link. `gossamer peer` runs on the machine's (ZeroMQ gossip, TCP links, the real clock;
// run_peer in peer.cpp); the simulator on emulated ones (sim/cluster.cpp: the virtual clock, the
// gossip and transport fabrics), so a simulated run goes through the same runtime as a real one.
//
// Threading: clock() and gossip() from any thread; the rest from the thread that runs the Peer (pace()
// from its training thread). Errors: kInvalidArgument for an address the user must change.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/hash.h"
#include "core/status.h"
#include "transport/gossip.h"
#include "transport/transport.h"

namespace gossamer::runtime {

// The links' transport of a run, opened once the spec (and so the run id) is known.
struct OpenedLinks {
  std::unique_ptr<transport::Transport> transport;
  std::string announced;  // where others dial them
  std::string bound;      // where they listen (Gloo's rendezvous host is taken from it)
};

class Host {
 public:
  virtual ~Host() = default;
  virtual Clock& clock() = 0;
  // Started, with this peer's seeds.
  virtual transport::Gossip& gossip() = 0;
  // Gossip's HOST:PORT as others are told (a port 0 resolved).
  virtual std::string gossip_announced() const = 0;
  // The links' transport; the run id is the spec's hash, so peers of another run are refused at the
  // handshake.
  [[nodiscard]] virtual Result<OpenedLinks> open_links(const Digest& spec_hash) = 0;
  // Whether others can open connections to `addresses` of this peer (transport::Gossip::
  // check_reachable), or nothing where every peer reaches every other (a simulation). Asked for
  // gossip's address before the run spec is heard, then for the links' once they listen.
  [[nodiscard]] virtual std::optional<Result<transport::Reachability>> check_reachable(const std::vector<std::string>& addresses,
                                                                                     const std::atomic<bool>* stop) = 0;
  // The seconds an inner step counts as, and waits out, given the measured ones (a simulated worker's
  // speed, a real peer's --throttle); as measured by default.
  virtual double pace(double measured_s) { return measured_s; }
  // The bandwidth of this peer's link (bytes/s) where the host knows it (a simulation's access link):
  // serving newcomers takes at most join.serve_share of it. A real peer knows it from --shape.
  virtual std::optional<double> link_bytes_per_s() const { return std::nullopt; }
};

}  // namespace gossamer::runtime
