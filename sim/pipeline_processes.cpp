#include "sim/pipeline_processes.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "model/gpt.h"
#include "sim/network.h"
#include "sim/pipeline_totals.h"
#include "sim/scheduler.h"
#include "sim/transport_fabric.h"
#include "train/pipeline.h"

namespace gossamer::sim {

namespace {

// What one simulated node reported: each iteration's record as it passed it on, and the bytes every
// node had sent by then (on average).
struct Reported {
  train::PipelineRecord rec;
  std::optional<double> val;
  double bytes_sent = 0;
};

// The pipeline's iteration i over every node that reported it, as one trainer hosting them all
// would have recorded it (its micro-batches' losses summed in node order), or nullopt when none did.
struct Merged {
  train::PipelineRecord rec;
  std::vector<std::int64_t> started;  // micro-batches each node started as an origin
  std::optional<double> val;
  double bytes_sent = 0;
};

// Where each node's last report of each iteration is (a node that ran an iteration again after a
// failure reported it twice: the later one counts).
using LatestReports = std::vector<std::map<std::int64_t, std::size_t>>;
LatestReports latest_reports(const std::vector<std::vector<Reported>>& reported) {
  LatestReports out(reported.size());
  for (std::size_t v = 0; v < reported.size(); ++v) {
    for (std::size_t k = 0; k < reported[v].size(); ++k) out[v][reported[v][k].rec.iteration] = k;
  }
  return out;
}

std::optional<Merged> merge(const std::vector<std::vector<Reported>>& reported, const LatestReports& latest, std::int64_t i) {
  const std::size_t n = reported.size();
  Merged m;
  m.started.assign(n, 0);
  train::PipelineRecord& r = m.rec;
  r.node_busy_s.assign(n, 0.0);
  r.node_peak_inflight.assign(n, 0);
  r.node_bytes_sent.assign(n, 0);
  r.timeline.resize(n);
  bool any = false;
  double loss_sum = 0, whole = 0;
  for (std::size_t v = 0; v < n; ++v) {
    const auto at = latest[v].find(i);
    if (at == latest[v].end()) continue;
    const Reported* it = &reported[v][at->second];
    const train::PipelineRecord& x = it->rec;
    if (!any) {
      r.iteration = x.iteration;
      r.lr = x.lr;
      r.predicted_makespan_s = x.predicted_makespan_s;
    }
    any = true;
    r.samples = std::max(r.samples, x.samples);
    for (double l : x.microbatch_losses) {
      loss_sum += l;
      r.microbatch_losses.push_back(l);
    }
    m.started[v] = x.losses;
    r.lost_nodes = std::max(r.lost_nodes, x.lost_nodes);
    if (r.grad_norm == 0) r.grad_norm = x.grad_norm;  // the first origin of stage 0 that took part
    r.activation_bytes += x.activation_bytes;
    r.sync_bytes += x.sync_bytes;
    r.sync_rounds += x.sync_rounds;
    r.seconds += x.seconds;
    // The makespan is the last node's part; the stages' sync, from then until the last node had
    // stepped (a node that ended its part early waits for the others' confirmations).
    r.makespan_s = std::max(r.makespan_s, x.makespan_s);
    whole = std::max(whole, x.makespan_s + x.sync_s);
    r.ended_s = std::max(r.ended_s, x.ended_s);
    r.node_busy_s[v] = x.node_busy_s[v];
    r.node_peak_inflight[v] = x.node_peak_inflight[v];
    r.node_bytes_sent[v] = x.node_bytes_sent[v];
    r.timeline[v] = x.timeline[v];
    if (it->val) m.val = it->val;
    // The evaluator passes an evaluated record on late (once its evaluation is done): the others'
    // bytes are those at the iteration's end.
    if (!it->val) m.bytes_sent = std::max(m.bytes_sent, it->bytes_sent);
  }
  if (!any) return std::nullopt;
  r.sync_s = std::max(0.0, whole - r.makespan_s);
  r.losses = static_cast<std::int64_t>(r.microbatch_losses.size());
  r.train_loss = r.losses > 0 ? loss_sum / static_cast<double>(r.losses) : 0;
  return m;
}

// The nodes' run: one actor per node, each with its transport on its network node.
class Nodes {
 public:
  Nodes(const train::RunConfig& c, const train::Corpus& corpus, const SimulatedNodesOptions& o, Scheduler& scheduler, Network& network, double hop_scale)
      : c_(c), corpus_(corpus), o_(o), scheduler_(scheduler), network_(network), fabric_(scheduler, network), hop_scale_(hop_scale), n_(static_cast<std::size_t>(c.pipeline.nodes)),
        reported_(n_), crashed_(n_, false), stops_(n_) {
    for (std::size_t v = 0; v < n_; ++v) addresses_.push_back(fmt::format("198.18.{}.{}:7300", v / 250, v % 250 + 1));
    outcomes_.assign(n_, error(ErrorCode::kInternal, "the node did not run"));
  }

