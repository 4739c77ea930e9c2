// Coordinator, the leader's side (coordinator.h): how long it waits for the rest (the adaptive
// grace), who leads an attempt, whom the leader waits for, the group it makes, and sending it.
#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "runtime/coordinator.h"

namespace gossamer::runtime {

namespace {
constexpr std::size_t kLagHistory = 8;   // rounds whose lag the grace adapts to
constexpr std::size_t kLagsToAdapt = 3;  // before that many, the full straggler_grace
}  // namespace

void Coordinator::announce_locked(const GroupView& g, std::uint64_t after_epoch, std::vector<Outgoing>& out) {
  // To every peer ready for this attempt, members and those left out alike (they learn it at once),
  // each as a change from the group it holds: the same bytes for most.
  std::map<std::uint64_t, Bytes> by_known;
  const Nanos now = clock_.now();
  for (const auto& [id, ready] : ready_[g.round]) {
    if (id == gossip_.self() || ready.after_epoch < after_epoch) continue;
    auto [it, fresh] = by_known.try_emplace(ready.known_epoch);
    if (fresh) it->second = group_message_locked(g, ready.known_epoch);
    out.push_back(Outgoing{id, it->second});
    answered_[{g.round, id}] = {now, ready.known_epoch == 0 || known_.count(ready.known_epoch) == 0};
  }
}

Nanos Coordinator::grace() const {
  if (lags_.size() < kLagsToAdapt) return options_.straggler_grace;
  // The median lag plus grace_spread robust spreads (CoordinatorOptions).
  const auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  std::vector<double> lags;
  for (Nanos l : lags_) lags.push_back(std::chrono::duration<double>(l).count());
  const double median = median_of(lags);
  std::vector<double> deviations;
  for (double l : lags) deviations.push_back(std::abs(l - median));
  const double spread = std::max(1.4826 * median_of(deviations), median / 4);
  const auto learned = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(median + options_.grace_spread * spread));
  return std::clamp(learned, std::min(options_.min_grace, options_.straggler_grace), options_.straggler_grace);
}

std::optional<Nanos> Coordinator::quorum_at_locked(std::int64_t round, const std::set<transport::PeerId>& expected,
                                                   const std::map<transport::PeerId, std::string>& ready, Nanos ready_since) const {
  // Each peer's share: its work in the last round where known (and not nothing), else the median of
  // the known ones (a newcomer's, or everyone's at the start: equal shares).
  std::set<transport::PeerId> counted = expected;
  for (const auto& [id, address] : ready) counted.insert(id);
  std::vector<std::int64_t> known;
  for (transport::PeerId id : counted) {
    if (auto w = work_.find(id); w != work_.end() && w->second > 0) known.push_back(w->second);
  }
  std::sort(known.begin(), known.end());
  const double usual = known.empty() ? 1.0 : static_cast<double>(known[known.size() / 2]);
  const auto share = [&](transport::PeerId id) {
    auto w = work_.find(id);
    return w != work_.end() && w->second > 0 ? static_cast<double>(w->second) : usual;
  };
  double total = 0;
  for (transport::PeerId id : counted) total += share(id);
  // The ready peers in the order they became ready.
  std::vector<std::pair<Nanos, transport::PeerId>> arrivals;
  const auto& announced = ready_.at(round);
  for (const auto& [id, address] : ready) arrivals.emplace_back(id == gossip_.self() ? ready_since : announced.at(id).at, id);
  std::sort(arrivals.begin(), arrivals.end());
  double arrived = 0;
  for (const auto& [at, id] : arrivals) {
    arrived += share(id);
    if (arrived >= options_.quorum * total) return at;
  }
  return std::nullopt;
}

