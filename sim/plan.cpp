#include "sim/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gossamer::sim {

namespace {

double latency_of(const PlanRow& row, const PlanInput& in) {
  const int hops = row.method == "noloco" ? 1 : in.allreduce_hops;
  return hops * in.latency_s;
}

}  // namespace

std::vector<PlanRow> plan(const PlanInput& in, double streaming_bits) {
  const double m = in.workers;
  const double ring = m > 1 ? 2.0 * (m - 1) / m : 0.0;
  const double p = in.parameters, s = in.step_time_s, u = in.target_utilization;
  const int fragments = std::max(1, (in.layers + in.fragment_layers - 1) / in.fragment_layers);
  const double sb = streaming_bits > 0 ? streaming_bits : in.bits_per_value;
  std::vector<PlanRow> rows = {
      {"ddp", 1, ring * p * in.bits_per_value, 0, 0},
      {"diloco", static_cast<double>(in.inner_steps), ring * p * in.bits_per_value, 0, 0},
      {"streaming_diloco", static_cast<double>(in.inner_steps) / fragments, ring * p / fragments * sb, 0, 0},
      {"noloco", static_cast<double>(in.inner_steps), p * in.bits_per_value, 0, 0},
      {"co2", static_cast<double>(in.inner_steps), ring * p * in.bits_per_value, 0, 0},
  };
  for (auto& r : rows) {
    // Exposed time allowed per sync: compute between syncs x (1/u - 1); plus what overlaps hide.
    double hidden = r.steps_between_syncs * s * (1.0 / u - 1.0) + in.backward_overlap * s;
    if (r.method == "streaming_diloco") hidden += in.overlap * s;
    if (r.method == "co2") hidden += r.steps_between_syncs * s;  // the next round runs meanwhile
    r.hidden_s = hidden;
    const double wire_time = hidden - latency_of(r, in);
    r.required_bits_per_s = wire_time > 0 ? r.bits_per_sync / wire_time : std::numeric_limits<double>::infinity();
  }
  return rows;
}

double planned_utilization(const PlanRow& row, const PlanInput& in, double bits_per_s) {
  const double compute = row.steps_between_syncs * in.step_time_s;
  const double comm = row.bits_per_sync / bits_per_s + latency_of(row, in);
  double free = in.backward_overlap * in.step_time_s;
  if (row.method == "streaming_diloco") free += in.overlap * in.step_time_s;
  if (row.method == "co2") free += compute;
  const double exposed = std::max(0.0, comm - free);
  return compute / (compute + exposed);
}

}  // namespace gossamer::sim
