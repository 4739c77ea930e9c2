#include "train/pipeline_trainer.h"
#include "train/pipeline_trainer_parts.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "core/signal.h"
#include "optim/outer_optimizer.h"
#include "quant/format.h"
#include "train/outer.h"
#include "train/pipeline.h"
#include "train/pipeline_wire.h"
#include "train/schedule.h"
#include "train/worker.h"
#include "transport/memory_link.h"

namespace gossamer::train {

namespace {

using Mesh = std::vector<std::vector<std::shared_ptr<transport::Link>>>;

Mesh memory_mesh(int n, std::uint64_t first_id) {
  Mesh links(static_cast<std::size_t>(n), std::vector<std::shared_ptr<transport::Link>>(static_cast<std::size_t>(n)));
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      auto [ab, ba] = transport::make_memory_link_pair(transport::PeerId{first_id + static_cast<std::uint64_t>(a)}, transport::PeerId{first_id + static_cast<std::uint64_t>(b)});
      links[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)] = ab;
      links[static_cast<std::size_t>(b)][static_cast<std::size_t>(a)] = ba;
    }
  }
  return links;
}

// The scheduler's options from the [pipeline] keys.
Result<skippipe::Options> scheduler_options(const RunConfig& c) {
  const auto& p = c.pipeline;
  skippipe::Options o;
  o.stages = static_cast<int>(p.stages);
  o.path_length = static_cast<int>(p.path_length);
  o.memory = static_cast<int>(p.memory);
  o.mbs_per_origin = static_cast<int>(p.mbs_per_origin);
  o.mbs_per_agent = static_cast<int>(p.mbs_per_agent);
  o.seed = static_cast<std::uint64_t>(c.train.seed);
  if (Status st = o.check(); !st.ok()) return st;
  return o;
}

// The nodes this process hosts, sorted and distinct (none named: all n).
Result<std::vector<int>> hosted_nodes(std::vector<int> local, int n) {
  if (local.empty()) {
    for (int v = 0; v < n; ++v) local.push_back(v);
  }
  for (int v : local) {
    if (v < 0 || v >= n) return error(ErrorCode::kInvalidArgument, "no pipeline node " + std::to_string(v) + " to host (pipeline.nodes = " + std::to_string(n) + ")");
  }
  std::sort(local.begin(), local.end());
  local.erase(std::unique(local.begin(), local.end()), local.end());
  return local;
}

}  // namespace



PipelineTrainer::PipelineTrainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PipelineTrainer::~PipelineTrainer() = default;

