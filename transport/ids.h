// Identifiers shared by the transport: who a peer is, which run it belongs to, and the tag that
// routes a message to its receiver. Plain values.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace gossamer::transport {

// A peer's id, unique within a run (chosen at random by default).
struct PeerId {
  std::uint64_t value = 0;
  friend bool operator==(PeerId, PeerId) = default;
  friend auto operator<=>(PeerId, PeerId) = default;
  std::string to_string() const;
};

// A run's id: peers of different runs refuse each other.
struct RunId {
  std::array<std::uint8_t, 16> bytes{};
  friend bool operator==(const RunId&, const RunId&) = default;
  std::string to_string() const;  // 32 hex digits
};

// Routes messages on a link: recv(tag) returns the next message sent with that tag.
using Tag = std::uint32_t;

PeerId random_peer_id();
RunId random_run_id();

}  // namespace gossamer::transport
