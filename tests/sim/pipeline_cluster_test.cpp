// SkipPipe pipelines in virtual time (sim/pipeline_cluster.h): the real runtime over the emulated
// per-pair network, with compute charged to the clock. The losses equal the in-process trainer's,
// reruns are bit-identical, each node's busy time is its work's closed form, and the simulated
// makespan agrees with the scheduler's prediction.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <cmath>
#include <map>

#include "sim/pipeline_cluster.h"
#include "skippipe/planner.h"
#include "train/pipeline_trainer.h"
#include "train/run.h"

using namespace gossamer;
using namespace gossamer::sim;

namespace {

// The reference's geo setting (20 nodes, 6 stages, paths of 4, memory 3, 30 micro-batches) on a
// 6-block GPT small enough for a test.
train::RunConfig geo_pipeline(const std::string& mode, int steps) {
  train::RunConfig c;
  c.model.layers = 6;
  c.model.width = 16;
  c.model.heads = 2;
  c.model.context = 16;
  c.data.synthetic.bytes = 60'000;
  c.train.batch_size = 2;
  c.train.steps = steps;
  c.train.warmup_steps = 1;
  c.train.lr = 1e-2;
  c.train.eval_every = 0;
  c.train.eval_batches = 2;
  c.pipeline.mode = *train::parse_choice<train::PipelineMode>(mode);
  c.pipeline.gcma_trials = 200;
  c.train.round_timeout_s = 1e6;
  return c;
}

}  // namespace

TEST_CASE("a simulated pipeline: each node's busy time adds up to the work's closed form, the makespan is the scheduler's prediction, SkipPipe's under 0.6 of the full pipeline's, reruns bit-identical") {
  std::map<std::string, double> makespan;
  for (const std::string mode : {"skippipe", "full"}) {
    CAPTURE(mode);
    auto c = geo_pipeline(mode, 2);
    c.pipeline.gcma_trials = 8000;  // the reference's search, as `gossamer schedule` runs it
    auto corpus = train::load_corpus(c);
    REQUIRE(corpus.ok());
    auto r = run_pipeline_cluster(c, *corpus);
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    const auto& p = r->pipeline;
    const double simulated = p["makespan_s"].get<double>(), predicted = p["predicted_makespan_s"].get<double>();
    MESSAGE(mode << ": simulated " << simulated << " s, predicted " << predicted << " s (closed form " << p["closed_form_makespan_s"].get<double>()
                 << "), stage sync " << p["sync_s"].get<double>() << " s; " << r->wall_s << " s of wall-clock");
    // Every micro-batch: L forwards, the head, L backwards of 1.5 forwards each, on some node.
    const int length = mode == "full" ? 6 : 4;
    double busy = 0;
    for (double b : p["node_busy_s"]) busy += b;
    CHECK(busy == doctest::Approx(2.0 * 30 * (2.5 * length + 0.25) * c.pipeline.forward_s).epsilon(1e-9));
    // The runtime over the emulated links, following the timetable, takes the time the scheduler's
    // event simulation predicts (92.96 s and 174.61 s, equal to the printed digits).
    CHECK(simulated == doctest::Approx(predicted).epsilon(1e-3));
    CHECK(p["first_makespan_s"].get<double>() == doctest::Approx(simulated).epsilon(1e-9));  // the same work every iteration
    for (int peak : p["node_peak_inflight"]) CHECK(peak <= 3);
    makespan[mode] = simulated;
    // Each node's compute in the timeline; its busy time is what its spans add up to.
    const auto& timeline = p["timeline"];
    REQUIRE(timeline.size() == 20);
    double spans = 0;
    for (const auto& node : timeline) {
      for (const auto& sp : node["spans"]) {
        CHECK(sp[3].get<double>() > sp[2].get<double>());
        spans += sp[3].get<double>() - sp[2].get<double>();
      }
    }
    CHECK(spans * 2 == doctest::Approx(busy).epsilon(1e-9));
    // A rerun: the same records, bit for bit.
    auto again = run_pipeline_cluster(c, *corpus);
    REQUIRE(again.ok());
    REQUIRE(again->records.size() == r->records.size());
    for (std::size_t i = 0; i < r->records.size(); ++i) CHECK(again->records[i].dump() == r->records[i].dump());
    CHECK(again->pipeline.dump() == r->pipeline.dump());
  }
  CHECK(makespan["skippipe"] <= 0.6 * makespan["full"]);
}

