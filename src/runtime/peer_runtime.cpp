#include "runtime/peer_runtime.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/signal.h"
#include "optim/flat_params.h"
#include "transport/shaped_link.h"

namespace gossamer::runtime {

using namespace std::chrono_literals;

namespace {
}  // namespace

// A group asked for from a thread of the clock's, so the agreement runs while this peer trains (or
// while it watches for a stop request); get() joins it.
class Peer::Pending {
 public:
  Pending(Clock& clock, std::int64_t round, std::function<Result<GroupView>()> ask) : round_(round), slot_(std::make_shared<Slot>()) {
    thread_ = clock.start_thread([slot = slot_, ask = std::move(ask)] {
      Result<GroupView> r = ask();
      std::lock_guard lock(slot->mu);
      slot->value.emplace(std::move(r));
    });
  }
  ~Pending() { thread_->join(); }
  std::int64_t round() const { return round_; }
  bool done() const {
    std::lock_guard lock(slot_->mu);
    return slot_->value.has_value();
  }
  Result<GroupView> get() {
    thread_->join();
    return std::move(*slot_->value);
  }

 private:
  struct Slot {
    std::mutex mu;
    std::optional<Result<GroupView>> value;
  };
  const std::int64_t round_;
  std::shared_ptr<Slot> slot_;
  std::unique_ptr<ClockThread> thread_;
};

Peer::Peer(PeerPlan plan, PeerEnvironment env) : plan_(std::move(plan)), env_(std::move(env)), clock_(env_.host->clock()), gossip_(env_.host->gossip()) {
  if (!env_.store) env_.store = std::make_shared<MemoryRunStore>();
}

Peer::~Peer() {
  if (ahead_) {  // a question asked ahead is withdrawn first
    coordinator_->stop();
    ahead_.reset();
  }
  setup_.outer.reset();
  setup_.comm.reset();  // joins the communication thread before the links go
}

Result<PeerOutcome> Peer::run() {
  if (Status st = learn_run(); !st.ok()) return st;
  if (config_.pipeline.enabled) return run_pipeline();
  if (Status st = link_up(); !st.ok()) return st;
  if (Status st = join_or_start(); !st.ok()) return st;
  board_->set_member(true);
  auto account = rounds();
  if (!account.ok()) return account.status();
  if (!failure_.ok()) return failure_;
  if (crashed_) {  // the process died: what it had done is all there is
    PeerOutcome out;
    out.steps = worker_->steps_done();
    out.rounds = account->rounds;
    out.skipped_rounds = account->skipped_rounds;
    out.account = *account;
    out.final_params = optim::flatten(worker_->model().parameters());
    return out;
  }
  return finish(*account);
}

Status Peer::learn_run() {
  if (plan_.outbound_only) {
    outbound_only_ = true;
    if (Status st = gossip_.set_outbound_only(true); !st.ok()) spdlog::warn("gossip: {}", st.to_string());
    spdlog::info("outbound-only (--outbound-only): this peer dials the others, and its links to other outbound-only peers go through a relay");
  }
  check_reachable(env_.host->gossip_announced(), "gossip");
  heard_ = listen_for_spec(gossip_, clock_);
  board_ = JoinBoard::make(gossip_, clock_);
  if (plan_.first) {
    spec_ = Spec{*plan_.own_spec, plan_.wait_for};
  } else {
    auto got = receive_spec(*heard_, plan_.spec_timeout, plan_.stop);
    if (!got.ok()) return got.status();
    spec_ = std::move(*got);
    if (plan_.own_spec && *plan_.own_spec != spec_.toml) {
      train::RunConfig own, run;
      if (train::apply_toml(own, *plan_.own_spec, "own").ok() && train::apply_toml(run, spec_.toml, "run").ok() && own.model.kind == train::ModelKind::kExternal &&
          run.model.kind == train::ModelKind::kExternal && own.model.signature != run.model.signature) {
        return error(ErrorCode::kInvalidArgument, "this peer's model (signature " + own.model.signature + ") is not the run's (" + run.model.signature +
                                                      "): its parameters' names, shapes, types or initial weights differ; build it the same way on "
                                                      "every peer, after the same torch.manual_seed");
      }
      return error(ErrorCode::kInvalidArgument, "this peer's config (hash " + digest_of(as_bytes(*plan_.own_spec)).hex() + ") differs from the run's (hash " +
                                                    digest_of(as_bytes(spec_.toml)).hex() + "): " +
                                                    (plan_.resumed ? "the checkpoint belongs to another run" : "drop --config to take the run's, or join another run"));
    }
  }
  if (spec_.toml.size() > kMaxSpec) return error(ErrorCode::kInvalidArgument, "the run's config is too large to announce");
  if (Status st = train::apply_toml(config_, spec_.toml, "run spec"); !st.ok()) return st;
  if (Status st = train::validate(config_); !st.ok()) return st;
  // A pipeline of one node is none: unless told otherwise, the first peer waits for pipeline.nodes.
  if (plan_.first && config_.pipeline.enabled && spec_.wait_for < 2) spec_.wait_for = static_cast<std::uint32_t>(config_.pipeline.nodes);
  if (plan_.device) config_.train.device = *plan_.device;  // where this machine computes is its own choice
  if (env_.check_run) {
    if (Status st = env_.check_run(config_); !st.ok()) return st;
  }
  if (!config_.pipeline.enabled) {  // (a pipeline's stages sync as pipeline.stage_sync says)
    auto outer = train::outer_config(config_);
    if (!outer.ok()) return outer.status();
    outer_config_ = std::move(*outer);
    auto schedule = round_schedule(config_, outer_config_);
    if (!schedule.ok()) return schedule.status();
    schedule_ = *schedule;
  }
  // A joiner learns the run's length from its spec: a drill past its end is refused here.
  if (Status st = check_round_drill(config_, plan_.crash_mid_round, "--crash-mid-round"); !st.ok()) return st;
  ddp_ = outer_config_.method == optim::Method::kDdp;
  round_timeout_ = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(config_.train.round_timeout_s));
  spec_hash_ = digest_of(as_bytes(spec_.toml));
  if (config_.pipeline.enabled) {
    spdlog::info("run {} (a {} pipeline of {} stages, {} iterations)", spec_hash_.hex().substr(0, 16), train::name_of(config_.pipeline.mode), config_.pipeline.stages, config_.train.steps);
  } else {
    spdlog::info("run {} ({} on {} steps, rounds every {} steps)", spec_hash_.hex().substr(0, 16), train::name_of(config_.outer.method), config_.train.steps, schedule_.period);
  }
  // Answers carry the furthest round this peer knows of: its own, or (joining) the one it heard of.
  announcer_ = std::make_unique<SpecAnnouncer>(
      gossip_, spec_,
      [this] {
        std::lock_guard lock(heard_->mu);
        return std::max<std::int64_t>(current_round_.load(), heard_->latest_round);
      },
      clock_);
  return env_.store->keep_spec(spec_.toml);
}

