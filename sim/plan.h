// Planning: the bandwidth each method needs to keep workers computing a target share of the time,
// analytically (`gossamer plan`), with the assumptions written down here and checked against the
// simulator in tests.
//
// Model. Workers compute inner steps of `step_time_s`; a method synchronizes `bits_per_sync` every
// `steps_between_syncs` steps. The synchronization's time on the wire, bits / bandwidth plus its
// latency-bound hops, may hide behind (a) the backward pass of the step that produced it
// (`backward_overlap` x step time; 2/3 when gradients are sent layer by layer during backward, 0 when
// they are sent after it, as Gossamer does today), (b) `overlap` further inner steps (Streaming
// DiLoCo's tau; a whole round for CO2), and what is left is exposed. Utilization = compute /
// (compute + exposed). Per method:
//   ddp:               every step, ring all-reduce of every parameter: 2 (M-1)/M x P x bits
//   diloco:            every H steps, the same all-reduce
//   streaming_diloco:  every H/F steps (F fragments of fragment_layers blocks), an all-reduce of P/F
//                      values, overlapped by tau steps
//   noloco:            every H steps, one exchange of P values with one peer (one hop each way)
//   co2:               every H steps, an all-reduce that overlaps the whole next round
// Latency: 2 (M-1) hops for a ring all-reduce (Gossamer's all-to-all scheme takes 2 hops), 1 for a
// pair exchange. Scales of blockwise codecs are ignored (under 1% at block 128).
// Threading: pure functions.
#pragma once

#include <string>
#include <vector>

#include "optim/method.h"

namespace gossamer::sim {

struct PlanInput {
  double parameters = 1e9;
  int layers = 24;
  double step_time_s = 0.1;
  int workers = 2;
  int inner_steps = 100;        // H
  int fragment_layers = 3;      // streaming_diloco
  int overlap = 1;              // tau (streaming_diloco)
  double bits_per_value = 16;   // bf16; fp4 = 4, fp32 = 32
  double target_utilization = 0.95;
  double backward_overlap = 0;  // fraction of a step the last step's backward hides (paper: 2/3)
  double latency_s = 0;         // one way, per hop
  int allreduce_hops = 2;       // latency-bound phases of one all-reduce (ring: 2 (M-1))
};

struct PlanRow {
  std::string method;
  optim::Method id{};
  double steps_between_syncs = 0;
  double bits_per_sync = 0;
  double required_bits_per_s = 0;  // for the target utilization; infinity when latency alone exceeds it
};

// One row per method of optim/method.h's table that exchanges anything (ddp, diloco, streaming_diloco,
// noloco, co2, sparseloco, muloco), from its traits; `streaming_bits_per_value`
// overrides the codec of streaming_diloco (fp4 = 4), 0 to use input.bits_per_value.
std::vector<PlanRow> plan(const PlanInput& input, double streaming_bits_per_value = 0);
// Utilization a method reaches at a bandwidth (bits/s): compute / (compute + exposed communication).
double planned_utilization(const PlanRow& row, const PlanInput& input, double bits_per_s);

}  // namespace gossamer::sim