Result<std::unique_ptr<PipelineTrainer>> PipelineTrainer::make(const RunConfig& c, const data::Dataset& data, PipelineEnvironment env) {
  auto impl = std::make_unique<Impl>();
  impl->config = c;
  GOSSAMER_CHECK(env.clock != nullptr, "PipelineTrainer: no clock");
  if (!env.link) {
    // In-memory links, a mesh per channel, made when first asked for (from the caller's thread).
    auto meshes = std::make_shared<std::map<int, Mesh>>();
    const int n = static_cast<int>(c.pipeline.nodes);
    env.link = [meshes, n](int from, int to, int channel) {
      auto it = meshes->find(channel);
      if (it == meshes->end()) it = meshes->emplace(channel, memory_mesh(n, 1)).first;
      return it->second[static_cast<std::size_t>(from)][static_cast<std::size_t>(to)];
    };
  }
  impl->env = env;
  impl->data = &data;
  const auto& p = c.pipeline;
  if (Status st = check_pipeline_shape(c); !st.ok()) return st;
  const skippipe::Mode mode = pipeline_mode(p.mode);
  auto scheduler = scheduler_options(c);
  if (!scheduler.ok()) return scheduler.status();
  const skippipe::Options o = *scheduler;
  const int n = static_cast<int>(p.nodes);
  if (!env.network) {
    if (Status st = check_network_in_one_process(c); !st.ok()) return st;
  }
  if (env.network && (env.network->nodes != n || !env.network->check().ok())) {
    return error(ErrorCode::kInvalidArgument, "the pipeline's measured network does not describe its " + std::to_string(n) + " nodes");
  }
  const skippipe::Network net = env.network ? *env.network : pipeline_network(c);
  skippipe::Costs costs = pipeline_costs(c);
  if (env.node_forward_s) {
    if (static_cast<int>(env.node_forward_s->size()) != n) return error(ErrorCode::kInvalidArgument, "the pipeline's measured forward times do not cover its nodes");
    costs.node_forward_s = *env.node_forward_s;
    costs.activation_bytes = static_cast<double>(hop_bytes(c));
    costs.hop_overhead_s = 0;  // measured with the links
  }
  auto make_plan = [&]() -> Result<skippipe::Plan> {
    skippipe::GcmaOptions g;
    g.trials = static_cast<int>(p.gcma_trials);
    g.seed = static_cast<std::uint64_t>(c.train.seed);
    auto stage_of = skippipe::assign_gcma(net, costs, o, g);
    if (!stage_of.ok()) return stage_of.status();
    return skippipe::plan(net, costs, *stage_of, o, mode);
  };
  // (A measured network is each process's own: planned where measured.)
  impl->plan_key = env.plans && !env.network ? to_toml(c) : std::string();
  auto planned = impl->plan_key.empty() ? make_plan() : env.plans->get(impl->plan_key, make_plan);
  if (!planned.ok()) return planned.status().with_context("planning the pipeline");
  impl->plan = std::move(*planned);
  // Every mode's nodes follow the planned iteration's timetable (pipeline.order), which the
  // skippipe mode's schedule already carries; the others get their simulation's.
  if (p.order == PipelineOrder::kTimetable && impl->plan.schedule.timetable.empty()) impl->plan.schedule.timetable = impl->plan.simulation.timetable;
  if (p.order == PipelineOrder::kArrival) impl->plan.schedule.timetable.clear();
  const skippipe::Schedule& s = impl->plan.schedule;

  quant::EncodeOptions codec;
  codec.codec = p.activation_codec;
  codec.block_size = static_cast<std::uint32_t>(c.outer.codec_block);
  impl->node_options.codec = codec;
  impl->node_options.max_batch = c.train.batch_size;
  impl->node_options.clock = env.clock;
  impl->node_options.compute = env.compute;
  impl->options = o;
  impl->mode = mode;
  impl->net = net;
  impl->costs = costs;
  auto local = hosted_nodes(env.local, n);
  if (!local.ok()) return local.status();
  impl->local = impl->env.local = *local;
  impl->nodes.resize(static_cast<std::size_t>(n));
  impl->adam.resize(static_cast<std::size_t>(n));
  impl->alive.assign(static_cast<std::size_t>(n), true);
  for (int v = 0; v < n; ++v) {
    if (s.stage_of[static_cast<std::size_t>(v)] == 0) impl->origins.push_back(v);
  }
  impl->ddp = p.stage_sync == optim::Method::kDdp;
  if (!impl->ddp) {
    RunConfig oc = c;
    oc.outer.method = p.stage_sync;
    oc.model.layers = c.model.layers / p.stages;  // what a stage holds: streaming_diloco cuts its fragments from these
    auto ocfg = outer_config(oc);
    if (!ocfg.ok()) return ocfg.status().with_context("pipeline.stage_sync");
    impl->outer_config = *ocfg;
  }
  if (Status st = impl->arrange(); !st.ok()) return st;
  const int world = static_cast<int>(impl->origins.size());
  for (int r = 0; r < world; ++r) {
    impl->samplers.push_back(std::make_unique<data::ShardSampler>(data.train(), r, world, c.train.batch_size, c.model.context,
                                                                  static_cast<std::uint64_t>(c.train.seed), c.data.shard_block));
  }
  impl->eval_set = data::validation_batches(data.val(), c.train.batch_size, c.model.context, c.train.eval_batches);
  return std::unique_ptr<PipelineTrainer>(new PipelineTrainer(std::move(impl)));
}