Status Peer::link_up() {
  auto opened = env_.host->open_links(spec_hash_);
  if (!opened.ok()) return opened.status();
  opened_ = std::move(*opened);
  {
    // ddp on Gloo or NCCL: each group's rank 0 serves the rendezvous where its links listen.
    const auto c = opened_.bound.rfind(':');
    outer_config_.gloo.over_group_links = true;
    outer_config_.gloo.store_host = outer_config_.gloo.interface_host = opened_.bound.substr(0, c);
    outer_config_.gloo.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(std::min(round_timeout_, kLinkTimeout));
  }
  // join.keep_rounds counts outer rounds: Streaming DiLoCo's take all its fragments' (H inner steps).
  const std::int64_t outer_period = outer_config_.method == optim::Method::kStreamingDiLoCo ? config_.streaming_diloco.inner_steps : schedule_.period;
  std::optional<double> serve_rate;
  if (auto link = own_link_bytes_per_s()) serve_rate = *link * config_.join.serve_share;
  donor_ = std::make_unique<DonorDuty>(clock_, config_.join.keep_rounds * std::max<std::int64_t>(outer_period, 1),
                                       static_cast<std::uint64_t>(config_.join.keep_mb * 1e6), serve_rate, [this] { return progress_.load(); });
  links_ = std::make_unique<PeerLinks>(
      *opened_.transport, clock_, [this](std::shared_ptr<transport::Link> l) { donor_->serve(shape_state_link(std::move(l))); },
      [g = &gossip_](transport::PeerId id, const std::string& announced) { return reachable_address(*g, id, announced); });
  if (plan_.poison) links_->poison(*plan_.poison);
  links_->tap_means(donor_->tap());
  if (plan_.crash_mid_round > 0 && env_.crash) {
    links_->crash_drill([this] {
      if (current_round_.load() != plan_.crash_mid_round || drilled_.exchange(true)) return;
      spdlog::warn("crash drill: dying in round {}'s collective, this peer's share of the average sent to half the group", plan_.crash_mid_round);
      env_.crash();
    });
  }
  if (plan_.shape) {
    links_->shape(*plan_.shape);
    spdlog::info("links shaped like '{}'", plan_.shape->name);
  }
  CoordinatorOptions co;
  co.min_members = spec_.wait_for;
  co.straggler_grace = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(config_.train.round_timeout_s / 2));
  co.quorum = config_.train.quorum;
  co.grace_spread = config_.train.grace_spread;
  co.layout = [this](std::size_t members) { return layout_for(members); };
  co.commit_rounds = !ddp_;  // (ddp's members that went on retry a later step: the step rule decides)
  check_reachable(opened_.announced, "links");
  if (outbound_only_ && ddp_ && train::on_c10d(config_.ddp.engine)) {
    return error(ErrorCode::kInvalidArgument, "ddp.engine = \"" + train::name_of(config_.ddp.engine) + "\" needs every peer to accept connections (it dials the other ranks "
                                              "itself), and this peer accepts none (behind NAT): run with ddp.engine = \"links\", or give "
                                              "this machine a port forward and --advertise");
  }
  if (Status st = check_relay_needs_key(); !st.ok()) return st;
  // Announced without an address when nobody can dial it: the others then wait for its links.
  coordinator_ = Coordinator::make(gossip_, outbound_only_ ? std::string() : opened_.announced, co, clock_);
  if (!env_.external) {  // (a caller's own training reads its own data)
    auto corpus = env_.corpus(config_);
    if (!corpus.ok()) return corpus.status();
    corpus_ = std::move(*corpus);
  }
  if (env_.set_threads && config_.train.threads > 0) torch::set_num_threads(static_cast<int>(config_.train.threads));
  return Status();
}

