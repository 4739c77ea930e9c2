#include <doctest/doctest.h>

#include <torch/torch.h>

#include "sim/cluster.h"
#include "tiny.h"

using namespace gossamer;
using namespace gossamer::sim;

namespace {

train::RunConfig tiny(const std::string& method) {
  train::RunConfig c = testing::tiny_run(method, 3, 24);
  c.diloco.inner_steps = 6;
  c.noloco.inner_steps = 6;
  c.co2.inner_steps = 6;
  c.streaming_diloco.inner_steps = 6;
  c.streaming_diloco.fragment_layers = 1;
  return c;
}

ClusterResult run(const train::RunConfig& c) {
  auto corpus = train::load_corpus(c);
  REQUIRE(corpus.ok());
  auto r = run_cluster(c, *corpus);
  REQUIRE(r.ok());
  return std::move(*r);
}

}  // namespace

TEST_CASE("a seeded simulation reruns bit-identically: metrics and final parameters") {
  for (const char* method : {"diloco", "streaming_diloco", "co2"}) {
    CAPTURE(method);
    const auto a = run(tiny(method)), b = run(tiny(method));
    REQUIRE(a.records.size() == b.records.size());
    for (std::size_t i = 0; i < a.records.size(); ++i) CHECK(a.records[i].dump() == b.records[i].dump());
    for (std::size_t w = 0; w < a.final_params.size(); ++w) CHECK(torch::equal(a.final_params[w], b.final_params[w]));
    CHECK(a.sim_time_s == b.sim_time_s);
  }
}

TEST_CASE("every method trains in the simulator and accounts its bytes and time") {
  for (const char* method : {"ddp", "diloco", "streaming_diloco", "noloco", "co2", "local"}) {
    CAPTURE(method);
    const auto r = run(tiny(method));
    REQUIRE(r.accounts.size() == 3);
    for (const auto& a : r.accounts) {
      CHECK(a.steps == 24);
      CHECK(a.compute_s == doctest::Approx(24 * 0.05));
      if (std::string(method) == "local") {
        CHECK(a.bytes_sent == 0);
      } else {
        CHECK(a.bytes_sent > 0);
        const std::string m = method;
        if (m == "ddp" || m == "diloco" || m == "noloco") CHECK(a.blocked_s > 0);  // synchronous rounds wait
      }
    }
    CHECK(r.sim_time_s >= 24 * 0.05 - 1e-9);
    bool has_val = false;
    for (const auto& rec : r.records) has_val = has_val || rec.contains("val_loss");
    CHECK(has_val);
  }
}

TEST_CASE("ddp sends every step what diloco sends once per round") {
  const auto ddp = run(tiny("ddp")), diloco = run(tiny("diloco"));
  const double ratio = static_cast<double>(ddp.accounts[0].bytes_sent) / static_cast<double>(diloco.accounts[0].bytes_sent);
  CHECK(ratio == doctest::Approx(6.0).epsilon(0.02));  // H = 6: same payload, 6 times as often
}

TEST_CASE("a crashed worker stops contributing and the rest go on") {
  auto c = tiny("diloco");
  c.sim.crash_worker = 2;
  c.sim.crash_at_step = 10;
  const auto r = run(c);
  CHECK(r.crashed[2]);
  CHECK(r.accounts[2].steps == 9);
  CHECK(r.accounts[0].steps == 24);
  CHECK(r.accounts[1].steps == 24);
  // The survivors re-form the group and keep synchronizing: every round applied, none skipped, and
  // after the last one both hold the same weights.
  CHECK(r.accounts[0].rounds == 4);
  CHECK(r.accounts[0].skipped_rounds == 0);
  CHECK(r.accounts[1].rounds == 4);
  CHECK(torch::equal(r.final_params[0], r.final_params[1]));
  CHECK_FALSE(torch::equal(r.final_params[0], r.final_params[2]));
}

TEST_CASE("after a crash every method goes on synchronizing over the survivors") {
  for (const char* method : {"ddp", "streaming_diloco", "noloco", "co2"}) {
    CAPTURE(method);
    auto c = tiny(method);
    c.sim.crash_worker = 1;
    c.sim.crash_at_step = 8;
    c.train.round_timeout_s = 5;
    const auto r = run(c);
    CHECK(r.crashed[1]);
    for (int w : {0, 2}) {
      CHECK(r.accounts[static_cast<std::size_t>(w)].steps == 24);
      CHECK(r.accounts[static_cast<std::size_t>(w)].rounds > r.accounts[static_cast<std::size_t>(w)].skipped_rounds);
    }
    // Rounds after the crash still move bytes between the two survivors.
    double sent_late = 0;
    for (const auto& rec : r.records) {
      if (rec["worker"] == 0 && rec["step"].get<int>() == 24) sent_late = rec["bytes_sent"].get<double>();
    }
    double sent_at_crash = 0;
    for (const auto& rec : r.records) {
      if (rec["worker"] == 0 && rec["step"].get<int>() <= 8) sent_at_crash = rec["bytes_sent"].get<double>();
    }
    CHECK(sent_late > sent_at_crash);
    CHECK(r.sim_time_s < 30);  // nobody waited out a round timeout
  }
}

TEST_CASE("a straggler stretches the simulated time of synchronous methods") {
  auto c = tiny("diloco");
  const auto even = run(c);
  c.sim.straggler = 1;
  c.sim.straggler_factor = 3.0;
  const auto slow = run(c);
  CHECK(slow.sim_time_s > even.sim_time_s * 2);  // compute is 3x; the rounds wait for the slow one
  CHECK(slow.accounts[1].compute_s == doctest::Approx(3 * even.accounts[1].compute_s));
  CHECK(slow.accounts[0].blocked_s > even.accounts[0].blocked_s);  // the others wait for it
}

TEST_CASE("heterogeneous links: a slow worker's link stretches the synchronous rounds") {
  auto c = tiny("diloco");
  c.sim.network = "custom";
  c.sim.bandwidth_mbit = 1000;
  c.sim.latency_ms = 1;
  auto spec = network_spec(c);
  REQUIRE(spec.ok());
  CHECK(spec->nodes[2].link.bandwidth_bytes_per_s == doctest::Approx(1000e6 / 8));
  const auto fast = run(c);
  c.sim.slow_link_workers = 1;
  c.sim.slow_link_mbit = 1;
  spec = network_spec(c);
  REQUIRE(spec.ok());
  CHECK(spec->nodes[2].link.bandwidth_bytes_per_s == doctest::Approx(1e6 / 8));
  CHECK(spec->nodes[1].link.bandwidth_bytes_per_s == doctest::Approx(1000e6 / 8));
  const auto slow = run(c);
  CHECK(slow.accounts[0].blocked_s > 5 * fast.accounts[0].blocked_s);
  CHECK(slow.accounts[0].bytes_sent == fast.accounts[0].bytes_sent);  // same traffic, slower
}
