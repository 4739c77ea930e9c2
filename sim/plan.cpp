#include "sim/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "optim/method.h"
#include "quant/format.h"
#include "quant/sparse.h"

namespace gossamer::sim {

namespace {

const optim::MethodInfo& traits_of(const PlanRow& row) { return optim::method_info(row.id); }

double latency_of(const PlanRow& row, const PlanInput& in) {
  const int hops = traits_of(row).exchange == optim::Exchange::kPairs ? 1 : in.allreduce_hops;  // a partner, not a ring
  return hops * in.latency_s;
}

// Time a synchronization may take while compute goes on: the last step's backward pass, tau more
// steps for Streaming DiLoCo, the whole next round for CO2.
double overlapped_s(const PlanRow& row, const PlanInput& in) {
  double t = in.backward_overlap * in.step_time_s;
  const optim::MethodInfo& m = traits_of(row);
  if (m.overlapped) t += in.overlap * in.step_time_s;
  if (m.one_round_stale) t += row.steps_between_syncs * in.step_time_s;
  return t;
}

}  // namespace

std::vector<PlanRow> plan(const PlanInput& in, double streaming_bits) {
  const double m = in.workers;
  const double ring = m > 1 ? 2.0 * (m - 1) / m : 0.0;
  const double p = in.parameters, s = in.step_time_s, u = in.target_utilization;
  const int fragments = std::max(1, (in.layers + in.fragment_layers - 1) / in.fragment_layers);
  const double sb = streaming_bits > 0 ? streaming_bits : in.bits_per_value;
  std::vector<PlanRow> rows;
  for (const optim::MethodInfo& info : optim::kMethods) {
    double peers = 0;  // how many times each value crosses this worker's link
    switch (info.exchange) {
      case optim::Exchange::kNone: continue;
      case optim::Exchange::kAllReduce: peers = ring; break;
      case optim::Exchange::kPairs: peers = 1; break;        // one partner
      case optim::Exchange::kAllGather: peers = m - 1; break;  // every other worker
    }
    double bits = in.bits_per_value;
    switch (info.plan_bits) {
      case optim::PlanBits::kAsked: break;
      case optim::PlanBits::kAskedStreaming: bits = sb; break;
      case optim::PlanBits::kInt2: bits = quant::bits_per_value(quant::EncodeOptions{.codec = quant::CodecId::kInt2}); break;  // with its scales
      case optim::PlanBits::kSparse: bits = quant::sparse_bits_per_value({}); break;  // the default chunk and top-k
    }
    double steps = info.every_step ? 1.0 : static_cast<double>(in.inner_steps), sync = peers * p;
    if (info.fragmented) {  // one fragment's values per round
      steps /= fragments;
      sync /= fragments;
    }
    rows.push_back(PlanRow{std::string(info.name), info.id, steps, sync * bits, 0});
  }
  for (auto& r : rows) {
    // Exposed time allowed per sync: compute between syncs x (1/u - 1); plus what overlaps hide.
    const double wire_time = r.steps_between_syncs * s * (1.0 / u - 1.0) + overlapped_s(r, in) - latency_of(r, in);
    r.required_bits_per_s = wire_time > 0 ? r.bits_per_sync / wire_time : std::numeric_limits<double>::infinity();
  }
  return rows;
}

double planned_utilization(const PlanRow& row, const PlanInput& in, double bits_per_s) {
  const double compute = row.steps_between_syncs * in.step_time_s;
  const double comm = row.bits_per_sync / bits_per_s + latency_of(row, in);
  const double exposed = std::max(0.0, comm - overlapped_s(row, in));
  return compute / (compute + exposed);
}

}  // namespace gossamer::sim