std::shared_ptr<transport::Link> Peer::shape_state_link(std::shared_ptr<transport::Link> link) {
  if (!plan_.shape) return link;
  auto shaped = transport::make_shaped_link(link, *plan_.shape, ++state_links_shaped_);
  if (!shaped.ok()) {
    spdlog::warn("state link not shaped: {}", shaped.status().to_string());
    return link;
  }
  return *shaped;
}

std::optional<double> Peer::shaped_link_bytes_per_s() const {
  if (plan_.shape && std::isfinite(plan_.shape->bandwidth_bytes_per_s)) return plan_.shape->goodput_bytes_per_s();
  return std::nullopt;
}

std::optional<double> Peer::own_link_bytes_per_s() const {
  const std::optional<double> known = env_.host->link_bytes_per_s();
  return known ? known : shaped_link_bytes_per_s();
}

const quant::EncodeOptions* Peer::layout_codec() const {
  switch (outer_config_.method) {
    case optim::Method::kDiLoCo:
      return &outer_config_.diloco.codec;
    case optim::Method::kMuLoCo:
      return &outer_config_.muloco.codec;
    case optim::Method::kStreamingDiLoCo:
      return &outer_config_.streaming.codec;
    case optim::Method::kCO2:
      return &outer_config_.co2.codec;
    case optim::Method::kDdp:
      return outer_config_.ddp_engine == optim::OuterConfig::DdpEngine::kLinks ? &outer_config_.ddp_codec : nullptr;
    default:
      return nullptr;  // pairs (NoLoCo) and all-gathers (SparseLoCo) need every link
  }
}

