// SkipPipe's scheduler (src/skippipe): the acceptance checks of SKIPPIPE.md section 3 that need no
// model: schedule validity with hand-broken schedules refused by the rule they break, the closed-form
// cost, bytes per iteration, the memory bound, determinism, the wire form, and the geo setting's
// makespans (CBS against the full pipeline, the cost-blind skip and CBS without TC2).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <string>

#include "skippipe/planner.h"
#include "support/mutate.h"

using namespace gossamer;
using namespace gossamer::skippipe;

namespace {

struct Geo {
  Network net = geo_network(20);
  Costs costs;
  Options options;
  std::vector<int> stage_of;
  Geo() {
    GcmaOptions g;
    g.trials = 2000;
    auto a = assign_gcma(net, costs, options, g);
    REQUIRE(a.ok());
    stage_of = *a;
  }
};

const Geo& geo() {
  static const Geo g;
  return g;
}

const Plan& planned(Mode m) {
  static std::map<Mode, Plan> plans;
  auto it = plans.find(m);
  if (it == plans.end()) {
    auto p = plan(geo().net, geo().costs, geo().stage_of, geo().options, m);
    REQUIRE_MESSAGE(p.ok(), p.status().to_string());
    it = plans.emplace(m, std::move(*p)).first;
  }
  return it->second;
}

bool refused_by(const Schedule& s, const std::string& rule) {
  const Status st = validate(s, &geo().net, &geo().costs);
  INFO(st.to_string());
  return !st.ok() && st.message().rfind(rule, 0) == 0;
}

}  // namespace

TEST_CASE("partition sizes: stage 0 gets nodes / path_length, the rest share evenly") {
  CHECK(partition_sizes(20, 6, 4) == std::vector<int>{5, 3, 3, 3, 3, 3});
  CHECK(partition_sizes(100, 6, 4) == std::vector<int>{25, 15, 15, 15, 15, 15});
  CHECK(partition_sizes(7, 3, 2) == std::vector<int>{4, 2, 1});
}

TEST_CASE("the reorder bounds: swaps, their distance and jumps") {
  const Options o;
  CHECK(order_allowed({1, 2, 3}, o));
  CHECK(order_allowed({2, 1, 3}, o));       // one swap of distance 1
  CHECK(order_allowed({2, 1, 4, 3}, o));    // two swaps
  CHECK_FALSE(order_allowed({3, 1, 2}, o)); // distance 2
  CHECK_FALSE(order_allowed({5, 4, 3}, o)); // 4 then 3: distances 1 and 2
  CHECK_FALSE(order_allowed({5}, Options{.max_jump = 4}));  // a jump of 5 past stage 0
}

TEST_CASE("a planned schedule keeps every rule, at the defaults with both bounds reached") {
  for (const Mode m : {Mode::kCostBlind, Mode::kNoCollision, Mode::kSkipPipe}) {
    CAPTURE(mode_name(m));
    const Schedule& s = planned(m).schedule;
    CHECK(validate(s, &geo().net, &geo().costs).ok());
    CHECK(s.agents.size() == 15);
    CHECK(s.microbatches() == 30);
    CHECK(s.stage_capacity() == 9);
    std::vector<int> stage_load(6, 0), node_load(20, 0);
    for (const auto& a : s.agents) {
      for (int h : a.hops) {
        ++stage_load[static_cast<std::size_t>(s.stage_of[static_cast<std::size_t>(h)])];
        ++node_load[static_cast<std::size_t>(h)];
      }
    }
    for (int st = 1; st < 6; ++st) CHECK(stage_load[static_cast<std::size_t>(st)] == 9);  // 45 visits over 5 stages
    for (int n = 0; n < 20; ++n) {
      if (s.stage_of[static_cast<std::size_t>(n)] != 0) CHECK(node_load[static_cast<std::size_t>(n)] == 3);  // 9 agents over 3 nodes
    }
  }
  CHECK(validate(planned(Mode::kFull).schedule, &geo().net, &geo().costs).ok());
}

