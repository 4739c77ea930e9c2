// Peer (peer_runtime.h), joining in both its roles: a newcomer's (the newest snapshot fetched,
// adopted and caught up by replaying the members' updates since; a member left out of a round goes
// the same way) and a member's (at each round's boundary it offers its state to newcomers, keeps the
// updates they will replay, and checkpoints); and join_or_start, which takes one or the other.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "optim/age_gate.h"
#include "optim/flat_params.h"
#include "runtime/peer_runtime.h"
#include "runtime/state_store.h"
#include "runtime/update_codec.h"

namespace gossamer::runtime {

using namespace std::chrono_literals;

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
        failed = (*session)->snapshot(*env_.store->snapshots(), deadline);
        join_stats_.bytes_received += (*session)->bytes_received();
        auto got = failed.ok() ? (*session)->result(env_.store->snapshots()) : Result<FetchResult>(failed);
        if (got.ok()) {
          FetchResult& f = *got;
          spdlog::info("fetched the state of round {} ({:.2f} MB) from {} donor(s) in {:.1f} s{}{}", offer->first, f.bytes.size() / 1e6, f.donors_used,
                       std::chrono::duration<double>(clock_.now() - join_started_).count(),
                       f.bytes_resumed > 0 ? fmt::format(", {:.2f} MB of it kept from before", f.bytes_resumed / 1e6) : std::string(),
                       f.donors_failed > 0 ? fmt::format(", {} failed", f.donors_failed) : std::string());
          session_ = std::move(*session);
          // Its rounds are asked for through the members that served it, until it is in a group.
          coordinator_->join_through(board_->offerers(offer->first));
          join_stats_.transfer_s = std::chrono::duration<double>(clock_.now() - transfer_started).count();
          join_stats_.transfer_started = transfer_started;
          join_stats_.round_at_transfer = round_at_start;
          join_stats_.transfer_rate = join_stats_.transfer_s > 0 ? static_cast<double>(f.bytes_received) / join_stats_.transfer_s : 0;
          join_stats_.snapshot_bytes = f.bytes.size();
          join_stats_.resumed_bytes += f.bytes_resumed;
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
  ++join_stats_.joins;
  donor_->withdraw();  // what it kept (if it offered state before) is no longer its state's history
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

Status Peer::catch_up(Deadline deadline, bool slack) {
  if (!session_) return error(ErrorCode::kOutOfRange, "no donors to catch up from");
  // No method's update holds more than two values per parameter (noloco's pair means): larger ones
  // are refused before anything is set aside for them.
  session_->set_update_limit(static_cast<std::uint64_t>(worker_->model().num_parameters()) * 8 + kUpdateHeaderBytes);
  std::int64_t at = worker_->steps_done();
  std::optional<std::int64_t> intended;
  bool to_the_end = false;
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
    const bool foreseen = last_batch == std::numeric_limits<std::size_t>::max() && foresee_no_gain(*index);
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
    join_stats_.bytes_received += session_->bytes_received() - before;
    if (!failed.ok()) return failed.with_context("catching up");
    if (!index->empty()) continue;
    // Nothing newer: caught up. This peer says now which round it takes part in, so that the members
    // wait for it there, and replays up to that round's start: ddp's members hold one state only at
    // a round's end, and with `slack` (it was not in time for the round it named before) it names
    // the round after the next, whose group is not being agreed yet.
    const std::int64_t last = schedule_.last_round(config_.train.steps);
    if (!intended) {
      intended = std::min(schedule_.first_round_after(at) + (slack ? 1 : 0), last);
      // No round left for it (it was not in time for the last one): it replays the members' updates
      // through the run's end instead, and they wait for it at their closing agreement (round last + 1).
      to_the_end = slack && schedule_.first_round_after(at) + 1 > last;
      coordinator_->intend(to_the_end ? last + 1 : *intended);
    }
    const bool more = to_the_end ? schedule_.first_round_after(at) <= last : schedule_.first_round_after(at) < *intended;
    if (more || (ddp_ && at % schedule_.period != 0)) {
      clock_.sleep_for(20ms);
      continue;
    }
    break;
  }
  take_part_after(at, intended, replayed);
  return Status();
}

bool Peer::foresee_no_gain(const std::vector<UpdateInfo>& index) const {
  if (index.empty() || join_stats_.transfer_rate <= 0 || join_stats_.round_at_transfer < 0) return false;
  const std::int64_t advanced = schedule_.rounds_over(index.back().step) - join_stats_.round_at_transfer;
  const double elapsed_s = std::chrono::duration<double>(clock_.now() - join_stats_.transfer_started).count();
  double mean_bytes = 0;
  for (const auto& u : index) mean_bytes += static_cast<double>(u.total) / static_cast<double>(index.size());
  return advanced >= 2 && mean_bytes / join_stats_.transfer_rate >= 0.8 * elapsed_s / static_cast<double>(advanced);
}

void Peer::take_part_after(std::int64_t at, std::optional<std::int64_t> intended, std::int64_t replayed) {
  // The members are already some steps into the round after `at` (the donors said where): this peer
  // starts there with them, leaving out the slots they computed before it arrived (as a member
  // slower than the fastest does), or the whole group would wait at the round's end while it
  // computed them. Never past the step before the next round's group is due. (ddp: its replayed
  // steps moved it, to a round's end.)
  std::int64_t start = at;
  if (!ddp_) {
    const std::int64_t due = schedule_.first_round_after(at) * schedule_.period - schedule_.lead;
    if (config_.join.align) start = std::min(std::clamp(session_->donors_step(), at, std::max(at, due - 1)), std::max(at, config_.train.steps));
    worker_->move_to(start);
  }
  const std::int64_t first = schedule_.first_round_after(at);
  agreed_round_ = first - 1;
  current_round_ = schedule_.rounds_over(at);
  join_stats_.updates_replayed += replayed;
  join_stats_.rounds_behind = schedule_.rounds_over(at) - snapshot_round_;
  join_stats_.fetch_s = std::chrono::duration<double>(clock_.now() - join_started_).count();
  if (intended != first) coordinator_->intend(first);  // (a run near its end: the last round)
  spdlog::info("joined at round {} (step {}); taking part from round {} (caught up: {} update(s) replayed, the run went on {} round(s) while the "
               "state came, {:.1f} s){}",
               snapshot_round_, at, first, replayed, join_stats_.rounds_behind, join_stats_.fetch_s,
               start > at ? fmt::format("; starting at step {} with the members", start) : std::string());
}

namespace {
// Catching up failed in a way a newer snapshot mends: the donors' logs no longer reach back, none of
// them could serve an update any more, or what they served does not replay (ddp: a step missing).
bool needs_newer_snapshot(const Status& st) {
  return st.code() == ErrorCode::kOutOfRange || st.code() == ErrorCode::kUnavailable || st.code() == ErrorCode::kDataLoss ||
         st.code() == ErrorCode::kMalformed;
}
}  // namespace

Status Peer::join(Deadline deadline, bool slack) {
  for (;;) {
    auto got = fetch_newest(deadline);
    if (!got.ok()) return got.status();
    if (Status st = adopt(*got); !st.ok()) return st;
    Status st = catch_up(deadline, slack);
    if (st.ok()) env_.store->snapshots()->clear();
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

  if (env_.external) {
    env_.external->shard = rank_;
    env_.external->shards = world_;
  }
  worker_ = env_.external ? std::make_unique<train::Worker>(config_, env_.external, clock_)
                         : std::make_unique<train::Worker>(config_, corpus_->dataset, rank_, world_, clock_);
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
  setup_.outer->record_updates([this](std::int64_t step, const at::Tensor& update) {
    donor_->record(step, schedule_.rounds_over(step), static_cast<std::uint32_t>(world_), update);
  });
  if (env_.external) env_.external->snapshot = [this]() -> Result<train::CheckpointState> { return checkpoint_state(); };

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
    env_.store->snapshots()->clear();
    fetched_.reset();
  } else {
    current_round_ = agreed_round_;
  }
  last_checkpoint_ = worker_->steps_done();
  return env_.store->open_records(plan_.resumed ? std::optional<std::int64_t>(worker_->steps_done()) : std::nullopt);
}

void Peer::settle_for_checkpoint() {
  if (Status st = setup_.outer->settle(after(round_timeout_)); !st.ok()) spdlog::warn("checkpointing without the average in flight: {}", st.to_string());
}

train::CheckpointState Peer::checkpoint_state() {
  settle_for_checkpoint();
  train::CheckpointState cs = worker_->checkpoint_state(spec_.toml);
  cs.outer_state = setup_.outer->save();
  cs.shard = rank_;
  cs.shards = world_;
  return cs;
}

Status Peer::save_checkpoint() {
  if (!env_.store->keeps_checkpoints()) {
    settle_for_checkpoint();  // (the state it would hold is the members' all the same)
    return Status();
  }
  return env_.store->save_checkpoint(checkpoint_state());
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
  donor_->at_boundary(done, !newcomers.empty());
  // CO2's average in flight is part of what is shared: in, while a newcomer may need it.
  const bool settle = donor_->recording() || !newcomers.empty();
  const Status settled = settle ? setup_.outer->settle(after(round_timeout_)) : Status();
  if (!newcomers.empty()) {
    bool fresh_snapshot = false;
    if (!settled.ok()) {
      spdlog::warn("round {}: no state offered to newcomers: {}", done, settled.to_string());
    } else if (donor_->needs_snapshot()) {
      // ddp shares its parameters and inner optimizer too, in bytes every member writes alike
      // (Worker::optimizer_state).
      const Bytes inner = newcomer_takes_inner_state() ? worker_->optimizer_state() : Bytes();
      donor_->offer(done, done_step, static_cast<std::uint32_t>(world_),
                    encode_shared_state(worker_->model().parameters(), *setup_.outer, ByteView(inner), newcomer_takes_inner_state()));
      fresh_snapshot = true;
    }
    const std::optional<std::int64_t> offered = donor_->snapshot_step();
    if (offered && !outbound_only_) board_->offer(schedule_.rounds_over(*offered), opened_.announced);  // nobody could dial it for the state
    if (fresh_snapshot && round_length_ > Nanos{0}) await_newcomers(newcomers, done_step);
  }
  if (checkpoint_due) {
    if (Status st = save_checkpoint(); !st.ok() && failure_.ok()) failure_ = st;
    last_checkpoint_ = done_step;
  }
}

void Peer::await_newcomers(const std::vector<transport::PeerId>& newcomers, std::int64_t done_step) {
  for (transport::PeerId id : newcomers) {
    // The slower of this donor's serving and the newcomer's own link (as it says), where known.
    const double estimate_s = donor_->transfer_estimate_s(board_->link_of(id));
    // ddp's updates (every step's gradients) outweigh its state within a round: its newcomers are
    // always awaited, however long their state takes; the others catch up instead.
    if (2 * estimate_s > std::chrono::duration<double>(round_length_).count() && !ddp_) continue;
    const double wait_s = std::min(std::max(2.0, 4 * estimate_s), std::chrono::duration<double>(round_timeout_).count() / 2);
    const Nanos wait = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(wait_s));
    coordinator_->expect(schedule_.first_round_after(done_step), id, wait);
  }
}

