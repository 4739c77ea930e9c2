#include "skippipe/topology.h"

#include <cmath>
#include <map>
#include <utility>

namespace gossamer::skippipe {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct GeoPair {
  const char* a;
  const char* b;
  double latency_ms;
  double gib_per_s;
};

// The reference's measured table (one-way latency in ms, bandwidth in GiB/s), SKIPPIPE.md section 1.
constexpr GeoPair kGeo[] = {
    {"AU", "BE", 129, .00983},   {"AU", "CA", 98, .01318},    {"AU", "DE", 125.5, .01046}, {"AU", "IA", 84, .01123},
    {"AU", "JP", 58, .01379},    {"AU", "LA", 69, .01465},    {"AU", "NL", 128, .00952},   {"AU", "OR", 68, .01465},
    {"AU", "SG", 48, .02979},    {"AU", "TW", 67, .02100},    {"AU", "LDN", 132, .00940},  {"BE", "CA", 41, .01990},
    {"BE", "DE", 4, .2425},      {"BE", "IA", 49, .02832},    {"BE", "JP", 112, .01172},   {"BE", "LA", 70, .01941},
    {"BE", "NL", 3, .2425},      {"BE", "OR", 66, .02087},    {"BE", "SG", 83, .01611},    {"BE", "TW", 105, .01245},
    {"BE", "LDN", 3.5, .2425},   {"CA", "DE", 44, .03186},    {"CA", "IA", 14, .07568},    {"CA", "JP", 74, .01807},
    {"CA", "LA", 35, .03052},    {"CA", "NL", 42, .02502},    {"CA", "OR", 30.5, .04712},  {"CA", "SG", 107, .01194},
    {"CA", "TW", 89, .01471},    {"CA", "LDN", 38.5, .03638}, {"DE", "IA", 53.5, .02661},  {"DE", "JP", 112, .01108},
    {"DE", "LA", 73, .01825},    {"DE", "NL", 3.5, .2425},    {"DE", "OR", 68, .01492},    {"DE", "SG", 80, .0125},
    {"DE", "TW", 102, .01257},   {"DE", "LDN", 6.6, .18875},  {"IA", "JP", 72.5, .01398},  {"IA", "LA", 23.4, .06146},
    {"IA", "NL", 51, .02740},    {"IA", "OR", 19.3, .09033},  {"IA", "TW", 88, .0128},     {"IA", "SG", 101.5, .01263},
    {"IA", "LDN", 48.1, .02185}, {"JP", "LA", 50, .02777},    {"JP", "NL", 108.5, .01138}, {"JP", "OR", 46.2, .03046},
    {"JP", "SG", 35.6, .03900},  {"JP", "TW", 19.2, .07672},  {"JP", "LDN", 107, .00889},  {"LA", "NL", 71.5, .01425},
    {"LA", "OR", 12.4, .11853},  {"LA", "SG", 79.5, .01685},  {"LA", "TW", 64, .01619},    {"LA", "LDN", 68, .01492},
    {"NL", "OR", 67, .02039},    {"NL", "SG", 81.5, .01636},  {"NL", "TW", 105.5, .01196}, {"NL", "LDN", 4.8, .000237},
    {"OR", "SG", 78.5, .01678},  {"OR", "TW", 59.5, .02332},  {"OR", "LDN", 64, .02124},   {"SG", "TW", 23.2, .06189},
    {"SG", "LDN", 85, .01569},   {"TW", "LDN", 109.5, .00896},
};

}  // namespace

const std::vector<std::string_view>& geo_locations() {
  static const std::vector<std::string_view> kLocations = {"AU", "BE", "CA", "DE", "IA", "JP", "LA", "NL", "OR", "SG", "TW", "LDN"};
  return kLocations;
}

