#include "run/coordinator.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "core/wire.h"

namespace gossamer::run {

namespace {

constexpr const char* kTopic = "gossamer.round";
constexpr std::uint8_t kVersion = 2;  // 2: READY carries the step of the retried collective
enum class Kind : std::uint8_t { kReady = 1, kGroup = 2, kIntent = 3 };
constexpr std::size_t kMaxAddress = 256, kMaxMembers = 4096;
constexpr std::uint64_t kMaxEpoch = std::uint64_t{1} << 62;  // epochs grow by one per group change
constexpr auto kPoll = std::chrono::milliseconds(20);
constexpr std::size_t kLagHistory = 8;   // rounds whose lag the grace adapts to
constexpr std::size_t kLagsToAdapt = 3;  // before that many, the full straggler_grace

// Every round message starts the same way.
Writer start_message(Kind kind, std::int64_t round) {
  Writer w;
  w.u8(kVersion);
  w.u8(static_cast<std::uint8_t>(kind));
  w.i64(round);
  return w;
}

Bytes encode_ready(std::int64_t round, std::uint64_t after_epoch, std::int64_t step, transport::PeerId id, const std::string& address) {
  Writer w = start_message(Kind::kReady, round);
  w.u64(after_epoch);
  w.i64(step);
  w.u64(id.value);
  w.str(address);
  return std::move(w).take();
}

Bytes encode_group(const GroupView& g) {
  Writer w = start_message(Kind::kGroup, g.round);
  w.u64(g.epoch);
  w.u64(g.leader.value);
  w.u32(static_cast<std::uint32_t>(g.members.size()));
  for (const auto& m : g.members) {
    w.u64(m.id.value);
    w.str(m.address);
  }
  return std::move(w).take();
}

std::set<transport::PeerId> live_ids(const transport::Gossip& gossip) {
  std::set<transport::PeerId> ids{gossip.self()};
  for (const auto& m : gossip.members()) {
    // A suspect (silent for a while, not yet dead) still counts: a peer stalled for a moment is not
    // left out of a round, and a dead one is dropped once gossip declares it dead.
    if (m.state == transport::MemberState::kAlive || m.state == transport::MemberState::kSuspect) ids.insert(m.id);
  }
  return ids;
}

}  // namespace

int GroupView::rank_of(transport::PeerId id) const {
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i].id == id) return static_cast<int>(i);
  }
  return -1;
}

Coordinator::Coordinator(transport::Gossip& gossip, std::string link_address, CoordinatorOptions options, Clock& clock)
    : gossip_(gossip), address_(std::move(link_address)), options_(options), clock_(clock), signal_(clock.make_signal()) {}

std::shared_ptr<Coordinator> Coordinator::make(transport::Gossip& gossip, std::string link_address, CoordinatorOptions options, Clock& clock) {
  auto c = std::make_shared<Coordinator>(gossip, std::move(link_address), options, clock);
  gossip.subscribe(kTopic, [weak = std::weak_ptr<Coordinator>(c)](transport::PeerId origin, const Bytes& payload) {
    if (auto self = weak.lock()) self->on_message(origin, payload);
  });
  return c;
}

void Coordinator::intend(std::int64_t round) {
  Writer w = start_message(Kind::kIntent, round);
  w.u64(gossip_.self().value);
  if (Status st = gossip_.broadcast(kTopic, std::move(w).take()); !st.ok()) spdlog::warn("could not announce joining round {}: {}", round, st.to_string());
}

void Coordinator::expect(std::int64_t round, transport::PeerId id, Nanos wait) {
  std::lock_guard lock(mu_);
  auto [it, fresh] = intents_[round].emplace(id, wait);
  if (!fresh) it->second = std::max(it->second, wait);
}

bool Coordinator::superseded(std::int64_t round, std::uint64_t epoch) const {
  std::lock_guard lock(mu_);
  return superseded_locked(round, epoch);
}

bool Coordinator::superseded_locked(std::int64_t round, std::uint64_t epoch) const {
  if (auto g = groups_.find(round); g != groups_.end() && g->second.epoch > epoch) return true;
  if (auto r = ready_.find(round); r != ready_.end()) {
    for (const auto& [id, ready] : r->second) {
      if (ready.after_epoch >= epoch) return true;
    }
  }
  return false;
}