// Left out of a round (too slow, or a newcomer not in time for the round it named). A newcomer still
// linked to its donors catches up from the updates they keep; otherwise it joins again as a newcomer
// does.
std::optional<optim::Group> Peer::left_out(std::int64_t round, const Status& why, bool merged) {
  spdlog::warn("round {}: {}; catching up with the members", round, why.to_string());
  // What it computed since the shared weights it holds (its drift from them; none for the methods
  // whose model is the shared state): set aside, unless the round took it in already.
  auto params = worker_->model().parameters();
  at::Tensor drift;
  const std::int64_t from_round = current_round_;
  if (!merged && config_.outer.late_work == train::LateWork::kMerge) {
    at::Tensor local = optim::flatten(params);
    at::Tensor shared;
    setup_.outer->evaluate_outer([&] {
      shared = optim::flatten(params);
      return 0.0;
    });
    drift = local - shared;
    if (!drift.abs().max().gt(0).item<bool>()) drift = at::Tensor();
  }
  if (!session_) join_started_ = clock_.now();
  Status st = catch_up(after(round_timeout_), /*slack=*/true);
  if (needs_newer_snapshot(st)) {
    session_.reset();
    join_started_ = clock_.now();
    st = join(after(round_timeout_), /*slack=*/true);
  }
  if (!st.ok()) failure_ = st.with_context("catching up after being left out");
  train::LeftBehind left;
  if (merged) {
    left.merged = 1.0;
  } else {
    // A late contribution: merged into this peer's next one at the weight of its age (the rounds the
    // members applied over the weights it started from), or dropped (outer.late_work, the gate's cutoff).
    const std::int64_t age = std::max<std::int64_t>(1, current_round_ - from_round);
    // (Caught up to the run's end, it has no next contribution: nothing rides on.)
    const bool next = st.ok() && drift.defined() && worker_->steps_done() < config_.train.steps;
    const double weight = next ? optim::AgeGate{config_.outer.age_decay, config_.outer.age_cutoff}.weight(static_cast<double>(age)) : 0.0;
    if (weight > 0) {
      // From the weights the members share (a Streaming DiLoCo fragment not replayed still holds this
      // peer's own), plus the share of its drift that rides on.
      setup_.outer->take_shared_weights();
      optim::write_flat(params, optim::flatten(params) + drift * weight);
      left.carried = weight;
      ++group_stats_.late_carried;
      spdlog::info("round {}: what this peer computed rides on into its next contribution at weight {:.3f} ({} round(s) late)", round, weight, age);
    } else {
      ++group_stats_.late_dropped;
    }
    setup_.outer->keep_work(weight);
  }
  left_behind_ = left;
  epoch_ = 0;
  return solo_group(clock_);
}

}  // namespace gossamer::runtime

