// SkipPipe's scheduler (docs/skippipe.md): which node hosts which stage (GCMA), and which path each
// agent takes (multi-agent path finding: conflict-based search over a low-level search of paths).
//
// Node-to-stage assignment, assign_gcma: a seeded genetic algorithm over assignments with the
// partition sizes of partition_sizes(). An assignment scores (lower is better) the largest hop
// within any stage (its replicas synchronise) plus twice the shortest closed tour over the stages,
// where going from one stage to another costs the bottleneck matching of their nodes (hop plus the
// sender's forward): what DT-FM and the reference optimise.
//
// Paths, plan():
//   - low level: an agent's cheapest path, over every order of path_length - 1 distinct non-zero
//     stages that keeps the reorder bounds, each order's nodes by dynamic programming; a path costs
//     its hops out and back and its nodes' forward and backward, so the cheapest is the fastest
//     alone (cost-blind: every hop and node costs 1, ties broken by a seeded draw);
//   - high level, conflict-based search: best first on (longest agent, sum of agents); a conflict is
//     a stage visited by more than stage_capacity() agents (load) or a non-zero node by more than
//     `memory` agents (TC1), and each child forbids the stage or node to one agent of the conflict.
//     When `max_expansions` runs out, it descends greedily from the best node found;
//   - collision-aware (Mode::kSkipPipe, TC2): from that solution, the iteration is simulated
//     (simulate.h); for the longest waits where an agent found a node busy with another's work,
//     children either swap that visit with another agent's visit of the same stage (loads kept) or
//     forbid the node to either agent and search again; the child whose simulated makespan is
//     shortest is kept while it is shorter, up to `max_simulations`. The result carries the
//     simulated timetable, for runtimes to follow (the stage runtime does not enforce it yet).
//   - plan_full: DT-FM's pipelines, as many as the smallest non-zero stage has nodes, each chained
//     through the cheapest unused node of every stage in order, carrying the micro-batches evenly.
// Every agent of an origin starts one forward (of the origin) after the one before (the reference's
// dt = k wm). Deterministic for a seed.
//
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "skippipe/schedule.h"
#include "skippipe/simulate.h"
#include "skippipe/topology.h"

namespace gossamer::skippipe {

struct GcmaOptions {
  int population = 200;
  int trials = 8000;
  std::uint64_t seed = 5;
};

// The node-to-stage assignment (stage of each node).
[[nodiscard]] Result<std::vector<int>> assign_gcma(const Network& net, const Costs& costs, const Options& o, const GcmaOptions& g = {});
// Its score (lower is better), as above.
double gcma_score(const std::vector<int>& stage_of, const Network& net, const Costs& costs, int stages);

struct PlanLimits {
  int max_expansions = 4000;  // high-level nodes expanded before the greedy descent
  int max_simulations = 400;  // collision-aware children simulated
};

struct Plan {
  Schedule schedule;
  double predicted_makespan_s = 0;  // closed form (simulate.h)
  Simulation simulation;            // the iteration, simulated
  int expansions = 0;               // high-level nodes expanded
  int simulations = 0;              // iterations simulated
};

// Paths for a skipping mode (kCostBlind, kNoCollision, kSkipPipe) over the given assignment.
[[nodiscard]] Result<Plan> plan(const Network& net, const Costs& costs, const std::vector<int>& stage_of, const Options& o, Mode mode,
                                const PlanLimits& limits = {});
// DT-FM's full pipelines over the given assignment.
[[nodiscard]] Result<Plan> plan_full(const Network& net, const Costs& costs, const std::vector<int>& stage_of, const Options& o);

}  // namespace gossamer::skippipe
