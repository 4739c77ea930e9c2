// Dial-back checks: how a peer learns whether others can open connections to it (or whether it sits
// behind a NAT without a port forward). The peer sends a REQUEST over its gossip connection to a
// member that accepts connections; that member opens a TCP connection to each address named and
// sends back an ANSWER through the same connection (gossip.cpp carries both beside the member
// tables; ZeroMQ keeps them apart by their magic).
//
// Wire (little-endian, core/wire):
//   magic "GSRP" | version u8 | type u8 (1 REQUEST, 2 ANSWER) | nonce u64, then
//   REQUEST: requester id u64 | count u8 (1..kMaxReachAddresses) | count x address str (HOST:PORT)
//   ANSWER:  observed ip str | count u8 | count x (outcome u8: 0 unreached, 1 reached, 2 unchecked; detail str)
// A helper opens the TCP connection and writes the 4-byte magic "GSPB" (a Gossamer link port closes
// such a connection quietly, counting it as a probe), then closes it.
// Untrusted input: decoders refuse anything malformed (kMalformed), of another version
// (kVersionMismatch) or beyond the caps. Pure functions, thread-safe; probe_tcp blocks up to its
// timeout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "core/clock.h"
#include "core/status.h"
#include "transport/ids.h"

namespace gossamer::transport {

inline constexpr std::size_t kMaxReachAddresses = 4;

enum class ReachType : std::uint8_t { kNone = 0, kRequest = 1, kAnswer = 2 };

// The dial-back messages' version (docs/wire.md).
inline constexpr std::uint8_t kReachVersion = 1;

struct ReachRequest {
  std::uint64_t nonce = 0;
  PeerId requester;
  std::vector<std::string> addresses;
};

enum class ReachOutcome : std::uint8_t {
  kUnreached = 0,
  kReached = 1,
  kUnchecked = 2,  // the helper would not dial it (a name or IP other than the one the request came from)
};

struct ReachResult {
  ReachOutcome outcome = ReachOutcome::kUnreached;
  std::string detail;  // why not, or empty
  bool reached() const { return outcome == ReachOutcome::kReached; }
};

struct ReachAnswer {
  std::uint64_t nonce = 0;
  std::string observed_ip;
  std::vector<ReachResult> results;  // one per address of the request, in its order
};

// kNone unless `bytes` starts with the magic and a known type (cheap: only the header is looked at).
ReachType reach_type(ByteView bytes);
Bytes encode_reach_request(const ReachRequest& request);
[[nodiscard]] Result<ReachRequest> decode_reach_request(ByteView bytes);
Bytes encode_reach_answer(const ReachAnswer& answer);
[[nodiscard]] Result<ReachAnswer> decode_reach_answer(ByteView bytes);

// Opens a TCP connection to `address` (HOST:PORT, a name is looked up), writes the probe magic and
// closes it: ok when it opened within `timeout`; otherwise a Status saying what happened (refused,
// timed out, no route).
[[nodiscard]] Status probe_tcp(const std::string& address, Nanos timeout);

// True when `first4` is the probe magic a helper writes.
bool is_reach_probe_magic(ByteView first4);

// What a helper dials for `requested` (one address of a REQUEST) when the request came from
// `observed_ip`: a wildcard host is replaced by the observed IP; another host is dialled only when it
// is (or its name resolves to) the observed IP, so no member can use a peer to knock on third
// parties or inside its network. kNotFound for a host that is not the observed IP: not checked.
[[nodiscard]] Result<std::string> reach_target(const std::string& requested, const std::string& observed_ip);

}  // namespace gossamer::transport
