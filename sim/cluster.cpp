#include "sim/cluster.h"

#include <torch/torch.h>

#include <spdlog/spdlog.h>

#include <algorithm>

#include "optim/flat_params.h"
#include "train/worker.h"

namespace gossamer::sim {

Result<NetworkSpec> network_spec(const train::RunConfig& c) {
  transport::LinkProfile link;
  if (c.sim.network == "custom") {
    link.name = "custom";
    link.bandwidth_bytes_per_s = c.sim.bandwidth_mbit * 1e6 / 8;
    link.latency = std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::milli>(c.sim.latency_ms));
    link.jitter = std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::milli>(c.sim.jitter_ms));
    link.loss = c.sim.loss;
  } else {
    auto preset = transport::link_profile_preset(c.sim.network);
    if (!preset.ok()) return error(ErrorCode::kInvalidArgument, "sim.network: " + preset.status().message());
    link = *preset;
  }
  if (Status st = link.validate(); !st.ok()) return error(ErrorCode::kInvalidArgument, "sim.network: " + st.message());
  NetworkSpec spec;
  spec.seed = static_cast<std::uint64_t>(c.sim.seed);
  spec.hub_bytes_per_s = c.sim.shared_uplink_mbit * 1e6 / 8;
  for (std::int64_t i = 0; i < c.sim.workers; ++i) {
    NodeSpec node{link, -1};
    if (i >= c.sim.workers - c.sim.slow_link_workers) {
      node.link.name = link.name + " (slow)";
      node.link.bandwidth_bytes_per_s = c.sim.slow_link_mbit * 1e6 / 8;
    }
    spec.nodes.push_back(node);
  }
  return spec;
}

double step_seconds(const train::RunConfig& c, std::int64_t parameters, double measured_s) {
  if (c.sim.compute == "fixed") return c.sim.step_time_s;
  if (c.sim.compute == "measured") return measured_s;
  const double tokens = static_cast<double>(c.train.batch_size * c.model.context);
  return 6.0 * static_cast<double>(parameters) * tokens / (c.sim.device_tflops * 1e12 * c.sim.device_utilization);
}

