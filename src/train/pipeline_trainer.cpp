#include "train/pipeline_trainer.h"

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

}  // namespace

Result<skippipe::Mode> pipeline_mode(const std::string& name) {
  if (name == "full") return skippipe::Mode::kFull;
  if (name == "random") return skippipe::Mode::kCostBlind;
  if (name == "noca") return skippipe::Mode::kNoCollision;
  if (name == "skippipe") return skippipe::Mode::kSkipPipe;
  return error(ErrorCode::kInvalidArgument, "pipeline.mode '" + name + "': use full, random, noca or skippipe");
}

std::size_t hop_bytes(const RunConfig& c) {
  quant::EncodeOptions codec;
  if (auto id = quant::codec_from_name(c.pipeline.activation_codec); id.ok()) codec.codec = *id;
  codec.block_size = static_cast<std::uint32_t>(c.outer.codec_block);
  return encode_activation(ActivationHeader{}, torch::zeros({c.train.batch_size, c.model.context, c.model.width}), codec).size();
}

double measure_stage_forward_s(const RunConfig& c, int runs) {
  model::Gpt model(gpt_config(c, 0));
  model.train(false);
  torch::NoGradGuard no_grad;
  const std::int64_t per = std::max<std::int64_t>(1, c.model.layers / std::max<std::int64_t>(1, c.pipeline.stages));
  const auto x = torch::randn({c.train.batch_size, c.model.context, c.model.width});
  std::vector<double> times;
  for (int k = 0; k <= runs; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    auto y = x;
    for (std::int64_t i = 0; i < per; ++i) y = model.block(i, y);
    (void)y.sum().item<float>();
    if (k > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());  // the first warms up
  }
  std::sort(times.begin(), times.end());
  return times.empty() ? 0.0 : times[times.size() / 2];
}

Status check_pipeline_shape(const RunConfig& c) {
  const auto& p = c.pipeline;
  if (c.model.kind != "gpt") return error(ErrorCode::kInvalidArgument, "pipelines cut the built-in GPT into stages: set model.kind = gpt");
  if (c.train.optimizer != "adamw") {
    return error(ErrorCode::kInvalidArgument, "a pipeline's stages train with AdamW: train.optimizer = " + c.train.optimizer + " is for data-parallel runs; drop it");
  }
  if (c.model.layers % p.stages != 0) {
    return error(ErrorCode::kInvalidArgument,
                 fmt::format("model.layers ({}) must be divisible by pipeline.stages ({}), each stage holding as many layers: set model.layers to a "
                             "multiple of {} (--set model.layers={}) or pipeline.stages to a divisor of {}",
                             c.model.layers, p.stages, p.stages, p.stages * ((c.model.layers + p.stages - 1) / p.stages), c.model.layers));
  }
  if (p.path_length > p.stages) {
    return error(ErrorCode::kInvalidArgument, fmt::format("pipeline.path_length ({}) must be at most pipeline.stages ({})", p.path_length, p.stages));
  }
  return Status();
}

Status check_network_in_one_process(const RunConfig& c) {
  if (c.pipeline.network != "measured") return Status();
  return error(ErrorCode::kInvalidArgument, "pipeline.network = measured plans on the links the nodes measure between their processes: run it with "
                                            "--node (a process per node) or over gossamer peer; one process and the simulator have none to measure, "
                                            "so give them geo, geo-fixed or uniform (--set pipeline.network=geo)");
}

skippipe::Network pipeline_network(const RunConfig& c) {
  const int n = static_cast<int>(c.pipeline.nodes);
  if (c.pipeline.network == "geo" || c.pipeline.network == "geo-fixed") return skippipe::geo_network(n, c.pipeline.network == "geo-fixed");
  return skippipe::uniform_network(n, 0.05, 1e9 / 8);
}

skippipe::Costs pipeline_costs(const RunConfig& c) {
  skippipe::Costs costs;
  costs.forward_s = c.pipeline.forward_s;
  costs.activation_bytes = c.pipeline.activation_mib * 1024 * 1024;
  return costs;
}

