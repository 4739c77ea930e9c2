#include "skippipe/planner.h"
#include "skippipe/planner_parts.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <string>
#include <tuple>

namespace gossamer::skippipe {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Orders of stages a path may visit, at most: past this the low-level search would be too slow.
constexpr std::size_t kMaxOrders = 200000;
using Mask = std::uint64_t;  // a set of stages (kMaxStages <= 64)

// A draw in [0, 1) from a seeded generator, the same on every platform.
double unit(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

using planner_parts::nodes_by_stage;

Status check_assignment(const Network& net, const Costs& costs, const std::vector<int>& stage_of, const Options& o) {
  if (Status st = o.check(); !st.ok()) return st;
  if (Status st = net.check(); !st.ok()) return st;
  if (Status st = costs.check(net); !st.ok()) return st;
  if (static_cast<int>(stage_of.size()) != net.nodes) return error(ErrorCode::kInvalidArgument, "the assignment names " + std::to_string(stage_of.size()) + " nodes, the network has " + std::to_string(net.nodes));
  const auto by = nodes_by_stage(stage_of, o.stages);
  for (int s = 0; s < o.stages; ++s) {
    if (by[static_cast<std::size_t>(s)].empty()) return error(ErrorCode::kInvalidArgument, "no node hosts stage " + std::to_string(s) + ": more nodes are needed");
  }
  return Status();
}

// ---- Low level: an agent's cheapest path. ----

struct PathPlan {
  std::vector<int> hops;
  double cost = kInf;
};

class LowLevel {
 public:
  LowLevel(const Network& net, const Costs& costs, const std::vector<int>& stage_of, const Options& o, bool blind)
      : o_(o), n_(net.nodes), by_stage_(nodes_by_stage(stage_of, o.stages)) {
    edge_.assign(static_cast<std::size_t>(n_) * static_cast<std::size_t>(n_), 0.0);
    node_.assign(static_cast<std::size_t>(n_), 0.0);
    std::mt19937_64 rng(o.seed);
    for (int a = 0; a < n_; ++a) {
      node_[static_cast<std::size_t>(a)] = blind ? 1.0 : (1.0 + costs.backward_factor) * costs.forward(a);
      for (int b = 0; b < n_; ++b) {
        // Cost-blind: every hop alike, ties broken by a seeded draw (so paths spread at random).
        edge_[static_cast<std::size_t>(a * n_ + b)] = blind ? 1.0 + 1e-3 * unit(rng) : costs.hop(net, a, b) + costs.hop(net, b, a);
      }
    }
    std::vector<int> prefix;
    enumerate(prefix, 0);
  }

  // `stages_ok`, when given, must accept the set of stages a path visits.
  PathPlan best(int origin, Mask forbidden_stages, const std::vector<int>& forbidden_nodes, const std::function<bool(Mask)>& stages_ok = {}) const {
    PathPlan out;
    std::vector<double> cost, next;
    std::vector<std::vector<int>> parent(static_cast<std::size_t>(o_.path_length - 1));
    for (const auto& order : orders_) {
      bool skip = false;
      Mask visits = 0;
      for (int s : order) {
        skip = skip || (forbidden_stages >> s & 1u) != 0;
        visits |= Mask{1} << s;
      }
      if (skip || (stages_ok && !stages_ok(visits))) continue;
      // Layer k: the usable nodes of stage order[k]; cost[i]: cheapest from the origin to node i.
      std::vector<const std::vector<int>*> layers;
      for (int s : order) layers.push_back(&by_stage_[static_cast<std::size_t>(s)]);
      auto usable = [&](int node) { return !std::binary_search(forbidden_nodes.begin(), forbidden_nodes.end(), node); };
      cost.assign(layers[0]->size(), kInf);
      for (std::size_t i = 0; i < layers[0]->size(); ++i) {
        const int v = (*layers[0])[i];
        if (usable(v)) cost[i] = edge(origin, v) + node_[static_cast<std::size_t>(v)];
      }
      for (std::size_t k = 1; k < layers.size(); ++k) {
        next.assign(layers[k]->size(), kInf);
        auto& par = parent[k];
        par.assign(layers[k]->size(), -1);
        for (std::size_t j = 0; j < layers[k]->size(); ++j) {
          const int v = (*layers[k])[j];
          if (!usable(v)) continue;
          for (std::size_t i = 0; i < layers[k - 1]->size(); ++i) {
            if (cost[i] == kInf) continue;
            const double c = cost[i] + edge((*layers[k - 1])[i], v) + node_[static_cast<std::size_t>(v)];
            if (c < next[j]) {
              next[j] = c;
              par[j] = static_cast<int>(i);
            }
          }
        }
        cost.swap(next);
      }
      const auto& last = *layers.back();
      int end = -1;
      double total = kInf;
      for (std::size_t i = 0; i < last.size(); ++i) {
        if (cost[i] == kInf) continue;
        const double c = cost[i] + edge(last[i], origin);
        if (c < total) {
          total = c;
          end = static_cast<int>(i);
        }
      }
      if (end < 0 || total >= out.cost) continue;
      out.cost = total;
      out.hops.assign(layers.size(), -1);
      int at = end;
      for (std::size_t k = layers.size(); k-- > 0;) {
        out.hops[k] = (*layers[k])[static_cast<std::size_t>(at)];
        if (k > 0) at = parent[k][static_cast<std::size_t>(at)];
      }
    }
    return out;
  }

  // The cost of one given path (as best() counts it).
  double cost(int origin, const std::vector<int>& hops) const {
    double c = 0;
    int at = origin;
    for (int v : hops) {
      c += edge(at, v) + node_[static_cast<std::size_t>(v)];
      at = v;
    }
    return c + edge(at, origin);
  }

  std::size_t orders() const { return orders_.size(); }

 private:
  double edge(int a, int b) const { return edge_[static_cast<std::size_t>(a * n_ + b)]; }
  void enumerate(std::vector<int>& prefix, Mask used) {
    if (orders_.size() > kMaxOrders) return;  // too many to search: plan() refuses
    if (static_cast<int>(prefix.size()) == o_.path_length - 1) {
      orders_.push_back(prefix);
      return;
    }
    for (int s = 1; s < o_.stages; ++s) {
      if ((used >> s & 1u) != 0) continue;
      prefix.push_back(s);
      if (order_allowed(prefix, o_)) enumerate(prefix, used | (Mask{1} << s));
      prefix.pop_back();
    }
  }

  const Options& o_;
  const int n_;
  std::vector<std::vector<int>> by_stage_;
  std::vector<double> edge_, node_;
  std::vector<std::vector<int>> orders_;
};

// ---- High level: conflict-based search. ----

struct AgentSpec {
  int origin;
  double start;
};

struct HNode {
  std::vector<Mask> forbid_stage;             // per agent
  std::vector<std::vector<int>> forbid_node;  // per agent, sorted
  std::vector<PathPlan> plans;
  double longest = 0, sum = 0;
  std::uint64_t id = 0;
};

struct Conflict {
  bool stage = false;  // a stage's load, else a node's (TC1)
  int what = 0;
  std::vector<int> agents;
};

class Search {
 public:
  Search(const LowLevel& low, const std::vector<AgentSpec>& agents, const std::vector<int>& stage_of, const Options& o, int capacity, int max_expansions)
      : low_(low), agents_(agents), stage_of_(stage_of), o_(o), capacity_(capacity), max_expansions_(max_expansions) {}

  HNode root(const std::vector<Mask>& stages, const std::vector<std::vector<int>>& nodes) {
    HNode h;
    h.forbid_stage = stages;
    h.forbid_node = nodes;
    h.plans.resize(agents_.size());
    for (std::size_t a = 0; a < agents_.size(); ++a) replan(h, a);
    score(h);
    return h;
  }

  // Best first from `start`, then greedy; kUnavailable when no path keeps the constraints.
  Result<HNode> solve(HNode start, bool best_first) {
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> open;
    std::set<std::vector<std::int64_t>> seen;
    nodes_.clear();
    auto add = [&](HNode h) {
      if (!seen.insert(key(h)).second) return;
      h.id = nodes_.size();
      open.push(Entry{h.longest, h.sum, h.id});
      nodes_.push_back(std::move(h));
    };
    add(std::move(start));
    while (best_first && !open.empty() && expansions_ < max_expansions_) {
      const Entry e = open.top();
      open.pop();
      const HNode& h = nodes_[e.id];
      auto c = conflict(h);
      if (!c) return nodes_[e.id];
      ++expansions_;
      for (HNode& child : children(nodes_[e.id], *c)) add(std::move(child));
    }
    if (open.empty()) return error(ErrorCode::kUnavailable, "no paths keep the stage loads and memory: raise pipeline.memory or lower pipeline.path_length");
    HNode h = nodes_[open.top().id];
    nodes_.clear();
    return descend(std::move(h));
  }

  // Greedy: the cheapest child of each conflict until there is none.
  Result<HNode> descend(HNode h) {
    for (;;) {
      auto c = conflict(h);
      if (!c) return h;
      ++expansions_;
      auto kids = children(h, *c);
      if (kids.empty()) return error(ErrorCode::kUnavailable, "no paths keep the stage loads and memory: raise pipeline.memory or lower pipeline.path_length");
      auto best = std::min_element(kids.begin(), kids.end(), [](const HNode& x, const HNode& y) { return std::tie(x.longest, x.sum) < std::tie(y.longest, y.sum); });
      h = std::move(*best);
    }
  }

  bool replan(HNode& h, std::size_t a) {
    h.plans[a] = low_.best(agents_[a].origin, h.forbid_stage[a], h.forbid_node[a]);
    return h.plans[a].cost < kInf;
  }
  void score(HNode& h) const {
    h.longest = 0;
    h.sum = 0;
    for (std::size_t a = 0; a < agents_.size(); ++a) {
      const double t = agents_[a].start + h.plans[a].cost;
      h.longest = std::max(h.longest, t);
      h.sum += t;
    }
  }
  int expansions() const { return expansions_; }
  const LowLevel& low() const { return low_; }

 private:
  struct Entry {
    double longest, sum;
    std::uint64_t id;
    bool operator>(const Entry& o) const { return std::tie(longest, sum, id) > std::tie(o.longest, o.sum, o.id); }
  };

  std::optional<Conflict> conflict(const HNode& h) const {
    std::vector<std::vector<int>> on_stage(static_cast<std::size_t>(o_.stages));
    std::vector<std::vector<int>> on_node(stage_of_.size());
    for (std::size_t a = 0; a < h.plans.size(); ++a) {
      for (int v : h.plans[a].hops) {
        on_stage[static_cast<std::size_t>(stage_of_[static_cast<std::size_t>(v)])].push_back(static_cast<int>(a));
        on_node[static_cast<std::size_t>(v)].push_back(static_cast<int>(a));
      }
    }
    for (int s = 1; s < o_.stages; ++s) {
      if (static_cast<int>(on_stage[static_cast<std::size_t>(s)].size()) > capacity_) return Conflict{true, s, on_stage[static_cast<std::size_t>(s)]};
    }
    for (std::size_t v = 0; v < on_node.size(); ++v) {
      if (static_cast<int>(on_node[v].size()) > o_.memory) return Conflict{false, static_cast<int>(v), on_node[v]};
    }
    return std::nullopt;
  }

  std::vector<HNode> children(const HNode& h, const Conflict& c) {
    std::vector<HNode> out;
    for (int a : c.agents) {
      HNode child = h;
      const auto ai = static_cast<std::size_t>(a);
      if (c.stage) {
        child.forbid_stage[ai] |= Mask{1} << c.what;
      } else {
        auto& f = child.forbid_node[ai];
        f.insert(std::lower_bound(f.begin(), f.end(), c.what), c.what);
      }
      if (!replan(child, ai)) continue;
      score(child);
      out.push_back(std::move(child));
    }
    return out;
  }

  static std::vector<std::int64_t> key(const HNode& h) {
    std::vector<std::int64_t> k;
    for (std::size_t a = 0; a < h.plans.size(); ++a) {
      k.push_back(static_cast<std::int64_t>(h.forbid_stage[a]));
      k.push_back(-1);
      for (int v : h.forbid_node[a]) k.push_back(v);
      k.push_back(-2);
    }
    return k;
  }


 private:
  const LowLevel& low_;
  const std::vector<AgentSpec>& agents_;
  const std::vector<int>& stage_of_;
  const Options& o_;
  const int capacity_;
  const int max_expansions_;
  int expansions_ = 0;
  std::vector<HNode> nodes_;
};

// Prioritized planning, for when the search finds no way through (tight capacities, many nodes):
// agents in turn (round robin over the origins) take their cheapest path among the stages and
// nodes with room left, keeping the rest feasible: with R agents still to plan, each visiting
// path_length - 1 distinct stages, the stages' room (at most R each) must add up to R (L - 1).
std::optional<std::vector<PathPlan>> prioritized(const LowLevel& low, const std::vector<AgentSpec>& agents, const std::vector<int>& stage_of, const Options& o,
                                                 int capacity) {
  const auto by = nodes_by_stage(stage_of, o.stages);
  std::vector<int> stage_room(static_cast<std::size_t>(o.stages), 0), node_room(stage_of.size(), o.memory);
  for (int st = 1; st < o.stages; ++st) {
    stage_room[static_cast<std::size_t>(st)] = std::min(capacity, static_cast<int>(by[static_cast<std::size_t>(st)].size()) * o.memory);
  }
  std::vector<std::size_t> order(agents.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  // Round robin over origins: each origin's k-th agent before any origin's (k+1)-th.
  std::map<int, int> seen;
  std::vector<int> rank(agents.size());
  for (std::size_t a = 0; a < agents.size(); ++a) rank[a] = seen[agents[a].origin]++;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return rank[x] < rank[y]; });
  std::vector<PathPlan> plans(agents.size());
  const int hops = o.path_length - 1;
  int remaining = static_cast<int>(agents.size());
  for (std::size_t a : order) {
    --remaining;  // the others, after this one
    Mask full = 0;
    for (int st = 1; st < o.stages; ++st) {
      if (stage_room[static_cast<std::size_t>(st)] <= 0) full |= Mask{1} << st;
    }
    std::vector<int> full_nodes;
    for (std::size_t v = 0; v < node_room.size(); ++v) {
      if (node_room[v] <= 0) full_nodes.push_back(static_cast<int>(v));
    }
    auto feasible = [&](Mask visits) {
      long long room = 0;
      for (int st = 1; st < o.stages; ++st) room += std::min(stage_room[static_cast<std::size_t>(st)] - static_cast<int>(visits >> st & 1u), remaining);
      return room >= static_cast<long long>(remaining) * hops;
    };
    plans[a] = low.best(agents[a].origin, full, full_nodes, feasible);
    if (plans[a].cost == kInf) return std::nullopt;
    for (int v : plans[a].hops) {
      --node_room[static_cast<std::size_t>(v)];
      --stage_room[static_cast<std::size_t>(stage_of[static_cast<std::size_t>(v)])];
    }
  }
  return plans;
}

Schedule make_schedule(Mode mode, const Options& o, const std::vector<int>& stage_of, const std::vector<AgentSpec>& specs, const HNode& h) {
  Schedule s;
  s.mode = mode;
  s.options = o;
  s.stage_of = stage_of;
  for (std::size_t a = 0; a < specs.size(); ++a) s.agents.push_back(Agent{specs[a].origin, h.plans[a].hops, specs[a].start, o.mbs_per_agent});
  return s;
}

// What TC2's refinement works over (plan()'s inputs and its search).
struct Refinement {
  const Network& net;
  const Costs& costs;
  const std::vector<int>& stage_of;
  const Options& o;
  Mode mode;
  const std::vector<AgentSpec>& specs;
  Search& search;
  const PlanLimits& limits;
};

// The (agent, node) visits to try moving: those behind the longest waits in `sim`, at most six.
std::vector<std::pair<int, int>> collision_tries(const Simulation& sim, const HNode& best) {
  auto collisions = sim.collisions;
  std::stable_sort(collisions.begin(), collisions.end(), [](const Collision& x, const Collision& y) { return x.wait_s > y.wait_s; });
  std::vector<std::pair<int, int>> tries;
  for (const auto& c : collisions) {
    for (int a : {c.waiting_agent, c.busy_agent}) {
      const auto& hops = best.plans[static_cast<std::size_t>(a)].hops;
      if (std::find(hops.begin(), hops.end(), c.node) == hops.end()) continue;  // its origin: it cannot leave
      if (std::find(tries.begin(), tries.end(), std::make_pair(a, c.node)) == tries.end()) tries.emplace_back(a, c.node);
    }
    if (tries.size() >= 6) break;
  }
  return tries;
}

// TC2: children that keep an agent off a node where it waited on another's work, or kept another
// waiting; the one whose simulated iteration is shortest, while one is shorter. `simulations`
// counts every iteration simulated (up to the limit).
void refine_by_collisions(const Refinement& r, HNode& best, Simulation& best_sim, int& simulations) {
  const auto room = [&] { return simulations < r.limits.max_simulations; };
  for (bool improved = true; improved && room();) {
    improved = false;
    const std::vector<std::pair<int, int>> tries = collision_tries(best_sim, best);
    std::optional<std::pair<HNode, Simulation>> winner;
    auto consider = [&](HNode child) {
      auto child_sim = simulate(make_schedule(r.mode, r.o, r.stage_of, r.specs, child), r.net, r.costs);
      ++simulations;
      if (!child_sim.ok()) return;
      const double bar = winner ? winner->second.makespan_s : best_sim.makespan_s;
      if (child_sim->makespan_s < bar - 1e-9) winner.emplace(std::move(child), std::move(*child_sim));
    };
    // Swaps: the agent trades its visit of the node with another agent's visit of a node of the
    // same stage, so every stage's and node's load stays as it is (where loads are tight, at the
    // defaults, no other move keeps them).
    for (const auto& [a, node] : tries) {
      const auto ai = static_cast<std::size_t>(a);
      const auto& ha = best.plans[ai].hops;
      const auto ka = static_cast<std::size_t>(std::find(ha.begin(), ha.end(), node) - ha.begin());
      for (std::size_t c = 0; c < best.plans.size() && room(); ++c) {
        if (c == ai) continue;
        const auto& hc = best.plans[c].hops;
        for (std::size_t kc = 0; kc < hc.size() && room(); ++kc) {
          const int other = hc[kc];
          if (other == node || r.stage_of[static_cast<std::size_t>(other)] != r.stage_of[static_cast<std::size_t>(node)]) continue;
          if (std::find(ha.begin(), ha.end(), other) != ha.end() || std::find(hc.begin(), hc.end(), node) != hc.end()) continue;
          const auto& fa = best.forbid_node[ai];
          const auto& fc = best.forbid_node[c];
          if (std::binary_search(fa.begin(), fa.end(), other) || std::binary_search(fc.begin(), fc.end(), node)) continue;
          HNode child = best;
          child.plans[ai].hops[ka] = other;
          child.plans[c].hops[kc] = node;
          child.plans[ai].cost = r.search.low().cost(r.specs[ai].origin, child.plans[ai].hops);
          child.plans[c].cost = r.search.low().cost(r.specs[c].origin, child.plans[c].hops);
          r.search.score(child);
          consider(std::move(child));
        }
      }
    }
    for (const auto& [a, node] : tries) {
      if (!room()) break;
      HNode child = best;
      auto& f = child.forbid_node[static_cast<std::size_t>(a)];
      f.insert(std::lower_bound(f.begin(), f.end(), node), node);
      if (!r.search.replan(child, static_cast<std::size_t>(a))) continue;
      r.search.score(child);
      auto settled = r.search.descend(std::move(child));
      if (!settled.ok()) continue;
      consider(std::move(*settled));
    }
    if (winner) {
      best = std::move(winner->first);
      best_sim = std::move(winner->second);
      improved = true;
    }
  }
}

}  // namespace

