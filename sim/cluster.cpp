#include "sim/cluster.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <optional>
#include <random>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "optim/flat_params.h"
#include "runtime/peer_runtime.h"
#include "runtime/state_store.h"
#include "sim/gossip_fabric.h"
#include "sim/transport_fabric.h"
#include "train/speeds.h"
#include "train/worker.h"

namespace gossamer::sim {

namespace {

// Independent workers (outer.method = "local"): no peers, no network traffic, each on its own shard.
Result<ClusterResult> run_local(const train::RunConfig& config, const optim::OuterConfig& outer_config, const train::Corpus& corpus,
                                const ClusterProgress& progress) {
  const int m = static_cast<int>(config.sim.workers);
  Stopwatch wall(real_clock());
  Scheduler scheduler;
  ClusterResult result;
  result.accounts.resize(static_cast<std::size_t>(m));
  result.final_params.resize(static_cast<std::size_t>(m));
  result.shared_digests.resize(static_cast<std::size_t>(m));
  result.crashed.assign(static_cast<std::size_t>(m), false);
  result.started_s.assign(static_cast<std::size_t>(m), 0.0);
  Status failure;
  double compute_wall = 0;
  std::vector<std::unique_ptr<ClockThread>> threads;
  for (int r = 0; r < m; ++r) {
    threads.push_back(scheduler.start_thread([&, r] {
      train::Worker worker(config, corpus.dataset, r, m, scheduler);
      if (r == 0) result.parameters = worker.model().num_parameters();
      optim::Group alone;
      alone.clock = &scheduler;
      alone.peers.resize(1);
      auto setup = optim::make_outer_optimizer(outer_config, train::param_blocks(worker.model()), std::move(alone));
      if (!setup.ok()) {
        failure = setup.status();
        return;
      }
      train::LoopOptions lo;
      lo.steps = config.train.steps;
      lo.eval_every = config.train.eval_every;
      lo.evaluate = r == 0;
      lo.round_timeout = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(config.train.round_timeout_s));
      train::LoopHooks hooks;
      lo.budget_period = train::budget_period(config);
      const double slow = 1.0 / train::worker_speeds(config)[static_cast<std::size_t>(r)];
      hooks.pace = [&, slow](double measured) {
        const double s = step_seconds(config, worker.model().num_parameters(), measured) * slow;
        scheduler.sleep_for(std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(s)));
        return s;
      };
      hooks.keep_going = [&, r](std::int64_t next) {
        if (progress) progress(r, next - 1, config.train.steps);
        return true;
      };
      hooks.record = [&, r](const nlohmann::json& rec) {
        nlohmann::json out = rec;
        out["worker"] = r;
        result.records.push_back(std::move(out));
      };
      auto account = train::run_worker_loop(worker, *setup, scheduler, lo, hooks);
      if (!account.ok()) {
        if (failure.ok()) failure = account.status().with_context("worker " + std::to_string(r));
        return;
      }
      result.accounts[static_cast<std::size_t>(r)] = *account;
      result.final_params[static_cast<std::size_t>(r)] = optim::flatten(worker.model().parameters());
      compute_wall += account->step_wall_s + account->eval_wall_s;
      if (progress) progress(r, worker.steps_done(), config.train.steps);
    }));
  }
  Status ran = scheduler.run();
  scheduler.stop();
  threads.clear();
  if (!ran.ok()) return ran;
  if (!failure.ok()) return failure;
  result.sim_time_s = std::chrono::duration<double>(scheduler.now()).count();
  result.wall_s = wall.elapsed_seconds();
  result.compute_wall_s = compute_wall;
  return result;
}

}  // namespace

