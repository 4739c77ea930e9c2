// Members of unequal speed in the simulator: rounds on a time budget (outer.round_budget = "time"),
// token-weighted merges, per-worker speeds (sim.speeds); flaky ones: steady churn by time and goodput.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <cmath>

#include "sim/cluster.h"
#include "sim/report.h"
#include "tiny.h"

using namespace gossamer;
using namespace gossamer::sim;

namespace {

train::RunConfig unequal(const std::string& method, const std::string& budget) {
  train::RunConfig c = testing::tiny_run(method, 4, 48);
  c.diloco.inner_steps = 12;
  c.sparseloco.inner_steps = 12;
  c.streaming_diloco.inner_steps = 12;
  c.streaming_diloco.fragment_layers = 1;
  c.outer.round_budget = *train::parse_choice<train::RoundBudget>(budget);
  c.sim.speeds = "1x2,0.5,0.25";
  c.sim.step_time_s = 0.2;  // a round's compute well above its communication, as DiLoCo is meant to run
  return c;
}

ClusterResult run(const train::RunConfig& c) { return testing::simulate(c); }

double utilization(const train::WorkerAccount& a) { return a.compute_s / (a.compute_s + a.blocked_s); }

}  // namespace

TEST_CASE("a time budget: slower members compute the steps that fit, nobody waits for the slowest, replicas stay identical") {
  for (const char* method : {"diloco", "sparseloco", "streaming_diloco"}) {
    CAPTURE(method);
    const auto lockstep = run(unequal(method, "steps"));
    const auto timed = run(unequal(method, "time"));
    // Lockstep: everyone computes all 48 steps and the fast ones wait for the quarter-speed one.
    for (const auto& a : lockstep.accounts) CHECK(a.computed_steps == 48);
    CHECK(utilization(lockstep.accounts[0]) < 0.4);
    // On the budget: the half-speed member computes about half the steps, the quarter-speed one a
    // quarter (the first step of each is timed together, so even the first round is on budget).
    const auto& t = timed.accounts;
    CHECK(t[0].computed_steps == 48);
    CHECK(t[1].computed_steps == 48);
    CHECK(t[2].computed_steps == doctest::Approx(24).epsilon(0.1));
    CHECK(t[3].computed_steps == doctest::Approx(12).epsilon(0.15));
    for (const auto& a : t) {
      CHECK(a.steps == 48);
      CHECK(a.tokens == a.computed_steps * 4 * 16);
      CHECK(a.computed_tokens == a.tokens);
      CHECK(utilization(a) > 0.7);  // what is left is the rounds' own communication, the same for everyone
      CHECK(std::abs(utilization(a) - utilization(t[0])) < 0.08);
    }
    CHECK(timed.sim_time_s < 0.45 * lockstep.sim_time_s);
    if (std::string(method) != "streaming_diloco") {  // whose members keep weights of their own (mixing)
      for (std::size_t w = 1; w < timed.final_params.size(); ++w) CHECK(torch::equal(timed.final_params[w], timed.final_params[0]));
    }
    // The work that reached the model: every computed token, none lost.
    for (const auto& a : t) CHECK(a.merged_tokens == a.computed_tokens);
  }
}

TEST_CASE("a time budget among equals is the lockstep run, bit for bit, and reruns identically") {
  auto steps = unequal("diloco", "steps");
  steps.sim.speeds = "";
  auto time = steps;
  time.outer.round_budget = train::RoundBudget::kTime;
  const auto a = run(steps), b = run(time), b2 = run(time);
  for (std::size_t w = 0; w < a.final_params.size(); ++w) {
    CHECK(b.accounts[w].computed_steps == 48);
    CHECK(torch::equal(a.final_params[w], b.final_params[w]));
    CHECK(torch::equal(b.final_params[w], b2.final_params[w]));
  }
  CHECK(b.sim_time_s == b2.sim_time_s);
}

TEST_CASE("sim.speeds: a straggler under speeds and sim.straggler stretches lockstep rounds alike") {
  auto by_list = unequal("diloco", "steps");
  by_list.sim.speeds = "1,1,1,0.5";
  auto by_straggler = by_list;
  by_straggler.sim.speeds = "";
  by_straggler.sim.straggler = 3;
  by_straggler.sim.straggler_factor = 2.0;
  const auto a = run(by_list), b = run(by_straggler);
  CHECK(a.sim_time_s == b.sim_time_s);
  CHECK(a.accounts[3].compute_s == doctest::Approx(48 * 0.4));
}

namespace {
nlohmann::json summary(const train::RunConfig& c, const ClusterResult& r) { return method_summary(MethodRun{"m", c, r}, 0.0); }
double goodput(const train::RunConfig& c, const ClusterResult& r) { return summary(c, r)["goodput"].get<double>(); }
}  // namespace

TEST_CASE("goodput: a time budget turns the fast members' waiting into merged tokens") {
  const auto lc = unequal("diloco", "steps"), tc = unequal("diloco", "time");
  const auto lockstep = run(lc), timed = run(tc);
  CHECK(goodput(lc, lockstep) > 0.2);
  CHECK(goodput(tc, timed) > 1.6 * goodput(lc, lockstep));
  CHECK(goodput(tc, timed) <= 1.0);
  const auto s = summary(tc, timed);
  CHECK(s["min_compute_utilization"].get<double>() > 0.7);
  CHECK(s["merged_tokens"].get<std::int64_t>() == s["tokens"].get<std::int64_t>());  // nobody joined: the workers' counts are their own
}

TEST_CASE("steady churn by time: seeded failures and restarts cost goodput, rerun bit-identically, and the run ends together") {
  auto c = testing::tiny_run("diloco", 5, 120);
  c.diloco.inner_steps = 10;
  c.train.checkpoint_every = 10;
  c.sim.step_time_s = 0.5;
  c.sim.churn_per_minute = 12;  // 1.2 failures a minute among 5 workers (the evaluator is spared)
  c.sim.churn_downtime_s = 5;
  const auto a = run(c), b = run(c);
  auto calm = c;
  calm.sim.churn_per_minute = 0;
  const auto still = run(calm);
  REQUIRE(a.records.size() == b.records.size());
  for (std::size_t i = 0; i < a.records.size(); ++i) CHECK(a.records[i].dump() == b.records[i].dump());
  CHECK(a.sim_time_s == b.sim_time_s);
  std::int64_t lost = 0;
  int finished = 0;
  for (std::size_t w = 0; w < a.accounts.size(); ++w) {
    lost += a.accounts[w].computed_tokens - a.accounts[w].merged_tokens;
    if (a.accounts[w].steps != 120) continue;  // (one that crashed near the end comes back too late)
    ++finished;
    CHECK(torch::equal(a.final_params[w], a.final_params[0]));  // those that finished hold the members' weights
  }
  CHECK(finished >= 3);
  CHECK(lost > 0);  // work done since a crashed worker's last merge never reached the model
  CHECK(goodput(c, a) < goodput(calm, still));
  CHECK(goodput(c, a) > 0.3);
  CHECK(goodput(c, a) <= 1.0);
}
