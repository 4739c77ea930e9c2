#include <doctest/doctest.h>

#include <cmath>

#include "sim/cluster.h"
#include "sim/plan.h"
#include "tiny.h"

using namespace gossamer;
using namespace gossamer::sim;

TEST_CASE("the plan reproduces Table 4 of Streaming DiLoCo within 25%") {
  struct Row {
    double params;
    int layers;
    double step;
    double paper[5];  // Gbit/s: DP, DiLoCo, Streaming, + overlap, + overlap + FP4
  };
  const Row rows[] = {{1e9, 24, 0.1, {222.3, 23.3, 16.0, 9.1, 2.0}},
                      {1e10, 48, 0.8, {268.3, 33.9, 13.3, 6.2, 1.4}},
                      {1e11, 108, 4.9, {390.7, 49.4, 11.0, 5.2, 1.1}}};
  for (const auto& r : rows) {
    PlanInput in;
    in.parameters = r.params;
    in.layers = r.layers;
    in.step_time_s = r.step;
    in.workers = 2;
    in.inner_steps = 100;
    in.bits_per_value = 16;
    in.backward_overlap = 2.0 / 3.0;
    in.overlap = 0;
    const auto plain = plan(in);
    in.overlap = 1;
    const auto overlapped = plan(in);
    const auto fp4 = plan(in, 4);
    const double ours[5] = {plain[0].required_bits_per_s, plain[1].required_bits_per_s, plain[2].required_bits_per_s,
                            overlapped[2].required_bits_per_s, fp4[2].required_bits_per_s};
    for (int i = 0; i < 5; ++i) {
      CAPTURE(r.params);
      CAPTURE(i);
      CHECK(ours[i] / 1e9 == doctest::Approx(r.paper[i]).epsilon(0.25));
    }
  }
}

TEST_CASE("the plan's utilization agrees with the simulator's") {
  // A small diloco run over a custom network whose bandwidth the plan says gives 80% utilization.
  train::RunConfig c = testing::tiny_run("diloco", 4, 40);
  c.train.eval_batches = 1;
  c.diloco.inner_steps = 10;
  c.sim.network = "custom";
  c.sim.latency_ms = 5;
  auto corpus = train::load_corpus(c);
  REQUIRE(corpus.ok());
  const std::int64_t params = train::Worker(c, corpus->dataset, 0, 1, real_clock()).model().num_parameters();

  PlanInput in;
  in.parameters = static_cast<double>(params);
  in.layers = 2;
  in.step_time_s = 0.05;
  in.workers = 4;
  in.inner_steps = 10;
  in.bits_per_value = 32;
  in.target_utilization = 0.8;
  in.latency_s = 0.005;
  const PlanRow row = plan(in)[1];
  REQUIRE(row.method == "diloco");
  // The plan counts payload bits; the wire adds frame and packet headers (about 4.5% at 1500 bytes).
  c.sim.bandwidth_mbit = row.required_bits_per_s / 1e6 * 1.045;
  auto r = run_cluster(c, *corpus);
  REQUIRE(r.ok());
  double util = 0;
  for (const auto& a : r->accounts) util += a.compute_s / (a.compute_s + a.blocked_s);
  util /= 4;
  CHECK(util == doctest::Approx(0.8).epsilon(0.03));
  CHECK(planned_utilization(row, in, row.required_bits_per_s) == doctest::Approx(0.8));
}

TEST_CASE("the plan's rows are the method table's exchanging rows, each counted by its traits") {
  PlanInput in;
  in.parameters = 1e6;
  in.layers = 6;
  in.fragment_layers = 2;  // 3 fragments
  in.workers = 4;
  in.inner_steps = 30;
  in.bits_per_value = 8;
  const auto rows = plan(in, 4);
  std::vector<std::string> names;
  for (const auto& m : optim::kMethods) {
    if (m.exchange != optim::Exchange::kNone) names.emplace_back(m.name);
  }
  REQUIRE(rows.size() == names.size());
  const double ring = 2.0 * 3 / 4;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    CAPTURE(rows[i].method);
    CHECK(rows[i].method == names[i]);
    CHECK(optim::method_name(rows[i].id) == rows[i].method);
    CHECK(rows[i].required_bits_per_s > 0);
  }
  const auto row = [&](std::string_view name) {
    for (const auto& r : rows) {
      if (r.method == name) return r;
    }
    FAIL("no row " << name);
    return PlanRow{};
  };
  CHECK(row("ddp").steps_between_syncs == 1);
  CHECK(row("ddp").bits_per_sync == doctest::Approx(ring * 1e6 * 8));
  CHECK(row("diloco").steps_between_syncs == 30);
  CHECK(row("streaming_diloco").steps_between_syncs == doctest::Approx(10));
  CHECK(row("streaming_diloco").bits_per_sync == doctest::Approx(ring * 1e6 / 3 * 4));  // one fragment in the streaming codec
  CHECK(row("noloco").bits_per_sync == doctest::Approx(1e6 * 8));                       // one partner
  CHECK(row("sparseloco").bits_per_sync > 0);
  CHECK(row("sparseloco").bits_per_sync < 3 * 1e6 * 8);  // sparse, to every other worker
  CHECK(row("muloco").bits_per_sync < ring * 1e6 * 3);   // about 2 bits a value, whatever is asked
}