Result<ClusterResult> run_cluster(const train::RunConfig& config, const train::Corpus& corpus, const ClusterProgress& progress) {
  if (Status st = train::validate(config); !st.ok()) return st;
  auto outer_config = train::outer_config(config);
  if (!outer_config.ok()) return outer_config.status();
  auto spec = network_spec(config);
  if (!spec.ok()) return spec.status();
  const int m = static_cast<int>(config.sim.workers);
  const int evaluator = config.sim.crash_worker == 0 && m > 1 ? 1 : 0;

  Stopwatch wall(real_clock());
  Scheduler scheduler;
  Network net(scheduler, *spec);
  ClusterResult result;
  result.accounts.resize(static_cast<std::size_t>(m));
  result.crashed.assign(static_cast<std::size_t>(m), false);
  result.final_params.resize(static_cast<std::size_t>(m));

  std::vector<std::unique_ptr<train::Worker>> workers;
  std::vector<optim::OuterSetup> setups(static_cast<std::size_t>(m));
  for (int r = 0; r < m; ++r) {
    workers.push_back(std::make_unique<train::Worker>(config, corpus.dataset, r, m, scheduler));
    optim::Group group;
    group.rank = r;
    group.size = m;
    group.clock = &scheduler;
    group.peers.resize(static_cast<std::size_t>(m));
    for (int j = 0; j < m; ++j) {
      if (j != r) group.peers[static_cast<std::size_t>(j)] = net.link(r, j);
    }
    auto setup = optim::make_outer_optimizer(*outer_config, train::param_blocks(workers.back()->model()), std::move(group));
    if (!setup.ok()) return setup.status();
    setups[static_cast<std::size_t>(r)] = std::move(*setup);
  }
  result.parameters = workers.front()->model().num_parameters();

  // Membership: the scenario knows who is alive; each worker moves to a new group (and a new epoch of
  // links, so nothing of an abandoned round reaches it) at its first step or failed round after a crash.
  int epoch = 0;
  std::vector<int> worker_epoch(static_cast<std::size_t>(m), 0);
  auto group_of = [&](int r) {
    optim::Group g;
    g.clock = &scheduler;
    std::vector<int> members;
    for (int j = 0; j < m; ++j) {
      if (!result.crashed[static_cast<std::size_t>(j)]) members.push_back(j);
    }
    g.size = static_cast<int>(members.size());
    g.peers.resize(members.size());
    for (std::size_t k = 0; k < members.size(); ++k) {
      if (members[k] == r) {
        g.rank = static_cast<int>(k);
      } else {
        g.peers[k] = net.link(r, members[k], epoch);
      }
    }
    return g;
  };

  Status failure;
  double compute_wall = 0;
  std::vector<std::unique_ptr<ClockThread>> threads;
  for (int r = 0; r < m; ++r) {
    threads.push_back(scheduler.start_thread([&, r] {
      auto& worker = *workers[static_cast<std::size_t>(r)];
      auto& setup = setups[static_cast<std::size_t>(r)];
      const double slow = r == config.sim.straggler ? config.sim.straggler_factor : 1.0;
      train::LoopOptions lo;
      lo.steps = config.train.steps;
      lo.eval_every = config.train.eval_every;
      lo.evaluate = r == evaluator;
      lo.round_timeout = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(config.train.round_timeout_s));
      train::LoopHooks hooks;
      hooks.pace = [&, slow](double measured) {
        compute_wall += measured;
        const double s = step_seconds(config, result.parameters, measured) * slow;
        scheduler.sleep_for(std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(s)));
        return s;
      };
      hooks.keep_going = [&, r](std::int64_t next) {
        if (progress) progress(r, next - 1, config.train.steps);
        if (r == config.sim.crash_worker && next == config.sim.crash_at_step) {
          spdlog::info("sim: worker {} crashes before step {} (t = {:.1f} s)", r, next, std::chrono::duration<double>(scheduler.now()).count());
          net.crash(r);
          result.crashed[static_cast<std::size_t>(r)] = true;
          ++epoch;
          return false;
        }
        return true;
      };
      hooks.regroup = [&, r]() -> std::optional<optim::Group> {
        int& mine = worker_epoch[static_cast<std::size_t>(r)];
        if (mine == epoch) return std::nullopt;
        for (int j = 0; j < m; ++j) {
          if (j != r) net.close(r, j, mine);  // peers still waiting on us there fail now, and follow
        }
        mine = epoch;
        spdlog::info("sim: worker {} continues with the {} remaining workers", r, m - static_cast<int>(std::count(result.crashed.begin(), result.crashed.end(), true)));
        return group_of(r);
      };
      hooks.record = [&, r](const nlohmann::json& rec) {
        nlohmann::json out = rec;
        out["worker"] = r;
        result.records.push_back(std::move(out));
      };
      auto account = train::run_worker_loop(worker, setup, scheduler, lo, hooks);
      if (!account.ok() && failure.ok()) failure = account.status().with_context("worker " + std::to_string(r));
      if (account.ok()) {
        result.accounts[static_cast<std::size_t>(r)] = *account;
        compute_wall += account->eval_wall_s;
      }
      if (progress) progress(r, worker.steps_done(), config.train.steps);
      result.final_params[static_cast<std::size_t>(r)] = optim::flatten(worker.model().parameters());
      setup.outer.reset();
      setup.comm.reset();  // joins the communication thread, in virtual time
    }));
  }
  Status ran = scheduler.run();
  threads.clear();
  if (!ran.ok()) return ran;
  if (!failure.ok()) return failure;
  result.sim_time_s = std::chrono::duration<double>(scheduler.now()).count();
  result.wall_s = wall.elapsed_seconds();
  result.compute_wall_s = compute_wall;
  result.context_switches = scheduler.context_switches();
  return result;
}

}  // namespace gossamer::sim
