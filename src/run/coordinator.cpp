#include "run/coordinator.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "core/hash.h"
#include "core/wire.h"
#include "transport/endpoint.h"

namespace gossamer::run {

namespace {

constexpr const char* kTopic = "gossamer.round";
// 3: READY to the leader, GROUP to each peer as a change from the one it holds. 4: varints, and link
// addresses in gossip's compact form. 5: rounds committed all-or-nothing (DONE, COMMIT, a GROUP's prior).
constexpr std::uint8_t kVersion = 5;
enum class Kind : std::uint8_t { kReady = 1, kGroup = 2, kIntent = 3, kAt = 4, kAbandon = 5, kDone = 6, kCommit = 7 };
constexpr std::uint8_t kPassedOn = 1, kToEveryone = 2, kUnlinked = 4;  // READY and INTENT flags (kUnlinked: READY only)
constexpr std::uint8_t kWhole = 0, kChange = 1;         // GROUP forms
constexpr std::size_t kMaxMembers = 4096;
constexpr std::uint64_t kMaxRound = std::uint64_t{1} << 62;  // rounds and steps, far beyond any run
constexpr std::uint64_t kMaxEpoch = std::uint64_t{1} << 62;  // epochs grow by one per group change
constexpr auto kPoll = std::chrono::milliseconds(20);
constexpr std::size_t kInLine = 2;       // a READY goes to the leader and its fallback
constexpr std::size_t kContacts = 3;     // a newcomer's, at most
constexpr auto kLiveRefresh = std::chrono::milliseconds(50);  // gossip's view of who is live, copied at most this often

// Every round message starts the same way.
Writer start_message(Kind kind, std::int64_t round) {
  Writer w;
  w.u8(kVersion);
  w.u8(static_cast<std::uint8_t>(kind));
  w.uvar(static_cast<std::uint64_t>(round));
  return w;
}

Bytes encode_ready(std::int64_t round, std::uint64_t after_epoch, std::int64_t step, transport::PeerId id, std::uint64_t known_epoch,
                   std::uint8_t flags, const std::string& address) {
  Writer w = start_message(Kind::kReady, round);
  w.uvar(after_epoch);
  w.uvar(static_cast<std::uint64_t>(step));
  w.u64(id.value);
  w.uvar(known_epoch);
  w.u8(flags);
  transport::write_address(w, address);
  return std::move(w).take();
}

// What a change's receiver checks the members it made against.
std::uint64_t check_of(const std::vector<MemberInfo>& members) {
  Writer w;
  for (const auto& m : members) {
    w.u64(m.id.value);
    w.str(m.address);
  }
  const Digest d = digest_of(w.bytes());
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(d.bytes[i]) << (8 * i);
  return v;
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
  if (auto g = groups_.find(round); g != groups_.end() && g->second.epoch > epoch) return true;
  if (auto a = abandoned_.find(round); a != abandoned_.end() && a->second >= epoch) return true;
  if (auto r = ready_.find(round); r != ready_.end()) {
    for (const auto& [id, ready] : r->second) {
      if (ready.after_epoch >= epoch) return true;
    }
  }
  return false;
}

bool Coordinator::abandoned(std::int64_t round, std::uint64_t epoch) const {
  std::lock_guard lock(mu_);
  return abandoned_locked(round, epoch);
}

bool Coordinator::abandoned_locked(std::int64_t round, std::uint64_t epoch) const {
  if (auto g = groups_.find(round); g != groups_.end() && g->second.epoch > epoch) return true;
  auto a = abandoned_.find(round);
  return a != abandoned_.end() && a->second >= epoch;
}

bool Coordinator::went_through(std::int64_t round, std::uint64_t epoch) const {
  std::lock_guard lock(mu_);
  auto c = committed_.find(round);
  return c != committed_.end() && c->second.first == epoch;
}

void Coordinator::applied(std::int64_t round, std::uint64_t epoch) {
  if (epoch == 0) return;
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(mu_);
    applied_[round] = epoch;
    if (!options_.commit_rounds) return;
    done_[round][epoch].insert(gossip_.self());
    Writer w = start_message(Kind::kDone, round);
    w.uvar(epoch);
    const Bytes m = std::move(w).take();
    for (transport::PeerId id : deciders_locked(epoch)) {
      if (id != gossip_.self()) out.push_back(Outgoing{id, m});
    }
    decide_locked(round, epoch, out);
  }
  send(std::move(out));
}

std::vector<transport::PeerId> Coordinator::deciders_locked(std::uint64_t epoch) const {
  std::vector<transport::PeerId> line;
  auto members = known_.find(epoch);
  if (members == known_.end()) return line;
  const std::set<transport::PeerId>& alive = live_locked();
  for (const auto& m : members->second) {  // sorted by id
    if (alive.count(m.id) == 1) line.push_back(m.id);
    if (line.size() == kInLine) break;
  }
  return line;
}

Bytes Coordinator::commit_message_locked(std::int64_t round, std::uint64_t epoch, const std::set<transport::PeerId>& left) const {
  Writer w = start_message(Kind::kCommit, round);
  w.uvar(epoch);
  w.uvar(left.size());
  for (transport::PeerId id : left) w.u64(id.value);
  return std::move(w).take();
}

void Coordinator::decide_locked(std::int64_t round, std::uint64_t epoch, std::vector<Outgoing>& out) {
  if (!options_.commit_rounds) return;
  auto doubted = doubted_.find(round);
  if (doubted == doubted_.end() || doubted->second.count(epoch) == 0) return;  // nobody retries it
  if (abandoned_locked(round, epoch)) return;
  if (auto c = committed_.find(round); c != committed_.end() && c->second.first >= epoch) return;
  const transport::PeerId self = gossip_.self();
  const std::vector<transport::PeerId> deciders = deciders_locked(epoch);
  if (deciders.empty() || deciders.front() != self) return;
  // Every live member of the attempt's group has said it applied it or asks to retry it, or the
  // decider's grace is over (a DONE lost on the way, or a member that hangs).
  const std::vector<MemberInfo>& members = known_.at(epoch);
  const std::set<transport::PeerId>& alive = live_locked();
  const std::set<transport::PeerId>& done = done_[round][epoch];
  std::set<transport::PeerId> retried;
  for (const auto& [id, ready] : ready_[round]) {
    if (ready.after_epoch >= epoch) retried.insert(id);
  }
  const bool all_said = std::all_of(members.begin(), members.end(), [&](const MemberInfo& m) {
    return alive.count(m.id) == 0 || done.count(m.id) == 1 || retried.count(m.id) == 1;
  });
  // A member whose links for the attempt never came up never joined its collective: nobody can have
  // applied it (every share of the average needs every member's contribution).
  bool never_ran = false;
  for (const auto& [id, ready] : ready_[round]) never_ran = never_ran || (ready.after_epoch == epoch && ready.unlinked);
  if (!all_said && !(never_ran && done.empty()) && clock_.now() < doubted->second.at(epoch) + grace()) return;
  if (!done.empty()) {
    std::set<transport::PeerId> left;
    for (const auto& m : members) {
      if (retried.count(m.id) == 1 && done.count(m.id) == 0) left.insert(m.id);
    }
    ++stats_.committed;
    spdlog::info("round {}: the attempt over epoch {} went through for {} member(s): the {} that retried it are left out and catch up", round,
                 epoch, done.size(), left.size());
    out.push_back(Outgoing{std::nullopt, commit_message_locked(round, epoch, left)});
    if (last_ && last_->epoch == epoch) out_.insert(left.begin(), left.end());
    committed_[round] = {epoch, std::move(left)};
    return;
  }
  ++stats_.abandoned;
  spdlog::info("round {}: no member applied the attempt over epoch {}{}: it is retried", round, epoch,
               all_said ? "" : " (as far as the members that answered in time say)");
  abandoned_[round] = std::max(abandoned_[round], epoch);
  Writer w = start_message(Kind::kAbandon, round);
  w.uvar(epoch);
  out.push_back(Outgoing{std::nullopt, std::move(w).take()});
}

bool Coordinator::on_commit_locked(transport::PeerId origin, std::int64_t round, Reader& r) {
  const std::uint64_t epoch = r.uvar();
  const std::uint64_t count = r.uvar();
  if (r.ok() && (epoch == 0 || epoch >= kMaxEpoch)) r.fail(ErrorCode::kMalformed, "epoch " + std::to_string(epoch) + " out of range");
  if (r.ok() && count > kMaxMembers) r.fail(ErrorCode::kMalformed, std::to_string(count) + " members left out");
  std::set<transport::PeerId> left;
  for (std::uint64_t i = 0; r.ok() && i < count; ++i) left.insert(transport::PeerId{r.u64()});
  r.expect_end();
  if (!r.ok()) {
    drop_locked("a malformed COMMIT", origin, r.status().to_string());
    return false;
  }
  auto& c = committed_[round];
  if (c.first < epoch) c = {epoch, {}};
  if (c.first != epoch) return true;  // (a later attempt of the round is decided already)
  c.second.insert(left.begin(), left.end());
  if (last_ && last_->epoch == epoch) out_.insert(left.begin(), left.end());
  return true;
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
  const auto round = static_cast<std::int64_t>(r.uvar(kMaxRound));
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
    r.expect_end();
    taken = r.ok();
    if (taken) run_at_ = std::max(run_at_, round);
    else drop_locked("a malformed AT", origin, r.status().to_string());
  } else if (kind == Kind::kAbandon || kind == Kind::kDone) {
    const std::uint64_t epoch = r.uvar();
    r.expect_end();
    if (r.ok() && (epoch == 0 || epoch >= kMaxEpoch)) r.fail(ErrorCode::kMalformed, "epoch " + std::to_string(epoch) + " out of range");
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

Bytes Coordinator::group_message_locked(const GroupView& g, std::uint64_t known) const {
  Writer w = start_message(Kind::kGroup, g.round);
  w.uvar(g.epoch);
  w.u64(g.leader.value);
  w.uvar(g.width);
  w.uvar(g.prior);
  // (A change only from an epoch up to the group's own: one from a later group, which a peer that
  // went on holds while it asks about an earlier round, is refused by its reader.)
  auto base = known == 0 || known > g.epoch ? known_.end() : known_.find(known);
  if (base == known_.end()) {
    w.u8(kWhole);
    w.uvar(g.members.size());
    for (const auto& m : g.members) {
      w.u64(m.id.value);
      transport::write_address(w, m.address);
    }
    return std::move(w).take();
  }
  std::vector<transport::PeerId> removed;
  std::vector<MemberInfo> added;
  const std::map<transport::PeerId, std::string> before = [&] {
    std::map<transport::PeerId, std::string> b;
    for (const auto& m : base->second) b[m.id] = m.address;
    return b;
  }();
  std::set<transport::PeerId> now;
  for (const auto& m : g.members) {
    now.insert(m.id);
    auto it = before.find(m.id);
    if (it != before.end() && it->second == m.address) continue;
    if (it != before.end()) removed.push_back(m.id);  // (a new address: out and in again)
    added.push_back(m);
  }
  for (const auto& [id, address] : before) {
    if (now.count(id) == 0) removed.push_back(id);
  }
  std::sort(removed.begin(), removed.end());
  w.u8(kChange);
  w.uvar(known);
  w.uvar(g.members.size());
  w.u64(check_of(g.members));
  w.uvar(removed.size());
  for (transport::PeerId id : removed) w.u64(id.value);
  w.uvar(added.size());
  for (const auto& m : added) {
    w.u64(m.id.value);
    transport::write_address(w, m.address);
  }
  return std::move(w).take();
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
  Ready ready;
  ready.after_epoch = r.uvar();
  ready.step = static_cast<std::int64_t>(r.uvar(kMaxRound));
  const transport::PeerId id{r.u64()};
  ready.known_epoch = r.uvar();
  const std::uint8_t flags = r.u8();
  ready.address = transport::read_address(r);
  ready.at = clock_.now();
  ready.heard = true;
  r.expect_end();
  if (r.ok() && (ready.after_epoch >= kMaxEpoch || ready.known_epoch >= kMaxEpoch)) r.fail(ErrorCode::kMalformed, "epoch out of range");
  if (r.ok() && (flags & ~(kPassedOn | kToEveryone | kUnlinked)) != 0) r.fail(ErrorCode::kMalformed, "unknown flags " + std::to_string(flags));
  ready.unlinked = (flags & kUnlinked) != 0 && ready.after_epoch > 0;
  if (r.ok() && (id.value == 0 || id == gossip_.self())) r.fail(ErrorCode::kMalformed, "it names peer " + id.to_string());
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
  const transport::PeerId id{r.u64()};
  const std::uint8_t flags = r.u8();
  r.expect_end();
  if (r.ok() && (flags & ~kPassedOn) != 0) r.fail(ErrorCode::kMalformed, "unknown flags " + std::to_string(flags));
  if (r.ok() && id.value == 0) r.fail(ErrorCode::kMalformed, "it names peer 0");
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

bool Coordinator::on_group_locked(transport::PeerId origin, std::int64_t round, Reader& r, std::vector<Outgoing>& out) {
  GroupView g;
  g.round = round;
  g.epoch = r.uvar();
  g.leader = transport::PeerId{r.u64()};
  g.width = static_cast<std::uint32_t>(r.uvar(kMaxMembers));
  g.prior = r.uvar(kMaxEpoch - 1);
  const std::uint8_t form = r.u8();
  if (r.ok() && (g.width == 1 || g.width > kMaxMembers)) r.fail(ErrorCode::kMalformed, "a layout of width " + std::to_string(g.width));
  // (An epoch near 2^64 would wrap the next one to 0, which no peer ever takes: every later round would stall.)
  if (r.ok() && (g.epoch == 0 || g.epoch >= kMaxEpoch)) r.fail(ErrorCode::kMalformed, "epoch " + std::to_string(g.epoch) + " out of range");
  if (r.ok() && form != kWhole && form != kChange) r.fail(ErrorCode::kMalformed, "unknown group form " + std::to_string(form));
  const auto read_member = [&] {
    MemberInfo m;
    m.id = transport::PeerId{r.u64()};
    m.address = transport::read_address(r);
    return m;
  };
  bool readable = true;  // a change from a group this peer holds, which checks out
  if (r.ok() && form == kWhole) {
    const std::uint64_t count = r.uvar();
    if (r.ok() && (count == 0 || count > kMaxMembers)) r.fail(ErrorCode::kMalformed, "a group of " + std::to_string(count) + " members");
    for (std::uint64_t i = 0; r.ok() && i < count; ++i) {
      MemberInfo m = read_member();
      if (r.ok() && i > 0 && !(g.members.back().id < m.id)) r.fail(ErrorCode::kMalformed, "members not sorted by id");
      g.members.push_back(std::move(m));
    }
    r.expect_end();
  } else if (r.ok()) {
    const std::uint64_t base = r.uvar();
    const std::uint64_t count = r.uvar();
    const std::uint64_t check = r.u64();
    if (r.ok() && (count == 0 || count > kMaxMembers)) r.fail(ErrorCode::kMalformed, "a group of " + std::to_string(count) + " members");
    if (r.ok() && (base == 0 || base > g.epoch)) r.fail(ErrorCode::kMalformed, "a change from epoch " + std::to_string(base));
    std::map<transport::PeerId, std::string> members;
    auto held = known_.find(base);
    readable = held != known_.end();
    if (readable) {
      for (const auto& m : held->second) members[m.id] = m.address;
    }
    const std::uint64_t removed = r.uvar();
    if (r.ok() && removed > kMaxMembers) r.fail(ErrorCode::kMalformed, std::to_string(removed) + " members removed");
    for (std::uint64_t i = 0; r.ok() && i < removed; ++i) {
      const transport::PeerId id{r.u64()};
      if (r.ok() && readable && members.erase(id) == 0) readable = false;
    }
    const std::uint64_t added = r.uvar();
    if (r.ok() && added > kMaxMembers) r.fail(ErrorCode::kMalformed, std::to_string(added) + " members added");
    for (std::uint64_t i = 0; r.ok() && i < added; ++i) {
      MemberInfo m = read_member();
      if (r.ok() && readable && !members.emplace(m.id, m.address).second) readable = false;
    }
    r.expect_end();
    if (r.ok() && readable) {
      for (auto& [id, address] : members) g.members.push_back(MemberInfo{id, std::move(address)});
      readable = g.members.size() == count && check_of(g.members) == check;
    }
  }
  // (Any peer holding the group may answer with it, so the origin need not be the leader.)
  if (!r.ok()) {
    drop_locked("a malformed GROUP", origin, r.status().to_string());
    return false;
  }
  max_epoch_ = std::max(max_epoch_, g.epoch);
  if (!readable) {
    // A change from a group this peer does not hold: it asks the sender for the whole group.
    const auto mine = ready_.find(round);
    if (mine != ready_.end()) {
      if (auto it = mine->second.find(gossip_.self()); it != mine->second.end()) {
        out.push_back(Outgoing{origin, encode_ready(round, it->second.after_epoch, it->second.step, gossip_.self(), 0,
                                                    it->second.unlinked ? kUnlinked : 0, address_)});
      }
    }
    return true;
  }
  remember_locked(g);
  auto& slot = groups_[round];
  // Two leaders at once (views differ for a moment): the larger epoch wins, then the lower leader.
  if (slot.members.empty() || g.epoch > slot.epoch || (g.epoch == slot.epoch && g.leader < slot.leader)) slot = std::move(g);
  return true;
}

Result<GroupView> Coordinator::agree(std::int64_t round, std::uint64_t after_epoch, Deadline deadline, std::int64_t step, bool unlinked) {
  const transport::PeerId self = gossip_.self();
  const Nanos ready_since = clock_.now();
  std::unique_lock lock(mu_);
  if (after_epoch > 0) ++stats_.retries;
  ready_[round][self] = Ready{after_epoch, step, last_ ? last_->epoch : 0, address_, ready_since, true, unlinked && after_epoch > 0};
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
  // READY goes to the leader and its fallback; a retry to everyone (the other members learn that the
  // epoch is abandoned, superseded()); once the grace is over, to everyone too (whoever leads then).
  std::set<transport::PeerId> told;  // told already (the leader: since the last repeat)
  const auto say_ready = [&](bool everyone, bool repeat) {
    std::vector<Outgoing> out;
    if (everyone) {
      out.push_back(Outgoing{std::nullopt, ready_message_locked(round, after_epoch, step, kToEveryone)});
    } else {
      // And to the lowest live id, when it is not in line: a peer left on its own (or a few split
      // off) hears of the main group from its leader, and comes back to it.
      // A repeat goes to the leader alone; the others in line have it once.
      const Bytes m = ready_message_locked(round, after_epoch, step, 0);
      const std::set<transport::PeerId>& alive = live_locked();
      std::vector<transport::PeerId> to = in_line_locked(alive);
      if (repeat && !to.empty()) told.erase(to.front());
      to.push_back(*alive.begin());
      for (transport::PeerId id : to) {
        if (id != self && told.insert(id).second) out.push_back(Outgoing{id, m});
      }
    }
    lock.unlock();
    send(std::move(out));
    lock.lock();
  };
  if (after_epoch > 0 && !options_.commit_rounds) {  // the leader retrying: it tells everyone itself that the epoch is abandoned
    const std::vector<transport::PeerId> line = in_line_locked();
    if (!line.empty() && line.front() == self && abandoned_[round] < after_epoch) {
      abandoned_[round] = after_epoch;
      Writer w = start_message(Kind::kAbandon, round);
      w.uvar(after_epoch);
      lock.unlock();
      send({Outgoing{std::nullopt, std::move(w).take()}});
      lock.lock();
    }
  }
  say_ready(false, false);
  Nanos last_repeat = clock_.now();
  // READY is repeated for a leader that missed it, less and less often.
  Nanos repeat_every = options_.repeat_every;
  Nanos last_view_check = clock_.now();
  int repeats_past_grace = 0;
  for (;;) {
    if (stopping_) return error(ErrorCode::kAborted, "this peer is leaving the run");
    if (after_epoch > 0 && options_.commit_rounds) {
      // The attempt is decided (by this peer, when it decides it): it went through for the others,
      // or it is abandoned and a new group follows.
      std::vector<Outgoing> out;
      decide_locked(round, after_epoch, out);
      if (!out.empty()) {
        lock.unlock();
        send(std::move(out));
        lock.lock();
        continue;
      }
      if (auto c = committed_.find(round); c != committed_.end() && c->second.first == after_epoch) {
        ++stats_.missed_commits;
        // It is out of its last group, as the others see it: it neither leads nor is waited for; its
        // READYs and INTENTs go to those who lead the members now.
        if (last_ && last_->epoch == after_epoch) {
          out_ = c->second.second;
          out_.insert(self);
        }
        return error(ErrorCode::kAborted, "round " + std::to_string(round) + " went through for the other members (epoch " +
                                              std::to_string(after_epoch) + ") while this peer's collective failed: it is left out and "
                                              "catches up with their state");
      }
    }
    auto it = groups_.find(round);
    if (it != groups_.end() && it->second.epoch > after_epoch) {
      const GroupView g = it->second;
      if (g.rank_of(self) < 0) {
        return error(ErrorCode::kAborted, "left out of round " + std::to_string(round) + " by leader " + g.leader.to_string() +
                                              (after_epoch > 0 ? " (this peer was not ready in time, or retries an earlier step than the others)" : " (this peer was not ready in time)"));
      }
      // The group goes on from the state its leader applied the round before: a member that applied
      // that round over another epoch (it went on after an attempt the others abandoned) catches up.
      if (auto mine = applied_.find(round - 1); g.prior != 0 && mine != applied_.end() && mine->second != g.prior) {
        last_ = g;
        out_ = {self};
        return error(ErrorCode::kAborted, "this peer applied round " + std::to_string(round - 1) + " over epoch " + std::to_string(mine->second) +
                                              ", the group of round " + std::to_string(round) + " goes on from epoch " + std::to_string(g.prior) +
                                              ": it catches up with the members' state");
      }
      last_ = g;
      out_.clear();
      contacts_.clear();
      return g;
    }
    if (round == 0 && !last_) {
      const std::int64_t beyond = std::max({run_at_, ready_.empty() ? 0 : ready_.rbegin()->first, groups_.empty() ? 0 : groups_.rbegin()->first});
      if (beyond > 0) {
        return error(ErrorCode::kUnavailable, "the run is already past its start (its peers are at round " + std::to_string(beyond) +
                                                  "): it joins through a state transfer");
      }
    }
    if (auto decided = leader_decision(round, after_epoch, step, ready_since)) {
      groups_[round] = *decided;
      remember_locked(*decided);
      spdlog::info("round {}: leading, group of {} with epoch {}", round, decided->members.size(), decided->epoch);
      std::vector<Outgoing> out;
      announce_locked(*decided, after_epoch, out);
      lock.unlock();
      send(std::move(out));
      lock.lock();
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
      say_ready(everyone, true);
      last_repeat = clock_.now();
      repeat_every = std::min<Nanos>(2 * repeat_every, std::chrono::seconds(5));
      continue;
    }
    if (clock_.now() - last_view_check >= std::chrono::milliseconds(200)) {
      last_view_check = clock_.now();
      say_ready(false, false);  // (only those not told yet)
    }
    // Until a message arrives, or a poll interval passes (gossip's view of who is alive, and the
    // grace, change without a message).
    const std::uint64_t seen = changes_;
    const Nanos wake = std::min(clock_.now() + kPoll, deadline.time());
    signal_->wait(lock, Deadline::at(wake), [&] { return stopping_ || changes_ != seen; });
  }
}

}  // namespace gossamer::run
