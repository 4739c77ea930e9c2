// LinkModel: the one account of how a LinkProfile delays what is sent over it. Pure: bytes and the
// time of sending in, the time the link is free again and the due time out. The real-time shaper
// (shaped_link.h), shaped gossip (gossip.h) and the simulator's emulated network (sim/network.h) all
// draw their delays here, so a profile means the same thing in each and sim-against-real comparisons
// under jitter and loss compare like with like.
//
// The model, for one message of n bytes (what the caller counts: framing included where it has one):
// - bandwidth: the message occupies the link for LinkProfile::wire_bytes(n) / bandwidth, after the
//   ones handed over before it (one message on the wire at a time);
// - propagation: latency, plus jitter drawn from a signed normal N(0, jitter) (so `latency` stays the
//   mean one-way delay, as netem's jitter does), plus one round trip (2 x latency) of retransmission
//   for each lost packet: each of the ceil(n / mss) packets (mss = mtu - 52) is lost with probability
//   `loss`. Never below zero. Jitter is drawn before loss, from the caller's generator;
// - order: due times never decrease, because a TCP stream delivers in order (head-of-line blocking),
//   so jitter and loss delay but never reorder.
// Threading: a LinkModel is a plain value; its owner serializes calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>

#include "core/clock.h"
#include "transport/link_profile.h"

namespace gossamer::transport {

// What the propagation of one message depends on: a profile's, or a simulated path's made of its two
// ends (sim/network.h), whose jitter need not be a whole number of nanoseconds.
struct PathShape {
  Nanos latency{0};
  double jitter_ns = 0;  // standard deviation of the signed normal draw
  double loss = 0;       // per packet
  std::size_t mtu_bytes = 1500;

  static PathShape of(const LinkProfile& profile);
};

// The propagation delay of one message of `bytes` bytes: latency + jitter + retransmissions, >= 0.
Nanos draw_propagation(const PathShape& path, std::size_t bytes, std::mt19937_64& rng);

class LinkModel {
 public:
  LinkModel(const LinkProfile& profile, std::uint64_t seed);

  struct Carried {
    Nanos sent;  // when the link has carried its last byte (it is free for the next message)
    Nanos due;   // when it arrives at the other end
  };
  // A message of `bytes` bytes handed to the link at `now` (any fixed epoch, the same for every call).
  Carried carry(Nanos now, std::size_t bytes);
  // When a message of `bytes` handed over at `now` would have left, without carrying it.
  Nanos would_send(Nanos now, std::size_t bytes) const;
  // Time `bytes` bytes (already counted as wire bytes) occupy the link; zero when unlimited.
  Nanos wire_time(double bytes) const;
  const LinkProfile& profile() const { return profile_; }

 private:
  LinkProfile profile_;
  PathShape path_;
  std::mt19937_64 rng_;
  Nanos free_at_{0};
  Nanos last_due_{0};
};

}  // namespace gossamer::transport