TEST_CASE("hand-broken schedules are refused, naming the rule they break") {
  const Schedule good = planned(Mode::kSkipPipe).schedule;
  REQUIRE_FALSE(good.timetable.empty());
  Schedule s = good;
  s.agents[0].origin = s.agents[0].hops[0];
  CHECK(refused_by(s, "R1 origin"));
  s = good;
  s.agents[0].hops.pop_back();
  CHECK(refused_by(s, "R2 length"));
  s = good;
  s.agents[0].hops[1] = s.agents[0].origin;  // stage 0 again
  CHECK(refused_by(s, "R2 length"));
  s = good;
  // A node of a stage the agent visits already.
  const int first_stage = s.stage_of[static_cast<std::size_t>(s.agents[0].hops[0])];
  for (int n = 0; n < s.nodes(); ++n) {
    if (s.stage_of[static_cast<std::size_t>(n)] == first_stage && n != s.agents[0].hops[0]) {
      s.agents[0].hops[1] = n;
      break;
    }
  }
  CHECK(refused_by(s, "R2 length"));
  s = good;
  // Stages 5, 4, 3 in that order: the second swap is 2 below the highest.
  for (int k = 0; k < 3; ++k) {
    for (int n = 0; n < s.nodes(); ++n) {
      if (s.stage_of[static_cast<std::size_t>(n)] == 5 - k) s.agents[0].hops[static_cast<std::size_t>(k)] = n;
    }
  }
  CHECK(refused_by(s, "R3 reorder"));
  s = good;
  s.timetable.clear();
  // Move one agent's visit of a stage onto another stage that is full: R4 (or R5 first, a full node).
  {
    auto& a = s.agents[0];
    std::vector<int> stages;
    for (int h : a.hops) stages.push_back(s.stage_of[static_cast<std::size_t>(h)]);
    int other = 1;
    while (std::find(stages.begin(), stages.end(), other) != stages.end()) ++other;
    // Keep the order legal: replace the visit whose stage is nearest below `other`.
    std::vector<int> by_other;
    for (int n = 0; n < s.nodes(); ++n) {
      if (s.stage_of[static_cast<std::size_t>(n)] == other) by_other.push_back(n);
    }
    std::size_t k = 0;
    for (std::size_t i = 0; i < stages.size(); ++i) {
      std::vector<int> trial = stages;
      trial[i] = other;
      if (order_allowed(trial, s.options)) k = i;
    }
    a.hops[k] = by_other[0];
    const Status st = validate(s, &geo().net, &geo().costs);
    CHECK_FALSE(st.ok());
    CHECK((st.message().rfind("R4 load", 0) == 0 || st.message().rfind("R5 memory", 0) == 0));
  }
  s = good;
  s.options.memory = 2;
  s.timetable.clear();
  CHECK(refused_by(s, "R5 memory"));  // 3 agents on each non-zero node
  s = good;
  s.agents.pop_back();
  s.timetable.clear();
  CHECK(!validate(s, &geo().net, &geo().costs).ok());
  s = good;
  s.agents[0].microbatches = 3;
  s.timetable.clear();
  CHECK(refused_by(s, "R6 count"));
  // R7: an entry moved onto another computation of its node, or before its input can arrive.
  s = good;
  s.timetable[1].forward_start = s.timetable[0].forward_start;  // hop 1 as early as hop 0
  CHECK(refused_by(s, "R7 timetable"));
  s = good;
  s.timetable.pop_back();
  CHECK(refused_by(s, "R7 timetable"));
  s = good;
  {
    // Two micro-batches' forwards at one origin at the same time.
    auto& e0 = s.timetable[0];
    for (auto& e : s.timetable) {
      if (e.agent == e0.agent && e.microbatch == 1 && e.hop == 0) e.forward_start = e0.forward_start;
    }
  }
  CHECK(refused_by(s, "R7 timetable"));
}

TEST_CASE("a collision-free agent costs dt + (2.5 L + 0.25) wm + 2 sum of its hops, and alone it takes exactly that") {
  const auto& g = geo();
  const Schedule& s = planned(Mode::kNoCollision).schedule;
  const Agent& a = s.agents[1];
  double hops = 0;
  std::vector<int> path{a.origin};
  path.insert(path.end(), a.hops.begin(), a.hops.end());
  for (std::size_t k = 0; k < path.size(); ++k) {
    const int x = path[k], y = path[(k + 1) % path.size()];
    hops += g.costs.hop(g.net, x, y) + g.costs.hop(g.net, y, x);
  }
  const double L = 4, wm = g.costs.forward_s;
  CHECK(agent_cost(a, g.net, g.costs) == doctest::Approx((2.5 * L + 0.25) * wm + hops).epsilon(1e-12));
  // Alone: one agent carrying one micro-batch, from its origin, mbs_per_origin 1.
  Schedule alone = s;
  alone.options.mbs_per_origin = 1;
  alone.options.mbs_per_agent = 1;
  alone.agents = {a};
  alone.agents[0].microbatches = 1;
  alone.agents[0].start_s = 3.0;
  for (int n = 0; n < alone.nodes(); ++n) {
    if (alone.stage_of[static_cast<std::size_t>(n)] == 0 && n != a.origin) alone.stage_of[static_cast<std::size_t>(n)] = 1;  // one origin only
  }
  auto sim = simulate(alone, g.net, g.costs);
  REQUIRE_MESSAGE(sim.ok(), sim.status().to_string());
  CHECK(sim->makespan_s == doctest::Approx(3.0 + agent_cost(a, g.net, g.costs)).epsilon(1e-9));
  CHECK(sim->collisions.empty());
}

