#include "runtime/coordinator.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "core/hash.h"
#include "core/wire.h"
#include "runtime/coordinator_messages.h"
#include "transport/endpoint.h"

namespace gossamer::runtime {

namespace {

using namespace coordinator_parts;

constexpr const char* kTopic = "gossamer.round";
constexpr auto kPoll = std::chrono::milliseconds(20);
// A wait loop that did not run for this long (it wakes every kPoll) was stopped with its process (a
// stopped or swapping machine): its own stall is nobody else's lateness.
constexpr auto kStalled = std::chrono::seconds(2);
constexpr std::size_t kContacts = 3;     // a newcomer's, at most
constexpr auto kLiveRefresh = std::chrono::milliseconds(50);  // gossip's view of who is live, copied at most this often

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

void Coordinator::set_work(std::map<transport::PeerId, std::int64_t> work) {
  std::lock_guard<std::mutex> lock(mu_);
  work_ = std::move(work);
}

void Coordinator::intend(std::int64_t round) {
  Writer w = start_message(Kind::kIntent, round);
  w.u64(gossip_.self().value);
  w.u8(0);
  const Bytes m = std::move(w).take();
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(mu_);
    for (transport::PeerId id : in_line_locked()) {
      if (id != gossip_.self()) out.push_back(Outgoing{id, m});
    }
  }
  if (out.empty()) spdlog::warn("could not announce joining round {}: no member of the run is known", round);
  send(std::move(out));
}

void Coordinator::join_through(std::vector<transport::PeerId> members) {
  std::lock_guard lock(mu_);
  std::sort(members.begin(), members.end());
  members.erase(std::remove(members.begin(), members.end(), gossip_.self()), members.end());
  if (members.size() > kContacts) members.resize(kContacts);
  contacts_ = std::move(members);
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
  if (abandoned_locked(round, epoch)) return true;
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
  const auto [version, kind, round] = read_header(r);
  if (origin == gossip_.self()) return;  // its own broadcast, delivered here too
  std::vector<Outgoing> out;
  std::unique_lock lock(mu_);
  if (r.ok() && version != kVersion) {
    ++stats_.dropped;
    spdlog::warn("peer {} speaks round protocol {}, this peer {}: its messages are ignored (run the same gossamer version)", origin.to_string(),
                 version, kVersion);
    return;
  }
  bool taken = false;
  if (!r.ok()) {
    drop_locked("a malformed round message", origin, r.status().to_string());
  } else if (kind == Kind::kReady) {
    taken = on_ready_locked(origin, round, r, out);
  } else if (kind == Kind::kGroup) {
    taken = on_group_locked(origin, round, r, out);
  } else if (kind == Kind::kIntent) {
    taken = on_intent_locked(origin, round, r, out);
  } else if (kind == Kind::kAt) {
    read_at(r);
    taken = r.ok();
    if (taken) run_at_ = std::max(run_at_, round);
    else drop_locked("a malformed AT", origin, r.status().to_string());
  } else if (kind == Kind::kAbandon || kind == Kind::kDone) {
    const std::uint64_t epoch = read_epoch(r);
    taken = r.ok();
    if (!taken) {
      drop_locked(kind == Kind::kDone ? "a malformed DONE" : "a malformed ABANDON", origin, r.status().to_string());
    } else if (kind == Kind::kAbandon) {
      abandoned_[round] = std::max(abandoned_[round], epoch);
    } else {
      done_[round][epoch].insert(origin);
      decide_locked(round, epoch, out);
    }
  } else if (kind == Kind::kCommit) {
    taken = on_commit_locked(origin, round, r);
  } else {
    drop_locked("a round message of unknown kind " + std::to_string(static_cast<int>(kind)), origin, "");
  }
  if (!taken) return;
  ++changes_;
  lock.unlock();
  signal_->notify_all();
  send(std::move(out));
}

void Coordinator::drop_locked(const std::string& what, transport::PeerId origin, const std::string& why) {
  ++stats_.dropped;
  spdlog::warn("dropped {} from peer {}{}", what, origin.to_string(), why.empty() ? "" : ": " + why);
}

void Coordinator::send(std::vector<Outgoing> out) {
  if (out.empty()) return;
  {
    std::lock_guard lock(mu_);
    stats_.messages_sent += static_cast<std::int64_t>(out.size());
  }
  for (auto& o : out) {
    const Status st = o.to ? gossip_.send(*o.to, kTopic, o.payload) : gossip_.broadcast(kTopic, o.payload);
    if (!st.ok()) spdlog::debug("a round message to {} was not sent: {}", o.to ? o.to->to_string() : std::string("everyone"), st.to_string());
  }
}

const std::set<transport::PeerId>& Coordinator::live_locked() const {
  // Copying gossip's whole table at every poll of every waiting peer would cost O(N) each (the
  // simulator runs a thousand of them): it is copied when it changed, or, from a gossip that does not
  // say, at most every kLiveRefresh.
  const Nanos now = clock_.now();
  const std::uint64_t version = gossip_.members_version();
  const bool changed = version == 0 ? (!live_at_ || now - *live_at_ >= kLiveRefresh) : (!live_at_ || version != live_version_);
  if (changed) {
    live_ = live_ids(gossip_);
    live_at_ = now;
    live_version_ = version;
  }
  return live_;
}

std::vector<transport::PeerId> Coordinator::in_line_locked() const { return in_line_locked(live_locked()); }

std::vector<transport::PeerId> Coordinator::in_line_locked(const std::set<transport::PeerId>& alive) const {
  std::vector<transport::PeerId> line;
  if (last_) {
    for (const auto& m : last_->members) {  // sorted by id
      if (alive.count(m.id) == 1 && out_.count(m.id) == 0) line.push_back(m.id);
      if (line.size() == kInLine) break;
    }
    return line;
  }
  if (!contacts_.empty()) {
    for (transport::PeerId id : contacts_) {
      if (alive.count(id) == 1) line.push_back(id);
    }
    if (!line.empty()) return line;
  }
  for (transport::PeerId id : alive) {  // sorted
    line.push_back(id);
    if (line.size() == kInLine) break;
  }
  return line;
}

Bytes Coordinator::ready_message_locked(std::int64_t round, std::uint64_t after_epoch, std::int64_t step, std::uint8_t flags) const {
  if (auto mine = ready_.find(round); mine != ready_.end()) {
    if (auto it = mine->second.find(gossip_.self()); it != mine->second.end() && it->second.unlinked) flags |= kUnlinked;
  }
  return encode_ready(round, after_epoch, step, gossip_.self(), last_ ? last_->epoch : 0, flags, address_);
}

void Coordinator::pass_on_locked(transport::PeerId id, const Bytes& message, std::vector<Outgoing>& out) {
  const std::vector<transport::PeerId> line = in_line_locked();
  if (std::find(line.begin(), line.end(), gossip_.self()) != line.end()) return;  // in line itself: it keeps it
  for (transport::PeerId to : line) {
    if (to != id) out.push_back(Outgoing{to, message});
  }
  ++stats_.passed_on;
}

void Coordinator::remember_locked(const GroupView& g) {
  known_[g.epoch] = g.members;
  while (known_.size() > kKnownGroups) known_.erase(known_.begin());
}

void Coordinator::answer_locked(transport::PeerId id, std::int64_t round, const Ready& ready, std::vector<Outgoing>& out) {
  if (id == gossip_.self()) return;
  auto g = groups_.find(round);
  const bool has_group = g != groups_.end() && g->second.epoch > ready.after_epoch;
  const bool past = !has_group && last_ && last_->round > round && ready.after_epoch == 0;
  if (!has_group && !past) return;
  const bool whole = has_group && (ready.known_epoch == 0 || known_.count(ready.known_epoch) == 0);
  const Nanos now = clock_.now();
  auto [slot, fresh] = answered_.try_emplace({round, id}, now, whole);
  if (!fresh) {
    if (now - slot->second.first < options_.repeat_every && (!whole || slot->second.second)) return;
    slot->second = {now, whole};
  }
  if (has_group) {
    out.push_back(Outgoing{id, group_message_locked(g->second, ready.known_epoch)});
  } else {
    out.push_back(Outgoing{id, start_message(Kind::kAt, last_->round).take()});
  }
}

bool Coordinator::on_ready_locked(transport::PeerId origin, std::int64_t round, Reader& r, std::vector<Outgoing>& out) {
  ReadyMessage m = read_ready(r);
  const transport::PeerId id = m.id;
  const std::uint8_t flags = m.flags;
  Ready ready;
  ready.after_epoch = m.after_epoch;
  ready.step = m.step;
  ready.known_epoch = m.known_epoch;
  ready.address = std::move(m.address);
  ready.at = clock_.now();
  ready.heard = true;
  ready.unlinked = (flags & kUnlinked) != 0 && ready.after_epoch > 0;
  if (r.ok() && id == gossip_.self()) r.fail(ErrorCode::kMalformed, "it names peer " + id.to_string());
  if (!r.ok() || ((flags & kPassedOn) == 0 && id != origin)) {
    drop_locked("a malformed READY", origin, r.ok() ? "it names another peer" : r.status().to_string());
    return false;
  }
  auto& slot = ready_[round][id];
  if (!slot.heard || ready.after_epoch >= slot.after_epoch) slot = ready;
  // The epochs in use, as far as its READY says: a group this peer leads never takes one again.
  max_epoch_ = std::max({max_epoch_, ready.after_epoch, ready.known_epoch});
  // A peer still waiting for a group this peer holds (it may have missed it): it gets it now. A READY
  // to everyone is answered by the group's leader alone (or, with the leader gone, by the first in
  // line): every member holds the group, and a thousand answers would follow one question.
  const std::size_t answers = out.size();
  bool answers_it = (flags & kToEveryone) == 0;
  if (!answers_it) {
    auto g = groups_.find(round);
    const std::vector<transport::PeerId> line = in_line_locked();
    answers_it = (g != groups_.end() && g->second.leader == gossip_.self()) || (!line.empty() && line.front() == gossip_.self());
  }
  if (answers_it) answer_locked(id, round, ready, out);
  // Not in line for it in this peer's view (the sender's view differs, or it is a newcomer that knows
  // only a few members): passed on, once, to the leader and fallback this peer sees.
  // A retry. All-or-nothing rounds: the attempt is decided once (decide_locked), and a retry of one
  // that went through is told so. Otherwise, reaching the leader (first in line): everyone hears once
  // that the epoch is abandoned (a member whose collective went through must not go on with a state
  // the others do not share).
  if (ready.after_epoch > 0 && options_.commit_rounds) {
    doubted_[round].try_emplace(ready.after_epoch, ready.at);
    decide_locked(round, ready.after_epoch, out);
    if (auto c = committed_.find(round); c != committed_.end() && c->second.first == ready.after_epoch && id != gossip_.self()) {
      const std::vector<transport::PeerId> deciders = deciders_locked(ready.after_epoch);
      const bool decides = !deciders.empty() && deciders.front() == gossip_.self();
      if (decides && c->second.second.insert(id).second) {
        // Left out after the decision went out: everyone hears of it (nobody waits for it next round).
        out.push_back(Outgoing{std::nullopt, commit_message_locked(round, c->second.first, {id})});
      } else {
        out.push_back(Outgoing{id, commit_message_locked(round, c->second.first, c->second.second)});
      }
    }
  } else if (ready.after_epoch > 0) {
    const std::vector<transport::PeerId> line = in_line_locked();
    if (!line.empty() && line.front() == gossip_.self() && abandoned_[round] < ready.after_epoch) {
      abandoned_[round] = ready.after_epoch;
      Writer w = start_message(Kind::kAbandon, round);
      w.uvar(ready.after_epoch);
      out.push_back(Outgoing{std::nullopt, std::move(w).take()});
    }
  }
  if ((flags & (kPassedOn | kToEveryone)) == 0 && out.size() == answers) {
    pass_on_locked(id, encode_ready(round, ready.after_epoch, ready.step, id, ready.known_epoch, kPassedOn | (ready.unlinked ? kUnlinked : 0), ready.address),
                   out);
  }
  return true;
}

bool Coordinator::on_intent_locked(transport::PeerId origin, std::int64_t round, Reader& r, std::vector<Outgoing>& out) {
  const auto [id, flags] = read_intent(r);
  if (!r.ok() || ((flags & kPassedOn) == 0 && id != origin)) {
    drop_locked("a malformed INTENT", origin, r.ok() ? "it names another peer" : r.status().to_string());
    return false;
  }
  intents_[round][id] = options_.straggler_grace;  // it holds the state: worth the whole grace
  if ((flags & kPassedOn) == 0) {
    Writer w = start_message(Kind::kIntent, round);
    w.u64(id.value);
    w.u8(kPassedOn);
    pass_on_locked(id, w.bytes(), out);
  }
  return true;
}

void Coordinator::begin_attempt_locked(std::int64_t round, std::uint64_t after_epoch, std::int64_t step, bool unlinked, Nanos ready_since) {
  if (after_epoch > 0) ++stats_.retries;
  ready_[round][gossip_.self()] = Ready{after_epoch, step, last_ ? last_->epoch : 0, address_, ready_since, true, unlinked && after_epoch > 0};
  if (after_epoch > 0 && options_.commit_rounds) doubted_[round].try_emplace(after_epoch, ready_since);
  // Rounds long past are of no use any more.
  ready_.erase(ready_.begin(), ready_.lower_bound(round - 2));
  done_.erase(done_.begin(), done_.lower_bound(round - 2));
  doubted_.erase(doubted_.begin(), doubted_.lower_bound(round - 2));
  committed_.erase(committed_.begin(), committed_.lower_bound(round - 2));
  applied_.erase(applied_.begin(), applied_.lower_bound(round - 2));
  groups_.erase(groups_.begin(), groups_.lower_bound(round - 2));
  intents_.erase(intents_.begin(), intents_.lower_bound(round - 2));
  abandoned_.erase(abandoned_.begin(), abandoned_.lower_bound(round - 2));
  std::erase_if(answered_, [&](const auto& kv) { return kv.first.first < round - 2; });
}

std::vector<Coordinator::Outgoing> Coordinator::ready_messages_locked(const Attempt& a, std::set<transport::PeerId>& told, bool everyone,
                                                                      bool repeat) {
  // READY goes to the leader and its fallback; a retry to everyone (the other members learn that the
  // epoch is abandoned, superseded()); once the grace is over, to everyone too (whoever leads then).
  std::vector<Outgoing> out;
  if (everyone) {
    out.push_back(Outgoing{std::nullopt, ready_message_locked(a.round, a.after_epoch, a.step, kToEveryone)});
    return out;
  }
  // And to the lowest live id, when it is not in line: a peer left on its own (or a few split off)
  // hears of the main group from its leader, and comes back to it.
  // A repeat goes to the leader alone; the others in line have it once.
  const Bytes m = ready_message_locked(a.round, a.after_epoch, a.step, 0);
  const std::set<transport::PeerId>& alive = live_locked();
  std::vector<transport::PeerId> to = in_line_locked(alive);
  if (repeat && !to.empty()) told.erase(to.front());
  to.push_back(*alive.begin());
  for (transport::PeerId id : to) {
    if (id != gossip_.self() && told.insert(id).second) out.push_back(Outgoing{id, m});
  }
  return out;
}

std::optional<Bytes> Coordinator::abandon_message_locked(std::int64_t round, std::uint64_t after_epoch) {
  // The leader retrying (without commit rounds) tells everyone itself that the epoch is abandoned.
  if (after_epoch == 0 || options_.commit_rounds) return std::nullopt;
  const std::vector<transport::PeerId> line = in_line_locked();
  if (line.empty() || line.front() != gossip_.self() || abandoned_[round] >= after_epoch) return std::nullopt;
  abandoned_[round] = after_epoch;
  Writer w = start_message(Kind::kAbandon, round);
  w.uvar(after_epoch);
  return std::move(w).take();
}

std::optional<Result<GroupView>> Coordinator::outcome_locked(const Attempt& a) {
  const transport::PeerId self = gossip_.self();
  if (a.after_epoch > 0 && options_.commit_rounds) {
    if (auto c = committed_.find(a.round); c != committed_.end() && c->second.first == a.after_epoch) {
      ++stats_.missed_commits;
      // It is out of its last group, as the others see it: it neither leads nor is waited for; its
      // READYs and INTENTs go to those who lead the members now.
      if (last_ && last_->epoch == a.after_epoch) {
        out_ = c->second.second;
        out_.insert(self);
      }
      return error(ErrorCode::kAborted, "round " + std::to_string(a.round) + " went through for the other members (epoch " +
                                            std::to_string(a.after_epoch) + ") while this peer's collective failed: it is left out and "
                                            "catches up with their state");
    }
  }
  auto it = groups_.find(a.round);
  if (it != groups_.end() && it->second.epoch > a.after_epoch) {
    const GroupView g = it->second;
    if (g.rank_of(self) < 0) {
      return error(ErrorCode::kAborted, "left out of round " + std::to_string(a.round) + " by leader " + g.leader.to_string() +
                                            (a.after_epoch > 0 ? " (this peer was not ready in time, or retries an earlier step than the others)"
                                                               : " (this peer was not ready in time)"));
    }
    // The group goes on from the state its leader applied the round before: a member that applied
    // that round over another epoch (it went on after an attempt the others abandoned) catches up.
    if (auto mine = applied_.find(a.round - 1); g.prior != 0 && mine != applied_.end() && mine->second != g.prior) {
      last_ = g;
      out_ = {self};
      return error(ErrorCode::kAborted, "this peer applied round " + std::to_string(a.round - 1) + " over epoch " + std::to_string(mine->second) +
                                            ", the group of round " + std::to_string(a.round) + " goes on from epoch " + std::to_string(g.prior) +
                                            ": it catches up with the members' state");
    }
    last_ = g;
    out_.clear();
    contacts_.clear();
    return g;
  }
  if (a.round == 0 && !last_) {
    const std::int64_t beyond = std::max({run_at_, ready_.empty() ? 0 : ready_.rbegin()->first, groups_.empty() ? 0 : groups_.rbegin()->first});
    if (beyond > 0) {
      return error(ErrorCode::kUnavailable, "the run is already past its start (its peers are at round " + std::to_string(beyond) +
                                                "): it joins through a state transfer");
    }
  }
  return std::nullopt;
}

Result<GroupView> Coordinator::agree(std::int64_t round, std::uint64_t after_epoch, Deadline deadline, std::int64_t step, bool unlinked) {
  const Attempt a{round, after_epoch, step};
  Nanos ready_since = clock_.now();
  std::unique_lock lock(mu_);
  begin_attempt_locked(round, after_epoch, step, unlinked, ready_since);
  const auto send_unlocked = [&](std::vector<Outgoing> out) {
    lock.unlock();
    send(std::move(out));
    lock.lock();
  };
  std::set<transport::PeerId> told;  // told already (the leader: since the last repeat)
  if (std::optional<Bytes> abandon = abandon_message_locked(round, after_epoch)) send_unlocked({Outgoing{std::nullopt, std::move(*abandon)}});
  send_unlocked(ready_messages_locked(a, told, false, false));
  Nanos last_repeat = clock_.now();
  // READY is repeated for a leader that missed it, less and less often.
  Nanos repeat_every = options_.repeat_every;
  Nanos last_view_check = clock_.now();
  int repeats_past_grace = 0;
  Nanos awake = clock_.now();
  for (;;) {
    if (stopping_) return error(ErrorCode::kAborted, "this peer is leaving the run");
    if (const Nanos now = clock_.now(); now - awake > kStalled) {
      // This peer did not run for a while: what it waited for went on without it, and the others'
      // messages went to whoever leads. Its waits start afresh (it must not lead a group of those it
      // happens to have heard of), and its READY goes out again.
      spdlog::warn("round {}: this peer did not run for {:.1f} s (stopped or swapping): waiting for the others afresh", round,
                   std::chrono::duration<double>(now - awake).count());
      ready_since += now - awake;
      ready_[round][gossip_.self()].at = ready_since;
      awake = now;
      told.clear();
      send_unlocked(ready_messages_locked(a, told, false, false));
      continue;
    }
    awake = clock_.now();
    if (after_epoch > 0 && options_.commit_rounds) {
      // The attempt is decided (by this peer, when it decides it): it went through for the others,
      // or it is abandoned and a new group follows.
      std::vector<Outgoing> out;
      decide_locked(round, after_epoch, out);
      if (!out.empty()) {
        send_unlocked(std::move(out));
        continue;
      }
    }
    if (std::optional<Result<GroupView>> outcome = outcome_locked(a)) return std::move(*outcome);
    if (auto decided = leader_decision(round, after_epoch, step, ready_since)) {
      groups_[round] = *decided;
      remember_locked(*decided);
      spdlog::info("round {}: leading, group of {} with epoch {}", round, decided->members.size(), decided->epoch);
      std::vector<Outgoing> out;
      announce_locked(*decided, after_epoch, out);
      send_unlocked(std::move(out));
      continue;
    }
    if (deadline.expired(clock_)) {
      return error(ErrorCode::kTimeout, "no group was announced for round " + std::to_string(round) + " before the deadline");
    }
    // Again once the interval passed (to whoever is in line then), and at once to a peer that came
    // in line since (the leader died, or this peer's view of the members grew).
    // (The view is looked at every 200 ms, not at every poll: it copies gossip's whole table.)
    if (clock_.now() - last_repeat >= repeat_every) {
      // Past its grace, to everyone: once, then every fourth repeat (a broadcast costs every peer).
      const bool everyone = clock_.now() >= ready_since + grace() && (repeats_past_grace++ % 4 == 0);
      send_unlocked(ready_messages_locked(a, told, everyone, true));
      last_repeat = clock_.now();
      repeat_every = std::min<Nanos>(2 * repeat_every, std::chrono::seconds(5));
      continue;
    }
    if (clock_.now() - last_view_check >= std::chrono::milliseconds(200)) {
      last_view_check = clock_.now();
      send_unlocked(ready_messages_locked(a, told, false, false));  // (only those not told yet)
    }
    // Until a message arrives, or a poll interval passes (gossip's view of who is alive, and the
    // grace, change without a message).
    const std::uint64_t seen = changes_;
    const Nanos wake = std::min(clock_.now() + kPoll, deadline.time());
    signal_->wait(lock, Deadline::at(wake), [&] { return stopping_ || changes_ != seen; });
  }
}

}  // namespace gossamer::runtime