Result<Plan> plan(const Network& net, const Costs& costs, const std::vector<int>& stage_of, const Options& o, Mode mode, const PlanLimits& limits) {
  if (mode == Mode::kFull) return plan_full(net, costs, stage_of, o);
  if (Status st = check_assignment(net, costs, stage_of, o); !st.ok()) return st;
  const LowLevel low(net, costs, stage_of, o, mode == Mode::kCostBlind);
  if (low.orders() == 0) return error(ErrorCode::kInvalidArgument, "no order of stages keeps the reorder bounds at this path length");
  if (low.orders() > kMaxOrders) {
    return error(ErrorCode::kInvalidArgument, "more than " + std::to_string(kMaxOrders) + " orders of stages are possible paths at " + std::to_string(o.stages) +
                                                  " stages and paths of " + std::to_string(o.path_length) + ": use fewer stages or a path length nearer either end");
  }
  std::vector<AgentSpec> specs;
  for (int n = 0; n < net.nodes; ++n) {
    if (stage_of[static_cast<std::size_t>(n)] != 0) continue;
    for (int k = 0; k < o.mbs_per_origin / o.mbs_per_agent; ++k) specs.push_back(AgentSpec{n, k * costs.forward(n)});
  }
  Schedule shape;
  shape.mode = mode;
  shape.options = o;
  shape.stage_of = stage_of;
  shape.agents.resize(specs.size());
  const int capacity = shape.stage_capacity();
  Search search(low, specs, stage_of, o, capacity, limits.max_expansions);
  const std::vector<Mask> no_stages(specs.size(), 0);
  const std::vector<std::vector<int>> no_nodes(specs.size());
  auto solved = search.solve(search.root(no_stages, no_nodes), true);
  if (!solved.ok()) {
    // No way through the conflicts within the budget: prioritized planning always finds one where
    // the capacities allow any.
    auto plans = prioritized(low, specs, stage_of, o, capacity);
    if (!plans) return solved.status();
    HNode h;
    h.forbid_stage = no_stages;
    h.forbid_node = no_nodes;
    h.plans = std::move(*plans);
    search.score(h);
    solved = std::move(h);
  }
  HNode best = std::move(*solved);

  Plan out;
  out.schedule = make_schedule(mode, o, stage_of, specs, best);
  auto sim = simulate(out.schedule, net, costs);
  if (!sim.ok()) return sim.status();
  out.simulations = 1;
  Simulation best_sim = std::move(*sim);
  if (mode == Mode::kSkipPipe) {
    refine_by_collisions(Refinement{net, costs, stage_of, o, mode, specs, search, limits}, best, best_sim, out.simulations);
    out.schedule = make_schedule(mode, o, stage_of, specs, best);
    out.schedule.timetable = best_sim.timetable;
  }
  out.predicted_makespan_s = predicted_makespan(out.schedule, net, costs);
  out.simulation = std::move(best_sim);
  out.expansions = search.expansions();
  if (Status st = validate(out.schedule, &net, &costs); !st.ok()) return st.with_context("the planned schedule");
  return out;
}

