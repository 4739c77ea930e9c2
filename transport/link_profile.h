// LinkProfile: how a network path behaves. Used by the real-time shaper here and by the simulator's
// emulated links, so a profile means the same thing in both. Plain value.
//
// Presets (one-way latency; RTT is twice that):
//   loopback          unlimited, 0
//   datacenter        100 Gbit/s, 25 us, jitter 5 us
//   cross-region      1 Gbit/s, 35 ms, jitter 2 ms, loss 0.01%
//   intercontinental  500 Mbit/s, 75 ms, jitter 5 ms, loss 0.1%
//   home              100 Mbit/s, 15 ms, jitter 3 ms, loss 0.1%
//   wan-100m-80ms     100 Mbit/s, 40 ms (80 ms RTT), jitter 1 ms
#pragma once

#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/status.h"

namespace gossamer::transport {

struct LinkProfile {
  std::string name = "custom";
  double bandwidth_bytes_per_s = std::numeric_limits<double>::infinity();
  Nanos latency{0};  // one way
  Nanos jitter{0};   // standard deviation of extra one-way delay (never negative in total)
  double loss = 0.0; // packet loss probability, modelled as retransmission delay
  std::size_t mtu_bytes = 1500;

  // Bytes on the wire for n bytes of TCP payload: each MTU-sized packet also carries 66 bytes of
  // Ethernet (14), IP (20) and TCP-with-timestamps (32) headers, as a kernel shaper such as tbf counts.
  double wire_bytes(std::size_t n) const;
  // Payload bytes per second the link can carry: bandwidth x mss / (mss + 66), mss = mtu - 52.
  double goodput_bytes_per_s() const;
  // Time to deliver n bytes of payload on an idle link, ignoring jitter and loss.
  Nanos ideal_transfer_time(std::size_t n) const;
  // Checks ranges (bandwidth > 0, loss in [0, 1), non-negative times).
  [[nodiscard]] Status validate() const;
};

[[nodiscard]] Result<LinkProfile> link_profile_preset(std::string_view name);
std::vector<std::string> link_profile_names();

}  // namespace gossamer::transport
