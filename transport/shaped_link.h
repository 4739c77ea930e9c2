// ShapedLink: a Link decorator that makes a fast local link behave like the path a LinkProfile
// describes, in real time, so real processes on one machine can act as if continents apart.
//
// Model (applied to what this end sends; wrap both ends for a symmetric path), computed by LinkModel
// (link_model.h) as the simulator's is:
// - bandwidth: a message of n bytes (plus its frame header) occupies the link for its wire bytes
//   (payload plus Ethernet/IP/TCP headers per MTU-sized packet, LinkProfile::wire_bytes) / bandwidth,
//   which is what a kernel shaper such as tbf counts. Messages go out back to back in call order;
//   send() returns once at most kShaperSendBufferBytes of its message are still to go out, as a
//   writer to a kernel socket buffer does, so the link stays busy while the caller prepares its next
//   message and a caller that is late by less than the buffer's drain time loses no bandwidth. A send
//   whose return would come after its deadline fails with kTimeout and occupies nothing;
// - latency and jitter: the message is then delivered after latency + N(0, jitter) (never before it
//   was sent), by a delay line that hands it to the inner link at its due time; due times never
//   decrease, because a TCP stream delivers in order (head-of-line blocking), so jitter delays but
//   never reorders;
// - loss: each MSS-sized packet is lost with probability `loss` (seeded), and each loss costs one
//   round trip (2 x latency) of retransmission delay, the fast-retransmit case.
// Lifetime: destroying a ShapedLink delivers what its sends accepted, at their due times, as a
// closed TCP socket still sends its buffer (at most 10 s; what is left then is dropped with a
// warning); close() drops it at once.
// Threading: thread-safe like any Link; one delay-line thread per ShapedLink. An error of the inner
// link found by the delay line (after send() returned) fails the link: later calls report it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "transport/link.h"
#include "transport/link_profile.h"

namespace gossamer::transport {

// Bytes a shaped send may leave unsent when it returns (a socket send buffer's worth).
inline constexpr std::size_t kShaperSendBufferBytes = std::size_t{1} << 20;

[[nodiscard]] Result<std::shared_ptr<Link>> make_shaped_link(std::shared_ptr<Link> inner, const LinkProfile& profile,
                                                             std::uint64_t seed = 1);

}  // namespace gossamer::transport
