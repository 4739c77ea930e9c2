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
};

}  // namespace gossamer::transport