namespace {

// Worker r's host: 198.18.0.0/15 is set aside for benchmarks, so a simulated address is never a real one.
std::string host_of(int r) { return "198.18." + std::to_string(r / 250) + "." + std::to_string(r % 250 + 1); }
std::string gossip_address(int r) { return "tcp://" + host_of(r) + ":7000"; }
std::string link_address(int r) { return host_of(r) + ":7001"; }

// Adds what one life of a worker did to what its earlier lives did (a worker that churns restarts).
void add_life(train::WorkerAccount& total, const train::WorkerAccount& life) {
  total.steps = life.steps;
  total.tokens += life.tokens;
  total.computed_steps += life.computed_steps;
  total.merged_tokens += life.merged_tokens;
  total.late_tokens_carried += life.late_tokens_carried;
  total.late_tokens_lost += life.late_tokens_lost;
  total.computed_tokens += life.computed_tokens;
  total.loop_s += life.loop_s;
  total.rounds += life.rounds;
  total.skipped_rounds += life.skipped_rounds;
  total.bytes_sent += life.bytes_sent;
  total.bytes_received += life.bytes_received;
  total.state_bytes_sent += life.state_bytes_sent;
  total.state_bytes_received += life.state_bytes_received;
  total.gossip_bytes_sent += life.gossip_bytes_sent;
  total.gossip_bytes_received += life.gossip_bytes_received;
  total.membership_bytes_sent += life.membership_bytes_sent;
  total.left_out += life.left_out;
  total.compute_s += life.compute_s;
  total.blocked_s += life.blocked_s;
  total.eval_wall_s += life.eval_wall_s;
  total.step_wall_s += life.step_wall_s;
}

// The simulated peers of one run: each worker is a real Peer (runtime/peer_runtime.h) on the virtual
// clock, the emulated network and fabrics for gossip and links; the scenario decides when a worker
// starts, dies and restarts.
class PeerCluster {
 public:
  PeerCluster(const train::RunConfig& config, const train::Corpus& corpus, const ClusterProgress& progress, const NetworkSpec& spec)
      : config_(config),
        progress_(progress),
        m_(static_cast<int>(config.sim.workers)),
        net_(scheduler_, spec),
        gossip_fabric_(scheduler_, net_),
        link_fabric_(scheduler_, net_),
        toml_(train::to_toml(config)),
        corpus_(&corpus, [](const train::Corpus*) {}),  // not owned
        joiner_(static_cast<int>(config.sim.join_worker)),
        reached_(scheduler_.make_signal()),
        saved_(static_cast<std::size_t>(m_)),
        churn_(static_cast<std::size_t>(m_)),
        downtime_(static_cast<std::size_t>(m_)),
        killed_(static_cast<std::size_t>(m_)) {
    for (int r = 0; r < m_; ++r) stores_.push_back(runtime::make_memory_store());
    result_.accounts.resize(static_cast<std::size_t>(m_));
    result_.final_params.resize(static_cast<std::size_t>(m_));
    result_.shared_digests.resize(static_cast<std::size_t>(m_));
    result_.started_s.assign(static_cast<std::size_t>(m_), -1.0);
    for (int r = 0; r < m_; ++r) {
      failure_rng_.emplace_back(static_cast<std::uint64_t>(config.sim.seed) * 0xA24BAED4963EE407ull + static_cast<std::uint64_t>(r) + 29);
    }
    fail_at_.resize(static_cast<std::size_t>(m_));
    stall_at_.resize(static_cast<std::size_t>(m_));
    for (int r = 0; r < m_; ++r) stall_rng_.emplace_back(static_cast<std::uint64_t>(config.sim.seed) * 0x9FB21C651E98DF25ull + static_cast<std::uint64_t>(r) + 31);
    dropped_.assign(static_cast<std::size_t>(m_), false);
    while (m_ > 1 && (evaluator_ == config.sim.crash_worker || evaluator_ == joiner_)) ++evaluator_;
    if (evaluator_ >= m_) evaluator_ = 0;
    for (int r = 0; r < m_; ++r) {
      if (r != joiner_) {
        first_ = r;
        break;
      }
    }
    plan_churn();
  }