Result<Plan> plan_full(const Network& net, const Costs& costs, const std::vector<int>& stage_of, const Options& o) {
  if (Status st = check_assignment(net, costs, stage_of, o); !st.ok()) return st;
  const auto by = nodes_by_stage(stage_of, o.stages);
  std::size_t pipelines = by[0].size();
  for (int s = 1; s < o.stages; ++s) pipelines = std::min(pipelines, by[static_cast<std::size_t>(s)].size());
  std::vector<char> used(static_cast<std::size_t>(net.nodes), 0);
  auto edge = [&](int a, int b) { return costs.hop(net, a, b) + costs.hop(net, b, a); };
  Schedule s;
  s.mode = Mode::kFull;
  s.options = o;
  s.stage_of = stage_of;
  const int total = static_cast<int>(by[0].size()) * o.mbs_per_origin;
  for (std::size_t p = 0; p < pipelines; ++p) {
    // The cheapest chain through unused nodes, one per stage in order, back to its origin.
    double best = kInf;
    std::vector<int> chain;
    for (int origin : by[0]) {
      if (used[static_cast<std::size_t>(origin)]) continue;
      std::vector<std::vector<double>> cost(static_cast<std::size_t>(o.stages));
      std::vector<std::vector<int>> parent(static_cast<std::size_t>(o.stages));
      for (int st = 1; st < o.stages; ++st) {
        const auto& layer = by[static_cast<std::size_t>(st)];
        cost[static_cast<std::size_t>(st)].assign(layer.size(), kInf);
        parent[static_cast<std::size_t>(st)].assign(layer.size(), -1);
        for (std::size_t j = 0; j < layer.size(); ++j) {
          const int v = layer[j];
          if (used[static_cast<std::size_t>(v)]) continue;
          if (st == 1) {
            cost[1][j] = edge(origin, v);
            continue;
          }
          const auto& prev = by[static_cast<std::size_t>(st - 1)];
          for (std::size_t i = 0; i < prev.size(); ++i) {
            const double c = cost[static_cast<std::size_t>(st - 1)][i] + edge(prev[i], v);
            if (c < cost[static_cast<std::size_t>(st)][j]) {
              cost[static_cast<std::size_t>(st)][j] = c;
              parent[static_cast<std::size_t>(st)][j] = static_cast<int>(i);
            }
          }
        }
      }
      const auto& last = by[static_cast<std::size_t>(o.stages - 1)];
      for (std::size_t j = 0; j < last.size(); ++j) {
        const double c = cost[static_cast<std::size_t>(o.stages - 1)][j] + edge(last[j], origin);
        if (!(c < best)) continue;
        best = c;
        chain.assign(static_cast<std::size_t>(o.stages), origin);
        int at = static_cast<int>(j);
        for (int st = o.stages - 1; st >= 1; --st) {
          chain[static_cast<std::size_t>(st)] = by[static_cast<std::size_t>(st)][static_cast<std::size_t>(at)];
          at = parent[static_cast<std::size_t>(st)][static_cast<std::size_t>(at)];
        }
      }
    }
    if (chain.empty()) return error(ErrorCode::kInvalidArgument, "no full pipeline can be chained: some hop costs no finite time (a bandwidth too small?)");
    for (int v : chain) used[static_cast<std::size_t>(v)] = 1;
    const int mbs = total / static_cast<int>(pipelines) + (static_cast<int>(p) < total % static_cast<int>(pipelines) ? 1 : 0);
    s.agents.push_back(Agent{chain[0], std::vector<int>(chain.begin() + 1, chain.end()), 0.0, mbs});
  }
  Plan out;
  auto sim = simulate(s, net, costs);
  if (!sim.ok()) return sim.status();
  out.schedule = std::move(s);
  out.simulation = std::move(*sim);
  out.simulations = 1;
  out.predicted_makespan_s = predicted_makespan(out.schedule, net, costs);
  return out;
}

}  // namespace gossamer::skippipe
