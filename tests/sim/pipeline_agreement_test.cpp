// The pipeline's agreement in the simulator (sim/pipeline_processes.h) is the one pipeline processes
// follow (runtime/pipeline_process.h): the same fault, run by real nodes over TCP on loopback and by
// simulated nodes in virtual time, leaves every survivor with the same notes of the agreement, step
// by step, and the same weights.
#include <doctest/doctest.h>

#include <algorithm>

#include "sim/pipeline_processes.h"
#include "support/pipeline_config.h"
#include "support/pipeline_nodes.h"
#include "train/run.h"

using namespace gossamer;
using namespace gossamer::testing;

namespace {

train::RunConfig agreement_pipeline() { return small_pipeline_processes(5); }

bool has(const std::vector<std::string>& notes, const std::string& line) { return std::find(notes.begin(), notes.end(), line) != notes.end(); }

std::string joined(const std::vector<std::string>& notes) {
  std::string out;
  for (const auto& n : notes) out += "  " + n + "\n";
  return out;
}

}  // namespace

TEST_CASE("a node lost while it confirms an iteration: simulated nodes go through the agreement real processes go through, note for note") {
  const auto c = agreement_pipeline();
  auto corpus = train::load_corpus(c);
  REQUIRE(corpus.ok());
  constexpr int kLost = 3;  // it confirms iteration 2 to nodes 0-2 only, then dies
  std::vector<std::string> addresses;
  auto real = start_transports(c, addresses);
  run_nodes(c, real, addresses, corpus->dataset, [](std::size_t v, runtime::PipelineProcessRequest& req) {
    if (v == kLost) req.crash_while_confirming = 2;
  });
  sim::SimulatedNodesOptions o;
  o.crash_while_confirming.assign(static_cast<std::size_t>(c.pipeline.nodes), 0);
  o.crash_while_confirming[kLost] = 2;
  o.rejoin_timeout = std::chrono::seconds(3);
  auto simulated = sim::simulate_pipeline_nodes(c, *corpus, o);
  REQUIRE_MESSAGE(simulated.ok(), simulated.status().to_string());
  std::string all;  // every real node's notes, to show with a failure
  for (std::size_t v = 0; v < real.size(); ++v) {
    all += "real node " + std::to_string(v) + ":\n" + (real[v].outcome.ok() ? joined(real[v].outcome->agreement) : "  " + real[v].outcome.status().to_string() + "\n");
  }
  INFO(all);
  REQUIRE_FALSE(real[kLost].outcome.ok());
  REQUIRE_FALSE(simulated->outcomes[kLost].ok());
  for (int v = 0; v < c.pipeline.nodes; ++v) {
    if (v == kLost) continue;
    CAPTURE(v);
    REQUIRE_MESSAGE(real[static_cast<std::size_t>(v)].outcome.ok(), real[static_cast<std::size_t>(v)].outcome.status().to_string());
    const auto& mine = simulated->outcomes[static_cast<std::size_t>(v)];
    REQUIRE_MESSAGE(mine.ok(), mine.status().to_string());
    const auto& theirs = *real[static_cast<std::size_t>(v)].outcome;
    INFO("real:\n" << joined(theirs.agreement) << "simulated:\n" << joined(mine->agreement));
    CHECK(mine->agreement == theirs.agreement);
    // The fault as it went: all linked, the survivors again in epoch 1 without node 3; the nodes
    // that did not hear node 3 confirm iteration 2 caught up; everyone finished.
    CHECK(has(theirs.agreement, "linked 0: 0,1,2,3,4,5,6,7"));
    CHECK(has(theirs.agreement, "linked 1: 0,1,2,4,5,6,7"));
    CHECK(has(theirs.agreement, "without 3"));
    CHECK(has(theirs.agreement, "caught up 2") == (v > kLost));
    CHECK(has(theirs.agreement, "confirmed 2") == (v < kLost));
    CHECK(theirs.agreement.back() == "goodbye");
    // The same weights at the end, and the same schedule.
    CHECK(mine->params_digest == theirs.params_digest);
    CHECK(mine->schedule_hash == theirs.schedule_hash);
    CHECK(mine->iterations == theirs.iterations);
    CHECK(mine->lost_nodes == 1);
    CHECK(mine->retried_iterations == theirs.retried_iterations);
  }
}

TEST_CASE("a node crashed mid-iteration in the simulator: the survivors agree on the nodes left through the real agreement, rejoin timeout included") {
  auto c = agreement_pipeline();
  c.pipeline.crash_node = 5;
  c.pipeline.crash_at_iteration = 3;
  auto corpus = train::load_corpus(c);
  REQUIRE(corpus.ok());
  sim::SimulatedNodesOptions o;
  o.rejoin_timeout = std::chrono::seconds(4);
  auto r = sim::simulate_pipeline_nodes(c, *corpus, o);
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  CHECK(r->result.crashed[5]);
  std::vector<std::string> agreed;  // the lines every survivor notes alike (links, schedules, who is left)
  for (int v = 0; v < c.pipeline.nodes; ++v) {
    if (v == 5) continue;
    CAPTURE(v);
    const auto& out = r->outcomes[static_cast<std::size_t>(v)];
    REQUIRE_MESSAGE(out.ok(), out.status().to_string());
    CHECK(out->iterations == c.train.steps);
    CHECK(has(out->agreement, "without 5"));
    CHECK(has(out->agreement, "linked 1: 0,1,2,3,4,6,7"));
    std::vector<std::string> shared;
    for (const auto& line : out->agreement) {
      if (line.rfind("linked", 0) == 0 || line.rfind("schedule", 0) == 0 || line.rfind("without", 0) == 0) shared.push_back(line);
    }
    if (agreed.empty()) agreed = shared;
    CHECK(shared == agreed);
    // The survivors waited the rejoin timeout for node 5 before going on without it.
    CHECK(out->rejoin_s >= 4.0);
    CHECK(out->rejoin_s < 4.0 + 5 * r->result.pipeline["makespan_s"].get<double>());
  }
  CHECK(r->result.pipeline["rejoin_s"].get<double>() >= 4.0);
  CHECK(r->result.pipeline["lost_nodes"].get<int>() == 1);
  REQUIRE(r->result.records.size() == static_cast<std::size_t>(c.train.steps));
  CHECK(r->result.records[2]["lost_nodes"].get<int>() == 1);
  // Deterministic, the agreement included.
  auto again = sim::simulate_pipeline_nodes(c, *corpus, o);
  REQUIRE(again.ok());
  REQUIRE(again->result.records.size() == r->result.records.size());
  for (std::size_t i = 0; i < r->result.records.size(); ++i) CHECK(again->result.records[i].dump() == r->result.records[i].dump());
  REQUIRE(again->outcomes.size() == r->outcomes.size());
  for (std::size_t v = 0; v < r->outcomes.size(); ++v) {
    if (v == 5) continue;
    REQUIRE(again->outcomes[v].ok());
    CHECK(again->outcomes[v]->agreement == r->outcomes[v]->agreement);
  }
}