  Result<ClusterResult> run() {
    Stopwatch wall(real_clock());
    std::vector<std::unique_ptr<ClockThread>> threads;
    for (int r = 0; r < m_; ++r) threads.push_back(scheduler_.start_thread([this, r] { run_worker(r); }));
    {
      // The parameter count for the compute model, from one model like the workers'.
      train::Worker probe(config_, corpus_->dataset, 0, 1, scheduler_);
      result_.parameters = probe.model().num_parameters();
    }
    Status ran;
    try {
      ran = scheduler_.run();
    } catch (...) {
      scheduler_.stop();  // unwind the workers while what they use still exists
      throw;
    }
    scheduler_.stop();
    threads.clear();
    if (!ran.ok()) return ran;
    if (!failure_.ok()) return failure_;
    result_.sim_time_s = std::chrono::duration<double>(scheduler_.now()).count();
    result_.wall_s = wall.elapsed_seconds();
    result_.compute_wall_s = compute_wall_;
    for (int r = 0; r < m_; ++r) result_.crashed.push_back(net_.crashed(r) || dropped_[static_cast<std::size_t>(r)]);
    return std::move(result_);
  }

 private:
  double seconds_now() const { return std::chrono::duration<double>(scheduler_.now()).count(); }

  // Churn: each worker but the evaluator crashes in a 100-step block with probability
  // sim.churn_rate, at a step drawn uniformly in it (seeded per worker).
  void plan_churn() {
    if (config_.sim.churn_rate <= 0) return;
    for (int r = 0; r < m_; ++r) {
      if (r == evaluator_ || r == joiner_) continue;
      std::mt19937_64 rng(static_cast<std::uint64_t>(config_.sim.seed) * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(r) + 17);
      std::uniform_real_distribution<double> coin(0.0, 1.0);
      for (std::int64_t block = 0; block * 100 < config_.train.steps; ++block) {
        const bool crash = coin(rng) < config_.sim.churn_rate;
        const std::int64_t at = block * 100 + 2 + static_cast<std::int64_t>(rng() % 99);
        if (crash && at <= config_.train.steps) churn_[static_cast<std::size_t>(r)].push_back(at);
      }
    }
  }

  // The late joiner waits until a member reached sim.join_at_step; false: every member is gone first.
  bool wait_to_join(int r) {
    std::unique_lock lock(mu_);
    reached_->wait(lock, Deadline::never(), [&] { return furthest_ >= config_.sim.join_at_step || members_done_ == m_ - 1; });
    if (furthest_ < config_.sim.join_at_step) {
      spdlog::warn("sim: newcomer {} does not join: no member reached step {}", r, config_.sim.join_at_step);
      return false;
    }
    spdlog::info("sim: worker {} joins (t = {:.1f} s)", r, seconds_now());
    return true;
  }

  // Steady churn by time (sim.churn_per_minute): worker r, up since now, fails after an exponential
  // wait of mean 10 / rate minutes, drawn from its own seeded stream.
  void plan_timed_failure(int r) {
    if (config_.sim.churn_per_minute <= 0 || r == evaluator_ || r == joiner_) return;
    const double per_s = config_.sim.churn_per_minute / 10.0 / 60.0;
    std::exponential_distribution<double> wait(per_s);
    fail_at_[static_cast<std::size_t>(r)] = seconds_now() + wait(failure_rng_[static_cast<std::size_t>(r)]);
  }

  // Stalls (sim.stalls_per_minute): the seconds worker r stops for after its step now, 0 mostly. Each
  // worker's stalls come at exponential waits of mean 10 / rate minutes, from its own seeded stream.
  double stall(int r) {
    if (config_.sim.stalls_per_minute <= 0 || r == evaluator_) return 0.0;
    auto& due = stall_at_[static_cast<std::size_t>(r)];
    auto& rng = stall_rng_[static_cast<std::size_t>(r)];
    std::exponential_distribution<double> wait(config_.sim.stalls_per_minute / 10.0 / 60.0);
    const double now = seconds_now();
    if (!due) due = now + wait(rng);
    if (now < *due) return 0.0;
    due = now + config_.sim.stall_s + wait(rng);
    ++result_.stalls;
    spdlog::info("sim: worker {} stalls for {:.1f} s (t = {:.1f} s)", r, config_.sim.stall_s, now);
    return config_.sim.stall_s;
  }

