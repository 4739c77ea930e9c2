#include "run/peer_runtime.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/signal.h"
#include "optim/flat_params.h"
#include "run/state_store.h"
#include "run/update_codec.h"
#include "train/memory.h"
#include "transport/shaped_link.h"

namespace gossamer::run {

using namespace std::chrono_literals;

namespace {
constexpr Nanos kLinkTimeout = std::chrono::seconds(30);  // to link up a group's members
// The link speed a donor assumes where it does not know its own (no --shape): 100 Mbit/s, a common
// access link; it only decides whether a newcomer is awaited at the next round (boundary()).
constexpr double kAssumedLinkBytesPerS = 12.5e6;
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

Peer::Peer(PeerPlan plan, PeerEnvironment env) : plan_(std::move(plan)), env_(std::move(env)), clock_(*env_.clock), gossip_(*env_.gossip) {}

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
  check_reachable(env_.gossip_announced, "gossip");
  heard_ = listen_for_spec(gossip_, clock_);
  board_ = JoinBoard::make(gossip_, clock_);
  if (plan_.first) {
    spec_ = Spec{*plan_.own_spec, plan_.wait_for};
  } else {
    auto got = receive_spec(*heard_, plan_.spec_timeout, plan_.stop);
    if (!got.ok()) return got.status();
    spec_ = std::move(*got);
    if (plan_.own_spec && *plan_.own_spec != spec_.toml) {
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
  ddp_ = outer_config_.method == optim::Method::kDdp;
  round_timeout_ = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(config_.train.round_timeout_s));
  spec_hash_ = digest_of(as_bytes(spec_.toml));
  if (config_.pipeline.enabled) {
    spdlog::info("run {} (a {} pipeline of {} stages, {} iterations)", spec_hash_.hex().substr(0, 16), config_.pipeline.mode, config_.pipeline.stages, config_.train.steps);
  } else {
    spdlog::info("run {} ({} on {} steps, rounds every {} steps)", spec_hash_.hex().substr(0, 16), config_.outer.method, config_.train.steps, schedule_.period);
  }
  // Answers carry the furthest round this peer knows of: its own, or (joining) the one it heard of.
  announcer_ = std::make_unique<SpecAnnouncer>(
      gossip_, spec_,
      [this] {
        std::lock_guard lock(heard_->mu);
        return std::max<std::int64_t>(current_round_.load(), heard_->latest_round);
      },
      clock_);
  if (env_.keep_spec) return env_.keep_spec(spec_.toml);
  return Status();
}

Status Peer::link_up() {
  auto opened = env_.open_links(spec_hash_);
  if (!opened.ok()) return opened.status();
  opened_ = std::move(*opened);
  {
    // ddp on Gloo: each group's rank 0 serves the rendezvous where its links listen.
    const auto c = opened_.bound.rfind(':');
    outer_config_.gloo.over_group_links = true;
    outer_config_.gloo.store_host = outer_config_.gloo.interface_host = opened_.bound.substr(0, c);
    outer_config_.gloo.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(std::min(round_timeout_, kLinkTimeout));
  }
  // join.keep_rounds counts outer rounds: Streaming DiLoCo's take all its fragments' (H inner steps).
  const std::int64_t outer_period = outer_config_.method == optim::Method::kStreamingDiLoCo ? config_.streaming_diloco.inner_steps : schedule_.period;
  log_ = std::make_shared<UpdateLog>(config_.join.keep_rounds * std::max<std::int64_t>(outer_period, 1), static_cast<std::uint64_t>(config_.join.keep_mb * 1e6),
                                     tap_);
  server_ = std::make_unique<StateServer>(clock_, log_);
  if (auto link = own_link_bytes_per_s()) server_->set_rate(*link * config_.join.serve_share);
  links_ = std::make_unique<PeerLinks>(
      *opened_.transport, [this](std::shared_ptr<transport::Link> l) { server_->serve(shape_state_link(std::move(l))); },
      [g = &gossip_](transport::PeerId id, const std::string& announced) { return reachable_address(*g, id, announced); }, clock_);
  if (plan_.poison) links_->poison(*plan_.poison);
  links_->tap_means(tap_);
  if (plan_.shape) {
    links_->shape(*plan_.shape);
    spdlog::info("links shaped like '{}'", plan_.shape->name);
  }
  CoordinatorOptions co;
  co.min_members = spec_.wait_for;
  co.straggler_grace = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(config_.train.round_timeout_s / 2));
  co.layout = [this](std::size_t members) { return layout_for(members); };
  check_reachable(opened_.announced, "links");
  if (outbound_only_ && ddp_ && config_.ddp.engine == "gloo") {
    return error(ErrorCode::kInvalidArgument, "ddp.engine = \"gloo\" needs every peer to accept connections (Gloo dials the other ranks "
                                              "itself), and this peer accepts none (behind NAT): run with ddp.engine = \"links\", or give "
                                              "this machine a port forward and --advertise");
  }
  // Announced without an address when nobody can dial it: the others then wait for its links.
  coordinator_ = Coordinator::make(gossip_, outbound_only_ ? std::string() : opened_.announced, co, clock_);
  auto corpus = env_.corpus(config_);
  if (!corpus.ok()) return corpus.status();
  corpus_ = std::move(*corpus);
  if (env_.set_threads && config_.train.threads > 0) torch::set_num_threads(static_cast<int>(config_.train.threads));
  return Status();
}

void Peer::check_reachable(const std::string& address, const std::string& what) {
  if (outbound_only_ || plan_.first || !env_.check_reachable) return;
  auto reach = env_.check_reachable({address}, plan_.stop);
  if (!reach.ok() && reach.status().code() == ErrorCode::kAborted) return;  // stopping: the caller sees it next
  if (!reach.ok()) {
    spdlog::warn("could not check whether the others can connect to this peer's {} ({}); assuming they can", what, reach.status().message());
    return;
  }
  if (reach->reachable && !reach->unchecked.empty()) {
    spdlog::info("a member ({}) would not dial this peer's {} at {}: {}; taken as reachable, as advertised", reach->helper, what, address,
                 fmt::format("{}", fmt::join(reach->unchecked, "; ")));
    return;
  }
  if (reach->reachable) {
    spdlog::info("reachable: a member ({}) connected back to this peer's {} at {}", reach->helper, what, address);
    return;
  }
  const std::string seen = reach->observed_ip.empty() ? std::string() : " (it sees this peer as " + reach->observed_ip + ")";
  spdlog::warn("a member{} could not connect back to this peer's {}: {}. Taking part as outbound-only: this peer dials the others, and "
               "its links to other outbound-only peers go through a relay. To accept connections, forward both ports to this machine "
               "and pass --advertise PUBLIC_ADDRESS:PORT (docs/deploy.md)",
               seen, what, fmt::format("{}", fmt::join(reach->failed, "; ")));
  outbound_only_ = true;
  if (Status st = gossip_.set_outbound_only(true); !st.ok()) spdlog::warn("gossip: {}", st.to_string());
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

std::optional<double> Peer::own_link_bytes_per_s() const { return env_.link_bytes_per_s ? env_.link_bytes_per_s : shaped_link_bytes_per_s(); }

const quant::EncodeOptions* Peer::layout_codec() const {
  switch (outer_config_.method) {
    case optim::Method::kDiLoCo:
      return &outer_config_.diloco.codec;
    case optim::Method::kStreamingDiLoCo:
      return &outer_config_.streaming.codec;
    case optim::Method::kCO2:
      return &outer_config_.co2.codec;
    case optim::Method::kDdp:
      return outer_config_.ddp_engine == "links" ? &outer_config_.ddp_codec : nullptr;
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

Status Peer::check_not_stranded() const {
  if (!outbound_only_) return Status();
  for (const auto& m : gossip_.members()) {
    if (!m.outbound_only && (m.state == transport::MemberState::kAlive || m.state == transport::MemberState::kSuspect)) return Status();
  }
  return error(ErrorCode::kUnavailable, "every peer that accepts connections has left or died, and this peer accepts none (behind NAT, "
                                        "outbound-only): it can reach no other member, nor they it. Start a peer with a reachable address "
                                        "(a public IP, or a port forward and --advertise; see docs/deploy.md), then restart this one with --resume");
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

// Fetches the newest state the members offer (asking for it until one arrives); kTimeout at the deadline.
Result<FetchResult> Peer::fetch_newest(Deadline deadline) {
  std::optional<Nanos> last_ask;
  // Peers that say they are not in the run (other newcomers, after the run ended) do not count.
  RunGoneWatch watch(gossip_, clock_, std::max<Nanos>(plan_.dead_after, std::chrono::seconds(3)),
                     [board = board_](transport::PeerId id) { return board->absent(id, std::chrono::seconds(5)); });
  for (;;) {
    if (deadline.expired(clock_)) return error(ErrorCode::kTimeout, "no member offered the run's state in time");
    if (stop_requested()) return error(ErrorCode::kAborted, "stop requested while joining");
    if (watch.gone()) {
      // Everyone it knew has left or died (the run finished): there is nothing to join.
      return error(ErrorCode::kUnavailable, "every member of the run has left or died: the run is over, nothing to join");
    }
    if (!last_ask || clock_.now() - *last_ask >= 1s) {
      board_->ask_to_join(own_link_bytes_per_s().value_or(0));
      last_ask = clock_.now();
    }
    if (auto offer = board_->newest_offer(500ms)) {  // (the members reach their boundary, and offer, a little apart)
      Status failed;
      const Nanos transfer_started = clock_.now();
      std::int64_t round_at_start = -1;  // where the run was (as announced): the rounds it goes on during the transfer tell a round's length
      {
        std::lock_guard lock(heard_->mu);
        round_at_start = heard_->latest_round;
      }
      auto session = StateFetch::open(*opened_.transport, offer->second, offer->first, deadline, clock_,
                                      [this](std::shared_ptr<transport::Link> l) { return shape_state_link(std::move(l)); });
      if (session.ok()) {
        // This peer's own link, where known (--shape, a simulated link), paces what it asks for,
        // whatever number of donors serve it: chunks then arrive one after another (each one kept
        // is one a restart need not fetch) instead of all at once at the end.
        if (auto own = own_link_bytes_per_s()) (*session)->set_rate(*own);
        (*session)->set_stop(plan_.stop);
        // Asking to join again every second until it takes part: the donors keep the snapshot and
        // the updates while it asks (its requests alone may come rounds apart over a slow link).
        (*session)->keep_alive([board = board_, rate = own_link_bytes_per_s().value_or(0)] { board->ask_to_join(rate); }, 1s);
        spdlog::info("fetching the state of round {} ({:.2f} MB) from {} donor(s)", offer->first, (*session)->manifest().total / 1e6,
                     (*session)->donors_left());
        // Into the run folder as it arrives (a simulated worker: memory that outlives its crash), so
        // that a newcomer killed mid-way resumes from what it verified.
        if (!env_.snapshot_store) env_.snapshot_store = make_memory_store();
        failed = (*session)->snapshot(*env_.snapshot_store, deadline);
        state_received_ += (*session)->bytes_received();
        auto got = failed.ok() ? (*session)->result(env_.snapshot_store) : Result<FetchResult>(failed);
        if (got.ok()) {
          FetchResult& f = *got;
          spdlog::info("fetched the state of round {} ({:.2f} MB) from {} donor(s) in {:.1f} s{}{}", offer->first, f.bytes.size() / 1e6, f.donors_used,
                       std::chrono::duration<double>(clock_.now() - join_started_).count(),
                       f.bytes_resumed > 0 ? fmt::format(", {:.2f} MB of it kept from before", f.bytes_resumed / 1e6) : std::string(),
                       f.donors_failed > 0 ? fmt::format(", {} failed", f.donors_failed) : std::string());
          session_ = std::move(*session);
          // Its rounds are asked for through the members that served it, until it is in a group.
          coordinator_->join_through(board_->offerers(offer->first));
          state_transfer_s_ = std::chrono::duration<double>(clock_.now() - transfer_started).count();
          transfer_started_ = transfer_started;
          round_at_transfer_ = round_at_start;
          transfer_rate_ = state_transfer_s_ > 0 ? static_cast<double>(f.bytes_received) / state_transfer_s_ : 0;
          state_snapshot_bytes_ = f.bytes.size();
          state_resumed_bytes_ += f.bytes_resumed;
          return std::move(f);
        }
        failed = got.status();
        if (failed.code() == ErrorCode::kAborted) return error(ErrorCode::kAborted, "stop requested while fetching the state (what arrived is kept for a restart)");
        if (failed.code() == ErrorCode::kResourceExhausted || failed.code() == ErrorCode::kIoError) return failed;  // no other snapshot fits better
      } else {
        failed = session.status();
      }
      spdlog::warn("fetching the state of round {} failed: {}; trying a newer one", offer->first, failed.to_string());
      board_->forget(offer->first);
    }
    clock_.sleep_for(50ms);
  }
}

// Takes a fetched state as this peer's own: the step, the parameters, the outer state and, for ddp,
// the inner optimizer (otherwise its own goes on). catch_up() then brings it to the members' round.
Status Peer::adopt(const FetchResult& f) {
  auto inner = load_shared_state(f.bytes, worker_->model().parameters(), *setup_.outer);
  if (!inner.ok()) return inner.status().with_context("loading the run's state");
  train::CheckpointState st = worker_->checkpoint_state("");
  st.step = f.manifest.step;
  st.next_batch = f.manifest.step;
  st.tokens_seen = 0;
  if (Status s2 = worker_->restore(st); !s2.ok()) return s2.with_context("loading the run's state");
  if (!inner->empty()) {
    if (Status s3 = worker_->load_optimizer_state(*inner); !s3.ok()) return s3.with_context("loading the run's state");
  }
  current_round_ = f.manifest.round;
  snapshot_round_ = f.manifest.round;
  ++joins_;
  log_->stop();  // what it kept (if it offered state before) is no longer its state's history
  server_->withdraw();
  snapshot_step_.reset();
  return Status();
}

Status Peer::replay(std::int64_t step, ByteView update) {
  // No method's update holds more than two values per parameter (noloco's pair means).
  auto numel = update_values(update, worker_->model().num_parameters() * 2);
  if (!numel.ok()) return numel.status().with_context("the update of step " + std::to_string(step));
  at::Tensor t = torch::empty({*numel}, torch::kFloat);
  if (Status st = decode_update(update, std::span<float>(t.data_ptr<float>(), static_cast<std::size_t>(*numel))); !st.ok()) {
    return st.with_context("the update of step " + std::to_string(step));
  }
  if (ddp_) {
    if (Status st = worker_->replay_gradients(step, t); !st.ok()) return st;
  }
  return setup_.outer->replay(step, t);
}

void Peer::record(std::int64_t step, const at::Tensor& update) {
  if (!log_ || !log_->recording()) return;
  const at::Tensor flat = update.detach().to(at::kCPU, at::kFloat).contiguous().reshape({-1});
  const std::span<const float> values(flat.data_ptr<float>(), static_cast<std::size_t>(flat.numel()));
  // In the codec's bytes the all-reduce sent when they decode to exactly this update, else in fp32.
  auto payloads = tap_->take(values);
  if (payloads) ++updates_kept_encoded_;
  log_->add(step, schedule_.rounds_over(step), static_cast<std::uint32_t>(world_), encode_update(values, payloads));
}

Status Peer::catch_up(Deadline deadline, bool slack) {
  if (!session_) return error(ErrorCode::kOutOfRange, "no donors to catch up from");
  // No method's update holds more than two values per parameter (noloco's pair means): larger ones
  // are refused before anything is set aside for them.
  session_->set_update_limit(static_cast<std::uint64_t>(worker_->model().num_parameters()) * 8 + kUpdateHeaderBytes);
  std::int64_t at = worker_->steps_done();
  std::optional<std::int64_t> intended;
  std::int64_t replayed = 0;
  std::size_t last_batch = std::numeric_limits<std::size_t>::max();  // updates listed the loop before
  for (;;) {
    if (stop_requested()) return error(ErrorCode::kAborted, "stop requested while catching up");
    if (deadline.expired(clock_)) return error(ErrorCode::kTimeout, "catching up with the members took too long");
    const std::uint64_t before = session_->bytes_received();
    auto index = session_->updates_after(at, deadline);
    if (!index.ok()) return index.status();
    Status failed;
    // Not gaining on the members (its link carries a round's update no faster than a round goes): it
    // names a round now, so that they wait for it there (its link would set their pace anyway). Seen
    // when the list did not shrink over the last batch, or foreseen before the first one from the
    // pace its snapshot came at and the rounds the run went on meanwhile (over a slow link even the
    // first updates may outlast the run).
    bool foreseen = false;
    if (!index->empty() && last_batch == std::numeric_limits<std::size_t>::max() && transfer_rate_ > 0 && round_at_transfer_ >= 0) {
      const std::int64_t advanced = schedule_.rounds_over(index->back().step) - round_at_transfer_;
      const double elapsed_s = std::chrono::duration<double>(clock_.now() - transfer_started_).count();
      double mean_bytes = 0;
      for (const auto& u : *index) mean_bytes += static_cast<double>(u.total) / static_cast<double>(index->size());
      foreseen = advanced >= 2 && mean_bytes / transfer_rate_ >= 0.8 * elapsed_s / static_cast<double>(advanced);
    }
    // The members went past the round it named (it was named too late, or the updates since came
    // slower than the rounds): it names a later one.
    const bool passed = intended && !index->empty() && schedule_.first_round_after(index->back().step) > *intended;
    if (!index->empty() && (passed || (!intended && (foreseen || index->size() >= last_batch))) && index->size() < kMaxIndexEntries) {
      intended = std::min(schedule_.first_round_after(index->back().step) + 1, schedule_.last_round(config_.train.steps));
      coordinator_->intend(*intended);
      spdlog::info("catching up gains nothing on the members ({} update(s) to fetch again): they wait for this peer at round {}", index->size(),
                   *intended);
    }
    if (!index->empty()) {
      last_batch = index->size();
      // A few at a time (about two of the largest): over a slow link the whole list at once may
      // outlast the run, while a small batch soon shows whether the list shrinks.
      std::uint64_t largest = 0, taken = 0;
      for (const auto& u : *index) largest = std::max(largest, u.total);
      std::size_t count = 0;
      while (count < index->size() && (count == 0 || taken + (*index)[count].total <= 2 * largest)) taken += (*index)[count++].total;
      index->resize(count);
      auto bytes = session_->updates(*index, deadline);
      failed = bytes.status();
      for (std::size_t k = 0; bytes.ok() && k < bytes->size(); ++k) {
        failed = replay((*index)[k].step, (*bytes)[k]);
        if (!failed.ok()) break;
        at = (*index)[k].step;
        ++replayed;
      }
    }
    state_received_ += session_->bytes_received() - before;
    if (!failed.ok()) return failed.with_context("catching up");
    if (!index->empty()) continue;
    // Nothing newer: caught up. This peer says now which round it takes part in, so that the members
    // wait for it there, and replays up to that round's start: ddp's members hold one state only at
    // a round's end, and with `slack` (it was not in time for the round it named before) it names
    // the round after the next, whose group is not being agreed yet.
    if (!intended) {
      intended = std::min(schedule_.first_round_after(at) + (slack ? 1 : 0), schedule_.last_round(config_.train.steps));
      coordinator_->intend(*intended);
    }
    if (schedule_.first_round_after(at) < *intended || (ddp_ && at % schedule_.period != 0)) {
      clock_.sleep_for(20ms);
      continue;
    }
    break;
  }
  if (!ddp_) worker_->move_to(at);  // (ddp's replayed steps moved it)
  const std::int64_t first = schedule_.first_round_after(at);
  agreed_round_ = first - 1;
  current_round_ = schedule_.rounds_over(at);
  updates_replayed_ += replayed;
  join_rounds_behind_ = schedule_.rounds_over(at) - snapshot_round_;
  state_fetch_s_ = std::chrono::duration<double>(clock_.now() - join_started_).count();
  if (intended != first) coordinator_->intend(first);  // (a run near its end: the last round)
  spdlog::info("joined at round {} (step {}); taking part from round {} (caught up: {} update(s) replayed, the run went on {} round(s) while the "
               "state came, {:.1f} s)",
               snapshot_round_, at, first, replayed, join_rounds_behind_, state_fetch_s_);
  return Status();
}

namespace {
// Catching up failed in a way a newer snapshot mends: the donors' logs no longer reach back, none of
// them could serve an update any more, or what they served does not replay (ddp: a step missing).
bool needs_newer_snapshot(const Status& st) {
  return st.code() == ErrorCode::kOutOfRange || st.code() == ErrorCode::kUnavailable || st.code() == ErrorCode::kDataLoss ||
         st.code() == ErrorCode::kMalformed;
}
}  // namespace

Status Peer::join(Deadline deadline) {
  for (;;) {
    auto got = fetch_newest(deadline);
    if (!got.ok()) return got.status();
    if (Status st = adopt(*got); !st.ok()) return st;
    Status st = catch_up(deadline);
    if (st.ok() && env_.snapshot_store) env_.snapshot_store->clear();
    if (!needs_newer_snapshot(st)) return st;
    spdlog::warn("{}: this peer fell more than join.keep_rounds ({}) rounds behind while the state came; fetching a newer one "
                 "(raise join.keep_rounds when the state takes this long)", st.message(), config_.join.keep_rounds);
    board_->forget(got->manifest.round);
    session_.reset();
  }
}

Status Peer::join_or_start() {
  // A run that is already training is joined through a state transfer; otherwise round 0 says who
  // starts, and so each peer's shard.
  if (!plan_.first) {
    // Asked of a few more members (the first answer may have come from a peer waiting like this one).
    {
      std::lock_guard lock(heard_->mu);
      heard_->asked.reset();
    }
    ask_for_spec(*heard_);
    std::unique_lock lock(heard_->mu);
    heard_->signal->wait(lock, after(1500ms), [&] { return heard_->latest_round >= 0; });
  }
  bool joining = heard_->latest_round >= 0;
  if (!joining) {
    auto started = wait_for_start();
    if (!started.ok()) return started.status();
    start_ = std::move(*started);
    joining = !start_;
  }
  if (joining) {
    spdlog::info("the run is under way: fetching its state to join");
    join_started_ = clock_.now();
    auto got = fetch_newest(after(plan_.start_timeout));
    if (!got.ok()) return got.status().with_context("joining the run");
    fetched_ = std::move(*got);
    world_ = static_cast<int>(fetched_->manifest.shards);
    rank_ = static_cast<int>(gossip_.self().value % static_cast<std::uint64_t>(world_));
    // A peer that resumes goes on with the shard it trained (a new id would draw another one).
    if (plan_.resumed && plan_.resumed->shards == world_ && plan_.resumed->shard >= 0) rank_ = plan_.resumed->shard;
  } else {
    rank_ = start_->rank_of(gossip_.self());
    world_ = static_cast<int>(start_->members.size());
  }
  spdlog::info("training on shard {} of {}", rank_, world_);

  worker_ = std::make_unique<train::Worker>(config_, corpus_->dataset, rank_, world_, clock_);
  if (const auto* codec = layout_codec()) layout_payload_ = static_cast<double>(worker_->model().num_parameters()) * quant::bits_per_value(*codec) / 8;
  optim::Group first_group = solo_group(clock_);
  if (start_) {
    auto g = links_->group(*start_, after(std::min(round_timeout_, kLinkTimeout)));
    if (!g.ok()) return g.status().with_context("linking the starting group");
    first_group = std::move(*g);
    epoch_ = start_->epoch;
    members_ = start_->members;
    start_size_ = start_->members.size();
  }
  auto setup = optim::make_outer_optimizer(outer_config_, train::param_blocks(worker_->model()), std::move(first_group));
  if (!setup.ok()) return setup.status();
  setup_ = std::move(*setup);
  setup_.outer->record_updates([this](std::int64_t step, const at::Tensor& update) { record(step, update); });

  if (plan_.resumed) {
    // Its own checkpoint first (inner optimizer included); a newer state from the members, if any,
    // then replaces the shared part.
    if (Status st = worker_->restore(*plan_.resumed); !st.ok()) return st.with_context("resuming from " + plan_.resumed_from);
    if (Status st = setup_.outer->load(plan_.resumed->outer_state); !st.ok()) return st.with_context("resuming from " + plan_.resumed_from);
    agreed_round_ = schedule_.first_round_after(worker_->steps_done()) - 1;
    spdlog::info("resumed from {} at step {}", plan_.resumed_from, worker_->steps_done());
  }
  if (fetched_) {
    // The snapshot, unless this peer resumed from a checkpoint newer than it: then the updates the
    // donors keep since its own step bring it to the members (its checkpoint is the state they
    // shared at that step). A newer snapshot where they do not reach back.
    if (!plan_.resumed || fetched_->manifest.step > worker_->steps_done()) {
      if (Status st = adopt(*fetched_); !st.ok()) return st;
    } else {
      current_round_ = agreed_round_;
      snapshot_round_ = schedule_.rounds_over(worker_->steps_done());
    }
    Status st = catch_up(after(plan_.start_timeout));
    if (needs_newer_snapshot(st)) {
      spdlog::warn("{}: fetching a newer state", st.message());
      const std::int64_t round = fetched_->manifest.round;
      fetched_.reset();  // (a view into the store, which the next transfer reuses)
      board_->forget(round);
      session_.reset();
      st = join(after(plan_.start_timeout));
    }
    if (!st.ok()) return st.with_context("joining the run");
    // Taken: a later start of this peer resumes from its checkpoints, not from this transfer.
    if (env_.snapshot_store) env_.snapshot_store->clear();
    fetched_.reset();
  } else {
    current_round_ = agreed_round_;
  }
  last_checkpoint_ = worker_->steps_done();
  if (env_.open_records) return env_.open_records(plan_.resumed ? std::optional<std::int64_t>(worker_->steps_done()) : std::nullopt);
  return Status();
}

Status Peer::save_checkpoint() {
  if (Status st = setup_.outer->settle(after(round_timeout_)); !st.ok()) spdlog::warn("checkpointing without the average in flight: {}", st.to_string());
  if (!env_.save_checkpoint) return Status();
  train::CheckpointState cs = worker_->checkpoint_state(spec_.toml);
  cs.outer_state = setup_.outer->save();
  cs.shard = rank_;
  cs.shards = world_;
  return env_.save_checkpoint(cs);
}

// Just after a round. While a newcomer waits, this peer offers a snapshot of the state it shares
// with the other members (a new one only when the updates it keeps no longer reach back to the one
// it offers) and keeps the updates it applies from then on, so that a newcomer whose state takes
// rounds to arrive catches up instead of fetching again; once no newcomer has asked for anything for
// three rounds it drops both (a newcomer paces its requests to its link where it knows it, and over
// TCP a donor answers the next request only once the last answer is on its way, so a transfer under
// way keeps asking). The checkpoint is written when due.
void Peer::boundary(std::int64_t done_step) {
  const std::int64_t done = schedule_.rounds_over(done_step);
  const auto newcomers = board_->waiting();
  const std::int64_t every = config_.train.checkpoint_every;
  const bool checkpoint_due = every > 0 && done_step / every > last_checkpoint_ / every;
  if (done_step > last_boundary_step_) round_length_ = (clock_.now() - last_boundary_) * schedule_.period / (done_step - last_boundary_step_);
  last_boundary_ = clock_.now();
  last_boundary_step_ = done_step;
  const std::uint64_t requests = server_->requests();
  idle_boundaries_ = !newcomers.empty() || requests != requests_seen_ ? 0 : idle_boundaries_ + 1;
  requests_seen_ = requests;
  if (log_->recording() && idle_boundaries_ >= 3) {
    spdlog::info("round {}: no newcomer asked for the state for 3 rounds; the snapshot and the updates kept ({:.2f} MB at most) are dropped", done,
                 log_->peak_bytes() / 1e6);
    log_->stop();
    server_->withdraw();
    snapshot_step_.reset();
  }
  // CO2's average in flight is part of what is shared: in, while a newcomer may need it.
  const bool settle = log_->recording() || !newcomers.empty();
  const Status settled = settle ? setup_.outer->settle(after(round_timeout_)) : Status();
  bool fresh_snapshot = false;
  if (!newcomers.empty()) {
    const bool usable = snapshot_step_ && log_->recording() && log_->complete_after() <= *snapshot_step_;
    if (!settled.ok()) {
      spdlog::warn("round {}: no state offered to newcomers: {}", done, settled.to_string());
    } else if (!usable) {
      // ddp shares its inner optimizer too, in bytes every member writes alike (Worker::optimizer_state).
      const Bytes inner = ddp_ ? worker_->optimizer_state() : Bytes();
      Bytes state = encode_shared_state(worker_->model().parameters(), *setup_.outer, ByteView(inner), ddp_);
      // Chunks of 64 KiB to 1 MiB, at least 16 where the state allows, so that even a small state is
      // spread over the donors (every donor cuts the same size alike: it depends on the size only).
      const std::uint32_t chunk = snapshot_chunk_bytes(state.size());
      server_->offer(Snapshot::make(done, done_step, static_cast<std::uint32_t>(world_), std::move(state), chunk));
      log_->start(done_step);  // (one recording already goes on, reaching back further)
      snapshot_step_ = done_step;
      fresh_snapshot = true;
    }
    if (snapshot_step_ && !outbound_only_) board_->offer(schedule_.rounds_over(*snapshot_step_), opened_.announced);  // nobody could dial it for the state
    // A state that should arrive well within a round: the newcomers are awaited at the next one (as
    // leader, for a while), so they join at once. A larger one: they catch up and say when they come.
    if (fresh_snapshot && round_length_ > Nanos{0}) {
      for (transport::PeerId id : newcomers) {
        // The slower of this donor's serving and the newcomer's own link (as it says), where known.
        double rate = server_->rate() > 0 ? server_->rate() : kAssumedLinkBytesPerS;
        if (auto theirs = board_->link_of(id)) rate = std::min(rate, std::max(*theirs, 1e3));
        const double estimate_s = static_cast<double>(server_->offered_bytes()) / rate;
        // ddp's updates (every step's gradients) outweigh its state within a round: its newcomers are
        // always awaited, however long their state takes; the others catch up instead.
        if (2 * estimate_s > std::chrono::duration<double>(round_length_).count() && !ddp_) continue;
        const double wait_s = std::min(std::max(2.0, 4 * estimate_s), std::chrono::duration<double>(round_timeout_).count() / 2);
        const Nanos wait = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(wait_s));
        coordinator_->expect(schedule_.first_round_after(done_step), id, wait);
      }
    }
  }

  if (checkpoint_due) {
    if (Status st = save_checkpoint(); !st.ok() && failure_.ok()) failure_ = st;
    last_checkpoint_ = done_step;
  }
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

// Left out of a round (too slow, or a newcomer not in time for the round it named). A newcomer still
// linked to its donors catches up from the updates they keep; otherwise it joins again as a newcomer
// does.
std::optional<optim::Group> Peer::left_out(std::int64_t round, const Status& why) {
  spdlog::warn("round {}: {}; catching up with the members", round, why.to_string());
  if (!session_) join_started_ = clock_.now();
  Status st = catch_up(after(round_timeout_), /*slack=*/true);
  if (needs_newer_snapshot(st)) {
    session_.reset();
    join_started_ = clock_.now();
    st = join(after(round_timeout_));
  }
  if (!st.ok()) failure_ = st.with_context("catching up after being left out");
  epoch_ = 0;
  return solo_group(clock_);
}

// The group of each round, agreed just before the step after which its collective launches; asked
// again for the same step, it is a retry after a failed collective (of the round in effect).
std::optional<optim::Group> Peer::regroup(std::int64_t step) {
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
  if (!retry && epoch_ > 0 && coordinator_->superseded(agreed_round_, epoch_)) {
    // The round before was agreed again without this peer after its collective went through here
    // (a peer died mid-way: the others failed and retried it among themselves): its state is not
    // theirs any more, so it catches up with them as a peer left out does.
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
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (failed > 0) links_->close_through(failed);
    Result<GroupView> view = error(ErrorCode::kTimeout, "not asked");
    if (ahead_ && ahead_->round() == round && failed == 0) {
      view = ahead_->get();
      ahead_.reset();
      if (view.ok() && view->epoch < epoch_) {
        failed = view->epoch;  // overtaken by a retry since: ask again after it
        continue;
      }
      if (!view.ok() && view.status().code() == ErrorCode::kTimeout) view = coordinator_->agree(round, 0, deadline);
    } else {
      view = coordinator_->agree(round, failed, deadline, step);
    }
    if (!view.ok() && view.status().code() == ErrorCode::kAborted) {
      if (stop_requested()) return std::nullopt;
      return left_out(round, view.status());
    }
    if (!view.ok()) {
      spdlog::warn("round {}: {}; this peer applies the round on its own", round, view.status().to_string());
      log_->stop();  // its state leaves the members': what it kept serves no newcomer
      server_->withdraw();
      snapshot_step_.reset();
      ++solo_rounds_;
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
  hooks.pace = env_.pace;
  hooks.keep_going = [&](std::int64_t next) {
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
  hooks.state_traffic = [&] { return std::make_pair(server_->bytes_served(), state_received_); };
  hooks.gossip_traffic = [&] { return gossip_.bytes(); };
  hooks.membership_traffic = [&] { return gossip_.membership_bytes_sent(); };
  hooks.record = [&](const nlohmann::json& rec) {
    nlohmann::json out = rec;
    out["peer"] = env_.name;
    const transport::TransportStats ts = opened_.transport->stats();
    out["relayed_bytes_sent"] = ts.relayed_bytes_sent;
    out["relay_forwarded_bytes"] = ts.relay_forwarded_bytes;
    if (joins_ > 0) {
      out["joins"] = joins_;
      out["state_fetch_s"] = state_fetch_s_;
      out["state_transfer_s"] = state_transfer_s_;
      out["state_snapshot_bytes"] = state_snapshot_bytes_;
      out["state_resumed_bytes"] = state_resumed_bytes_;
      out["join_rounds_behind"] = join_rounds_behind_;
      out["updates_replayed"] = updates_replayed_;
    }
    if (log_->peak_bytes() > 0) {
      out["update_log_bytes"] = log_->bytes();
      out["updates_kept_encoded"] = updates_kept_encoded_;
    }
    if (env_.record) {
      if (Status st = env_.record(out); !st.ok() && failure_.ok()) failure_ = st;
    }
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
  if (Status st = save_checkpoint(); !st.ok()) return st;

  PeerOutcome out;
  out.steps = worker_->steps_done();
  out.rounds = account.rounds;
  out.skipped_rounds = account.skipped_rounds;
  const CoordinatorStats cs = coordinator_->stats();
  out.retries = cs.retries;
  out.finished = !stopped_ && worker_->steps_done() >= config_.train.steps;
  const at::Tensor flat = optim::flatten(worker_->model().parameters());
  out.params_digest = digest_of(bytes_of(flat)).hex();
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
  summary["retries"] = cs.retries;
  summary["dead_after_s"] = std::chrono::duration<double>(plan_.dead_after).count();
  summary["groups_led"] = cs.groups_announced;
  summary["left_out_by_this_leader"] = cs.left_out;
  summary["solo_rounds"] = solo_rounds_;
  // Tokens that reached the shared model over what this machine trains alone in its time in the loop.
  summary["goodput"] = train::goodput(account);
  summary["joins"] = joins_;
  summary["state_fetch_s"] = state_fetch_s_;
  summary["state_transfer_s"] = state_transfer_s_;
  summary["state_snapshot_bytes"] = state_snapshot_bytes_;
  summary["state_resumed_bytes"] = state_resumed_bytes_;
  summary["join_rounds_behind"] = join_rounds_behind_;
  summary["updates_replayed"] = updates_replayed_;
  summary["update_log_peak_bytes"] = log_->peak_bytes();
  summary["update_log_dropped"] = log_->dropped();
  summary["updates_kept_encoded"] = updates_kept_encoded_;
  summary["state_bytes_served"] = server_->bytes_served();
  summary["state_serve_throttled_s"] = server_->throttled_s();
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
  if (env_.write_summary) {
    if (Status st = env_.write_summary(summary); !st.ok()) return st;
  }
  setup_.outer.reset();
  setup_.comm.reset();
  gossip_.leave();
  return out;
}

}  // namespace gossamer::run