std::map<int, std::vector<MicroBatchData>> PipelineTrainer::Impl::draw_microbatches() const {
  // Each origin's micro-batches, as many as the schedule starts there (the full pipeline's origins
  // carry more than mbs_per_origin, its idle stage-0 nodes none), drawn from the origin's shard.
  std::map<int, std::vector<MicroBatchData>> out;
  std::map<int, std::int64_t> launches;
  for (const auto& a : plan.schedule.agents) launches[a.origin] += a.microbatches;
  for (std::size_t r = 0; r < origins.size(); ++r) {
    if (!nodes[static_cast<std::size_t>(origins[r])]) continue;  // another process's
    const std::int64_t count = launches[origins[r]];
    for (std::int64_t k = 0; k < count; ++k) {
      const auto b = samplers[r]->batch(done * count + k);
      out[origins[r]].push_back(MicroBatchData{b.tokens, b.targets});
    }
  }
  return out;
}

void PipelineTrainer::Impl::run_node(std::size_t v, std::uint64_t iteration, const std::vector<MicroBatchData>& batches, Deadline deadline,
                                     Deadline sync_deadline, double lr, NodeOutcome& out) {
  PipelineNode& node = *nodes[v];
  const auto rank_in = [&](const std::vector<int>& members) {  // this node's rank among its stage's replicas
    return static_cast<std::size_t>(std::find(members.begin(), members.end(), static_cast<int>(v)) - members.begin());
  };
  out.result = node.run_iteration(iteration, batches, deadline);
  if (!out.result.ok()) {
    // Its stage's replicas would wait for it in their sync: they learn at once instead.
    if (const auto r = replicas.find(node.stage()); r != replicas.end()) {
      if (const std::size_t rank = rank_in(r->second); rank < r->second.size()) {
        for (const auto& l : groups.at(node.stage())[rank].peers) {
          if (l) l->close();
        }
      }
    }
    return;
  }
  if (node.visits() == 0) return;
  if (ddp) {
    optim::CommStats cs;
    out.synced = node.sync_stage(groups.at(node.stage())[rank_in(replicas.at(node.stage()))], iteration, sync_deadline, &cs);
    out.sync_bytes = cs.bytes_sent;
    return;
  }
  // Its own step on its own micro-batches' mean gradient, then the stage's outer round when due.
  const auto& params = node.stage_parameters();
  for (const auto& p : params) {
    if (p.grad().defined()) p.mutable_grad().div_(static_cast<double>(node.visits()));
  }
  torch::nn::utils::clip_grad_norm_(params, config.train.grad_clip);
  for (auto& group : adam[v]->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  adam[v]->step();
  auto& outer_optimizer = *outer[v].outer;
  const std::uint64_t before = outer_optimizer.comm().bytes_sent;
  auto stepped = outer_optimizer.step(static_cast<std::int64_t>(iteration), sync_deadline);
  if (!stepped.ok()) {
    out.synced = stepped.status();
    return;
  }
  out.rounds = *stepped ? 1 : 0;
  out.sync_bytes = outer_optimizer.comm().bytes_sent - before;
}

Result<PipelineRecord> PipelineTrainer::Impl::record_of(std::vector<NodeOutcome>& outcomes) const {
  // The first failure that is not another's consequence (a peer gone, a deadline) names the cause.
  for (int v : local) {
    const auto& r = outcomes[static_cast<std::size_t>(v)].result;
    if (!r.ok() && r.status().code() != ErrorCode::kPeerLost && r.status().code() != ErrorCode::kTimeout) {
      return r.status().with_context("pipeline node " + std::to_string(v));
    }
  }
  PipelineRecord rec;
  double loss_sum = 0;
  int losses = 0;
  // Per node, indexed by node (zero for the nodes another process hosts).
  const std::size_t n = nodes.size();
  rec.node_busy_s.assign(n, 0.0);
  rec.node_peak_inflight.assign(n, 0);
  rec.node_bytes_sent.assign(n, 0);
  rec.timeline.resize(n);
  for (int local_node : local) {
    const auto v = static_cast<std::size_t>(local_node);
    NodeOutcome& o = outcomes[v];
    if (!o.result.ok()) return o.result.status().with_context("pipeline node " + std::to_string(v));
    if (!o.synced.ok()) return o.synced;
    IterationStats& it = *o.result;
    for (double l : it.losses) loss_sum += l;
    losses += static_cast<int>(it.losses.size());
    rec.microbatch_losses.insert(rec.microbatch_losses.end(), it.losses.begin(), it.losses.end());
    rec.activation_bytes += it.bytes_sent;
    rec.makespan_s = std::max(rec.makespan_s, it.finished_s);
    rec.node_busy_s[v] = it.busy_s;
    rec.node_peak_inflight[v] = it.peak_inflight;
    rec.node_bytes_sent[v] = it.bytes_sent;
    rec.timeline[v] = std::move(it.work);
    rec.sync_bytes += o.sync_bytes;
    rec.sync_rounds += o.rounds;
  }
  rec.train_loss = losses > 0 ? loss_sum / losses : 0;
  rec.losses = losses;
  return rec;
}

Result<PipelineRecord> PipelineTrainer::step(const std::function<Status()>& commit) {
  auto& m = *impl_;
  const auto& c = m.config;
  const auto start = std::chrono::steady_clock::now();
  m.pending.reset();  // an iteration not applied is dropped: this one starts from the same weights
  const std::uint64_t iteration = static_cast<std::uint64_t>(m.done) + 1;
  const std::map<int, std::vector<MicroBatchData>> data = m.draw_microbatches();
  for (int v : m.local) {
    for (const auto& p : m.nodes[static_cast<std::size_t>(v)]->stage_parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }
  Clock& clock = *m.env.clock;
  const Nanos t0 = clock.now();
  // The pipeline's part may take as long as the scheduler expects it to, four times over, plus
  // train.round_timeout_s; the sync has train.round_timeout_s more (a replica that finished early
  // waits there for the others).
  const Nanos timeout = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(c.train.round_timeout_s));
  const Deadline deadline = Deadline::after(clock, timeout + std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(4 * m.plan.simulation.makespan_s)));
  const Deadline sync_deadline = Deadline::at(deadline.time() + timeout);
  std::vector<Impl::NodeOutcome> outcomes(m.nodes.size());
  ScheduleOptions so;
  so.lr = c.train.lr;
  so.min_lr_ratio = c.train.min_lr_ratio;
  so.warmup_steps = c.train.warmup_steps;
  so.total_steps = c.train.steps;
  const double lr = learning_rate(so, m.done);
  {
    static const std::vector<MicroBatchData> kNone;
    std::vector<std::unique_ptr<ClockThread>> threads;
    for (int local : m.local) {
      const auto v = static_cast<std::size_t>(local);
      const auto it = data.find(local);
      const std::vector<MicroBatchData>& batches = it == data.end() ? kNone : it->second;
      threads.push_back(clock.start_thread([&, v] { m.run_node(v, iteration, batches, deadline, sync_deadline, lr, outcomes[v]); }));
    }
    for (auto& t : threads) t->join();
  }
  auto rec = m.record_of(outcomes);
  if (!rec.ok()) return rec.status();
  rec->lr = lr;
  m.pending = Impl::Pending{std::move(*rec), start, t0};
  if (commit) {
    if (Status st = commit(); !st.ok()) return st;
  }
  return apply_pending();
}