  // False when worker r dies before step `next` (its links and gossip cut first).
  bool alive(int r, std::int64_t next) {
    if (progress_) progress_(r, next - 1, config_.train.steps);
    {
      std::lock_guard lock(mu_);
      if (next - 1 > furthest_) {
        furthest_ = next - 1;
        reached_->notify_all();
      }
    }
    if (joiner_ >= 0 && r != joiner_ && joiner_ == config_.sim.crash_worker && next - 1 >= config_.sim.crash_at_step) kill_newcomer();
    auto& churn = churn_[static_cast<std::size_t>(r)];
    const bool scripted = r == config_.sim.crash_worker && r != joiner_ && next == config_.sim.crash_at_step;
    bool churned = false;
    while (!churn.empty() && churn.front() <= next) {  // (a restart may land past a planned step)
      churned = churned || churn.front() == next;
      churn.erase(churn.begin());
    }
    auto& fail_at = fail_at_[static_cast<std::size_t>(r)];
    const bool timed = fail_at && next >= 2 && seconds_now() >= *fail_at;  // (not before the run's first step)
    if (timed) fail_at.reset();
    if (!scripted && !churned && !timed) return true;
    auto& downtime = downtime_[static_cast<std::size_t>(r)];
    downtime.reset();
    if (!scripted) downtime = config_.sim.churn_downtime_s;
    if (scripted && config_.sim.crash_restart_s >= 0) downtime = config_.sim.crash_restart_s;
    spdlog::info("sim: worker {} crashes before step {} (t = {:.1f} s)", r, next, seconds_now());
    gossip_fabric_.crash(gossip_address(r));
    net_.crash(r);
    return false;
  }

  // The newcomer is killed (sim.crash_worker = sim.join_worker) once the run reaches
  // sim.crash_at_step, wherever it is: typically with its state still on its way. Its links and
  // gossip are cut at once, as for any crash; it then stops at the next point it looks (its own
  // store of the state, like a disk, outlives it).
  void kill_newcomer() {
    bool expected = false;
    if (!newcomer_killed_.compare_exchange_strong(expected, true)) return;
    spdlog::info("sim: newcomer {} is killed (the run reached step {}, t = {:.1f} s)", joiner_, config_.sim.crash_at_step, seconds_now());
    kill(joiner_);
  }

  // The fault drill (sim.crash_mid_round): worker r dies inside a collective, a moment after its own
  // share of the average left for half the group (time for it to land, as a real peer's would). It
  // then stops where it looks next.
  void crash_mid_round(int r) {
    scheduler_.sleep_for(std::chrono::seconds(1));
    spdlog::info("sim: worker {} crashes inside round {}'s collective (t = {:.1f} s)", r, config_.sim.crash_mid_round, seconds_now());
    kill(r);
  }

  // Worker r's process dies wherever it is (sim.crash_restart_s brings it back): its links and
  // gossip are cut at once, and its peer stops at the next point it looks.
  void kill(int r) {
    downtime_[static_cast<std::size_t>(r)].reset();
    if (config_.sim.crash_restart_s >= 0) downtime_[static_cast<std::size_t>(r)] = config_.sim.crash_restart_s;
    gossip_fabric_.crash(gossip_address(r));
    net_.crash(r);
    killed_[static_cast<std::size_t>(r)] = true;
  }

