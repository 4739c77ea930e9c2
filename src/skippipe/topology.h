// What the SkipPipe scheduler knows of the machines (docs/skippipe.md): per-pair one-way latency and
// bandwidth between nodes, what one stage's forward of one micro-batch costs on each node, and the
// size of what a hop carries. The reference's geo-distributed setting is a preset.
//
// A hop from node a to node b costs latency(a, b) + activation_bytes / bandwidth(a, b) + the per-hop
// overhead (the reference adds 0.35 s to every hop; SKIPPIPE.md section 1).
//
// Threading: plain values. No LibTorch in this library: the simulator and real peers share it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gossamer::skippipe {

struct Network {
  int nodes = 0;
  std::vector<double> latency_s;      // nodes x nodes, row-major, one way (the diagonal is unused)
  std::vector<double> bandwidth_Bps;  // nodes x nodes, bytes per second

  double latency(int a, int b) const { return latency_s[static_cast<std::size_t>(a * nodes + b)]; }
  double bandwidth(int a, int b) const { return bandwidth_Bps[static_cast<std::size_t>(a * nodes + b)]; }
  // Sizes match, latencies finite and >= 0, bandwidths finite and > 0 off the diagonal.
  [[nodiscard]] Status check() const;
};

// A network where every pair has the same latency and bandwidth.
Network uniform_network(int nodes, double latency_s, double bandwidth_Bps);

// The reference's geo-distributed table: node i sits at location i mod 12, in the order
// AU BE CA DE IA JP LA NL OR SG TW LDN; nodes at one location are 1 ms and 2 GiB/s apart. The table's
// NL-LDN entry (0.000237 GiB/s, about 1000 times below the other European pairs) looks like a typo;
// `fix_nl_ldn` replaces it by the BE-LDN figure (0.2425 GiB/s). Bandwidths are in the table's GiB/s.
Network geo_network(int nodes, bool fix_nl_ldn = false);
const std::vector<std::string_view>& geo_locations();

struct Costs {
  double forward_s = 1.76;             // one stage's forward of one micro-batch (the reference's wm)
  std::vector<double> node_forward_s;  // per node, when nodes differ; empty: forward_s everywhere
  double backward_factor = 1.5;        // a backward costs this many forwards
  double head_factor = 0.25;           // the head and loss at the origin, in forwards
  double activation_bytes = 32.0 * 1024 * 1024;  // what one hop carries (activations or their gradients)
  double hop_overhead_s = 0.35;        // added to every hop

  double forward(int node) const { return node_forward_s.empty() ? forward_s : node_forward_s[static_cast<std::size_t>(node)]; }
  // Latency plus transfer plus overhead of one hop from a to b.
  double hop(const Network& net, int a, int b) const;
  [[nodiscard]] Status check(const Network& net) const;
};

}  // namespace gossamer::skippipe
