#include "sim/pipeline_cluster.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "sim/pipeline_processes.h"
#include "sim/pipeline_totals.h"
#include "sim/scheduler.h"
#include "skippipe/topology.h"
#include "train/pipeline_trainer.h"
#include "train/pipeline_wire.h"
#include "transport/protocol.h"
#include "transport/tags.h"

namespace gossamer::sim {

NetworkSpec pipeline_network_spec(const train::RunConfig& c, double scale) {
  const skippipe::Network net = train::pipeline_network(c);
  const skippipe::Costs costs = train::pipeline_costs(c);
  const int n = net.nodes;
  NetworkSpec spec;
  spec.seed = static_cast<std::uint64_t>(c.sim.seed);
  transport::LinkProfile unlimited;
  unlimited.name = "unlimited";
  spec.nodes.assign(static_cast<std::size_t>(n), NodeSpec{unlimited, -1});
  spec.pairs.resize(static_cast<std::size_t>(n) * static_cast<std::size_t>(n));
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      spec.pairs[static_cast<std::size_t>(a * n + b)] =
          PairSpec{net.bandwidth(a, b) * scale, std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(net.latency(a, b) + costs.hop_overhead_s))};
    }
  }
  // The processes' agreement (sim/pipeline_processes.h) is not scaled with the model: its messages
  // take what they would on the table's links.
  spec.byte_weight = [scale](transport::Tag tag) {
    const bool agreement = (tag & ~transport::Tag{0xFu}) == transport::tags::kPipelineHello;
    return agreement ? scale : 1.0;
  };
  return spec;
}

namespace {

const std::vector<std::pair<std::string, std::string>>& pipeline_methods() {
  static const std::vector<std::pair<std::string, std::string>> m = {
      {"pipeline-full", "full"}, {"skippipe-random", "random"}, {"skippipe-noca", "noca"}, {"skippipe-cbs", "skippipe"}};
  return m;
}

}  // namespace

const std::vector<std::string>& pipeline_method_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [name, mode] : pipeline_methods()) v.push_back(name);
    return v;
  }();
  return names;
}

std::optional<std::string> pipeline_method_mode(const std::string& name) {
  for (const auto& [n, mode] : pipeline_methods()) {
    if (n == name) return mode;
  }
  return std::nullopt;
}

std::string pipeline_method_name(const std::string& mode) {
  for (const auto& [n, m] : pipeline_methods()) {
    if (m == mode) return n;
  }
  return "pipeline-" + mode;
}

namespace {

// One trainer hosting every node: what a run without a lost node takes.
struct OneTrainer {
  const train::RunConfig& c;
  const train::Corpus& corpus;
  const PipelineProgress& progress;
  Scheduler& scheduler;
  Network& network;
  double hop_scale;  // sim/pipeline_totals.h
  ClusterResult& result;
  double compute_wall = 0;

  Status run();
  // The omission check (the second half of the stages left out) and, beside, the model as trained
  // (without pipeline.depth_scaling): the summary shows what each changes.
  void end_figures(train::PipelineTrainer& t, std::optional<double> last_val, PipelineEnd& end);
};

void OneTrainer::end_figures(train::PipelineTrainer& t, std::optional<double> last_val, PipelineEnd& end) {
  Stopwatch omission(real_clock());
  // (The last iteration evaluates: its loss is the first figure.)
  end.evaluations = train::EndEvaluation(t, train::default_omitted_stages(c.pipeline.stages)).measure(t, t.stage_weights(), last_val);
  end.lost_nodes = t.lost_nodes();
  end.final_predicted_makespan_s = t.plan().simulation.makespan_s;
  for (int stage = 0; stage < c.pipeline.stages; ++stage) end.stage_replicas += static_cast<std::int64_t>(t.stage_replicas(stage).size());
  compute_wall += omission.elapsed_seconds();
}

Status OneTrainer::run() {
  train::PipelineEnvironment env;
  env.clock = &scheduler;
  env.link = [this](int from, int to, int channel) { return network.link(from, to, channel); };
  env.compute.forward_s = c.pipeline.forward_s;
  const auto nodes = static_cast<std::size_t>(c.pipeline.nodes);
  auto made = train::PipelineTrainer::make(c, corpus.dataset, env);
  if (!made.ok()) return made.status();
  train::PipelineTrainer& t = **made;
  PipelineTotals totals(c, t.plan(), hop_scale);
  result.parameters = model::Gpt(train::gpt_config(c, 0)).num_parameters();
  PipelineEnd end;
  std::optional<double> last_val;  // the latest evaluation's
  for (std::int64_t i = 1; i <= c.train.steps; ++i) {
    auto rec = t.step();
    if (!rec.ok()) return rec.status().with_context("iteration " + std::to_string(i));
    std::vector<std::int64_t> started(nodes, 0);  // micro-batches each origin started
    for (const auto& a : t.plan().schedule.agents) started[static_cast<std::size_t>(a.origin)] += a.microbatches;
    compute_wall += rec->seconds;
    std::optional<double> val;
    if ((c.train.eval_every > 0 && i % c.train.eval_every == 0) || i == c.train.steps) {
      Stopwatch eval(real_clock());
      val = last_val = t.evaluate();
      compute_wall += eval.elapsed_seconds();
    }
    result.records.push_back(totals.add(*rec, started, std::chrono::duration<double>(scheduler.now()).count(), bytes_sent_per_node(network, nodes), val));
    if (progress) progress(i, c.train.steps);
  }
  end_figures(t, last_val, end);
  totals.finish(end, network, std::chrono::duration<double>(scheduler.now()).count(), result);
  return Status();
}

}  // namespace

Result<ClusterResult> run_pipeline_cluster(const train::RunConfig& c, const train::Corpus& corpus, const PipelineProgress& progress) {
  if (Status st = train::check_network_in_one_process(c); !st.ok()) return st;  // before the emulated network is built on the table
  // A lost node goes through the agreement pipeline processes run (sim/pipeline_processes.h).
  if (c.pipeline.crash_node >= 0) {
    SimulatedNodesOptions o;
    o.progress = progress;
    auto nodes = simulate_pipeline_nodes(c, corpus, o);
    if (!nodes.ok()) return nodes.status();
    return std::move(nodes->result);
  }
  Stopwatch wall(real_clock());
  const double scale = hop_scale(c);
  Scheduler scheduler;
  Network network(scheduler, pipeline_network_spec(c, scale));
  ClusterResult result;
  result.crashed.assign(static_cast<std::size_t>(c.pipeline.nodes), false);
  OneTrainer one{c, corpus, progress, scheduler, network, scale, result};
  Status failure;
  auto driver = scheduler.start_thread([&] { failure = one.run(); });
  Status st = scheduler.run();
  if (!st.ok()) {
    scheduler.stop();
    return st.with_context("pipeline simulation");
  }
  driver->join();
  if (!failure.ok()) return failure;
  result.sim_time_s = std::chrono::duration<double>(scheduler.now()).count();
  result.wall_s = wall.elapsed_seconds();
  result.compute_wall_s = one.compute_wall;
  return result;
}

}  // namespace gossamer::sim
