// Relays: how two peers that both sit behind NAT (outbound-only, neither accepts connections) get a
// link. Each opens a TCP connection to a member that accepts connections (the relay) and sends a
// RELAY request naming itself, the other, the relay and a session; the relay pairs the two requests,
// answers both, and from then on copies bytes between the two connections. The two ends then run the
// usual handshake (protocol.h, secure_channel.h) end to end through it: with a run key the relay
// forwards records it cannot read, and any change it made would fail their authentication.
//
// RELAY request (112 bytes, little-endian):
//   magic "GSRY" | version u8 (2) | 3 zero bytes | run id 16 | from u64 | to u64 | session u64 |
//   relay u64 | time u64 (ms since the Unix epoch, the requester's clock) | nonce 16 |
//   tag 32 (HMAC-SHA-256 over the 80 bytes before it, keyed by a key derived from the run key;
//   zeros in a run without a key)
// The relay answers with 8 bytes: "GSRY" | status u8 (RelayStatus) | 3 zero bytes, then copies.
// A request of another run, with a tag that does not verify, naming the relay itself as an end, or
// naming another relay, is refused. So is one whose time is more than kRelayClockSkew from the
// relay's clock (kStale), and one the relay has taken before (its nonce seen within that window):
// a request captured on the wire can be used neither at another relay, nor later, nor twice.
//
// Threading: pure functions. The relay side is RelayHub (relay_hub.h, internal to the TCP transport).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>

#include "core/bytes.h"
#include "core/status.h"
#include "transport/ids.h"
#include "transport/secure_channel.h"

namespace gossamer::transport {

inline constexpr std::size_t kRelayRequestBytes = 112;
inline constexpr std::uint8_t kRelayVersion = 2;  // of requests and answers (docs/wire.md)
inline constexpr std::size_t kRelayAnswerBytes = 8;
// How far a request's time may lie from the relay's clock (either way): machines' clocks kept by
// NTP agree within a second; this leaves room for ones that drift, and bounds the replay cache.
inline constexpr std::chrono::minutes kRelayClockSkew{5};

enum class RelayStatus : std::uint8_t {
  kPaired = 0,    // the other end is here: bytes flow from now on
  kRefused = 1,   // another run, a tag that does not verify, or a malformed request
  kNoMatch = 2,   // the other end did not ask within the relay's wait
  kBusy = 3,      // the relay holds as many pairs or waiting requests as it allows
  kStale = 4,     // the request's time is too far from the relay's clock, or it was taken before
};

struct RelayRequest {
  RunId run;
  PeerId from, to;
  std::uint64_t session = 0;
  PeerId relay;               // the relay it is meant for
  std::uint64_t time_ms = 0;  // when it was made, ms since the Unix epoch
  std::array<std::uint8_t, 16> nonce{};
};

// Now, as a request's time: ms since the Unix epoch (the system clock).
std::uint64_t relay_time_now();

// True when `first4` is the relay magic (the accept path tells a RELAY from a HELLO by it).
bool is_relay_magic(ByteView first4);
Bytes encode_relay_request(const RelayRequest& request, const std::optional<RunKey>& key);
// Untrusted input: exactly kRelayRequestBytes. kMalformed for a bad layout, kVersionMismatch,
// kUnauthenticated when the tag does not verify under `key` (or is not zero without one).
[[nodiscard]] Result<RelayRequest> decode_relay_request(ByteView bytes, const std::optional<RunKey>& key);
Bytes encode_relay_answer(RelayStatus status);
[[nodiscard]] Result<RelayStatus> decode_relay_answer(ByteView bytes);

}  // namespace gossamer::transport