  // Worker r's host: the virtual clock, its gossip, links from the fabric, its speed and stalls as its
  // pace, its access link's goodput.
  class WorkerHost final : public runtime::Host {
   public:
    WorkerHost(PeerCluster& cluster, int r, transport::Gossip& gossip)
        : c_(cluster), r_(r), gossip_(gossip), slow_(1.0 / train::worker_speeds(cluster.config_)[static_cast<std::size_t>(r)]) {
      if (auto spec = network_spec(c_.config_); spec.ok() && static_cast<std::size_t>(r) < spec->nodes.size()) {
        const double goodput = spec->nodes[static_cast<std::size_t>(r)].link.goodput_bytes_per_s();
        if (std::isfinite(goodput)) link_bytes_per_s_ = goodput;
      }
    }
    Clock& clock() override { return c_.scheduler_; }
    transport::Gossip& gossip() override { return gossip_; }
    std::string gossip_announced() const override { return host_of(r_) + ":7000"; }
    Result<runtime::OpenedLinks> open_links(const Digest&) override {
      auto t = c_.link_fabric_.make(r_, link_address(r_), gossip_.self());
      if (!t.ok()) return t.status();
      runtime::OpenedLinks out;
      out.transport = std::move(*t);
      out.announced = out.bound = link_address(r_);
      return out;
    }
    std::optional<Result<transport::Reachability>> check_reachable(const std::vector<std::string>&, const std::atomic<bool>*) override {
      return std::nullopt;  // every worker reaches every other
    }
    double pace(double measured_s) override {
      const double s = step_seconds(c_.config_, c_.result_.parameters, measured_s) * slow_;
      c_.scheduler_.sleep_for(std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(s + c_.stall(r_))));
      return s;  // (a stall is not compute)
    }
    std::optional<double> link_bytes_per_s() const override { return link_bytes_per_s_; }

   private:
    PeerCluster& c_;
    const int r_;
    transport::Gossip& gossip_;
    const double slow_;  // its steps take this many times a step at full speed (sim.speeds, its straggler)
    std::optional<double> link_bytes_per_s_;
  };

  // Worker r's store: its records into the result (as the worker's), its checkpoints (where it may
  // restart) kept for its next life, its arriving state in memory that outlives a crash.
  class WorkerStore final : public runtime::MemoryRunStore {
   public:
    WorkerStore(PeerCluster& cluster, int r, bool keep_checkpoints)
        : MemoryRunStore(keep_checkpoints, cluster.stores_[static_cast<std::size_t>(r)]), c_(cluster), r_(r) {}
    Status record(const nlohmann::json& rec) override {
      nlohmann::json out = rec;
      out.erase("peer");
      out["worker"] = r_;
      c_.result_.records.push_back(std::move(out));
      return Status();
    }
    Status save_checkpoint(const train::CheckpointState& cs) override {
      c_.saved_[static_cast<std::size_t>(r_)] = cs;
      return Status();
    }

   private:
    PeerCluster& c_;
    const int r_;
  };

  runtime::PeerEnvironment environment(int r, runtime::Host& host) {
    runtime::PeerEnvironment env;
    env.host = &host;
    env.name = std::to_string(r);
    env.evaluate = r == evaluator_;
    env.set_threads = false;
    env.corpus = [this](const train::RunConfig&) -> Result<std::shared_ptr<const train::Corpus>> { return corpus_; };
    const bool restarts = config_.sim.churn_rate > 0 || config_.sim.churn_per_minute > 0 || (r == config_.sim.crash_worker && config_.sim.crash_restart_s >= 0);
    env.store = std::make_shared<WorkerStore>(*this, r, restarts);
    env.alive = [this, r](std::int64_t next) { return alive(r, next) && !killed_[static_cast<std::size_t>(r)]; };
    if (r == config_.sim.crash_worker && config_.sim.crash_mid_round > 0) env.crash = [this, r] { crash_mid_round(r); };
    return env;
  }