transport::PeerId Coordinator::leader_locked(std::int64_t round, std::uint64_t after_epoch, const std::set<transport::PeerId>& alive,
                                             bool grace_over) {
  // The lowest live id among the last group's members (this peer among them), at the start the lowest
  // live id (whom every READY goes to); once the grace is over (stragglers and the dead no longer
  // count), the lowest among the peers ready for this attempt.
  transport::PeerId leader = gossip_.self();
  if (last_ && !grace_over) {
    // (Sorted by id: the first live one below this peer leads; any live one, when this peer is out
    // of the group, left out of a round that went through without it.)
    const bool out = out_.count(leader) == 1;
    for (const auto& m : last_->members) {
      if (!out && !(m.id < leader)) break;
      if (alive.count(m.id) == 1 && out_.count(m.id) == 0) {
        leader = m.id;
        break;
      }
    }
  } else if (!grace_over) {
    leader = std::min(leader, *alive.begin());
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
      if (alive.count(m.id) == 1 && out_.count(m.id) == 0) expected.insert(m.id);
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
  std::uint32_t width = options_.layout ? options_.layout(g.members.size()) : 0;
  if (width == 1) width = 0;
  const bool unchanged = last_ && after_epoch == 0 && g.members == last_->members && last_->epoch == max_epoch_ && out_.empty() &&
                         !superseded_locked(last_->round, last_->epoch) && width == last_->width;
  g.epoch = unchanged ? last_->epoch : std::max(max_epoch_, after_epoch) + 1;
  g.width = width;
  if (auto prior = applied_.find(round - 1); prior != applied_.end()) g.prior = prior->second;
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
  // (Every waiting peer asks at every poll: no copies of the live set, and a peer that does not lead
  // finds out in a few look-ups.)
  const std::set<transport::PeerId>& alive = live_locked();
  const transport::PeerId self = gossip_.self();
  // A peer in line (it hears every READY) may lead once its grace is over; any other a little later
  // (up to 2 s), when the READYs of the others waiting have come to everyone and a group from the
  // leader's line, if any, has arrived.
  const std::vector<transport::PeerId> line = in_line_locked(alive);
  const bool in_line = std::find(line.begin(), line.end(), self) != line.end();
  const Nanos wait = grace() + (in_line ? Nanos{0} : std::min<Nanos>(grace(), std::chrono::seconds(2)));
  const bool grace_over = clock_.now() >= ready_since + wait;
  // A newcomer, which knows no last group (nor the epochs in use), does not lead before the grace is over.
  if (!last_ && round > 0 && !grace_over) return std::nullopt;
  if (leader_locked(round, after_epoch, alive, grace_over) != self) return std::nullopt;
  // All-or-nothing rounds: a retried attempt is regrouped only once it is decided abandoned (nobody
  // applied it); one that went through leaves those retrying it out instead.
  if (options_.commit_rounds && after_epoch > 0 && !abandoned_locked(round, after_epoch)) return std::nullopt;
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
  if (!enough) return std::nullopt;
  // Short of everyone: once a quorum of the work is ready and the grace has passed since (at the
  // latest at straggler_grace).
  const Nanos now = clock_.now();
  const std::optional<Nanos> quorum_at = quorum_at_locked(round, expected, ready, ready_since);
  const bool waited_enough = newcomer_wait ? now >= ready_since + std::max(*newcomer_wait, grace())
                                           : (quorum_at && now >= *quorum_at + grace()) || now >= ready_since + options_.straggler_grace;
  if (!complete && !waited_enough) return std::nullopt;
  if (complete && last_ && after_epoch == 0 && quorum_at) {
    // How long after the quorum the last member became ready: the lag the grace learns from.
    Nanos lag{0};
    for (transport::PeerId id : expected) {
      if (id != self) lag = std::max(lag, ready_[round][id].at - *quorum_at);
    }
    lags_.push_back(lag);
    if (lags_.size() > kLagHistory) lags_.pop_front();
  }
  if (!complete && !newcomer_wait && quorum_at && now >= *quorum_at + grace()) ++stats_.quorum_closes;
  return make_group_locked(round, after_epoch, step, ready, expected);
}

}  // namespace gossamer::runtime

