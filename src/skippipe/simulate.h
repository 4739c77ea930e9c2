// What a SkipPipe iteration costs: the closed form of a collision-free agent, and an event simulation
// of the whole iteration (every micro-batch's forwards, head and backwards, queued on their nodes).
//
// The simulation's rules, the same a runtime follows:
//   - a node computes one thing at a time, non-preemptively: of what is ready (and admitted), the
//     earliest ready first, backwards and heads before forwards, then by micro-batch; a schedule with
//     a timetable is followed in the timetable's order on each node instead;
//   - a non-zero node holds at most `memory` micro-batches' activations (from its forward to its
//     backward): a forward waits for a slot;
//   - an origin keeps at most `memory` of its micro-batches in flight, launching the next (in agent
//     order, none before its agent's start) as one finishes;
//   - a hop from a to b waits for the pair's link to be free, holds it for bytes / bandwidth, and
//     arrives latency + overhead later (links of different pairs do not contend).
// A schedule whose forwards wait on each other for memory in a cycle deadlocks: kAborted, naming the
// nodes.
//
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "skippipe/schedule.h"
#include "skippipe/topology.h"

namespace gossamer::skippipe {

struct NodeTime {
  double busy_s = 0;        // computing
  double idle_s = 0;        // makespan minus busy
  double queue_wait_s = 0;  // what ready work waited for this node, summed
  int collisions = 0;       // computations that found the node busy with another agent's
  int peak_inflight = 0;    // the most micro-batches whose activations it held at once
};

// One computation that found its node busy with another agent's.
struct Collision {
  int node = 0;
  int waiting_agent = 0;
  int busy_agent = 0;
  double wait_s = 0;
  bool forward = false;  // the waiting computation was a forward
};

struct Simulation {
  double makespan_s = 0;
  std::vector<NodeTime> nodes;
  std::vector<Collision> collisions;
  std::vector<TimetableEntry> timetable;  // what happened: a plan runtimes can follow
  std::uint64_t hop_messages = 0;         // activations and gradients sent between nodes
  double hop_bytes = 0;
};

[[nodiscard]] Result<Simulation> simulate(const Schedule& s, const Network& net, const Costs& costs);

// One micro-batch of the agent alone on its path: its computations (L forwards, the head, L
// backwards: (2.5 L + 0.25) forwards at the defaults) plus its hops out and back.
double agent_cost(const Agent& a, const Network& net, const Costs& costs);
// The closed form of the iteration: per agent, its start, one micro-batch's cost and each further
// micro-batch one bottleneck node's work later; the largest. Collisions and memory waits excluded.
double predicted_makespan(const Schedule& s, const Network& net, const Costs& costs);

}  // namespace gossamer::skippipe