  // One life of worker r (life 0 from the start, later ones after a crash): a peer with a fresh id.
  // Returns whether it died (and may restart).
  bool live(int r, int life) {
    transport::GossipOptions go;
    go.bind = gossip_address(r);
    // Seeds: three other workers from the first one on (a restarted worker finds one of them alive).
    for (int k = 0; k < m_ && go.seeds.size() < 3; ++k) {
      const int s = (first_ + k) % m_;
      if (s != r && s != joiner_) go.seeds.push_back(gossip_address(s));
    }
    go.self = transport::PeerId{(static_cast<std::uint64_t>(life) << 32) + static_cast<std::uint64_t>(r) + 1};
    go.dead_after = std::chrono::seconds(1);
    go.suspect_after = go.dead_after / 2;
    auto gossip = gossip_fabric_.make(r, go, static_cast<std::uint64_t>(config_.sim.seed) * 7919 + static_cast<std::uint64_t>(r) * 131 + life);
    if (!gossip.ok()) {
      if (failure_.ok()) failure_ = gossip.status();
      return false;
    }
    runtime::PeerPlan plan;
    const bool starts_run = r != joiner_ && life == 0;
    if (r != joiner_) plan.own_spec = toml_;
    plan.first = starts_run;
    plan.wait_for = static_cast<std::uint32_t>(m_ - (joiner_ >= 0 ? 1 : 0));
    plan.dead_after = go.dead_after;
    if (config_.sim.poison != train::PoisonKind::kNone && r >= m_ - config_.sim.poison_workers) {
      optim::Poison poison;
      poison.scale = config_.sim.poison == train::PoisonKind::kScale ? config_.sim.poison_scale : config_.sim.poison == train::PoisonKind::kSign ? -1.0 : 1.0;
      poison.nan = config_.sim.poison == train::PoisonKind::kNan;
      plan.poison = poison;
    }
    if (life > 0 && saved_[static_cast<std::size_t>(r)]) {
      plan.resumed = saved_[static_cast<std::size_t>(r)];
      plan.resumed_from = "worker " + std::to_string(r) + "'s last checkpoint";
    }
    killed_[static_cast<std::size_t>(r)] = false;
    if (r == config_.sim.crash_worker && life == 0) plan.crash_mid_round = config_.sim.crash_mid_round;
    if (result_.started_s[static_cast<std::size_t>(r)] < 0) result_.started_s[static_cast<std::size_t>(r)] = seconds_now();
    plan_timed_failure(r);
    plan.stop = &killed_[static_cast<std::size_t>(r)];  // a killed newcomer stops where it looks next
    WorkerHost host(*this, r, **gossip);
    runtime::Peer peer(std::move(plan), environment(r, host));
    auto out = peer.run();
    if (killed_[static_cast<std::size_t>(r)]) {
      if (out.ok()) {  // it finished before it saw it was killed
        add_life(result_.accounts[static_cast<std::size_t>(r)], out->account);
        result_.final_params[static_cast<std::size_t>(r)] = out->final_params;
        result_.shared_digests[static_cast<std::size_t>(r)] = out->shared_digest;
      }
      return true;  // died: it restarts after its downtime
    }
    if (!out.ok()) {
      // A newcomer (or a restarted worker) that cannot get in: the run goes on without it.
      if (r == joiner_ || life > 0) {
        spdlog::warn("sim: worker {} does not join: {}", r, out.status().to_string());
      } else if (out.status().code() != ErrorCode::kInvalidArgument) {
        // Lost on the way (it could not catch up with the members, say): as a real peer would exit,
        // this worker leaves the run and the others go on; it counts as crashed.
        spdlog::warn("sim: worker {} leaves the run: {}", r, out.status().to_string());
        dropped_[static_cast<std::size_t>(r)] = true;
      } else if (failure_.ok()) {
        failure_ = out.status().with_context("worker " + std::to_string(r));
      }
      return false;
    }
    add_life(result_.accounts[static_cast<std::size_t>(r)], out->account);
    result_.final_params[static_cast<std::size_t>(r)] = out->final_params;
    result_.shared_digests[static_cast<std::size_t>(r)] = out->shared_digest;
    compute_wall_ += out->account.step_wall_s + out->account.eval_wall_s;
    if (progress_) progress_(r, out->steps, config_.train.steps);
    return peer.crashed();
  }