std::uint32_t Peer::layout_for(std::size_t members) {
  // Only methods whose collective is allreduce_mean may go through a grid. Decided once per group
  // size with the model's size known (a round trip measured a little differently later does not
  // change a group's layout, and so its links); at the start, before the model is built, the
  // payload counts as small.
  if (layout_codec() == nullptr) return 0;
  std::lock_guard lock(layout_mu_);
  if (auto it = layouts_.find(members); it != layouts_.end()) return it->second;
  const double payload = layout_payload_.load();
  const Nanos rtt = gossip_.round_trip().value_or(Nanos{0});
  const auto width = static_cast<std::uint32_t>(optim::choose_width(static_cast<int>(members), payload, rtt, own_link_bytes_per_s().value_or(0)));
  if (payload > 0) layouts_[members] = width;
  return width;
}

// Round 0's group, or nothing when the run started without this peer.
Result<std::optional<GroupView>> Peer::wait_for_start(const std::function<bool()>& too_late) {
  spdlog::info("waiting for {} peer(s) to start", spec_.wait_for);
  // Asked from a thread of its own, so that a stop request (Ctrl-C) ends the wait at once.
  Pending pending(clock_, 0, [c = coordinator_, d = after(plan_.start_timeout)] { return c->agree(0, 0, d); });
  bool late = false;
  while (!pending.done()) {
    if (stop_requested()) coordinator_->stop();
    if (!late && too_late && too_late()) {
      late = true;
      coordinator_->stop();
    }
    clock_.sleep_for(100ms);
  }
  auto agreed = pending.get();
  if (stop_requested()) return error(ErrorCode::kAborted, "stop requested while waiting for the peers to start");
  if (late && !agreed.ok()) return std::optional<GroupView>();
  if (agreed.ok()) return std::optional<GroupView>(*agreed);
  if (agreed.status().code() == ErrorCode::kUnavailable || agreed.status().code() == ErrorCode::kAborted) return std::optional<GroupView>();
  return agreed.status().with_context("starting the run");
}

// A tenth of a round before the group is needed (late enough that a peer's READY says how far it
// got, so the leader's grace can tell a straggler), but after the last round's boundary, the next
// round's group is asked for from a thread of its own: the agreement is off the critical path. Not
// for ddp, whose rounds are agreed right at their boundary.
void Peer::ask_ahead(std::int64_t step) {
  if (ddp_ || ahead_) return;
  const std::int64_t next = schedule_.first_round_after(step - 1);
  const std::int64_t needed_at = next * schedule_.period - schedule_.lead;
  const std::int64_t ask_at = std::max(needed_at - std::max<std::int64_t>(1, schedule_.period / 10), (next - 1) * schedule_.period + 1);
  if (next <= agreed_round_ || next > schedule_.last_round(config_.train.steps) || step < ask_at || step >= needed_at) return;
  ahead_ = std::make_unique<Pending>(clock_, next, [c = coordinator_, next, d = after(round_timeout_)] { return c->agree(next, 0, d); });
}

