#include "sim/pipeline_cluster.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "sim/scheduler.h"
#include "skippipe/topology.h"
#include "train/pipeline_trainer.h"
#include "train/pipeline_wire.h"
#include "transport/protocol.h"

namespace gossamer::sim {

NetworkSpec pipeline_network_spec(const train::RunConfig& c, double hop_bytes) {
  const skippipe::Network net = train::pipeline_network(c);
  const skippipe::Costs costs = train::pipeline_costs(c);
  const double scale = costs.activation_bytes > 0 ? hop_bytes / costs.activation_bytes : 1.0;
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

nlohmann::json timeline_json(const train::PipelineRecord& rec, const skippipe::Schedule& s) {
  nlohmann::json nodes = nlohmann::json::array();
  for (std::size_t v = 0; v < rec.timeline.size(); ++v) {
    nlohmann::json spans = nlohmann::json::array();
    for (const auto& w : rec.timeline[v]) {
      const char* kind = w.kind == train::WorkKind::kForward ? "F" : w.kind == train::WorkKind::kBackward ? "B" : "H";
      spans.push_back(nlohmann::json::array({w.microbatch, kind, w.start_s, w.end_s}));
    }
    nodes.push_back({{"node", v}, {"stage", s.stage_of[v]}, {"spans", std::move(spans)}});
  }
  return nodes;
}

}  // namespace

Result<ClusterResult> run_pipeline_cluster(const train::RunConfig& c, const train::Corpus& corpus, const PipelineProgress& progress) {
  if (Status st = train::check_network_in_one_process(c); !st.ok()) return st;  // before the emulated network is built on the table
  Stopwatch wall(real_clock());
  // The real model's fp32 hop on the wire, against which the table's full-size hop is scaled.
  const at::Tensor probe = torch::zeros({c.train.batch_size, c.model.context, c.model.width});
  const Bytes message = train::encode_activation(train::ActivationHeader{}, probe, quant::EncodeOptions{});
  const double hop_bytes = transport::LinkProfile{}.wire_bytes(message.size() + transport::kFrameHeaderBytes);
  Scheduler scheduler;
  Network network(scheduler, pipeline_network_spec(c, hop_bytes));
  train::PipelineEnvironment env;
  env.clock = &scheduler;
  env.link = [&network](int from, int to, int channel) { return network.link(from, to, channel); };
  env.compute.forward_s = c.pipeline.forward_s;
  const auto nodes = static_cast<std::size_t>(c.pipeline.nodes);

  ClusterResult result;
  result.accounts.resize(nodes);
  result.crashed.assign(nodes, false);
  Status failure;
  double compute_wall = 0;
  auto driver = scheduler.start_thread([&] {
    auto made = train::PipelineTrainer::make(c, corpus.dataset, env);
    if (!made.ok()) {
      failure = made.status();
      return;
    }
    train::PipelineTrainer& t = **made;
    // Copies: a lost node's reschedule (exclude) replaces the trainer's plan.
    const skippipe::Plan plan = t.plan();
    const skippipe::Schedule& s = plan.schedule;
    {
      model::Gpt probe_model(train::gpt_config(c, 0));
      result.parameters = probe_model.num_parameters();
    }
    std::vector<std::int64_t> launched(nodes, 0);  // micro-batches each origin started, in all
    std::vector<double> busy(nodes, 0.0);
    std::vector<int> peak(nodes, 0);
    double pipeline_time = 0, sync_time = 0;
    std::uint64_t activation_bytes = 0, sync_bytes = 0;
    std::int64_t sync_rounds = 0;
    nlohmann::json timeline;
    double first_makespan = 0;
    double lost_s = 0;           // virtual time of iterations that failed and were run again
    std::int64_t retried = 0;
    std::optional<double> last_val;  // the latest evaluation's
    for (std::int64_t i = 1; i <= c.train.steps; ++i) {
      const bool crash = c.pipeline.crash_node >= 0 && i == c.pipeline.crash_at_iteration;
      const int victim = static_cast<int>(c.pipeline.crash_node);
      const Nanos started = scheduler.now();
      if (crash) {
        // Half-way through the iteration, as the scheduler expects it to go, the node's process dies.
        const auto half = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(0.5 * t.plan().simulation.makespan_s));
        scheduler.call_at(started + half, [&network, victim] { network.crash(victim); });
      }
      auto rec = t.step();
      if (crash && rec.ok()) {
        // It took no part this iteration (an idle origin): the others go on without it all the same.
        if (Status st = t.exclude({victim}); !st.ok()) {
          failure = st.with_context("iteration " + std::to_string(i));
          return;
        }
      }
      if (!rec.ok() && crash) {
        // The survivors saw it go (their links to it closed); they go on without it, the same
        // iteration again over a new schedule.
        lost_s += std::chrono::duration<double>(scheduler.now() - started).count();
        ++retried;
        if (Status st = t.exclude({victim}); !st.ok()) {
          failure = st.with_context("iteration " + std::to_string(i));
          return;
        }
        rec = t.step();
      }
      if (!rec.ok()) {
        failure = rec.status().with_context("iteration " + std::to_string(i));
        return;
      }
      if (crash) result.crashed[static_cast<std::size_t>(victim)] = true;
      for (const auto& a : t.plan().schedule.agents) launched[static_cast<std::size_t>(a.origin)] += a.microbatches;
      compute_wall += rec->seconds;
      pipeline_time += rec->makespan_s;
      sync_time += rec->sync_s;
      activation_bytes += rec->activation_bytes;
      sync_bytes += rec->sync_bytes;
      sync_rounds += rec->sync_rounds;
      for (std::size_t v = 0; v < nodes && v < rec->node_busy_s.size(); ++v) {
        busy[v] += rec->node_busy_s[v];
        peak[v] = std::max(peak[v], rec->node_peak_inflight[v]);
      }
      if (i == 1) {
        timeline = timeline_json(*rec, s);
        first_makespan = rec->makespan_s;
      }
      double sent = 0;
      for (std::size_t v = 0; v < nodes; ++v) sent += static_cast<double>(network.traffic(static_cast<int>(v)).wire_bytes_sent);
      nlohmann::json j = {{"worker", 0},
                          {"step", rec->iteration},
                          {"samples", rec->samples},
                          {"train_loss", rec->train_loss},
                          {"lr", rec->lr},
                          {"grad_norm", rec->grad_norm},
                          {"time_s", std::chrono::duration<double>(scheduler.now()).count()},
                          {"makespan_s", rec->makespan_s},
                          {"sync_s", rec->sync_s},
                          {"predicted_makespan_s", t.plan().simulation.makespan_s},
                          {"activation_bytes", rec->activation_bytes},
                          {"sync_bytes", rec->sync_bytes},
                          {"sync_rounds", rec->sync_rounds},
                          {"lost_nodes", rec->lost_nodes},
                          {"microbatches", rec->losses},
                          {"bytes_sent", sent / static_cast<double>(nodes)}};
      if ((c.train.eval_every > 0 && i % c.train.eval_every == 0) || i == c.train.steps) {
        Stopwatch eval(real_clock());
        last_val = t.evaluate();
        j["val_loss"] = *last_val;
        compute_wall += eval.elapsed_seconds();
      }
      result.records.push_back(std::move(j));
      if (progress) progress(i, c.train.steps);
    }
    // The omission check (the second half of the stages left out) and, beside, the model as trained
    // (without pipeline.depth_scaling): the summary shows what each changes.
    Stopwatch omission(real_clock());
    const auto weights = t.stage_weights();
    const std::vector<int> omit = train::default_omitted_stages(c.pipeline.stages);
    const double final_loss = last_val ? *last_val : t.evaluate_with(weights, t.depth_scales());  // (the last iteration evaluates)
    const double omitted = t.evaluate_with(weights, t.depth_scales(omit), omit);
    const double as_trained = t.evaluate_with(weights, {});
    const double omitted_as_trained = t.evaluate_with(weights, {}, omit);
    compute_wall += omission.elapsed_seconds();
    const double sim_time = std::chrono::duration<double>(scheduler.now()).count();
    const auto iterations = static_cast<double>(std::max<std::int64_t>(1, c.train.steps));
    std::size_t taking_part = 0;
    for (int stage = 0; stage < s.options.stages; ++stage) taking_part += t.stage_replicas(stage).size();
    nlohmann::json node_idle = nlohmann::json::array(), node_bytes = nlohmann::json::array();
    for (std::size_t v = 0; v < nodes; ++v) {
      auto& a = result.accounts[v];
      const NodeTraffic tr = network.traffic(static_cast<int>(v));
      a.steps = c.train.steps;
      a.tokens = launched[v] * c.train.batch_size * c.model.context;
      a.bytes_sent = tr.wire_bytes_sent;
      a.bytes_received = tr.wire_bytes_received;
      a.compute_s = busy[v];
      a.blocked_s = std::max(0.0, sim_time - busy[v]);
      a.rounds = c.pipeline.stage_sync == "ddp" ? c.train.steps : (taking_part > 0 ? sync_rounds / static_cast<std::int64_t>(taking_part) : 0);
      node_idle.push_back(std::max(0.0, pipeline_time - busy[v]));
      node_bytes.push_back(tr.wire_bytes_sent);
    }
    result.pipeline = {{"mode", train::name_of(c.pipeline.mode)},
                       {"stage_sync", c.pipeline.stage_sync},
                       {"nodes", c.pipeline.nodes},
                       {"stages", c.pipeline.stages},
                       {"path_length", c.pipeline.path_length},
                       {"stage_of", s.stage_of},
                       {"microbatches", s.microbatches()},
                       {"predicted_makespan_s", plan.simulation.makespan_s},
                       {"closed_form_makespan_s", plan.predicted_makespan_s},
                       {"makespan_s", pipeline_time / iterations},
                       {"first_makespan_s", first_makespan},
                       {"sync_s", sync_time / iterations},
                       {"node_busy_s", busy},
                       {"node_idle_s", node_idle},
                       {"node_peak_inflight", peak},
                       {"node_bytes_sent", node_bytes},
                       {"activation_bytes", activation_bytes},
                       {"sync_bytes", sync_bytes},
                       {"lost_nodes", t.lost_nodes()},
                       {"retried_iterations", retried},
                       {"retried_s", lost_s},
                       {"final_predicted_makespan_s", t.plan().simulation.makespan_s},
                       {"depth_scaling", c.pipeline.depth_scaling},
                       {"stage_shares", t.stage_shares()},
                       {"omitted_stages", omit},
                       {"val_loss", final_loss},
                       {"omitted_val_loss", omitted},
                       {"val_loss_as_trained", as_trained},
                       {"omitted_val_loss_as_trained", omitted_as_trained},
                       {"hop_bytes_scale", hop_bytes / std::max(1.0, train::pipeline_costs(c).activation_bytes)},
                       {"timeline", timeline}};
  });
  Status st = scheduler.run();
  if (!st.ok()) {
    scheduler.stop();
    return st.with_context("pipeline simulation");
  }
  driver->join();
  if (!failure.ok()) return failure;
  result.sim_time_s = std::chrono::duration<double>(scheduler.now()).count();
  result.wall_s = wall.elapsed_seconds();
  result.compute_wall_s = compute_wall;
  return result;
}

}  // namespace gossamer::sim