void Coordinator::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  signal_->notify_all();
}

CoordinatorStats Coordinator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Coordinator::on_message(transport::PeerId origin, const Bytes& payload) {
  Reader r(payload, "round message from peer " + origin.to_string());
  const std::uint8_t version = r.u8();
  const auto kind = static_cast<Kind>(r.u8());
  const std::int64_t round = r.i64();
  std::optional<GroupView> repeat;  // a group to announce again for a peer that missed it
  std::unique_lock lock(mu_);
  if (r.ok() && version != kVersion) {
    ++stats_.dropped;
    spdlog::warn("peer {} speaks round protocol {}, this peer {}: its messages are ignored (run the same gossamer version)", origin.to_string(),
                 version, kVersion);
    return;
  }
  bool taken = false;
  if (r.ok() && round < 0) {
    drop_locked("a round message for round " + std::to_string(round), origin, "");
  } else if (kind == Kind::kReady) {
    taken = on_ready_locked(origin, round, r, repeat);
  } else if (kind == Kind::kGroup) {
    taken = on_group_locked(origin, round, r);
  } else if (kind == Kind::kIntent) {
    const transport::PeerId id{r.u64()};
    r.expect_end();
    taken = r.ok();
    if (taken) intents_[round][id] = options_.straggler_grace;  // it holds the state: worth the whole grace
    else drop_locked("a malformed INTENT", origin, r.status().to_string());
  } else {
    drop_locked("a round message of unknown kind " + std::to_string(static_cast<int>(kind)), origin, "");
  }
  if (!taken) return;
  ++changes_;
  lock.unlock();
  signal_->notify_all();
  if (repeat) announce(*repeat);
}

void Coordinator::drop_locked(const std::string& what, transport::PeerId origin, const std::string& why) {
  ++stats_.dropped;
  spdlog::warn("dropped {} from peer {}{}", what, origin.to_string(), why.empty() ? "" : ": " + why);
}

bool Coordinator::on_ready_locked(transport::PeerId origin, std::int64_t round, Reader& r, std::optional<GroupView>& repeat) {
  Ready ready;
  ready.after_epoch = r.u64();
  ready.step = r.i64();
  const transport::PeerId id{r.u64()};
  ready.address = r.str(kMaxAddress);
  ready.at = clock_.now();
  ready.heard = true;
  r.expect_end();
  if (r.ok() && ready.after_epoch >= kMaxEpoch) r.fail(ErrorCode::kMalformed, "epoch " + std::to_string(ready.after_epoch) + " out of range");
  if (!r.ok() || id != origin) {
    drop_locked("a malformed READY", origin, r.ok() ? "it names another peer" : r.status().to_string());
    return false;
  }
  auto& slot = ready_[round][id];
  if (!slot.heard || ready.after_epoch >= slot.after_epoch) slot = std::move(ready);
  // A peer still waiting for a group this peer knows: say it again (it may have missed it). Only
  // its leader does, or, when gossip sees the leader dead, the lowest live member: every repeat is
  // a broadcast to every peer, and a group of hundreds is a few KB.
  auto g = groups_.find(round);
  if (g != groups_.end() && g->second.epoch > slot.after_epoch && repeats_group(g->second)) {
    auto [last, fresh] = repeated_.try_emplace(round, clock_.now());
    if (fresh || clock_.now() - last->second >= options_.repeat_every) {
      last->second = clock_.now();
      repeat = g->second;
    }
  }
  return true;
}