TEST_CASE("a simulated pipeline learns what the in-process trainer learns, bit for bit: the same losses, the stages' sync over the emulated links") {
  for (const std::string sync : {"ddp", "diloco"}) {
    CAPTURE(sync);
    auto c = geo_pipeline("skippipe", 4);
    c.pipeline.stage_sync = *optim::parse_method(sync);
    c.diloco.inner_steps = 2;
    c.train.eval_every = 2;
    auto corpus = train::load_corpus(c);
    REQUIRE(corpus.ok());
    auto simulated = run_pipeline_cluster(c, *corpus);
    REQUIRE_MESSAGE(simulated.ok(), simulated.status().to_string());
    auto trainer = train::PipelineTrainer::make(c, corpus->dataset);
    REQUIRE(trainer.ok());
    REQUIRE(simulated->records.size() == 4);
    std::uint64_t sync_bytes = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      auto rec = (*trainer)->step();
      REQUIRE(rec.ok());
      const auto& j = simulated->records[i];
      // Both follow the timetable: every node adds its gradients in the same order, so the emulated
      // network's arrival order and the threads' make no difference, to the last bit.
      CHECK(j["train_loss"].get<double>() == rec->train_loss);
      CHECK(j["sync_bytes"].get<std::uint64_t>() == rec->sync_bytes);
      CHECK(j["activation_bytes"].get<std::uint64_t>() == rec->activation_bytes);
      sync_bytes += rec->sync_bytes;
      if (i % 2 == 1) CHECK(j["val_loss"].get<double>() == (*trainer)->evaluate());
    }
    CHECK(sync_bytes > 0);
    CHECK(simulated->records.back()["time_s"].get<double>() > 0);
    CHECK(simulated->records.back()["train_loss"].get<double>() < simulated->records.front()["train_loss"].get<double>());
  }
}

TEST_CASE("a node crashes mid-iteration in a simulated pipeline: the survivors reschedule without it, run the iteration again and go on") {
  auto c = geo_pipeline("skippipe", 4);
  auto corpus = train::load_corpus(c);
  REQUIRE(corpus.ok());
  auto calm = run_pipeline_cluster(c, *corpus);
  REQUIRE(calm.ok());
  const auto stage_of = calm->pipeline["stage_of"].get<std::vector<int>>();
  for (const int stage : {1, 0}) {
    CAPTURE(stage);
    const int victim = static_cast<int>(std::find(stage_of.begin(), stage_of.end(), stage) - stage_of.begin());
    c.pipeline.crash_node = victim;
    c.pipeline.crash_at_iteration = 2;
    auto r = run_pipeline_cluster(c, *corpus);
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    const auto& p = r->pipeline;
    CHECK(p["lost_nodes"].get<int>() == 1);
    CHECK(p["retried_iterations"].get<int>() == 1);
    // The failed attempt took about half an iteration before the survivors saw the node go.
    CHECK(p["retried_s"].get<double>() > 0.4 * calm->pipeline["makespan_s"].get<double>());
    CHECK(p["retried_s"].get<double>() < 1.5 * calm->pipeline["makespan_s"].get<double>());
    REQUIRE(r->records.size() == 4);
    CHECK(r->records[0]["lost_nodes"].get<int>() == 0);
    CHECK(r->records[1]["lost_nodes"].get<int>() == 1);
    CHECK(r->crashed[static_cast<std::size_t>(victim)]);
    // A lost hop node's micro-batches go elsewhere; a lost origin's are no longer started.
    CHECK(r->records[3]["microbatches"].get<int>() == (stage == 0 ? 24 : 30));
    CHECK(r->records[0]["train_loss"].get<double>() == calm->records[0]["train_loss"].get<double>());
    CHECK(r->records[3]["train_loss"].get<double>() < r->records[0]["train_loss"].get<double>());
    CHECK(p["node_busy_s"][static_cast<std::size_t>(victim)].get<double>() < calm->pipeline["node_busy_s"][static_cast<std::size_t>(victim)].get<double>());
    // Deterministic, crash included.
    auto again = run_pipeline_cluster(c, *corpus);
    REQUIRE(again.ok());
    for (std::size_t i = 0; i < r->records.size(); ++i) CHECK(again->records[i].dump() == r->records[i].dump());
  }
}