bool PipelineTrainer::pending() const { return impl_->pending.has_value(); }

Result<PipelineRecord> PipelineTrainer::apply_pending() {
  auto& m = *impl_;
  const auto& c = m.config;
  GOSSAMER_CHECK(m.pending.has_value(), "PipelineTrainer::apply_pending: no iteration is pending");
  Impl::Pending p = std::move(*m.pending);
  m.pending.reset();
  PipelineRecord rec = std::move(p.rec);
  for (int local : m.local) {
    const auto v = static_cast<std::size_t>(local);
    PipelineNode& node = *m.nodes[v];
    if (!m.ddp || node.visits() == 0) continue;
    // Clipped per stage: every replica holds the same gradients, so they clip alike.
    const double norm = torch::nn::utils::clip_grad_norm_(node.stage_parameters(), c.train.grad_clip);
    if (node.stage() == 0 && rec.grad_norm == 0) rec.grad_norm = norm;  // the first origin that takes part
    for (auto& group : m.adam[v]->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(rec.lr);
    m.adam[v]->step();
  }
  ++m.done;
  const std::vector<double> visits = schedule_stage_visits(m.plan.schedule);
  m.stage_visits.resize(visits.size(), 0.0);
  for (std::size_t st = 0; st < visits.size(); ++st) m.stage_visits[st] += visits[st];
  rec.iteration = m.done;
  m.samples += m.plan.schedule.microbatches() * c.train.batch_size;  // every origin's, wherever hosted
  rec.samples = m.samples;
  rec.lost_nodes = m.lost;
  rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - p.start).count();
  rec.sync_s = std::max(0.0, std::chrono::duration<double>(m.env.clock->now() - p.t0).count() - rec.makespan_s);
  rec.ended_s = std::chrono::duration<double>(m.env.clock->now()).count();
  rec.predicted_makespan_s = m.plan.simulation.makespan_s;
  return rec;
}