// The group of each round, agreed just before the step after which its collective launches; asked
// again for the same step, it is a retry after a failed collective (of the round in effect).
std::optional<optim::Group> Peer::regroup(std::int64_t step) {
  if (stop_requested()) return std::nullopt;
  const bool retry = step == last_asked_;  // asked again for the same step: its collective failed
  last_asked_ = step;
  if (!retry && schedule_.ends_round(step - 1)) boundary(step - 1);
  if (!retry) ask_ahead(step);
  std::int64_t round = agreed_round_;
  if (!retry) {
    const auto due = schedule_.agreed_before(step);
    if (!due || *due <= agreed_round_) return std::nullopt;
    round = *due;
  }
  if (!retry && epoch_ > 0 && (ddp_ ? coordinator_->superseded(agreed_round_, epoch_) : coordinator_->abandoned(agreed_round_, epoch_))) {
    // The round before was agreed again without this peer after its collective went through here
    // (a peer died mid-way and no member told the decider in time that it applied the round: the
    // others retried it among themselves): its state is not theirs any more, so it catches up with
    // them as a peer left out does.
    return left_out(round, error(ErrorCode::kAborted, "round " + std::to_string(agreed_round_) +
                                                          " went through here but was retried without this peer"));
  }
  if (Status st = check_not_stranded(); !st.ok()) {
    if (Status saved = save_checkpoint(); !saved.ok()) spdlog::warn("no checkpoint: {}", saved.to_string());
    failure_ = st;
    return std::nullopt;
  }
  const Deadline deadline = after(round_timeout_);
  std::uint64_t failed = retry ? epoch_ : 0;
  bool unlinked = false;  // the failed epoch's links never came up here
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (failed > 0) links_->close_through(failed);
    Result<GroupView> view = error(ErrorCode::kTimeout, "not asked");
    if (ahead_ && ahead_->round() == round && failed == 0) {
      view = ahead_->get();
      ahead_.reset();
      if (view.ok() && view->epoch < epoch_) {
        failed = view->epoch;  // overtaken by a retry since: ask again after it
        unlinked = true;
        continue;
      }
      if (!view.ok() && view.status().code() == ErrorCode::kTimeout) view = coordinator_->agree(round, 0, deadline);
    } else {
      view = coordinator_->agree(round, failed, deadline, step, unlinked);
    }
    if (!view.ok() && view.status().code() == ErrorCode::kAborted) {
      if (stop_requested()) return std::nullopt;
      // A round that went through for the others took this peer's contribution in.
      return left_out(round, view.status(), failed > 0 && coordinator_->went_through(round, failed));
    }
    if (!view.ok()) {
      spdlog::warn("round {}: {}; this peer applies the round on its own", round, view.status().to_string());
      donor_->withdraw();  // its state leaves the members': what it kept serves no newcomer
      ++group_stats_.solo_rounds;
      session_.reset();  // its state is its own now: the members' updates no longer replay onto it
      agreed_round_ = round;
      epoch_ = 0;
      return solo_group(clock_);
    }
    if (view->epoch == epoch_ && !retry) {
      if (view->members == members_) {  // the same members as before: the same links go on
        agreed_round_ = round;
        current_round_ = round;
        return std::nullopt;
      }
      spdlog::warn("round {}: a group of other members under epoch {} (a newer leader's mistake): asking again", round, epoch_);
      failed = view->epoch;
      unlinked = true;
      continue;
    }
    if (!retry && failed == 0) {
      // The members change without a failure: what is in flight over the current links (CO2's
      // average) is let finish first, so every member keeps it alike.
      if (Status st = setup_.outer->settle(deadline); !st.ok()) spdlog::warn("round {}: {}", round, st.to_string());
    }
    auto g = links_->group(*view, after(std::min(round_timeout_, kLinkTimeout)),
                           [c = coordinator_, r = round, e = view->epoch] { return c->superseded(r, e); });
    if (g.ok()) {
      session_.reset();  // in a group: the donors are not needed any more
      agreed_round_ = round;
      current_round_ = round;
      epoch_ = view->epoch;
      members_ = view->members;
      if (start_size_ == 0) start_size_ = view->members.size();
      if (retry || view->members.size() != start_size_) spdlog::info("round {}: group of {} (epoch {})", round, view->members.size(), view->epoch);
      return std::move(*g);
    }
    spdlog::warn("round {}: linking the group of epoch {} failed: {}", round, view->epoch, g.status().to_string());
    failed = view->epoch;
    unlinked = true;
  }
  return std::nullopt;
}