bool Coordinator::on_group_locked(transport::PeerId origin, std::int64_t round, Reader& r) {
  GroupView g;
  g.round = round;
  g.epoch = r.u64();
  g.leader = transport::PeerId{r.u64()};
  const std::uint32_t count = r.u32();
  // (An epoch near 2^64 would wrap the next one to 0, which no peer ever takes: every later round would stall.)
  if (r.ok() && (g.epoch == 0 || g.epoch >= kMaxEpoch)) r.fail(ErrorCode::kMalformed, "epoch " + std::to_string(g.epoch) + " out of range");
  if (r.ok() && (count == 0 || count > kMaxMembers)) r.fail(ErrorCode::kMalformed, "a group of " + std::to_string(count) + " members");
  for (std::uint32_t i = 0; r.ok() && i < count; ++i) {
    MemberInfo m;
    m.id = transport::PeerId{r.u64()};
    m.address = r.str(kMaxAddress);
    if (r.ok() && i > 0 && !(g.members.back().id < m.id)) r.fail(ErrorCode::kMalformed, "members not sorted by id");
    g.members.push_back(std::move(m));
  }
  r.expect_end();
  // (Any member may repeat a group for a peer that missed it, so the origin need not be the leader.)
  if (!r.ok()) {
    drop_locked("a malformed GROUP", origin, r.status().to_string());
    return false;
  }
  max_epoch_ = std::max(max_epoch_, g.epoch);
  auto& slot = groups_[round];
  // Two leaders at once (views differ for a moment): the larger epoch wins, then the lower leader.
  if (slot.members.empty() || g.epoch > slot.epoch || (g.epoch == slot.epoch && g.leader < slot.leader)) slot = std::move(g);
  return true;
}

bool Coordinator::repeats_group(const GroupView& g) const {
  const transport::PeerId self = gossip_.self();
  if (g.leader == self) return true;
  const std::set<transport::PeerId> alive = live_ids(gossip_);
  if (alive.count(g.leader) == 1) return false;
  for (const auto& m : g.members) {
    if (alive.count(m.id) == 1) return m.id == self;  // members are sorted by id
  }
  return false;
}

void Coordinator::broadcast_ready(std::int64_t round, std::uint64_t after_epoch, std::int64_t step) {
  if (Status st = gossip_.broadcast(kTopic, encode_ready(round, after_epoch, step, gossip_.self(), address_)); !st.ok()) {
    spdlog::warn("could not announce readiness for round {}: {}", round, st.to_string());
  }
}

void Coordinator::announce(const GroupView& g) {
  if (Status st = gossip_.broadcast(kTopic, encode_group(g)); !st.ok()) {
    spdlog::warn("could not announce the group of round {}: {}", g.round, st.to_string());
  }
}

Nanos Coordinator::grace() const {
  if (lags_.size() < kLagsToAdapt) return options_.straggler_grace;
  const Nanos typical = *std::max_element(lags_.begin(), lags_.end());
  const auto scaled = std::chrono::duration_cast<Nanos>(typical * options_.grace_factor);
  return std::clamp(scaled, std::min(options_.min_grace, options_.straggler_grace), options_.straggler_grace);
}

transport::PeerId Coordinator::leader_locked(std::int64_t round, std::uint64_t after_epoch, const std::set<transport::PeerId>& alive,
                                             bool grace_over) {
  // The lowest live id among the last group's members (this peer among them); at the start, and once
  // the grace is over (stragglers and the dead no longer count), among the peers ready for this attempt.
  transport::PeerId leader = gossip_.self();
  if (last_ && !grace_over) {
    for (const auto& m : last_->members) {
      if (alive.count(m.id) == 1 && m.id < leader) leader = m.id;
    }
  } else {
    for (const auto& [id, r] : ready_[round]) {
      if (r.after_epoch >= after_epoch && alive.count(id) == 1 && id < leader) leader = id;
    }
  }
  return leader;
}

std::set<transport::PeerId> Coordinator::expected_locked(std::int64_t round, const std::set<transport::PeerId>& alive,
                                                         const std::map<transport::PeerId, std::string>& ready, std::optional<Nanos>& newcomer_wait) {
  // The live members of the last group (every live peer at the start), and the newcomers that said
  // they take part in this round.
  std::set<transport::PeerId> expected;
  if (last_) {
    for (const auto& m : last_->members) {
      if (alive.count(m.id) == 1) expected.insert(m.id);
    }
  } else {
    expected = alive;
  }
  newcomer_wait.reset();
  if (auto in = intents_.find(round); in != intents_.end()) {
    for (const auto& [id, wait] : in->second) {
      if (alive.count(id) == 0) continue;
      expected.insert(id);
      if (ready.count(id) == 0) newcomer_wait = std::max(newcomer_wait.value_or(Nanos{0}), wait);
    }
  }
  return expected;
}

