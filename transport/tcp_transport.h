// TCP transport on standalone Asio: one io_context thread per transport, links that stream large
// messages straight from the caller's buffer (no copy on send), per-tag receive queues with a
// backpressure cap, keepalive, TCP_NODELAY, and a congestion-control algorithm chosen per socket where
// the kernel offers it (BBR copes with loss far better than CUBIC on long, lossy paths).
// See transport.h and link.h for the threading and error contracts.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/clock.h"
#include "core/status.h"
#include "transport/secure_channel.h"
#include "transport/transport.h"

namespace gossamer::transport {

struct TcpOptions {
  std::string listen = "127.0.0.1:0";  // port 0: an ephemeral port
  PeerId self;                          // zero: a random id
  RunId run;
  std::uint64_t max_message_bytes = std::uint64_t{1} << 30;   // larger frames are a protocol error
  std::uint64_t max_buffered_bytes = std::uint64_t{2} << 30;  // per link: reading pauses beyond this
  Nanos handshake_timeout = std::chrono::seconds(10);
  // Connections accepted but not through their handshake yet: beyond this many, the oldest is
  // closed to make room (counted, logged at a bounded rate), so junk connections held open cannot
  // pile up, nor keep a genuine handshake (a round trip or two) out by their number.
  std::size_t max_handshakes = 256;
  // The same from one source IP (an IPv6 /64): beyond it, new ones are closed at once, evicting
  // nobody; one host cannot take every place.
  std::size_t max_handshakes_per_ip = 32;
  // Links through their handshake that accept() has not taken yet: beyond this, closed.
  std::size_t max_accepted = 1024;
  // Serving as a relay (relay.h) for peers that accept no connections: how long a request waits
  // for its other end, and how many pairs at once (0: no relaying).
  Nanos relay_wait = std::chrono::seconds(30);
  std::size_t relay_max_pairs = 256;
  // A relayed pair that carried nothing either way for about this long is closed.
  Nanos relay_idle = std::chrono::minutes(15);
  std::string congestion_control;  // "bbr", "cubic", ...; empty: the OS default
  bool keepalive = true;
  // The run key: links are then authenticated and encrypted (secure_channel.h), and peers without
  // the key are refused. Without a key the transport is insecure, for local benchmarking only.
  std::optional<RunKey> key;
};

[[nodiscard]] Result<std::unique_ptr<Transport>> make_tcp_transport(const TcpOptions& options);

}  // namespace gossamer::transport