std::vector<int> PipelineTrainer::stage_holders() const {
  const auto& m = *impl_;
  std::vector<int> out;
  for (int stage = 0; stage < m.config.pipeline.stages; ++stage) {
    int holder = -1;
    if (const auto it = m.replicas.find(stage); it != m.replicas.end() && !it->second.empty()) holder = it->second.front();
    for (std::size_t v = 0; v < m.plan.schedule.stage_of.size() && holder < 0; ++v) {
      if (m.plan.schedule.stage_of[v] == stage && m.alive[v]) holder = static_cast<int>(v);
    }
    out.push_back(holder);
  }
  return out;
}

std::vector<at::Tensor> PipelineTrainer::node_parameters(int node) const {
  GOSSAMER_CHECK(node >= 0 && static_cast<std::size_t>(node) < impl_->nodes.size() && impl_->nodes[static_cast<std::size_t>(node)],
                 "PipelineTrainer::node_parameters: node " + std::to_string(node) + " is not hosted here");
  return impl_->nodes[static_cast<std::size_t>(node)]->stage_parameters();
}

Status PipelineTrainer::exclude(const std::vector<int>& dead) {
  auto& m = *impl_;
  m.pending.reset();
  const int n = static_cast<int>(m.alive.size());
  std::vector<bool> alive = m.alive;
  for (int d : dead) {
    if (d < 0 || d >= n) return error(ErrorCode::kInvalidArgument, "no pipeline node " + std::to_string(d));
    alive[static_cast<std::size_t>(d)] = false;
  }
  const auto& stage_of = m.plan.schedule.stage_of;
  // Planned over the survivors that took part: their weights are current. A node the schedule gave
  // nothing (the full pipeline's idle stage-0 nodes) still holds the initial weights, so it stays out.
  const std::vector<int> took_part = node_visits(m.plan.schedule);
  std::vector<int> survivors;  // sub-problem index -> node
  for (int v = 0; v < n; ++v) {
    if (alive[static_cast<std::size_t>(v)] && took_part[static_cast<std::size_t>(v)] > 0) survivors.push_back(v);
  }
  std::vector<int> per_stage(static_cast<std::size_t>(m.options.stages), 0);
  for (int v : survivors) ++per_stage[static_cast<std::size_t>(stage_of[static_cast<std::size_t>(v)])];
  for (int st = 0; st < m.options.stages; ++st) {
    if (per_stage[static_cast<std::size_t>(st)] == 0) {
      return error(ErrorCode::kUnavailable, "the pipeline cannot go on: no node of stage " + std::to_string(st) + " is left (its weights are gone)");
    }
  }
  // The scheduler's problem over the survivors, their stages kept (their weights stay where they are).
  const auto k = static_cast<int>(survivors.size());
  skippipe::Network sub;
  sub.nodes = k;
  sub.latency_s.resize(static_cast<std::size_t>(k) * static_cast<std::size_t>(k));
  sub.bandwidth_Bps.resize(sub.latency_s.size());
  std::vector<int> sub_stage(static_cast<std::size_t>(k));
  for (int a = 0; a < k; ++a) {
    sub_stage[static_cast<std::size_t>(a)] = stage_of[static_cast<std::size_t>(survivors[static_cast<std::size_t>(a)])];
    for (int b = 0; b < k; ++b) {
      const std::size_t at = static_cast<std::size_t>(a * k + b);
      sub.latency_s[at] = m.net.latency(survivors[static_cast<std::size_t>(a)], survivors[static_cast<std::size_t>(b)]);
      sub.bandwidth_Bps[at] = m.net.bandwidth(survivors[static_cast<std::size_t>(a)], survivors[static_cast<std::size_t>(b)]);
    }
  }
  // The survivors of a stage carry its micro-batches: each may take more agents than pipeline.memory
  // allowed before (TC1), so memory is raised, one at a time, to the least the plan needs.
  auto replan = [&]() {
    Result<skippipe::Plan> out = error(ErrorCode::kUnavailable, "not planned");
    skippipe::Options o = m.options;
    for (int mem = m.options.memory; mem <= 4 * m.options.memory + 4; ++mem) {
      o.memory = mem;
      out = m.mode == skippipe::Mode::kFull ? skippipe::plan_full(sub, m.costs, sub_stage, o) : skippipe::plan(sub, m.costs, sub_stage, o, m.mode);
      if (out.ok()) break;
    }
    return out;
  };
  if (!m.plan_key.empty()) {  // what is planned here: the survivors, with their stages
    m.plan_key += "\nwithout";
    for (int v : survivors) m.plan_key += " " + std::to_string(v) + ":" + std::to_string(stage_of[static_cast<std::size_t>(v)]);
  }
  Result<skippipe::Plan> planned = m.plan_key.empty() ? replan() : m.env.plans->get(m.plan_key, replan);
  if (!planned.ok()) return planned.status().with_context("rescheduling the pipeline without the lost nodes");
  skippipe::Schedule s = planned->schedule;
  if (m.config.pipeline.order == PipelineOrder::kTimetable && s.timetable.empty()) s.timetable = planned->simulation.timetable;
  if (m.config.pipeline.order == PipelineOrder::kArrival) s.timetable.clear();
  // Checked over the survivors (the lost nodes, still listed by their stage in the pipeline's
  // numbering, would count as origins that start nothing).
  if (Status st = skippipe::validate(s); !st.ok()) return st.with_context("the rescheduled pipeline");
  for (auto& a : s.agents) {  // back to the pipeline's node numbers
    a.origin = survivors[static_cast<std::size_t>(a.origin)];
    for (int& h : a.hops) h = survivors[static_cast<std::size_t>(h)];
  }
  s.stage_of = stage_of;
  m.alive = alive;
  for (int d : dead) {
    m.nodes[static_cast<std::size_t>(d)].reset();
    m.adam[static_cast<std::size_t>(d)].reset();
  }
  m.local.erase(std::remove_if(m.local.begin(), m.local.end(), [&](int v) { return !alive[static_cast<std::size_t>(v)]; }), m.local.end());
  m.plan.predicted_makespan_s = planned->predicted_makespan_s;
  m.plan.simulation = planned->simulation;
  m.plan.schedule = std::move(s);
  m.options.memory = planned->schedule.options.memory;  // (raised as far as the survivors needed)
  m.lost += static_cast<std::int64_t>(dead.size());
  ++m.epoch;  // fresh links: nothing of the failed iteration reaches the next
  std::string names;
  for (int d : dead) names += (names.empty() ? "" : ", ") + std::to_string(d);
  spdlog::warn("pipeline rescheduled without node(s) {}: {} nodes left, {} micro-batches an iteration{}", names, survivors.size(), m.plan.schedule.microbatches(),
               m.options.memory > m.config.pipeline.memory ? ", memory raised to " + std::to_string(m.options.memory) : "");
  return m.arrange();
}

std::int64_t PipelineTrainer::lost_nodes() const { return impl_->lost; }

bool PipelineTrainer::can_evaluate() const {
  for (int stage = 0; stage < impl_->config.pipeline.stages; ++stage) {
    if (impl_->representative(stage) < 0) return false;
  }
  return true;
}

const skippipe::Plan& PipelineTrainer::plan() const { return impl_->plan; }
std::vector<std::vector<at::Tensor>> PipelineTrainer::stage_replicas(int stage) const {
  std::vector<std::vector<at::Tensor>> out;
  const auto it = impl_->replicas.find(stage);
  if (it == impl_->replicas.end()) return out;
  for (int v : it->second) {
    if (impl_->nodes[static_cast<std::size_t>(v)]) out.push_back(impl_->nodes[static_cast<std::size_t>(v)]->stage_parameters());
  }
  return out;
}
std::int64_t PipelineTrainer::iterations_done() const { return impl_->done; }
std::int64_t PipelineTrainer::samples_per_iteration() const {
  return impl_->plan.schedule.microbatches() * impl_->config.train.batch_size;
}

}  // namespace gossamer::train