Result<train::WorkerAccount> Peer::rounds() {
  last_boundary_ = clock_.now();
  last_boundary_step_ = worker_->steps_done();
  train::LoopOptions lo;
  lo.steps = config_.train.steps;
  lo.eval_every = config_.train.eval_every;
  lo.evaluate = env_.evaluate;
  lo.round_timeout = round_timeout_;
  lo.budget_period = train::budget_period(config_);
  train::LoopHooks hooks;
  hooks.pace = [host = env_.host](double measured_s) { return host->pace(measured_s); };
  hooks.keep_going = [&](std::int64_t next) {
    progress_ = next - 1;
    if (!failure_.ok()) return false;
    if (env_.alive && !env_.alive(next)) {
      crashed_ = true;
      return false;
    }
    if (stop_requested()) {
      spdlog::warn("stop requested: leaving the run before step {}", next);
      stopped_ = true;
      return false;
    }
    return true;
  };
  hooks.regroup = [&](std::int64_t step) { return regroup(step); };
  hooks.applied = [&](std::int64_t) {
    if (ddp_) return;
    coordinator_->applied(agreed_round_, epoch_);
    // What each member brought to this round: the work a leader's quorum expects of it next.
    const std::vector<std::int64_t> steps = setup_.outer->round_steps();
    if (steps.size() == members_.size()) {
      std::map<transport::PeerId, std::int64_t> work;
      for (std::size_t i = 0; i < steps.size(); ++i) work[members_[i].id] = steps[i];
      coordinator_->set_work(std::move(work));
    }
  };
  hooks.left_behind = [&] { return std::exchange(left_behind_, std::nullopt); };
  hooks.state_traffic = [&] { return std::make_pair(donor_->bytes_served(), join_stats_.bytes_received); };
  hooks.gossip_traffic = [&] { return gossip_.bytes(); };
  hooks.membership_traffic = [&] { return gossip_.membership_bytes_sent(); };
  hooks.record = [&](const nlohmann::json& rec) {
    nlohmann::json out = rec;
    out["peer"] = env_.name;
    const transport::TransportStats ts = opened_.transport->stats();
    out["relayed_bytes_sent"] = ts.relayed_bytes_sent;
    out["relay_forwarded_bytes"] = ts.relay_forwarded_bytes;
    if (join_stats_.joins > 0) join_stats_.write(out);
    donor_->write_record(out);
    if (Status st = env_.store->record(out); !st.ok() && failure_.ok()) failure_ = st;
    if (rec.contains("val_loss")) {
      if (rec["step"].get<std::int64_t>() == config_.train.steps) final_val_ = rec["val_loss"].get<double>();
      spdlog::info("step {}/{}: val loss {:.4f}, rounds {}, sent {:.2f} MB", rec["step"].get<std::int64_t>(), config_.train.steps,
                   rec["val_loss"].get<double>(), rec["rounds"].get<std::int64_t>(), rec["bytes_sent"].get<double>() / 1e6);
    }
  };
  return train::run_worker_loop(*worker_, setup_, clock_, lo, hooks);
}

