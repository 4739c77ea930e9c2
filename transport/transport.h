// Transport: the factory of Links to other peers (gloo's Device). It owns one I/O thread that drives
// every socket it creates; it listens on one address and performs the HELLO handshake on each new
// connection, refusing peers of another run or another major wire version.
//
// Thread-safety: all methods may be called from any thread. Blocking: connect() and accept() block
// until a link is ready or their Deadline passes (a real-time Deadline: TCP runs on the real clock).
// Destruction closes every link and joins the I/O thread.
#pragma once

#include <memory>
#include <string>

#include "core/clock.h"
#include "core/status.h"
#include "transport/ids.h"
#include "transport/link.h"

namespace gossamer::transport {

// What a transport counted about relays (relay.h) and refused connections.
struct TransportStats {
  std::uint64_t relay_forwarded_bytes = 0;  // copied between other peers, as their relay
  std::uint64_t relay_pairs = 0;            // links this transport relayed
  std::uint64_t relayed_bytes_sent = 0;     // this peer's own traffic over relayed links
  std::uint64_t relayed_bytes_received = 0;
  std::uint64_t refused = 0;                // connections refused (handshake, relay request, or too many at once)
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual PeerId self() const = 0;
  virtual const RunId& run() const = 0;
  // "host:port" others can connect to (the real port when listening on port 0).
  virtual std::string address() const = 0;
  // Connects and handshakes. kVersionMismatch / kUnauthenticated when the peer is refused.
  [[nodiscard]] virtual Result<std::shared_ptr<Link>> connect(const std::string& address, Deadline deadline) = 0;
  // The next incoming link that passed the handshake.
  [[nodiscard]] virtual Result<std::shared_ptr<Link>> accept(Deadline deadline) = 0;
  // A link to `target` through the relay at `relay` (relay.h), for two peers that accept no
  // connections: both ends call this with the same `session`; `initiator` is true on exactly one of
  // them (it plays the connecting side of the handshake). kUnavailable where relays are not offered.
  // `relay_id` is the relay's peer id: the request is good at that relay only (relay.h).
  [[nodiscard]] virtual Result<std::shared_ptr<Link>> connect_relayed(const std::string& relay, PeerId relay_id, PeerId target,
                                                                      std::uint64_t session, bool initiator, Deadline deadline) {
    (void)relay, (void)relay_id, (void)target, (void)session, (void)initiator, (void)deadline;
    return error(ErrorCode::kUnavailable, "this transport has no relays");
  }
  // As a relay: closes what it relays for sessions up to `session` (a run's group links of epochs
  // its own group has left behind). Nothing where it relays nothing.
  virtual void retire_relayed(std::uint64_t session) { (void)session; }
  virtual TransportStats stats() const { return {}; }
};

}  // namespace gossamer::transport