GroupView Coordinator::make_group_locked(std::int64_t round, std::uint64_t after_epoch, std::int64_t step,
                                         const std::map<transport::PeerId, std::string>& ready, const std::set<transport::PeerId>& expected) {
  const transport::PeerId self = gossip_.self();
  const auto& announced = ready_[round];
  const auto step_of = [&](transport::PeerId id) { return id == self ? step : announced.at(id).step; };  // of the collective retried
  std::int64_t furthest = step;  // the latest step retried
  if (after_epoch > 0) {
    for (const auto& [id, address] : ready) furthest = std::max(furthest, step_of(id));
  }
  GroupView g;
  g.round = round;
  g.leader = self;
  for (const auto& [id, address] : ready) {
    // A retry: members whose collective failed at an earlier step than the others' are behind (the
    // others finished that step, the crash cut it short for them only). They cannot take part in the
    // later step's collective; they are left out and catch up from the members.
    const std::int64_t at = step_of(id);
    if (after_epoch > 0 && at < furthest) {
      ++stats_.left_out;
      spdlog::warn("round {}: peer {} retries step {} while others are at step {}: it is left out and catches up", round, id.to_string(), at, furthest);
      continue;
    }
    g.members.push_back(MemberInfo{id, address});
  }
  // The same members as the last group, which nobody is retrying and no newer group has replaced:
  // it goes on under its epoch, so its links (and a collective still in flight over them) are kept.
  const bool unchanged = last_ && after_epoch == 0 && g.members == last_->members && last_->epoch == max_epoch_ &&
                         !superseded_locked(last_->round, last_->epoch);
  g.epoch = unchanged ? last_->epoch : std::max(max_epoch_, after_epoch) + 1;
  max_epoch_ = std::max(max_epoch_, g.epoch);
  ++stats_.groups_announced;
  for (transport::PeerId id : expected) {
    if (ready.count(id) == 0) {
      ++stats_.left_out;
      spdlog::warn("round {}: peer {} is not ready in time and is left out of this round", round, id.to_string());
    }
  }
  return g;
}

std::optional<GroupView> Coordinator::leader_decision(std::int64_t round, std::uint64_t after_epoch, std::int64_t step, Nanos ready_since) {
  const std::set<transport::PeerId> alive = live_ids(gossip_);
  const transport::PeerId self = gossip_.self();
  const bool grace_over = clock_.now() >= ready_since + grace();
  // A newcomer, which knows no last group (nor the epochs in use), does not lead before the grace is over.
  if (!last_ && round > 0 && !grace_over) return std::nullopt;
  if (leader_locked(round, after_epoch, alive, grace_over) != self) return std::nullopt;
  std::map<transport::PeerId, std::string> ready;  // ready for this attempt, and alive
  for (const auto& [id, r] : ready_[round]) {
    if (r.after_epoch >= after_epoch && alive.count(id) == 1) ready[id] = r.address;
  }
  ready[self] = address_;
  // A newcomer still on its way (its state transfer is no member's lag) gets the wait it was given.
  std::optional<Nanos> newcomer_wait;
  const std::set<transport::PeerId> expected = expected_locked(round, alive, ready, newcomer_wait);
  const bool complete = std::all_of(expected.begin(), expected.end(), [&](transport::PeerId id) { return ready.count(id) == 1; });
  const bool enough = last_ || ready.size() >= options_.min_members;
  const bool waited_enough = newcomer_wait ? clock_.now() >= ready_since + std::max(*newcomer_wait, grace()) : grace_over;
  if (!enough || (!complete && !waited_enough)) return std::nullopt;
  if (complete && last_ && after_epoch == 0) {
    // How long after this leader the last member became ready: the lag the grace adapts to.
    Nanos lag{0};
    for (transport::PeerId id : expected) {
      if (id != self) lag = std::max(lag, ready_[round][id].at - ready_since);
    }
    lags_.push_back(lag);
    if (lags_.size() > kLagHistory) lags_.pop_front();
  }
  return make_group_locked(round, after_epoch, step, ready, expected);
}

