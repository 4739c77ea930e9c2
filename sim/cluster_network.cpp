// The emulated network and compute of a simulated run (sim/cluster.h): network_spec and step_seconds.
#include "sim/cluster.h"

#include <chrono>
#include <string>
#include <vector>

#include "skippipe/topology.h"

namespace gossamer::sim {

namespace {
double mbit_to_bytes_per_s(double mbit) { return mbit * 1e6 / 8; }
}  // namespace

Result<NetworkSpec> network_spec(const train::RunConfig& c) {
  transport::LinkProfile link;
  std::vector<PairSpec> pairs;
  if (c.sim.network == "skippipe-geo") {
    // Access links unlimited: the table's pairs are the network (sim/network.h).
    link.name = "skippipe-geo";
    const int n = static_cast<int>(c.sim.workers);
    const skippipe::Network geo = skippipe::geo_network(n);
    pairs.resize(static_cast<std::size_t>(n) * static_cast<std::size_t>(n));
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        if (a != b) {
          pairs[static_cast<std::size_t>(a * n + b)] =
              PairSpec{geo.bandwidth(a, b), std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(geo.latency(a, b)))};
        }
      }
    }
  } else if (c.sim.network == "custom") {
    link.name = "custom";
    link.bandwidth_bytes_per_s = mbit_to_bytes_per_s(c.sim.bandwidth_mbit);
    link.latency = std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::milli>(c.sim.latency_ms));
    link.jitter = std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::milli>(c.sim.jitter_ms));
    link.loss = c.sim.loss;
  } else {
    auto preset = transport::link_profile_preset(c.sim.network);
    if (!preset.ok()) return error(ErrorCode::kInvalidArgument, "sim.network: " + preset.status().message());
    link = *preset;
  }
  if (Status st = link.validate(); !st.ok()) return error(ErrorCode::kInvalidArgument, "sim.network: " + st.message());
  NetworkSpec spec;
  spec.pairs = std::move(pairs);
  spec.seed = static_cast<std::uint64_t>(c.sim.seed);
  spec.hub_bytes_per_s = mbit_to_bytes_per_s(c.sim.shared_uplink_mbit);
  for (std::int64_t k = 0; k < c.sim.sites; ++k) {
    spec.sites.push_back(SiteSpec{"site " + std::to_string(k), mbit_to_bytes_per_s(c.sim.site_uplink_mbit),
                                  std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::milli>(c.sim.site_latency_ms))});
  }
  for (std::int64_t i = 0; i < c.sim.workers; ++i) {
    // Sites take contiguous blocks of workers, as even as they divide.
    NodeSpec node{link, c.sim.sites > 0 ? static_cast<int>(i * c.sim.sites / c.sim.workers) : -1};
    if (i >= c.sim.workers - c.sim.slow_link_workers) {
      node.link.name = link.name + " (slow)";
      node.link.bandwidth_bytes_per_s = mbit_to_bytes_per_s(c.sim.slow_link_mbit);
    }
    spec.nodes.push_back(node);
  }
  return spec;
}

double step_seconds(const train::RunConfig& c, std::int64_t parameters, double measured_s) {
  if (c.sim.compute == train::ComputeModel::kFixed) return c.sim.step_time_s;
  if (c.sim.compute == train::ComputeModel::kMeasured) return measured_s;
  const double tokens = static_cast<double>(c.train.batch_size * c.model.context);
  return 6.0 * static_cast<double>(parameters) * tokens / (c.sim.device_tflops * 1e12 * c.sim.device_utilization);
}

}  // namespace gossamer::sim
