// Peer::run_pipeline: a run whose config says pipeline.enabled, over real peers. The peers agree on
// round 0's group as any run does (coordinator.h: every peer ready at the start, at least the first
// peer's wait_for, by default pipeline.nodes); its members, sorted by id, are the pipeline's nodes 0
// .. n-1, and pipeline.nodes becomes n, so the schedule is planned over exactly the peers there.
// Every member plans it from the same config and they confirm it by hash (pipeline_process.h); a
// node lost later is rescheduled around. A peer that comes after the start is not taken: the
// pipeline's nodes are fixed when it starts.
#include <torch/torch.h>

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/peer_runtime.h"
#include "transport/endpoint.h"
#include "runtime/pipeline_process.h"
#include "train/trained_model.h"

namespace gossamer::runtime {

Result<PipelineProcessRequest> Peer::pipeline_request(const GroupView& group) {
  const int n = static_cast<int>(group.members.size());
  PipelineProcessRequest req;
  req.config = config_;
  req.clock = &clock_;
  req.config.pipeline.nodes = n;
  if (Status st = train::validate(req.config); !st.ok()) return st.with_context("a pipeline over the " + std::to_string(n) + " peers at the start");
  req.node = group.rank_of(gossip_.self());
  // A member announced on a wildcard is dialled at the IP its gossip comes from. A member that joined
  // last may not have reached this peer's member table yet (membership news spreads in a few
  // periods): wait for it, up to 10 s, instead of dialling a wildcard.
  const Deadline resolve_by = after(std::chrono::seconds(10));
  for (const auto& m : group.members) {
    req.ids.push_back(m.id);
    std::string address = reachable_address(gossip_, m.id, m.address);
    while (m.id != gossip_.self() && transport::is_wildcard_address(address) && !resolve_by.expired(clock_) && !stop_requested()) {
      clock_.sleep_for(std::chrono::milliseconds(50));
      address = reachable_address(gossip_, m.id, m.address);
    }
    req.addresses.push_back(std::move(address));
  }
  req.shape = plan_.shape;
  req.stop = plan_.stop;
  // A lost node is known by its links; the others wait for it as long as gossip would.
  req.rejoin_timeout = std::max<Nanos>(std::chrono::seconds(10), 2 * plan_.dead_after);
  return req;
}

Result<PeerOutcome> Peer::run_pipeline() {
  if (&clock_ != &real_clock()) {
    return error(ErrorCode::kInvalidArgument, "a pipeline over peers runs on real links and the real clock: simulate pipelines with `gossamer sim --pipeline`");
  }
  auto opened = env_.host->open_links(spec_hash_);
  if (!opened.ok()) return opened.status();
  opened_ = std::move(*opened);
  check_reachable(opened_.announced, "links");
  if (outbound_only_) {
    return error(ErrorCode::kInvalidArgument, "a pipeline node must accept connections (each node dials the nodes below it and is dialled by those "
                                              "above), and this peer accepts none (behind NAT): forward its two ports to this machine and pass "
                                              "--advertise PUBLIC_ADDRESS:PORT (docs/deploy.md), or run it on a machine the others can reach");
  }
  CoordinatorOptions co;
  co.min_members = spec_.wait_for;
  co.straggler_grace = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(config_.train.round_timeout_s / 2));
  co.quorum = config_.train.quorum;
  co.grace_spread = config_.train.grace_spread;
  coordinator_ = Coordinator::make(gossip_, opened_.announced, co, clock_);
  auto corpus = env_.corpus(config_);
  if (!corpus.ok()) return corpus.status();
  corpus_ = std::move(*corpus);
  if (env_.set_threads && config_.train.threads > 0) torch::set_num_threads(static_cast<int>(config_.train.threads));

  // The pipeline agrees on round 0 only: a peer that hears a node finished an iteration is too late
  // (every node of round 0 links to every other before the first iteration, so no member can hear it).
  std::int64_t heard_at = -1;
  auto start = wait_for_start([&] {
    ask_for_spec(*heard_);  // (once a second: the answers say where the run is)
    std::lock_guard lock(heard_->mu);
    heard_at = heard_->latest_round;
    return heard_at >= 1;
  });
  if (!start.ok()) return start.status();
  if (!*start) {
    return error(ErrorCode::kUnavailable, "the pipeline started without this peer" + (heard_at >= 1 ? " (its nodes are at iteration " + std::to_string(heard_at) + ")" : std::string()) +
                                              ": a pipeline's nodes are fixed when it starts, and it takes no newcomers; start this peer with the next run");
  }
  const GroupView& group = **start;
  const int n = static_cast<int>(group.members.size());
  auto request = pipeline_request(group);
  if (!request.ok()) return request.status();
  PipelineProcessRequest& req = *request;
  spdlog::info("pipeline of {} peers: this peer is node {}; planning the schedule over them", n, req.node);
  if (Status st = env_.store->open_records(std::nullopt); !st.ok()) return st;
  Status record_failed;
  req.on_iteration = [&](const train::PipelineRecord& r, std::optional<double> val) {
    current_round_ = r.iteration;  // what the spec's announcer tells joiners
    nlohmann::json j = pipeline_record_json(req.node, r, val);
    j["peer"] = env_.name;
    if (Status st = env_.store->record(j); !st.ok() && record_failed.ok()) record_failed = st;
    spdlog::info("pipeline node {}: iteration {}/{}, {:.2f} s{}{}", req.node, r.iteration, config_.train.steps, r.seconds,
                 r.lost_nodes > 0 ? fmt::format(", {} node(s) lost", r.lost_nodes) : std::string(),
                 val ? fmt::format(", val loss {:.4f}", *val) : std::string());
    // The fault drill (--crash-at-step): the process dies here, before the next iteration.
    if (env_.alive && r.iteration < config_.train.steps) (void)env_.alive(r.iteration + 1);
  };
  current_round_ = 0;
  auto outcome = run_pipeline_process(req, *opened_.transport, corpus_->dataset);
  if (!outcome.ok()) return outcome.status();
  if (!record_failed.ok()) return record_failed;
  nlohmann::json summary = pipeline_summary_json(req.node, *outcome);
  summary["peer"] = env_.name;
  summary["nodes"] = n;
  summary["mode"] = train::name_of(config_.pipeline.mode);
  summary["steps"] = outcome->iterations;
  if (Status st = env_.store->write_summary(summary); !st.ok()) return st;
  // The evaluating peer keeps the whole model it assembled at the end, for gossamer sample and export
  // (a pipeline cannot resume from it: its nodes' optimizer states are theirs).
  if (outcome->model && env_.store->keeps_checkpoints()) {
    auto state = train::trained_model_state(config_, *outcome->model, outcome->iterations);
    if (!state.ok()) return state.status();
    if (Status st = env_.store->save_checkpoint(*state); !st.ok()) return st;
    spdlog::info("pipeline node {}: the trained model is in checkpoint.bin (gossamer sample --from, gossamer export --from)", req.node);
  }
  PeerOutcome out;
  out.pipeline = true;
  out.steps = outcome->iterations;
  out.rounds = outcome->iterations;
  out.retries = outcome->retried_iterations;
  out.final_val_loss = outcome->final_val_loss;
  out.params_digest = outcome->params_digest;
  out.finished = !outcome->stopped && outcome->iterations >= config_.train.steps;
  stopped_ = outcome->stopped;
  return out;
}

}  // namespace gossamer::runtime