namespace {

// Per stage: the micro-batches of one iteration of `s` that visit it (stage 0: every one).
std::vector<double> schedule_stage_visits(const skippipe::Schedule& s) {
  std::vector<double> visits(static_cast<std::size_t>(s.options.stages), 0.0);
  for (const auto& agent : s.agents) {
    visits[0] += agent.microbatches;
    for (int node : agent.hops) visits[static_cast<std::size_t>(s.stage_of[static_cast<std::size_t>(node)])] += agent.microbatches;
  }
  return visits;
}

}  // namespace

struct PipelineTrainer::Impl {
  RunConfig config;
  PipelineEnvironment env;
  const data::Dataset* data = nullptr;
  skippipe::Plan plan;
  // What the plan is made of, kept for rescheduling around lost nodes.
  skippipe::Options options;
  skippipe::Mode mode = skippipe::Mode::kSkipPipe;
  skippipe::Network net;
  skippipe::Costs costs;
  PipelineNodeOptions node_options;
  std::optional<optim::OuterConfig> outer_config;
  std::vector<bool> alive;     // per node
  int epoch = 0;               // links of epoch e are channels 2e (activations) and 2e + 1 (stage sync)
  std::int64_t lost = 0;       // nodes the pipeline went on without
  std::vector<std::unique_ptr<PipelineNode>> nodes;         // per node; null for those another process hosts
  std::vector<std::unique_ptr<torch::optim::AdamW>> adam;   // the same
  std::vector<int> local;                                   // the nodes hosted here, in order
  std::map<int, std::vector<int>> replicas;   // stage -> its nodes that take part (a micro-batch visits them)
  std::vector<optim::OuterSetup> outer;       // per node, with stage_sync = diloco (empty for idle nodes)
  bool ddp = true;
  std::map<int, std::vector<optim::Group>> groups;  // stage -> a group per replica
  std::vector<int> origins;                   // stage-0 nodes in order
  std::vector<std::unique_ptr<data::ShardSampler>> samplers;  // per origin
  std::vector<data::Batch> eval_set;
  std::int64_t done = 0;
  std::int64_t samples = 0;
  // Per stage: micro-batches of the iterations done that visited it (stage 0: all of them).
  std::vector<double> stage_visits;
  // An iteration whose commit failed: its record so far (losses, learning rate) and when it began.
  struct Pending {
    PipelineRecord rec;
    std::chrono::steady_clock::time_point start;
    Nanos t0{0};
  };
  std::optional<Pending> pending;