  void run_worker(int r) {
    // Whatever way this worker ends, the late joiner stops waiting for it.
    struct Done {
      PeerCluster& c;
      bool member;
      ~Done() {
        if (!member) return;
        {
          std::lock_guard lock(c.mu_);
          ++c.members_done_;
        }
        c.reached_->notify_all();
      }
    } done{*this, r != joiner_};
    if (r == joiner_ && !wait_to_join(r)) return;
    // Churn brings a worker back, and sim.crash_restart_s the scripted crash's; otherwise it is for good.
    // Nor once the run is over (a member reached the last step, or every other member is done): its
    // downtime ends early then, so the run's time is the members' and not a sleeper's.
    auto over = [&] { return members_done_ >= m_ - 1 - (joiner_ >= 0 ? 1 : 0) || furthest_ >= config_.train.steps - 1; };
    for (int life = 0; live(r, life) && downtime_[static_cast<std::size_t>(r)]; ++life) {
      {
        std::unique_lock lock(mu_);
        const Nanos downtime = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(*downtime_[static_cast<std::size_t>(r)]));
        if (reached_->wait(lock, Deadline::after(scheduler_, downtime), over)) break;
      }
      net_.revive(r);
      spdlog::info("sim: worker {} restarts (t = {:.1f} s)", r, seconds_now());
    }
  }

  const train::RunConfig& config_;
  const ClusterProgress& progress_;
  const int m_;
  Scheduler scheduler_;
  Network net_;
  GossipFabric gossip_fabric_;
  TransportFabric link_fabric_;
  const std::string toml_;
  const std::shared_ptr<const train::Corpus> corpus_;
  const int joiner_;
  int first_ = 0;      // the first worker present from the start (the joiner is not)
  int evaluator_ = 0;  // the one worker that evaluates
  std::mutex mu_;
  std::unique_ptr<Signal> reached_;  // a member reached a further step, or finished
  std::int64_t furthest_ = 0;
  int members_done_ = 0;
  std::vector<std::optional<train::CheckpointState>> saved_;  // each worker's last checkpoint (churn)
  std::vector<std::vector<std::int64_t>> churn_;              // each worker's planned crash steps
  std::vector<std::optional<double>> downtime_;               // after its last crash: how long it stays down (virtual s); none: for good
  std::vector<std::mt19937_64> failure_rng_;                  // steady churn's draws, per worker
  std::vector<std::optional<double>> fail_at_;                // steady churn: when it fails next (virtual s)
  std::vector<std::mt19937_64> stall_rng_;                    // stalls' draws, per worker
  std::vector<std::optional<double>> stall_at_;               // when it stalls next (virtual s)
  std::vector<bool> dropped_;                                 // left the run on an error of its own (not the scenario's)
  std::vector<std::atomic<bool>> killed_;                     // stopped by a kill (the newcomer's); reset at each life
  std::atomic<bool> newcomer_killed_{false};
  std::vector<std::shared_ptr<runtime::SnapshotStore>> stores_;   // each worker's store of a state on its way (outlives a crash)
  ClusterResult result_;
  Status failure_;
  double compute_wall_ = 0;
};

Result<ClusterResult> run_peers(const train::RunConfig& config, const train::Corpus& corpus, const ClusterProgress& progress) {
  auto spec = network_spec(config);
  if (!spec.ok()) return spec.status();
  PeerCluster cluster(config, corpus, progress, *spec);
  return cluster.run();
}

}  // namespace

Result<ClusterResult> run_cluster(const train::RunConfig& config, const train::Corpus& corpus, const ClusterProgress& progress) {
  if (Status st = train::validate(config); !st.ok()) return st;
  auto outer_config = train::outer_config(config);
  if (!outer_config.ok()) return outer_config.status();
  if (outer_config->method == optim::Method::kDdp && config.ddp.engine != train::DdpEngine::kLinks) {
    return error(ErrorCode::kInvalidArgument, "the simulator runs ddp over its emulated links: set ddp.engine = \"links\" (gloo and nccl are for real peers)");
  }
  if (outer_config->method == optim::Method::kLocal) return run_local(config, *outer_config, corpus, progress);
  return run_peers(config, corpus, progress);
}

}  // namespace gossamer::sim