TEST_CASE("hops per iteration: 2 L messages per micro-batch skipping, 2 S in the full pipeline, memory held to its bound") {
  for (const Mode m : {Mode::kFull, Mode::kCostBlind, Mode::kNoCollision, Mode::kSkipPipe}) {
    CAPTURE(mode_name(m));
    const Plan& p = planned(m);
    const int per_mb = 2 * (m == Mode::kFull ? 6 : 4);
    CHECK(p.simulation.hop_messages == static_cast<std::uint64_t>(30 * per_mb));
    CHECK(p.simulation.hop_bytes == doctest::Approx(30.0 * per_mb * geo().costs.activation_bytes));
    for (const auto& nt : p.simulation.nodes) CHECK(nt.peak_inflight <= geo().options.memory);
  }
}

TEST_CASE("geo setting: CBS within 0.60 of the full pipeline, no slower than the cost-blind skip, and TC2 no worse than without it") {
  const double full = planned(Mode::kFull).simulation.makespan_s;
  const double blind = planned(Mode::kCostBlind).simulation.makespan_s;
  const double noca = planned(Mode::kNoCollision).simulation.makespan_s;
  const double cbs = planned(Mode::kSkipPipe).simulation.makespan_s;
  MESSAGE("makespans: full " << full << " s, cost-blind " << blind << " s, without TC2 " << noca << " s, CBS " << cbs << " s");
  CHECK(cbs <= 0.60 * full);
  CHECK(cbs <= blind);
  CHECK(cbs <= noca * 1.05);
  // The timetable it carries replays to the same makespan.
  auto again = simulate(planned(Mode::kSkipPipe).schedule, geo().net, geo().costs);
  REQUIRE(again.ok());
  CHECK(again->makespan_s == doctest::Approx(cbs).epsilon(1e-12));
}

TEST_CASE("the same seed gives the same schedule bytes, the wire form round-trips and its golden header is pinned") {
  auto again = plan(geo().net, geo().costs, geo().stage_of, geo().options, Mode::kSkipPipe);
  REQUIRE(again.ok());
  const Schedule& s = planned(Mode::kSkipPipe).schedule;
  CHECK(again->schedule.encode() == s.encode());
  CHECK(again->schedule.hash() == s.hash());
  GcmaOptions g;
  g.trials = 2000;
  CHECK(*assign_gcma(geo().net, geo().costs, geo().options, g) == geo().stage_of);
  auto back = Schedule::decode(s.encode());
  REQUIRE_MESSAGE(back.ok(), back.status().to_string());
  CHECK(back->encode() == s.encode());
  const Bytes b = s.encode();
  // "GSKP", version 1, mode 3, then stages 6 and path length 4.
  const Bytes head(b.begin(), b.begin() + 14);
  const Bytes want{std::byte{'G'}, std::byte{'S'}, std::byte{'K'}, std::byte{'P'}, std::byte{1}, std::byte{3}, std::byte{6}, std::byte{0}, std::byte{0}, std::byte{0},
                   std::byte{4}, std::byte{0}, std::byte{0}, std::byte{0}};
  CHECK(head == want);
}

TEST_CASE("seeded mutations of a schedule's bytes are refused or decode to a valid schedule, never a crash") {
  std::mt19937_64 rng(18);
  const Bytes good = planned(Mode::kSkipPipe).schedule.encode();
  int refused = 0;
  for (int k = 0; k < 3000; ++k) {
    const Bytes m = testing::mutate(good, rng);
    auto s = Schedule::decode(m);
    if (!s.ok()) {
      ++refused;
      continue;
    }
    CHECK(validate(*s).ok());
  }
  CHECK(refused > 0);
}

TEST_CASE("the scheduler's own speed: 20 nodes well under 5 s, 100 nodes under 60 s") {
  for (const int nodes : {20, 100}) {
    CAPTURE(nodes);
    const auto start = std::chrono::steady_clock::now();
    const Network net = geo_network(nodes);
    const Costs costs;
    const Options o;
    auto a = assign_gcma(net, costs, o);
    REQUIRE(a.ok());
    auto p = plan(net, costs, *a, o, Mode::kSkipPipe);
    REQUIRE_MESSAGE(p.ok(), p.status().to_string());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    MESSAGE(nodes << " nodes: GCMA and CBS in " << s << " s, " << p->expansions << " expansions, " << p->simulations << " simulations");
    CHECK(s < (nodes == 20 ? 5.0 : 60.0));
    CHECK(validate(p->schedule, &net, &costs).ok());
  }
}

TEST_CASE("decoding refuses schedules whose counts would overflow or exceed the caps, before building anything") {
  Schedule s = planned(Mode::kNoCollision).schedule;
  s.timetable.clear();
  // Agents that carry 2^20 micro-batches each: more than a decoded schedule may hold.
  for (auto& a : s.agents) a.microbatches = 1 << 20;
  auto d = Schedule::decode(s.encode());
  CHECK_FALSE(d.ok());
  CHECK(d.status().code() == ErrorCode::kOutOfRange);
  Options o;
  o.mbs_per_origin = (1 << 16) + 2;
  CHECK_FALSE(o.check().ok());
  o = Options{};
  o.memory = 5000;
  CHECK_FALSE(o.check().ok());
}