  // The node hosted here whose weights stand for `stage`: its first replica that takes part, or (a
  // stage no micro-batch visits) any node hosting it, which holds the initial weights; -1: none here.
  int representative(int stage) const {
    if (const auto it = replicas.find(stage); it != replicas.end()) {
      for (int v : it->second) {
        if (nodes[static_cast<std::size_t>(v)]) return v;
      }
    }
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      if (nodes[v] && nodes[v]->stage() == stage) return static_cast<int>(v);
    }
    return -1;
  }

  // Nodes, links, stage groups and outer optimizers for plan.schedule and the current epoch: made
  // the first time, rearranged after a reschedule (weights and AdamW state kept).
  Status arrange() {
    const skippipe::Schedule& s = plan.schedule;
    const int n = static_cast<int>(s.stage_of.size());
    replicas.clear();
    groups.clear();
    const std::vector<int> visits = node_visits(s);
    for (int v = 0; v < n; ++v) {
      if (alive[static_cast<std::size_t>(v)] && visits[static_cast<std::size_t>(v)] > 0) replicas[s.stage_of[static_cast<std::size_t>(v)]].push_back(v);
    }
    for (int v : local) {
      std::vector<std::shared_ptr<transport::Link>> links(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) {
        if (j != v && alive[static_cast<std::size_t>(j)]) links[static_cast<std::size_t>(j)] = env.link(v, j, 2 * epoch);
      }
      auto& node = nodes[static_cast<std::size_t>(v)];
      if (node) {
        node->reschedule(s, std::move(links));
        continue;
      }
      node = std::make_unique<PipelineNode>(v, s, model::Gpt(gpt_config(config, 0)), std::move(links), node_options);
      auto opts = torch::optim::AdamWOptions(config.train.lr)
                      .betas(std::make_tuple(config.train.beta1, config.train.beta2))
                      .eps(config.train.eps)
                      .weight_decay(config.train.weight_decay);
      adam[static_cast<std::size_t>(v)] = std::make_unique<torch::optim::AdamW>(node->stage_parameters(), opts);
    }
    for (const auto& [stage, members] : replicas) {
      groups[stage].resize(members.size());
      for (std::size_t r = 0; r < members.size(); ++r) {
        if (!nodes[static_cast<std::size_t>(members[r])]) continue;  // another process's
        optim::Group grp;
        grp.rank = static_cast<int>(r);
        grp.size = static_cast<int>(members.size());
        grp.clock = env.clock;
        grp.peers.resize(members.size());
        for (std::size_t k = 0; k < members.size(); ++k) {
          if (k != r) grp.peers[k] = env.link(members[r], members[k], 2 * epoch + 1);
        }
        groups[stage][r] = std::move(grp);
      }
    }
    if (!ddp) {
      // A new group is a new outer optimizer: after a reschedule its outer state starts afresh.
      outer.clear();
      outer.resize(static_cast<std::size_t>(n));
      for (const auto& [stage, members] : replicas) {
        for (std::size_t r = 0; r < members.size(); ++r) {
          const int v = members[r];
          if (!nodes[static_cast<std::size_t>(v)]) continue;
          auto setup = optim::make_outer_optimizer(*outer_config, nodes[static_cast<std::size_t>(v)]->stage_param_blocks(), groups[stage][r]);
          if (!setup.ok()) return setup.status().with_context("stage " + std::to_string(stage) + "'s " + config.pipeline.stage_sync);
          outer[static_cast<std::size_t>(v)] = std::move(*setup);
        }
      }
    }
    return Status();
  }
};

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
  auto mode = pipeline_mode(p.mode);
  if (!mode.ok()) return mode.status();
  auto codec_id = quant::codec_from_name(p.activation_codec);
  if (!codec_id.ok()) return codec_id.status();
  skippipe::Options o;
  o.stages = static_cast<int>(p.stages);
  o.path_length = static_cast<int>(p.path_length);
  o.memory = static_cast<int>(p.memory);
  o.mbs_per_origin = static_cast<int>(p.mbs_per_origin);
  o.mbs_per_agent = static_cast<int>(p.mbs_per_agent);
  o.seed = static_cast<std::uint64_t>(c.train.seed);
  if (Status st = o.check(); !st.ok()) return st;
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
  skippipe::GcmaOptions g;
  g.trials = static_cast<int>(p.gcma_trials);
  g.seed = static_cast<std::uint64_t>(c.train.seed);
  auto stage_of = skippipe::assign_gcma(net, costs, o, g);
  if (!stage_of.ok()) return stage_of.status();
  auto planned = skippipe::plan(net, costs, *stage_of, o, *mode);
  if (!planned.ok()) return planned.status().with_context("planning the pipeline");
  impl->plan = std::move(*planned);
  // Every mode's nodes follow the planned iteration's timetable (pipeline.order), which the
  // skippipe mode's schedule already carries; the others get their simulation's.
  if (p.order == "timetable" && impl->plan.schedule.timetable.empty()) impl->plan.schedule.timetable = impl->plan.simulation.timetable;
  if (p.order == "arrival") impl->plan.schedule.timetable.clear();
  const skippipe::Schedule& s = impl->plan.schedule;

  quant::EncodeOptions codec;
  codec.codec = *codec_id;
  codec.block_size = static_cast<std::uint32_t>(c.outer.codec_block);
  impl->node_options.codec = codec;
  impl->node_options.max_batch = c.train.batch_size;
  impl->node_options.clock = env.clock;
  impl->node_options.compute = env.compute;
  impl->options = o;
  impl->mode = *mode;
  impl->net = net;
  impl->costs = costs;
  if (env.local.empty()) {
    for (int v = 0; v < n; ++v) env.local.push_back(v);
  }
  for (int v : env.local) {
    if (v < 0 || v >= n) return error(ErrorCode::kInvalidArgument, "no pipeline node " + std::to_string(v) + " to host (pipeline.nodes = " + std::to_string(n) + ")");
  }
  std::sort(env.local.begin(), env.local.end());
  env.local.erase(std::unique(env.local.begin(), env.local.end()), env.local.end());
  impl->local = env.local;
  impl->env.local = env.local;
  impl->nodes.resize(static_cast<std::size_t>(n));
  impl->adam.resize(static_cast<std::size_t>(n));
  impl->alive.assign(static_cast<std::size_t>(n), true);
  for (int v = 0; v < n; ++v) {
    if (s.stage_of[static_cast<std::size_t>(v)] == 0) impl->origins.push_back(v);
  }
  impl->ddp = p.stage_sync == "ddp";
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

