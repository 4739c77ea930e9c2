#include "sim/cluster.h"

#include <torch/torch.h>

#include <spdlog/spdlog.h>

#include "optim/flat_params.h"
#include "train/worker.h"

namespace gossamer::sim {

namespace {
double mbit_to_bytes_per_s(double mbit) { return mbit * 1e6 / 8; }
}  // namespace

Result<NetworkSpec> network_spec(const train::RunConfig& c) {
  transport::LinkProfile link;
  if (c.sim.network == "custom") {
    link.name = "custom";
    link.bandwidth_bytes_per_s = mbit_to_bytes_per_s(c.sim.bandwidth_mbit);
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
  spec.hub_bytes_per_s = mbit_to_bytes_per_s(c.sim.shared_uplink_mbit);
  for (std::int64_t i = 0; i < c.sim.workers; ++i) {
    NodeSpec node{link, -1};
    if (i >= c.sim.workers - c.sim.slow_link_workers) {
      node.link.name = link.name + " (slow)";
      node.link.bandwidth_bytes_per_s = mbit_to_bytes_per_s(c.sim.slow_link_mbit);
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
  result.final_params.resize(static_cast<std::size_t>(m));

  // Membership: the scenario knows who is alive (the network's crash list); after a crash each worker
  // moves, at its next step or failed round, to the group of the survivors over a new epoch of links
  // (one epoch per crash), so nothing of an abandoned round reaches it.
  auto alive = [&] {
    std::vector<int> members;
    for (int j = 0; j < m; ++j) {
      if (!net.crashed(j)) members.push_back(j);
    }
    return members;
  };
  auto epoch_now = [&] {  // asked every step: count, do not build the list
    int crashes = 0;
    for (int j = 0; j < m; ++j) crashes += net.crashed(j) ? 1 : 0;
    return crashes;
  };
  auto group_of = [&](int r) {
    const std::vector<int> members = alive();
    const int epoch = m - static_cast<int>(members.size());
    optim::Group g;
    g.clock = &scheduler;
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

  std::vector<std::unique_ptr<train::Worker>> workers;
  std::vector<optim::OuterSetup> setups(static_cast<std::size_t>(m));
  for (int r = 0; r < m; ++r) {
    workers.push_back(std::make_unique<train::Worker>(config, corpus.dataset, r, m, scheduler));
    auto setup = optim::make_outer_optimizer(*outer_config, train::param_blocks(workers.back()->model()), group_of(r));
    if (!setup.ok()) return setup.status();
    setups[static_cast<std::size_t>(r)] = std::move(*setup);
  }
  result.parameters = workers.front()->model().num_parameters();
  std::vector<int> worker_epoch(static_cast<std::size_t>(m), 0);

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
          return false;
        }
        return true;
      };
      hooks.regroup = [&, r]() -> std::optional<optim::Group> {
        int& mine = worker_epoch[static_cast<std::size_t>(r)];
        const int epoch = epoch_now();
        if (mine == epoch) return std::nullopt;
        for (int j = 0; j < m; ++j) {
          if (j != r) net.close(r, j, mine);  // peers still waiting on us there fail now, and follow
        }
        mine = epoch;
        optim::Group g = group_of(r);
        spdlog::info("sim: worker {} continues with the {} remaining workers", r, g.size);
        return g;
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
  for (int r = 0; r < m; ++r) result.crashed.push_back(net.crashed(r));
  return result;
}

}  // namespace gossamer::sim
