// Coordinator, rounds committed all-or-nothing (coordinator.h): a member's DONE, the decider's
// COMMIT or ABANDON of a retried attempt, and what a member reads of them.
#include <algorithm>

#include <spdlog/spdlog.h>

#include "runtime/coordinator.h"
#include "runtime/coordinator_messages.h"

namespace gossamer::runtime {

using namespace coordinator_parts;

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
  const auto [epoch, left] = read_commit(r);
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

}  // namespace gossamer::runtime