Result<PipelineRecord> PipelineTrainer::step(const std::function<Status()>& commit) {
  auto& m = *impl_;
  const auto& c = m.config;
  const auto start = std::chrono::steady_clock::now();
  m.pending.reset();  // an iteration not applied is dropped: this one starts from the same weights
  const std::uint64_t iteration = static_cast<std::uint64_t>(m.done) + 1;
  // Each origin's micro-batches, as many as the schedule starts there (the full pipeline's origins
  // carry more than mbs_per_origin, its idle stage-0 nodes none), drawn from the origin's shard.
  std::map<int, std::vector<MicroBatchData>> data;
  std::map<int, std::int64_t> launches;
  for (const auto& a : m.plan.schedule.agents) launches[a.origin] += a.microbatches;
  for (std::size_t r = 0; r < m.origins.size(); ++r) {
    if (!m.nodes[static_cast<std::size_t>(m.origins[r])]) continue;  // another process's
    const std::int64_t count = launches[m.origins[r]];
    for (std::int64_t k = 0; k < count; ++k) {
      const auto b = m.samplers[r]->batch(m.done * count + k);
      data[m.origins[r]].push_back(MicroBatchData{b.tokens, b.targets});
    }
  }
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
  const std::size_t n = m.nodes.size();
  std::vector<Result<IterationStats>> results(n, error(ErrorCode::kInternal, "not run"));
  std::vector<Status> synced(n);
  std::vector<std::uint64_t> sync_bytes(n, 0);
  std::vector<std::int64_t> rounds(n, 0);
  ScheduleOptions so;
  so.lr = c.train.lr;
  so.min_lr_ratio = c.train.min_lr_ratio;
  so.warmup_steps = c.train.warmup_steps;
  so.total_steps = c.train.steps;
  const double lr = learning_rate(so, m.done);
  {
    std::vector<std::unique_ptr<ClockThread>> threads;
    for (int local : m.local) {
      const auto v = static_cast<std::size_t>(local);
      threads.push_back(clock.start_thread([&, v] {
        const auto it = data.find(static_cast<int>(v));
        PipelineNode& node = *m.nodes[v];
        results[v] = node.run_iteration(iteration, it == data.end() ? std::vector<MicroBatchData>{} : it->second, deadline);
        if (!results[v].ok()) {
          // Its stage's replicas would wait for it in their sync: they learn at once instead.
          if (const auto r = m.replicas.find(node.stage()); r != m.replicas.end()) {
            const auto rank = static_cast<std::size_t>(std::find(r->second.begin(), r->second.end(), static_cast<int>(v)) - r->second.begin());
            if (rank < r->second.size()) {
              for (const auto& l : m.groups.at(node.stage())[rank].peers) {
                if (l) l->close();
              }
            }
          }
          return;
        }
        if (node.visits() == 0) return;
        if (m.ddp) {
          // The stage's replicas: this node's rank among them.
          const int stage = node.stage();
          const auto& members = m.replicas.at(stage);
          const auto rank = static_cast<std::size_t>(std::find(members.begin(), members.end(), static_cast<int>(v)) - members.begin());
          optim::CommStats cs;
          synced[v] = node.sync_stage(m.groups.at(stage)[rank], iteration, sync_deadline, &cs);
          sync_bytes[v] = cs.bytes_sent;
          return;
        }
        // Its own step on its own micro-batches' mean gradient, then the stage's outer round when due.
        const auto& params = node.stage_parameters();
        for (const auto& p : params) {
          if (p.grad().defined()) p.mutable_grad().div_(static_cast<double>(node.visits()));
        }
        torch::nn::utils::clip_grad_norm_(params, c.train.grad_clip);
        for (auto& group : m.adam[v]->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
        m.adam[v]->step();
        auto& outer = *m.outer[v].outer;
        const std::uint64_t before = outer.comm().bytes_sent;
        auto stepped = outer.step(static_cast<std::int64_t>(iteration), sync_deadline);
        if (!stepped.ok()) {
          synced[v] = stepped.status();
          return;
        }
        rounds[v] = *stepped ? 1 : 0;
        sync_bytes[v] = outer.comm().bytes_sent - before;
      }));
    }
    for (auto& t : threads) t->join();
  }
  PipelineRecord rec;
  double loss_sum = 0;
  int losses = 0;
  // The first failure that is not another's consequence (a peer gone, a deadline) names the cause.
  for (int v : m.local) {
    const auto& r = results[static_cast<std::size_t>(v)];
    if (!r.ok() && r.status().code() != ErrorCode::kPeerLost && r.status().code() != ErrorCode::kTimeout) {
      return r.status().with_context("pipeline node " + std::to_string(v));
    }
  }
  // Per node, indexed by node (zero for the nodes another process hosts).
  rec.node_busy_s.assign(n, 0.0);
  rec.node_peak_inflight.assign(n, 0);
  rec.node_bytes_sent.assign(n, 0);
  rec.timeline.resize(n);
  for (int local : m.local) {
    const auto v = static_cast<std::size_t>(local);
    if (!results[v].ok()) return results[v].status().with_context("pipeline node " + std::to_string(v));
    if (!synced[v].ok()) return synced[v];
    for (double l : results[v]->losses) {
      loss_sum += l;
      ++losses;
    }
    rec.activation_bytes += results[v]->bytes_sent;
    rec.makespan_s = std::max(rec.makespan_s, results[v]->finished_s);
    rec.node_busy_s[v] = results[v]->busy_s;
    rec.node_peak_inflight[v] = results[v]->peak_inflight;
    rec.node_bytes_sent[v] = results[v]->bytes_sent;
    rec.timeline[v] = std::move(results[v]->work);
    rec.sync_bytes += sync_bytes[v];
    rec.sync_rounds += rounds[v];
  }
  rec.train_loss = losses > 0 ? loss_sum / losses : 0;
  rec.losses = losses;
  rec.lr = lr;
  m.pending = Impl::Pending{std::move(rec), start, t0};
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
  return rec;
}

double PipelineTrainer::evaluate(const std::vector<int>& omitted) { return evaluate_with(stage_weights(), depth_scales(omitted), omitted); }

std::map<int, std::vector<at::Tensor>> PipelineTrainer::stage_weights() const {
  const auto& m = *impl_;
  std::map<int, std::vector<at::Tensor>> stages;
  for (int stage = 0; stage < m.config.pipeline.stages; ++stage) {
    // (With stage_sync = diloco: its live weights, the same on every replica just after a round.)
    const int rep = m.representative(stage);
    GOSSAMER_CHECK(rep >= 0, "PipelineTrainer::evaluate: stage " + std::to_string(stage) + " has no node in this process");
    stages[stage] = m.nodes[static_cast<std::size_t>(rep)]->stage_parameters();
  }
  return stages;
}

std::vector<double> PipelineTrainer::depth_scales(const std::vector<int>& omitted) const {
  if (!impl_->config.pipeline.depth_scaling) return {};
  const std::vector<double> shares = stage_shares();
  // A trained path adds `expected` stages' updates to the residual stream (L - 1 at balance); the
  // stages kept add as much, in proportion to their shares, none more than its whole update.
  double expected = 0, kept = 0;
  for (std::size_t st = 1; st < shares.size(); ++st) {
    expected += shares[st];
    if (std::find(omitted.begin(), omitted.end(), static_cast<int>(st)) == omitted.end()) kept += shares[st];
  }
  std::vector<double> scales(shares.size(), 1.0);
  for (std::size_t st = 1; st < shares.size() && kept > 0; ++st) scales[st] = std::min(1.0, shares[st] * expected / kept);
  return scales;
}

model::Gpt PipelineTrainer::assemble(const std::map<int, std::vector<at::Tensor>>& stages, const std::vector<double>& scales) const {
  const auto& m = *impl_;
  model::Gpt model(gpt_config(m.config, 0));
  // The stages' parameters, into the whole model in block order.
  std::map<int, std::size_t> taken;
  torch::NoGradGuard no_grad;
  const std::int64_t per = m.config.model.layers / m.config.pipeline.stages;
  for (const auto& block : model.blocks()) {
    int stage = 0;
    if (block.name != "embed" && block.name != "final") stage = static_cast<int>(std::stoll(block.name.substr(6)) / per);
    const auto it = stages.find(stage);
    GOSSAMER_CHECK(it != stages.end(), "PipelineTrainer::assemble: no parameters for stage " + std::to_string(stage));
    for (const auto& p : block.parameters) {
      const std::size_t k = taken[stage]++;
      GOSSAMER_CHECK(k < it->second.size() && it->second[k].sizes() == p.tensor.sizes(), "PipelineTrainer::assemble: stage " + std::to_string(stage) + "'s parameters do not fit");
      p.tensor.copy_(it->second[k]);
    }
  }
  GOSSAMER_CHECK(scales.empty() || static_cast<std::int64_t>(scales.size()) == m.config.pipeline.stages, "PipelineTrainer::assemble: a scale per stage");
  for (std::int64_t i = 0; i < m.config.model.layers && !scales.empty(); ++i) {
    const double scale = scales[static_cast<std::size_t>(i / per)];
    if (scale != 1) model.scale_residual_branches(i, scale);
  }
  model.train(false);
  return model;
}

double PipelineTrainer::evaluate_with(const std::map<int, std::vector<at::Tensor>>& stages, const std::vector<double>& scales,
                                      const std::vector<int>& omitted) const {
  const auto& m = *impl_;
  model::Gpt model = assemble(stages, scales);
  torch::NoGradGuard no_grad;
  const std::int64_t per = m.config.model.layers / m.config.pipeline.stages;
  double total = 0;
  std::int64_t count = 0;
  for (const auto& b : m.eval_set) {
    auto x = model.embed(b.tokens);
    for (std::int64_t s = 0; s < m.config.pipeline.stages; ++s) {
      if (s > 0 && std::find(omitted.begin(), omitted.end(), static_cast<int>(s)) != omitted.end()) continue;
      for (std::int64_t i = s * per; i < (s + 1) * per; ++i) x = model.block(i, x);
    }
    const auto logits = model.head(x);
    total += torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), b.targets.reshape({-1})).item<double>() * static_cast<double>(b.tokens.numel());
    count += b.tokens.numel();
  }
  return count > 0 ? total / static_cast<double>(count) : 0;
}

