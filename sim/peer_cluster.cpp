// The cluster runner over the real peer runtime (run/peer_runtime.h): every simulated worker is a
// Peer with the real gossip, Coordinator, state transfer and group links, on the virtual clock and
// the emulated network. See cluster.h.
#include <mutex>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "run/peer_runtime.h"
#include "sim/cluster.h"
#include "sim/gossip_fabric.h"
#include "sim/transport_fabric.h"
#include "train/checkpoint.h"

namespace gossamer::sim {

namespace {

// Worker r's host: 198.18.0.0/15 is set aside for benchmarks, so a simulated address is never a real one.
std::string host_of(int r) { return "198.18." + std::to_string(r / 250) + "." + std::to_string(r % 250 + 1); }
std::string gossip_address(int r) { return "tcp://" + host_of(r) + ":7000"; }
std::string link_address(int r) { return host_of(r) + ":7001"; }

// The first worker present from the start (the joiner is not).
int first_present(const train::RunConfig& c) {
  for (int r = 0; r < c.sim.workers; ++r) {
    if (r != c.sim.join_worker) return r;
  }
  return 0;
}

}  // namespace

Result<ClusterResult> run_peer_cluster(const train::RunConfig& config, const train::Corpus& corpus, const ClusterProgress& progress) {
  if (Status st = train::validate(config); !st.ok()) return st;
  auto outer_config = train::outer_config(config);
  if (!outer_config.ok()) return outer_config.status();
  auto spec = network_spec(config);
  if (!spec.ok()) return spec.status();
  const int m = static_cast<int>(config.sim.workers);
  if (outer_config->method == optim::Method::kDdp && config.ddp.engine != "links") {
    return error(ErrorCode::kInvalidArgument, "the simulator runs ddp over its emulated links: set ddp.engine = \"links\" (gloo is for real peers)");
  }
  if (outer_config->method == optim::Method::kLocal) return error(ErrorCode::kInvalidArgument, "run_peer_cluster: local workers have no peers");

  Stopwatch wall(real_clock());
  Scheduler scheduler;
  Network net(scheduler, *spec);
  GossipFabric gossip_fabric(scheduler, net);
  TransportFabric link_fabric(scheduler, net);
  ClusterResult result;
  result.accounts.resize(static_cast<std::size_t>(m));
  result.final_params.resize(static_cast<std::size_t>(m));
  const std::string toml = train::to_toml(config);
  const std::shared_ptr<const train::Corpus> shared_corpus(&corpus, [](const train::Corpus*) {});  // not owned

  const int joiner = static_cast<int>(config.sim.join_worker);
  const int first = first_present(config);
  int evaluator = 0;
  while (m > 1 && (evaluator == config.sim.crash_worker || evaluator == joiner)) ++evaluator;
  if (evaluator >= m) evaluator = 0;

  // The late joiner starts once a member has reached sim.join_at_step.
  std::mutex mu;
  auto reached = scheduler.make_signal();
  std::int64_t furthest = 0;

  Status failure;
  double compute_wall = 0;
  std::vector<std::unique_ptr<ClockThread>> threads;
  for (int r = 0; r < m; ++r) {
    threads.push_back(scheduler.start_thread([&, r] {
      if (r == joiner) {
        std::unique_lock lock(mu);
        reached->wait(lock, Deadline::never(), [&] { return furthest >= config.sim.join_at_step; });
        spdlog::info("sim: worker {} joins (t = {:.1f} s)", r, std::chrono::duration<double>(scheduler.now()).count());
      }
      transport::GossipOptions go;
      go.bind = gossip_address(r);
      go.seeds = {gossip_address(r == first ? (first + 1) % m : first)};
      go.self = transport::PeerId{static_cast<std::uint64_t>(r) + 1};
      go.dead_after = std::chrono::seconds(1);
      go.suspect_after = go.dead_after / 2;
      auto gossip = gossip_fabric.make(r, go, static_cast<std::uint64_t>(config.sim.seed) * 7919 + static_cast<std::uint64_t>(r));
      if (!gossip.ok()) {
        failure = gossip.status();
        return;
      }
      run::PeerPlan plan;
      if (r != joiner) plan.own_spec = toml;
      plan.first = r != joiner;
      plan.wait_for = static_cast<std::uint32_t>(m - (joiner >= 0 ? 1 : 0));
      plan.dead_after = go.dead_after;

      run::PeerEnvironment env;
      env.clock = &scheduler;
      env.gossip = gossip->get();
      env.name = std::to_string(r);
      env.evaluate = r == evaluator;
      env.set_threads = false;
      env.open_links = [&, r, id = go.self](const Digest&) -> Result<run::OpenedLinks> {
        auto t = link_fabric.make(r, link_address(r), id);
        if (!t.ok()) return t.status();
        run::OpenedLinks out;
        out.transport = std::move(*t);
        out.announced = out.bound = link_address(r);
        return out;
      };
      env.corpus = [&](const train::RunConfig&) -> Result<std::shared_ptr<const train::Corpus>> { return shared_corpus; };
      env.record = [&, r](const nlohmann::json& rec) {
        nlohmann::json out = rec;
        out.erase("peer");
        out["worker"] = r;
        result.records.push_back(std::move(out));
        return Status();
      };
      const double slow = r == config.sim.straggler ? config.sim.straggler_factor : 1.0;
      env.pace = [&, slow](double measured) {
        const double s = step_seconds(config, result.parameters, measured) * slow;
        scheduler.sleep_for(std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(s)));
        return s;
      };
      env.alive = [&, r](std::int64_t next) {
        if (progress) progress(r, next - 1, config.train.steps);
        {
          std::lock_guard lock(mu);
          if (next - 1 > furthest) {
            furthest = next - 1;
            reached->notify_all();
          }
        }
        if (r == config.sim.crash_worker && next == config.sim.crash_at_step) {
          spdlog::info("sim: worker {} crashes before step {} (t = {:.1f} s)", r, next, std::chrono::duration<double>(scheduler.now()).count());
          gossip_fabric.crash(gossip_address(r));
          net.crash(r);
          return false;
        }
        return true;
      };
      run::Peer peer(std::move(plan), std::move(env));
      auto out = peer.run();
      if (!out.ok()) {
        if (r == joiner) {
          // The members count on nobody: the run simply goes on without it.
          spdlog::warn("sim: newcomer {} does not join: {}", r, out.status().to_string());
          return;
        }
        if (failure.ok()) failure = out.status().with_context("worker " + std::to_string(r));
        return;
      }
      result.accounts[static_cast<std::size_t>(r)] = out->account;
      result.final_params[static_cast<std::size_t>(r)] = out->final_params;
      compute_wall += out->account.step_wall_s + out->account.eval_wall_s;
      if (progress) progress(r, out->steps, config.train.steps);
    }));
  }
  {
    // The parameter count for the compute model, from one model like the workers'.
    train::Worker probe(config, corpus.dataset, 0, 1, scheduler);
    result.parameters = probe.model().num_parameters();
  }
  Status ran;
  try {
    ran = scheduler.run();
  } catch (...) {
    scheduler.stop();  // unwind the workers while what they use still exists
    throw;
  }
  scheduler.stop();
  threads.clear();
  if (!ran.ok()) return ran;
  if (!failure.ok()) return failure;
  result.sim_time_s = std::chrono::duration<double>(scheduler.now()).count();
  result.wall_s = wall.elapsed_seconds();
  result.compute_wall_s = compute_wall;
  for (int r = 0; r < m; ++r) result.crashed.push_back(net.crashed(r));
  return result;
}

}  // namespace gossamer::sim