  // From an actor: every node's transport, then every node in an actor of its own; waits for all.
  Status run();
  SimulatedNodes finish(double compute_wall);

 private:
  runtime::PipelineProcessRequest request(std::size_t v);

  const train::RunConfig& c_;
  const train::Corpus& corpus_;
  const SimulatedNodesOptions& o_;
  Scheduler& scheduler_;
  Network& network_;
  TransportFabric fabric_;
  const double hop_scale_;  // sim/pipeline_totals.h
  const std::size_t n_;
  std::vector<std::string> addresses_;
  std::vector<std::vector<Reported>> reported_;
  std::vector<Result<runtime::PipelineProcessOutcome>> outcomes_;
  std::vector<bool> crashed_;
  std::shared_ptr<train::PlanMemo> plans_ = std::make_shared<train::PlanMemo>();
  std::vector<std::atomic<bool>> stops_;  // a crashed node's process is gone: it does nothing more
  bool crash_armed_ = true;
  std::int64_t furthest_ = 0;  // the furthest iteration any node reported
};

runtime::PipelineProcessRequest Nodes::request(std::size_t v) {
  runtime::PipelineProcessRequest req;
  req.config = c_;
  req.clock = &scheduler_;
  req.compute.forward_s = c_.pipeline.forward_s;
  req.plans = plans_;  // every node plans the same schedules: once for all
  req.node = static_cast<int>(v);
  req.addresses = addresses_;
  req.rejoin_timeout = o_.rejoin_timeout;
  req.omission_check = true;
  req.stop = &stops_[v];
  if (v < o_.crash_while_confirming.size()) req.crash_while_confirming = o_.crash_while_confirming[v];
  req.on_iteration = [this, v](const train::PipelineRecord& r, std::optional<double> val) {
    reported_[v].push_back(Reported{r, val, bytes_sent_per_node(network_, n_)});
    if (r.iteration > furthest_) {
      furthest_ = r.iteration;
      if (o_.progress) o_.progress(r.iteration, c_.train.steps);
    }
  };
  if (c_.pipeline.crash_node == static_cast<std::int64_t>(v)) {
    // Half-way through the iteration, as the scheduler expects it to go, the node's process dies.
    req.on_iteration_start = [this, v](std::int64_t i, double predicted_s) {
      if (i != c_.pipeline.crash_at_iteration || !crash_armed_) return;
      crash_armed_ = false;
      const auto half = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(0.5 * predicted_s));
      scheduler_.call_at(scheduler_.now() + half, [this, v] {
        network_.crash(static_cast<int>(v));
        crashed_[v] = true;
        stops_[v] = true;
      });
    };
  }
  return req;
}

Status Nodes::run() {
  std::vector<std::unique_ptr<transport::Transport>> transports;
  for (std::size_t v = 0; v < n_; ++v) {
    auto t = fabric_.make(static_cast<int>(v), addresses_[v], transport::PeerId{v + 1});
    if (!t.ok()) return t.status().with_context("pipeline node " + std::to_string(v) + "'s transport");
    transports.push_back(std::move(*t));
  }
  std::vector<std::unique_ptr<ClockThread>> actors;
  for (std::size_t v = 0; v < n_; ++v) {
    actors.push_back(scheduler_.start_thread([this, v, &transports] {
      const runtime::PipelineProcessRequest req = request(v);
      outcomes_[v] = runtime::run_pipeline_process(req, *transports[v], corpus_.dataset);
      // A node that failed or stopped is a process that ends: it listens no more.
      if (!outcomes_[v].ok() || outcomes_[v]->stopped) transports[v].reset();
    }));
  }
  for (auto& a : actors) a->join();
  return Status();
}

SimulatedNodes Nodes::finish(double compute_wall) {
  SimulatedNodes out;
  ClusterResult& result = out.result;
  result.crashed = crashed_;
  const runtime::PipelineProcessOutcome* first = nullptr;  // the first node that ended well
  PipelineEnd end;
  for (const auto& o : outcomes_) {
    if (!o.ok()) continue;
    if (!first) first = &*o;
    end.lost_nodes = std::max(end.lost_nodes, o->lost_nodes);
    end.retried_iterations = std::max(end.retried_iterations, o->retried_iterations);
    end.retried_s = std::max(end.retried_s, o->retried_s);
    end.rejoin_s = std::max(end.rejoin_s.value_or(0.0), o->rejoin_s);
    if (o->last_plan) {
      end.final_predicted_makespan_s = o->last_plan->simulation.makespan_s;
      // The nodes taking part at the end: those a micro-batch of the final schedule visits, as one
      // trainer counts its stages' replicas (every process holds the same schedule).
      const std::vector<int> visits = train::node_visits(o->last_plan->schedule);
      end.stage_replicas = std::count_if(visits.begin(), visits.end(), [](int n) { return n > 0; });
    }
    if (o->end) end.evaluations = *o->end;
  }
  result.parameters = model::Gpt(train::gpt_config(c_, 0)).num_parameters();
  result.compute_wall_s = compute_wall;
  if (first != nullptr && first->first_plan) {
    PipelineTotals totals(c_, *first->first_plan, hop_scale_);
    const LatestReports latest = latest_reports(reported_);
    for (std::int64_t i = 1; i <= c_.train.steps; ++i) {
      const auto m = merge(reported_, latest, i);
      if (!m) continue;
      result.compute_wall_s += m->rec.seconds;
      result.records.push_back(totals.add(m->rec, m->started, m->rec.ended_s, m->bytes_sent, m->val));
    }
    totals.finish(end, network_, std::chrono::duration<double>(scheduler_.now()).count(), result);
  }
  result.sim_time_s = std::chrono::duration<double>(scheduler_.now()).count();
  out.outcomes = std::move(outcomes_);
  return out;
}

}  // namespace

