#include "sim/cluster.h"

#include <mutex>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "optim/flat_params.h"
#include "train/checkpoint.h"
#include "train/worker.h"
#include "transport/protocol.h"
#include "transport/tags.h"

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
  for (std::int64_t k = 0; k < c.sim.sites; ++k) {
    spec.sites.push_back(SiteSpec{"site " + std::to_string(k), mbit_to_bytes_per_s(c.sim.site_uplink_mbit),
                                  std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::milli>(c.sim.site_latency_ms))});
  }
  for (std::int64_t i = 0; i < c.sim.workers; ++i) {
    // Sites take contiguous blocks of workers, as even as they divide.
    NodeSpec node{link, c.sim.sites > 0 ? static_cast<int>(i * c.sim.sites / c.sim.workers) : -1};
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
  if (outer_config->method == optim::Method::kDdp && config.ddp.engine != "links") {
    return error(ErrorCode::kInvalidArgument, "the simulator runs ddp over its emulated links: set ddp.engine = \"links\" (gloo is for real peers)");
  }

  Stopwatch wall(real_clock());
  Scheduler scheduler;
  Network net(scheduler, *spec);
  ClusterResult result;
  result.accounts.resize(static_cast<std::size_t>(m));
  result.final_params.resize(static_cast<std::size_t>(m));

  // Membership: the scenario knows who is alive (the network's crash list) and whether the late joiner
  // is in yet (from step sim.join_at_step on). Each membership has its own epoch of links, so nothing
  // of an abandoned round reaches a re-formed group. A crash is noticed when it happens (each worker
  // moves to the survivors' group at its next step or failed round); a join is scheduled, so every
  // member switches exactly before step join_at_step and no round is cut short by it.
  const int joiner = static_cast<int>(config.sim.join_worker);
  const std::int64_t join_step = config.sim.join_at_step;
  int crashes = 0;
  auto epoch_for = [&](std::int64_t next_step) { return 2 * crashes + (joiner >= 0 && next_step >= join_step ? 1 : 0); };
  auto group_of = [&](int r, int epoch) {
    optim::Group g;
    g.clock = &scheduler;
    const bool joined = epoch % 2 == 1;
    if (r == joiner && !joined) {  // not in yet: alone until it joins
      g.size = 1;
      g.peers.resize(1);
      return g;
    }
    g.size = 0;
    for (int j = 0; j < m; ++j) {
      if (net.crashed(j) || (j == joiner && !joined)) continue;
      if (j == r) g.rank = g.size;
      g.peers.push_back(j == r ? nullptr : net.link(r, j, epoch));
      ++g.size;
    }
    return g;
  };
  int evaluator = 0;
  while (m > 1 && (evaluator == config.sim.crash_worker || evaluator == joiner)) ++evaluator;
  if (evaluator >= m) evaluator = 0;

  std::vector<std::unique_ptr<train::Worker>> workers;
  std::vector<optim::OuterSetup> setups(static_cast<std::size_t>(m));
  for (int r = 0; r < m; ++r) {
    workers.push_back(std::make_unique<train::Worker>(config, corpus.dataset, r, m, scheduler));
    auto setup = optim::make_outer_optimizer(*outer_config, train::param_blocks(workers.back()->model()), group_of(r, epoch_for(1)));
    if (!setup.ok()) return setup.status();
    setups[static_cast<std::size_t>(r)] = std::move(*setup);
  }
  result.parameters = workers.front()->model().num_parameters();
  std::vector<int> worker_epoch(static_cast<std::size_t>(m), epoch_for(1));

  // The late join: the first member to reach join_at_step captures its training state (model, inner
  // and outer optimizer, step) and streams it to the newcomer from a thread of its own while it trains
  // on; the newcomer loads it and takes part from that step. The transfer's bytes are counted on both.
  const Nanos round_timeout = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(config.train.round_timeout_s));
  constexpr int kStateEpoch = 1 << 24;  // the links state transfers use
  constexpr transport::Tag kStateTag = transport::tags::kSimState;
  std::mutex join_mu;
  auto join_signal = scheduler.make_signal();
  int donor = -1;
  int members_done = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> state_traffic(static_cast<std::size_t>(m));
  std::vector<std::unique_ptr<ClockThread>> transfers;
  // Lets what is in flight over worker r's links (CO2's average) finish: before its state is handed
  // over, and before the members change for the newcomer, so every member keeps it alike.
  auto settle = [&](int r) {
    if (Status st = setups[static_cast<std::size_t>(r)].outer->settle(Deadline::after(scheduler, round_timeout)); !st.ok()) {
      spdlog::warn("sim: worker {}: {}", r, st.to_string());
    }
  };
  auto serve_newcomer = [&](int r) {
    {
      std::lock_guard lock(join_mu);  // this member serves it (the others need not, even while it waits below)
      donor = r;
    }
    join_signal->notify_all();
    auto& worker = *workers[static_cast<std::size_t>(r)];
    train::CheckpointState state = worker.checkpoint_state("");
    settle(r);  // an average in flight (CO2) goes with the state, so the newcomer applies it with the others
    state.outer_state = setups[static_cast<std::size_t>(r)].outer->save();
    auto blob = std::make_shared<Bytes>(train::encode_checkpoint(state));
    spdlog::info("sim: worker {} sends its training state at step {} ({:.1f} MB) to newcomer {}", r, worker.steps_done(), blob->size() / 1e6, joiner);
    transfers.push_back(scheduler.start_thread([&, r, blob] {
      auto link = net.link(r, joiner, kStateEpoch);
      if (Status st = link->send(kStateTag, *blob, Deadline::never()); !st.ok()) {
        spdlog::warn("sim: worker {} could not send its state to newcomer {}: {}", r, joiner, st.to_string());
        return;
      }
      state_traffic[static_cast<std::size_t>(r)].first += blob->size() + transport::kFrameHeaderBytes;
    }));
  };
  // The newcomer's side: waits for a donor, fetches and loads its state. kUnavailable: nobody could
  // serve it (no member reached the step, or the donor died mid-transfer).
  auto fetch_state = [&](int r) -> Status {
    auto& worker = *workers[static_cast<std::size_t>(r)];
    int from = -1;
    {
      std::unique_lock lock(join_mu);
      join_signal->wait(lock, Deadline::never(), [&] { return donor >= 0 || members_done == m - 1; });
      from = donor;
    }
    if (from < 0) return error(ErrorCode::kUnavailable, "no member reached step " + std::to_string(join_step) + " to hand it the training state");
    auto bytes = net.link(r, from, kStateEpoch)->recv(kStateTag, Deadline::never());
    if (!bytes.ok()) {
      return error(ErrorCode::kUnavailable, "fetching the training state from worker " + std::to_string(from) + " failed: " + bytes.status().to_string());
    }
    state_traffic[static_cast<std::size_t>(r)].second += bytes->size() + transport::kFrameHeaderBytes;
    auto state = train::decode_checkpoint(*bytes, "state from worker " + std::to_string(from));
    if (!state.ok()) return state.status();
    const train::CheckpointState own = worker.checkpoint_state("");
    state->rng_state = own.rng_state;  // its own dropout stream, and only the tokens it trains on
    state->tokens_seen = 0;
    if (Status st = worker.restore(*state); !st.ok()) return st;
    if (Status st = setups[static_cast<std::size_t>(r)].outer->load(state->outer_state); !st.ok()) return st;
    spdlog::info("sim: newcomer {} loaded worker {}'s state and joins at step {} (t = {:.1f} s)", r, from, worker.steps_done() + 1,
                 std::chrono::duration<double>(scheduler.now()).count());
    return Status();
  };

  Status failure;
  double compute_wall = 0;
  std::vector<std::unique_ptr<ClockThread>> threads;
  for (int r = 0; r < m; ++r) {
    threads.push_back(scheduler.start_thread([&, r] {
      auto& worker = *workers[static_cast<std::size_t>(r)];
      auto& setup = setups[static_cast<std::size_t>(r)];
      auto finish = [&] {
        result.final_params[static_cast<std::size_t>(r)] = optim::flatten(worker.model().parameters());
        setup.outer.reset();
        setup.comm.reset();  // joins the communication thread, in virtual time
        if (r != joiner) {
          std::lock_guard lock(join_mu);
          ++members_done;
        }
        join_signal->notify_all();
      };
      if (r == joiner) {
        if (Status st = fetch_state(r); !st.ok()) {
          // The members already count it in: it leaves like a crashed worker, so they re-form without it.
          spdlog::warn("sim: newcomer {} does not join: {}", r, st.to_string());
          if (failure.ok() && st.code() != ErrorCode::kUnavailable) failure = st.with_context("worker " + std::to_string(r));
          net.crash(r);
          ++crashes;
          finish();
          return;
        }
      }
      const double slow = r == config.sim.straggler ? config.sim.straggler_factor : 1.0;
      train::LoopOptions lo;
      lo.steps = config.train.steps;
      lo.eval_every = config.train.eval_every;
      lo.evaluate = r == evaluator;
      lo.round_timeout = round_timeout;
      train::LoopHooks hooks;
      hooks.pace = [&, slow](double measured) {
        const double s = step_seconds(config, result.parameters, measured) * slow;
        scheduler.sleep_for(std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(s)));
        return s;
      };
      hooks.keep_going = [&, r](std::int64_t next) {
        if (progress) progress(r, next - 1, config.train.steps);
        if (r == config.sim.crash_worker && next == config.sim.crash_at_step) {
          spdlog::info("sim: worker {} crashes before step {} (t = {:.1f} s)", r, next, std::chrono::duration<double>(scheduler.now()).count());
          net.crash(r);
          ++crashes;
          return false;
        }
        if (r != joiner && next == join_step && donor < 0 && joiner >= 0) serve_newcomer(r);
        return true;
      };
      hooks.regroup = [&, r](std::int64_t step) -> std::optional<optim::Group> {
        int& mine = worker_epoch[static_cast<std::size_t>(r)];
        const int epoch = epoch_for(step);
        if (mine == epoch) return std::nullopt;
        if (epoch == mine + 1 && epoch % 2 == 1) settle(r);  // the newcomer comes in (nobody failed)
        for (int j = 0; j < m; ++j) {
          if (j != r) net.close(r, j, mine);  // peers still waiting on us there fail now, and follow
        }
        mine = epoch;
        optim::Group g = group_of(r, epoch);
        spdlog::info("sim: worker {} continues in a group of {} workers", r, g.size);
        return g;
      };
      hooks.record = [&, r](const nlohmann::json& rec) {
        nlohmann::json out = rec;
        out["worker"] = r;
        result.records.push_back(std::move(out));
      };
      hooks.state_traffic = [&, r] { return state_traffic[static_cast<std::size_t>(r)]; };
      auto account = train::run_worker_loop(worker, setup, scheduler, lo, hooks);
      if (!account.ok() && failure.ok()) failure = account.status().with_context("worker " + std::to_string(r));
      if (account.ok()) {
        result.accounts[static_cast<std::size_t>(r)] = *account;
        compute_wall += account->step_wall_s + account->eval_wall_s;
      }
      if (progress) progress(r, worker.steps_done(), config.train.steps);
      finish();
    }));
  }
  Status ran;
  try {
    ran = scheduler.run();
  } catch (...) {
    scheduler.stop();  // unwind the other workers while what they use still exists
    throw;
  }
  scheduler.stop();
  threads.clear();
  transfers.clear();
  // A transfer that ended after its donor's last record: the totals still count it.
  for (int r = 0; r < m; ++r) {
    auto& acc = result.accounts[static_cast<std::size_t>(r)];
    const auto [sent, received] = state_traffic[static_cast<std::size_t>(r)];
    acc.bytes_sent += sent - acc.state_bytes_sent;
    acc.bytes_received += received - acc.state_bytes_received;
    acc.state_bytes_sent = sent;
    acc.state_bytes_received = received;
  }
  if (!ran.ok()) return ran;
  if (!failure.ok()) return failure;
  result.sim_time_s = std::chrono::duration<double>(scheduler.now()).count();
  result.wall_s = wall.elapsed_seconds();
  result.compute_wall_s = compute_wall;
  for (int r = 0; r < m; ++r) result.crashed.push_back(net.crashed(r));
  return result;
}

}  // namespace gossamer::sim