std::vector<double> PipelineTrainer::stage_shares() const {
  const auto& m = *impl_;
  const std::vector<double> visits = m.done > 0 ? m.stage_visits : schedule_stage_visits(m.plan.schedule);
  std::vector<double> shares(visits.size(), 1.0);
  for (std::size_t st = 1; st < visits.size(); ++st) shares[st] = visits[0] > 0 ? std::min(1.0, visits[st] / visits[0]) : 1.0;
  return shares;
}

std::vector<int> default_omitted_stages(std::int64_t stages) {
  std::vector<int> out;
  for (std::int64_t s = std::max<std::int64_t>(1, stages / 2); s < stages; ++s) out.push_back(static_cast<int>(s));
  return out;
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
  Result<skippipe::Plan> planned = error(ErrorCode::kUnavailable, "not planned");
  skippipe::Options o = m.options;
  for (int mem = m.options.memory; mem <= 4 * m.options.memory + 4; ++mem) {
    o.memory = mem;
    planned = m.mode == skippipe::Mode::kFull ? skippipe::plan_full(sub, m.costs, sub_stage, o) : skippipe::plan(sub, m.costs, sub_stage, o, m.mode);
    if (planned.ok()) break;
  }
  if (!planned.ok()) return planned.status().with_context("rescheduling the pipeline without the lost nodes");
  skippipe::Schedule s = planned->schedule;
  if (m.config.pipeline.order == "timetable" && s.timetable.empty()) s.timetable = planned->simulation.timetable;
  if (m.config.pipeline.order == "arrival") s.timetable.clear();
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
  m.options.memory = o.memory;
  m.lost += static_cast<std::int64_t>(dead.size());
  ++m.epoch;  // fresh links: nothing of the failed iteration reaches the next
  std::string names;
  for (int d : dead) names += (names.empty() ? "" : ", ") + std::to_string(d);
  spdlog::warn("pipeline rescheduled without node(s) {}: {} nodes left, {} micro-batches an iteration{}", names, survivors.size(), m.plan.schedule.microbatches(),
               o.memory > m.config.pipeline.memory ? ", memory raised to " + std::to_string(o.memory) : "");
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