Result<GroupView> Coordinator::agree(std::int64_t round, std::uint64_t after_epoch, Deadline deadline, std::int64_t step) {
  const transport::PeerId self = gossip_.self();
  const Nanos ready_since = clock_.now();
  {
    std::lock_guard lock(mu_);
    if (after_epoch > 0) ++stats_.retries;
    ready_[round][self] = Ready{after_epoch, step, address_, ready_since, true};
    // Rounds long past are of no use any more.
    ready_.erase(ready_.begin(), ready_.lower_bound(round - 2));
    groups_.erase(groups_.begin(), groups_.lower_bound(round - 2));
    repeated_.erase(repeated_.begin(), repeated_.lower_bound(round - 2));
    intents_.erase(intents_.begin(), intents_.lower_bound(round - 2));
  }
  broadcast_ready(round, after_epoch, step);
  Nanos last_repeat = clock_.now();
  // READY is repeated for peers that missed it, less and less often: gossip's rumors already
  // carry it for a few periods, and every repeat costs a broadcast to every peer.
  Nanos repeat_every = options_.repeat_every;
  std::size_t live_at_repeat = live_ids(gossip_).size();
  Nanos last_view_check = clock_.now();
  std::unique_lock lock(mu_);
  for (;;) {
    if (stopping_) return error(ErrorCode::kAborted, "this peer is leaving the run");
    auto it = groups_.find(round);
    if (it != groups_.end() && it->second.epoch > after_epoch) {
      const GroupView g = it->second;
      if (g.rank_of(self) < 0) {
        return error(ErrorCode::kAborted, "left out of round " + std::to_string(round) + " by leader " + g.leader.to_string() +
                                              (after_epoch > 0 ? " (this peer was not ready in time, or retries an earlier step than the others)" : " (this peer was not ready in time)"));
      }
      last_ = g;
      return g;
    }
    if (round == 0 && !last_ && ((!ready_.empty() && ready_.rbegin()->first > 0) || (!groups_.empty() && groups_.rbegin()->first > 0))) {
      return error(ErrorCode::kUnavailable, "the run is already past its start (its peers are at round " +
                                                       std::to_string(std::max(ready_.empty() ? 0 : ready_.rbegin()->first,
                                                                               groups_.empty() ? 0 : groups_.rbegin()->first)) +
                                                       "): it joins through a state transfer");
    }
    if (auto decided = leader_decision(round, after_epoch, step, ready_since)) {
      groups_[round] = *decided;
      lock.unlock();
      spdlog::info("round {}: leading, group of {} with epoch {}", round, decided->members.size(), decided->epoch);
      announce(*decided);
      lock.lock();
      continue;
    }
    if (deadline.expired(clock_)) {
      return error(ErrorCode::kTimeout, "no group was announced for round " + std::to_string(round) + " before the deadline");
    }
    // Again once the interval passed, or at once when this peer's view of the live peers has doubled
    // since (early on, the READY reached only the few peers it knew).
    // (The view is looked at every 200 ms, not at every poll: it copies gossip's whole table.)
    std::size_t live_now = live_at_repeat;
    if (clock_.now() - last_view_check >= std::chrono::milliseconds(200)) {
      live_now = live_ids(gossip_).size();
      last_view_check = clock_.now();
    }
    if (clock_.now() - last_repeat >= repeat_every || live_now >= 2 * live_at_repeat) {
      lock.unlock();
      broadcast_ready(round, after_epoch, step);
      last_repeat = clock_.now();
      live_at_repeat = live_now;
      repeat_every = std::min<Nanos>(2 * repeat_every, std::chrono::seconds(5));
      lock.lock();
      continue;
    }
    // Until a message arrives, or a poll interval passes (gossip's view of who is alive, and the
    // grace, change without a message).
    const std::uint64_t seen = changes_;
    const Nanos wake = std::min(clock_.now() + kPoll, deadline.time());
    signal_->wait(lock, Deadline::at(wake), [&] { return stopping_ || changes_ != seen; });
  }
}

}  // namespace gossamer::run
