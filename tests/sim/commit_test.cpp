// Rounds committed all-or-nothing (runtime/coordinator.h), in the simulator: a worker dies inside a
// round's collective once its own share of the average reached half the group (sim.crash_mid_round),
// so some members hold the round and others do not. Those holding it go on without catching up, the
// one that missed it catches up to their state, and every survivor ends with the same weights. And
// what keeps churn cheap for those who stay: a newcomer starts at the members' step, not at the
// round end its state is from.
#include <doctest/doctest.h>

#include <optional>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "sim/cluster.h"
#include "tiny.h"

using namespace gossamer;
using namespace gossamer::sim;

namespace {

train::RunConfig drill(const std::string& method, int crash_worker) {
  train::RunConfig c = testing::tiny_run(method, 4, 30);
  c.diloco.inner_steps = 5;
  c.sparseloco.inner_steps = 5;
  c.streaming_diloco.inner_steps = 10;
  c.streaming_diloco.fragment_layers = 1;
  c.train.round_timeout_s = 20;
  c.sim.crash_worker = crash_worker;
  c.sim.crash_mid_round = 2;
  return c;
}

// Workers whose records say they caught up with the members (a state transfer after being left out).
std::vector<int> caught_up(const ClusterResult& r) {
  std::vector<int> out;
  for (std::size_t w = 0; w < r.accounts.size(); ++w) {
    for (const auto& rec : r.records) {
      if (rec["worker"] == static_cast<int>(w) && rec.value("joins", 0) > 0) {
        out.push_back(static_cast<int>(w));
        break;
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("a crash between the exchange and the commit: the members holding the round go on, the one that missed it catches up") {
  // Rank k sends its mean to ranks k+1 and k+2 before it dies: rank k+3 misses it. Worker 1 dying
  // leaves the lowest id (who decides) without the round; worker 2 dying leaves worker 1 without it.
  struct Case {
    const char* method;
    int crash_worker;
    int missed;
  };
  for (const Case& k : {Case{"diloco", 1, 0}, Case{"diloco", 2, 1}, Case{"streaming_diloco", 2, 1}, Case{"sparseloco", 1, 0}}) {
    CAPTURE(std::string(k.method));
    CAPTURE(k.crash_worker);
    const ClusterResult r = testing::simulate(drill(k.method, k.crash_worker));
    CHECK(r.crashed[static_cast<std::size_t>(k.crash_worker)]);
    std::vector<int> survivors;
    for (int w = 0; w < 4; ++w) {
      if (w != k.crash_worker) survivors.push_back(w);
    }
    for (int w : survivors) {
      CAPTURE(w);
      CHECK(r.accounts[static_cast<std::size_t>(w)].steps == 30);
      // The state the members share (Streaming DiLoCo's own parameters differ by design).
      CHECK_FALSE(r.shared_digests[static_cast<std::size_t>(w)].empty());
      CHECK(r.shared_digests[static_cast<std::size_t>(w)] == r.shared_digests[static_cast<std::size_t>(survivors.front())]);
      if (std::string(k.method) != "streaming_diloco") {
        CHECK(torch::equal(r.final_params[static_cast<std::size_t>(w)], r.final_params[static_cast<std::size_t>(survivors.front())]));
      }
    }
    // Only the member that missed the round caught up; the two holding it went on.
    CHECK(caught_up(r) == std::vector<int>{k.missed});
    // What the one that missed computed reached the shared model (its contribution is in the
    // average the others applied): none of its work is lost, the round it missed included.
    const auto& missed = r.accounts[static_cast<std::size_t>(k.missed)];
    CHECK(missed.merged_tokens == missed.computed_tokens);
  }
}

TEST_CASE("a newcomer whose state arrives steps into a round starts there with the members: nobody waits at the round's end for it") {
  // The newcomer's link is slow (10 Mbit/s): its state takes some steps to come, and the members go
  // on meanwhile. It leaves out the slots they computed before it arrived, as a slower member does.
  train::RunConfig c = testing::tiny_run("diloco", 4, 36);
  c.diloco.inner_steps = 12;
  c.sim.join_worker = 3;
  c.sim.join_at_step = 13;
  c.sim.slow_link_workers = 1;
  const ClusterResult r = testing::simulate(c);
  CHECK(r.accounts[3].steps == 36);
  // Its first round: fewer steps computed than the round holds, none of them after the round's end.
  std::optional<nlohmann::json> first;
  for (const auto& rec : r.records) {
    if (rec["worker"] == 3 && !first) first = rec;
  }
  REQUIRE(first.has_value());
  CHECK((*first)["step"].get<int>() % 12 == 0);
  const auto computed = (*first)["computed_steps"].get<std::int64_t>();
  CHECK(computed > 0);
  CHECK(computed < 12);
  // The members did not wait for the steps it left out: what they waited in all is well below them.
  for (int w = 0; w < 3; ++w) CHECK(r.accounts[static_cast<std::size_t>(w)].blocked_s < (12 - computed) * 0.05 + 1.0);
  for (int w = 1; w < 4; ++w) CHECK(torch::equal(r.final_params[static_cast<std::size_t>(w)], r.final_params[0]));
}
