// Late contributions in the simulator: workers stall (sim.stalls_per_minute) long past the learned
// grace, the round closes on its quorum without them, and what they computed rides on into their
// next contribution at its age's weight (outer.late_work = "merge") or is dropped ("drop"), counted
// either way; the members' shared state stays identical.
#include <doctest/doctest.h>

#include <numeric>

#include <torch/torch.h>

#include "sim/cluster.h"
#include "tiny.h"

using namespace gossamer;
using namespace gossamer::sim;

namespace {

train::RunConfig stalling(const std::string& method, const std::string& late_work) {
  train::RunConfig c = testing::tiny_run(method, 4, 60);
  c.sim.step_time_s = 0.5;
  c.diloco.inner_steps = 5;
  c.sparseloco.inner_steps = 5;
  c.streaming_diloco.inner_steps = 10;
  c.streaming_diloco.fragment_layers = 1;
  c.train.round_timeout_s = 20;  // the first rounds wait up to 10 s for everyone
  c.sim.stalls_per_minute = 20;  // 2 per minute per worker
  c.sim.stall_s = 6;             // past the learned grace (2 s at least): left out
  c.outer.late_work = *train::parse_choice<train::LateWork>(late_work);
  return c;
}

struct Tokens {
  std::int64_t merged = 0, carried = 0, lost = 0;
};
Tokens tokens(const ClusterResult& r) {
  Tokens t;
  for (const auto& a : r.accounts) {
    t.merged += a.merged_tokens;
    t.carried += a.late_tokens_carried;
    t.lost += a.late_tokens_lost;
  }
  return t;
}

void check_shared(const ClusterResult& r) {
  for (std::size_t w = 0; w < r.accounts.size(); ++w) {
    CAPTURE(w);
    CHECK(r.accounts[w].steps == 60);
    REQUIRE_FALSE(r.shared_digests[w].empty());
    CHECK(r.shared_digests[w] == r.shared_digests[0]);
  }
}

}  // namespace

TEST_CASE("a stalled member is left out of a round on its quorum, and its late work rides on into its next contribution") {
  for (const std::string method : {"diloco", "streaming_diloco", "sparseloco"}) {
    CAPTURE(method);
    const ClusterResult merged = testing::simulate(stalling(method, "merge"));
    const ClusterResult dropped = testing::simulate(stalling(method, "drop"));
    CHECK(merged.stalls > 0);
    CHECK(merged.stalls == dropped.stalls);  // the same seeded stalls
    check_shared(merged);
    check_shared(dropped);
    const Tokens m = tokens(merged), d = tokens(dropped);
    CHECK(m.carried > 0);  // some member was late, and its work was carried
    CHECK(d.carried == 0);
    CHECK(d.lost > 0);  // dropped, and counted
    CHECK(m.lost < d.lost);
    CHECK(m.merged > d.merged);  // what was carried reached the model
  }
}

TEST_CASE("a late contribution's weight follows the age gate: a cutoff below one round drops it all") {
  train::RunConfig c = stalling("diloco", "merge");
  c.outer.age_cutoff = 0.5;
  const ClusterResult r = testing::simulate(c);
  const Tokens t = tokens(r);
  CHECK(r.stalls > 0);
  CHECK(t.carried == 0);
  CHECK(t.lost > 0);
  check_shared(r);
}

TEST_CASE("CGAD with a delay over real rounds: a member that missed one catches up to the same state, the waiting means included") {
  // The commit drill (commit_test.cpp): worker 1 dies inside round 2's all-reduce, worker 0 misses
  // the round and catches up by replaying it onto its state, where two rounds' means still wait.
  train::RunConfig c = testing::tiny_run("diloco", 4, 30);
  c.diloco.inner_steps = 5;
  c.train.round_timeout_s = 20;
  c.sim.crash_worker = 1;
  c.sim.crash_mid_round = 2;
  c.diloco.outer_step = train::OuterStep::kCgad;
  c.diloco.delay_rounds = 2;
  const ClusterResult r = testing::simulate(c);
  CHECK(r.crashed[1]);
  for (int w : {0, 2, 3}) {
    CAPTURE(w);
    CHECK(r.accounts[static_cast<std::size_t>(w)].steps == 30);
    REQUIRE_FALSE(r.shared_digests[static_cast<std::size_t>(w)].empty());
    CHECK(r.shared_digests[static_cast<std::size_t>(w)] == r.shared_digests[2]);
    CHECK(torch::equal(r.final_params[static_cast<std::size_t>(w)], r.final_params[2]));
  }
}