Status Network::check() const {
  const auto n2 = static_cast<std::size_t>(nodes) * static_cast<std::size_t>(nodes);
  if (nodes < 1) return error(ErrorCode::kInvalidArgument, "a network needs at least one node");
  if (latency_s.size() != n2 || bandwidth_Bps.size() != n2) {
    return error(ErrorCode::kInvalidArgument, "a network of " + std::to_string(nodes) + " nodes needs " + std::to_string(n2) + " latencies and bandwidths");
  }
  for (int a = 0; a < nodes; ++a) {
    for (int b = 0; b < nodes; ++b) {
      if (a == b) continue;
      if (!std::isfinite(latency(a, b)) || latency(a, b) < 0) {
        return error(ErrorCode::kInvalidArgument, "latency from node " + std::to_string(a) + " to " + std::to_string(b) + " must be finite and >= 0");
      }
      if (!std::isfinite(bandwidth(a, b)) || bandwidth(a, b) <= 0) {
        return error(ErrorCode::kInvalidArgument, "bandwidth from node " + std::to_string(a) + " to " + std::to_string(b) + " must be finite and > 0");
      }
    }
  }
  return Status();
}

Network uniform_network(int nodes, double latency_s, double bandwidth_Bps) {
  Network net;
  net.nodes = nodes;
  const auto n2 = static_cast<std::size_t>(nodes) * static_cast<std::size_t>(nodes);
  net.latency_s.assign(n2, latency_s);
  net.bandwidth_Bps.assign(n2, bandwidth_Bps);
  return net;
}

Network geo_network(int nodes, bool fix_nl_ldn) {
  const auto& locs = geo_locations();
  const auto m = static_cast<int>(locs.size());
  std::map<std::pair<std::string_view, std::string_view>, std::pair<double, double>> table;
  for (const auto& p : kGeo) {
    double gib = p.gib_per_s;
    if (fix_nl_ldn && std::string_view(p.a) == "NL" && std::string_view(p.b) == "LDN") gib = .2425;
    table[{p.a, p.b}] = table[{p.b, p.a}] = {p.latency_ms / 1000.0, gib * kGiB};
  }
  Network net = uniform_network(nodes, 0.001, 2.0 * kGiB);  // same location: 1 ms, 2 GiB/s
  for (int a = 0; a < nodes; ++a) {
    for (int b = 0; b < nodes; ++b) {
      const auto la = locs[static_cast<std::size_t>(a % m)], lb = locs[static_cast<std::size_t>(b % m)];
      if (la == lb) continue;
      const auto [lat, bw] = table.at({la, lb});
      net.latency_s[static_cast<std::size_t>(a * nodes + b)] = lat;
      net.bandwidth_Bps[static_cast<std::size_t>(a * nodes + b)] = bw;
    }
  }
  return net;
}

double Costs::hop(const Network& net, int a, int b) const { return net.latency(a, b) + activation_bytes / net.bandwidth(a, b) + hop_overhead_s; }

Status Costs::check(const Network& net) const {
  auto bad = [](const std::string& what) { return error(ErrorCode::kInvalidArgument, what); };
  if (!std::isfinite(forward_s) || forward_s <= 0) return bad("the forward time must be > 0");
  if (!node_forward_s.empty() && static_cast<int>(node_forward_s.size()) != net.nodes) {
    return bad("per-node forward times: " + std::to_string(node_forward_s.size()) + " given for " + std::to_string(net.nodes) + " nodes");
  }
  for (double f : node_forward_s) {
    if (!std::isfinite(f) || f <= 0) return bad("every node's forward time must be > 0");
  }
  if (!std::isfinite(backward_factor) || backward_factor < 0 || !std::isfinite(head_factor) || head_factor < 0) return bad("backward and head factors must be >= 0");
  if (!std::isfinite(activation_bytes) || activation_bytes < 0 || !std::isfinite(hop_overhead_s) || hop_overhead_s < 0) {
    return bad("activation bytes and the hop overhead must be >= 0");
  }
  return Status();
}

}  // namespace gossamer::skippipe