Result<SimulatedNodes> simulate_pipeline_nodes(const train::RunConfig& c, const train::Corpus& corpus, const SimulatedNodesOptions& o) {
  if (Status st = train::check_network_in_one_process(c); !st.ok()) return st;
  Stopwatch wall(real_clock());
  Scheduler scheduler;
  const double scale = hop_scale(c);
  Network network(scheduler, pipeline_network_spec(c, scale));
  Nodes nodes(c, corpus, o, scheduler, network, scale);
  Status failure;
  auto driver = scheduler.start_thread([&] { failure = nodes.run(); });
  if (Status st = scheduler.run(); !st.ok()) {
    scheduler.stop();
    return st.with_context("pipeline simulation");
  }
  driver->join();
  if (!failure.ok()) return failure;
  SimulatedNodes out = nodes.finish(0.0);
  // Every node but a crashed one must end well: a survivor's failure is the run's (each node's notes
  // of the agreement say how far it got).
  for (std::size_t v = 0; v < out.outcomes.size(); ++v) {
    const bool lost = out.result.crashed[v] || (v < o.crash_while_confirming.size() && o.crash_while_confirming[v] > 0);
    if (lost || out.outcomes[v].ok()) continue;
    for (std::size_t k = 0; k < out.outcomes.size(); ++k) {
      std::string notes;
      if (out.outcomes[k].ok()) {
        for (const auto& line : out.outcomes[k]->agreement) notes += (notes.empty() ? "" : "; ") + line;
      } else {
        notes = out.outcomes[k].status().to_string();
      }
      spdlog::warn("simulated pipeline node {}: {}", k, notes);
    }
    return out.outcomes[v].status().with_context("pipeline node " + std::to_string(v));
  }
  if (out.result.records.empty()) return error(ErrorCode::kInternal, "pipeline simulation: no node reported an iteration");
  out.result.wall_s = wall.elapsed_seconds();
  return out;
}

}  // namespace gossamer::sim
