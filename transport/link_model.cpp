#include "transport/link_model.h"

#include <algorithm>
#include <cmath>

namespace gossamer::transport {

namespace {
constexpr std::size_t kIpTcpBytes = 52;  // the part of each packet's headers inside the MTU
}  // namespace

PathShape PathShape::of(const LinkProfile& profile) {
  PathShape p;
  p.latency = profile.latency;
  p.jitter_ns = static_cast<double>(profile.jitter.count());
  p.loss = profile.loss;
  p.mtu_bytes = profile.mtu_bytes;
  return p;
}

Nanos draw_propagation(const PathShape& path, std::size_t bytes, std::mt19937_64& rng) {
  const double base = static_cast<double>(path.latency.count());
  double extra_ns = 0;
  if (path.jitter_ns > 0) extra_ns += std::normal_distribution<double>(0.0, path.jitter_ns)(rng);
  if (path.loss > 0) {
    const std::size_t mss = path.mtu_bytes - kIpTcpBytes;
    const auto packets = static_cast<std::int64_t>((bytes + mss - 1) / mss);
    const std::int64_t lost = std::binomial_distribution<std::int64_t>(packets, path.loss)(rng);
    extra_ns += static_cast<double>(lost) * 2.0 * base;  // one round trip per lost packet
  }
  return Nanos(static_cast<std::int64_t>(std::llround(std::max(0.0, base + extra_ns))));
}

LinkModel::LinkModel(const LinkProfile& profile, std::uint64_t seed) : profile_(profile), path_(PathShape::of(profile)), rng_(seed) {}

Nanos LinkModel::wire_time(double bytes) const {
  if (std::isinf(profile_.bandwidth_bytes_per_s)) return Nanos(0);
  return Nanos(static_cast<std::int64_t>(std::llround(bytes / profile_.bandwidth_bytes_per_s * 1e9)));
}

Nanos LinkModel::would_send(Nanos now, std::size_t bytes) const {
  return std::max(now, free_at_) + wire_time(profile_.wire_bytes(bytes));
}

LinkModel::Carried LinkModel::carry(Nanos now, std::size_t bytes) {
  Carried c;
  c.sent = would_send(now, bytes);
  free_at_ = c.sent;
  c.due = std::max(c.sent + draw_propagation(path_, bytes, rng_), last_due_);
  last_due_ = c.due;
  return c;
}

}  // namespace gossamer::transport
