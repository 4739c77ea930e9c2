#include "transport/link_profile.h"

#include <cmath>

namespace gossamer::transport {

namespace {
using std::chrono::microseconds;
using std::chrono::milliseconds;

LinkProfile make(std::string name, double bits_per_s, Nanos latency, Nanos jitter, double loss) {
  LinkProfile p;
  p.name = std::move(name);
  p.bandwidth_bytes_per_s = bits_per_s / 8.0;
  p.latency = latency;
  p.jitter = jitter;
  p.loss = loss;
  return p;
}

const std::vector<LinkProfile>& presets() {
  static const std::vector<LinkProfile> all = {
      make("loopback", std::numeric_limits<double>::infinity(), Nanos(0), Nanos(0), 0.0),
      make("datacenter", 100e9, microseconds(25), microseconds(5), 0.0),
      make("cross-region", 1e9, milliseconds(35), milliseconds(2), 1e-4),
      make("intercontinental", 500e6, milliseconds(75), milliseconds(5), 1e-3),
      make("home", 100e6, milliseconds(15), milliseconds(3), 1e-3),
      make("wan-100m-80ms", 100e6, milliseconds(40), milliseconds(1), 0.0),
  };
  return all;
}
}  // namespace

namespace {
constexpr double kHeaderBytesPerPacket = 66;  // Ethernet 14 + IPv4 20 + TCP with timestamps 32
constexpr double kIpTcpBytes = 52;            // the part of it inside the MTU
}  // namespace

double LinkProfile::wire_bytes(std::size_t n) const {
  const double mss = static_cast<double>(mtu_bytes) - kIpTcpBytes;
  const double packets = std::ceil(static_cast<double>(n) / mss);
  return static_cast<double>(n) + packets * kHeaderBytesPerPacket;
}

double LinkProfile::goodput_bytes_per_s() const {
  const double mss = static_cast<double>(mtu_bytes) - kIpTcpBytes;
  return bandwidth_bytes_per_s * mss / (mss + kHeaderBytesPerPacket);
}

Nanos LinkProfile::ideal_transfer_time(std::size_t n) const {
  if (std::isinf(bandwidth_bytes_per_s)) return latency;
  return latency + Nanos(static_cast<std::int64_t>(std::llround(wire_bytes(n) / bandwidth_bytes_per_s * 1e9)));
}

Status LinkProfile::validate() const {
  if (!(bandwidth_bytes_per_s > 0)) return error(ErrorCode::kInvalidArgument, "link profile " + name + ": bandwidth must be > 0");
  if (!(loss >= 0.0 && loss < 1.0)) return error(ErrorCode::kInvalidArgument, "link profile " + name + ": loss must be in [0, 1)");
  if (latency < Nanos(0) || jitter < Nanos(0)) return error(ErrorCode::kInvalidArgument, "link profile " + name + ": negative latency or jitter");
  if (mtu_bytes < 576) return error(ErrorCode::kInvalidArgument, "link profile " + name + ": mtu below 576 bytes");
  return Status();
}

Result<LinkProfile> link_profile_preset(std::string_view name) {
  std::string names;
  for (const auto& p : presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  return error(ErrorCode::kInvalidArgument, "unknown link profile '" + std::string(name) + "': use one of " + names);
}

std::vector<std::string> link_profile_names() {
  std::vector<std::string> out;
  for (const auto& p : presets()) out.push_back(p.name);
  return out;
}

}  // namespace gossamer::transport