Result<PeerOutcome> Peer::finish(const train::WorkerAccount& account) {
  const std::int64_t last_round = schedule_.last_round(config_.train.steps);
  if (!stopped_) {
    // A last agreement as a barrier: nobody tears its links down while a member may still be
    // receiving its share of the last round (a shaped link delivers after send() returned). Asked
    // from a thread of its own, so that a stop request ends the wait at once.
    Pending barrier(clock_, last_round + 1, [c = coordinator_, r = last_round + 1, d = after(round_timeout_)] { return c->agree(r, 0, d); });
    while (!barrier.done()) {
      if (stop_requested()) coordinator_->stop();
      clock_.sleep_for(50ms);
    }
    auto done = barrier.get();
    if (stop_requested()) {
      spdlog::warn("stop requested while waiting for the members to finish: leaving without them");
    } else if (!done.ok()) {
      spdlog::warn("the members did not all finish together: {}", done.status().to_string());
    }
  }
  if (env_.external && env_.external->stopped_mid_step) {
    spdlog::warn("stopped in the middle of a step of the caller's: no checkpoint of its parameters now (a resume starts from the last one)");
  } else if (Status st = save_checkpoint(); !st.ok()) {
    return st;
  }

  PeerOutcome out;
  out.steps = worker_->steps_done();
  out.rounds = account.rounds;
  out.skipped_rounds = account.skipped_rounds;
  const CoordinatorStats cs = coordinator_->stats();
  out.retries = cs.retries;
  out.finished = !stopped_ && worker_->steps_done() >= config_.train.steps;
  const at::Tensor flat = optim::flatten(worker_->model().parameters());
  out.params_digest = digest_of(bytes_of(flat)).hex();
  if (out.finished) out.shared_digest = digest_of(setup_.outer->save_shared()).hex();
  if (out.finished && env_.evaluate) out.final_val_loss = final_val_ ? *final_val_ : setup_.outer->evaluate_outer([&] { return worker_->evaluate(); });
  out.account = account;
  out.final_params = flat;
  nlohmann::json summary = account.to_json();
  summary["peer"] = env_.name;
  summary["run"] = spec_hash_.hex();
  summary["shard"] = rank_;
  summary["shards"] = world_;
  summary["finished"] = out.finished;
  summary["params_digest"] = out.params_digest;
  if (!out.shared_digest.empty()) summary["shared_digest"] = out.shared_digest;
  summary["retries"] = cs.retries;
  summary["dead_after_s"] = std::chrono::duration<double>(plan_.dead_after).count();
  summary["groups_led"] = cs.groups_announced;
  summary["left_out_by_this_leader"] = cs.left_out;
  summary["quorum_closes_by_this_leader"] = cs.quorum_closes;
  // All-or-nothing rounds: retried attempts this peer decided went through or abandoned, and rounds
  // that went through for the others while its collective failed (it caught up).
  summary["rounds_committed_by_this_peer"] = cs.committed;
  summary["rounds_abandoned_by_this_peer"] = cs.abandoned;
  summary["rounds_missed"] = cs.missed_commits;
  // Tokens that reached the shared model over what this machine trains alone in its time in the loop.
  summary["goodput"] = train::goodput(account);
  join_stats_.write(summary);
  group_stats_.write(summary);
  donor_->write_summary(summary);
  summary["dropped_messages"] = cs.dropped + static_cast<std::int64_t>(gossip_.dropped_messages());
  summary["refused_links"] = links_->refused_connections();
  summary["outbound_only"] = outbound_only_;
  const transport::TransportStats ts = opened_.transport->stats();
  summary["relayed_links"] = links_->relayed_links();
  summary["relayed_bytes_sent"] = ts.relayed_bytes_sent;
  summary["relayed_bytes_received"] = ts.relayed_bytes_received;
  summary["relay_forwarded_bytes"] = ts.relay_forwarded_bytes;
  summary["relay_pairs"] = ts.relay_pairs;
  if (out.final_val_loss) summary["final_val_loss"] = *out.final_val_loss;
  if (Status st = env_.store->write_summary(summary); !st.ok()) return st;
  setup_.outer.reset();
  setup_.comm.reset();
  gossip_.leave();
  return out;
}

}  // namespace gossamer::runtime

