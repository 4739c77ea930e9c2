#include "runtime/announcements.h"

#include <algorithm>
#include <cmath>

#include "transport/endpoint.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include <spdlog/spdlog.h>

#include "core/hash.h"
#include "core/wire.h"

namespace gossamer::runtime {

using namespace std::chrono_literals;

namespace {

constexpr const char* kSpecTopic = "gossamer.spec";
constexpr const char* kStateTopic = "gossamer.state";
constexpr Nanos kAnswerEvery = std::chrono::seconds(1);  // a spec holder answers one asker at most this often
constexpr int kAnswersPerSecond = 8;  // and this many askers a second in all (a spec is up to 60 KiB)
constexpr std::size_t kAsked = 3;     // members a WANT goes to at once
constexpr std::size_t kMaxJoinTargets = 32;  // members a newcomer asks for the state at most, after rounds without an offer

}  // namespace

namespace announcement_wire {

Bytes encode_spec(const Spec& spec, std::int64_t round, bool full) {
  Writer w;
  w.u8(kSpecVersion);
  w.u8(full ? kFullSpec : kBeacon);
  const Digest d = digest_of(as_bytes(spec.toml));
  w.raw(ByteView(reinterpret_cast<const std::byte*>(d.bytes.data()), d.bytes.size()));
  if (full) w.str(spec.toml);
  w.u32(spec.wait_for);
  w.i64(round);
  return std::move(w).take();
}

Bytes encode_want() {
  Writer w;
  w.u8(kSpecVersion);
  w.u8(kWant);
  return std::move(w).take();
}

Result<SpecMessage> decode_spec(ByteView bytes, const std::string& from) {
  Reader r(bytes, "run spec from " + from);
  SpecMessage m;
  const std::uint8_t version = r.u8();
  m.kind = r.u8();
  if (!r.ok()) return r.status();
  if (version != kSpecVersion) {
    return error(ErrorCode::kMalformed, from + " announces a run spec of version " + std::to_string(version) + ", this peer reads " +
                                            std::to_string(kSpecVersion) + ": run the same gossamer version on every peer");
  }
  if (m.kind == kWant) {
    r.expect_end();
    if (!r.ok()) return r.status();
    return m;
  }
  if (m.kind != kBeacon && m.kind != kFullSpec) return error(ErrorCode::kMalformed, "a run announcement of unknown kind " + std::to_string(m.kind));
  const ByteView hash = r.raw(32);
  if (m.kind == kFullSpec) m.spec.toml = r.str(kMaxSpec);
  m.spec.wait_for = r.u32();
  m.round = r.i64();
  r.expect_end();
  if (!r.ok()) return r.status();
  if (m.kind == kFullSpec && std::memcmp(hash.data(), digest_of(as_bytes(m.spec.toml)).bytes.data(), 32) != 0) {
    return error(ErrorCode::kMalformed, "the run spec from " + from + " does not match its hash");
  }
  return m;
}

Bytes encode_board(const BoardMessage& m) {
  Writer w;
  w.u8(kBoardVersion);
  w.u8(m.kind);
  w.u64(m.id);
  if (m.kind == kJoin && m.link > 0) w.u64(m.link);
  if (m.kind == kOffer) {
    w.i64(m.round);
    w.str(m.address);
  }
  return std::move(w).take();
}

Result<BoardMessage> decode_board(ByteView bytes, const std::string& from) {
  Reader r(bytes, "state message from " + from);
  BoardMessage m;
  const std::uint8_t version = r.u8();
  m.kind = r.u8();
  m.id = r.u64();
  if (m.kind == kJoin && r.remaining() == 8) m.link = r.u64();
  if (m.kind == kOffer) {
    m.round = r.i64();
    m.address = r.str(256);
  }
  r.expect_end();
  if (!r.ok()) return r.status();
  if (version != kBoardVersion || (m.kind != kJoin && m.kind != kOffer && m.kind != kAbsent)) {
    return error(ErrorCode::kMalformed, "a state message of version " + std::to_string(version) + " and kind " + std::to_string(m.kind) +
                                            " (this peer reads version " + std::to_string(kBoardVersion) + ", kinds 1 to 3)");
  }
  return m;
}

}  // namespace announcement_wire

using namespace announcement_wire;

// An announcer's state, shared with its gossip handler (which may outlive it).
struct AnnouncerState {
  std::mutex mu;
  bool gone = false;  // the announcer (and what `round` reads) is gone
  std::function<std::int64_t()> round;
  std::map<transport::PeerId, Nanos> answered;  // askers answered lately, and when
  Nanos second_started{0};
  int answers_this_second = 0;
};

SpecAnnouncer::SpecAnnouncer(transport::Gossip& gossip, Spec spec, std::function<std::int64_t()> round, Clock& clock)
    : state_(std::make_shared<AnnouncerState>()) {
  state_->round = std::move(round);
  gossip.subscribe(kSpecTopic, [weak = std::weak_ptr<AnnouncerState>(state_), &gossip, &clock, spec = std::move(spec)](transport::PeerId origin,
                                                                                                                      const Bytes& payload) {
    if (payload.size() != 2 || static_cast<std::uint8_t>(payload[0]) != kSpecVersion || static_cast<std::uint8_t>(payload[1]) != kWant) return;
    auto s = weak.lock();
    if (!s) return;
    std::int64_t at = -1;
    {
      std::lock_guard lock(s->mu);
      if (s->gone) return;
      const Nanos now = clock.now();
      // Bounded: one answer per asker a second, a few a second in all (askers ask again).
      if (auto it = s->answered.find(origin); it != s->answered.end() && now - it->second < kAnswerEvery) return;
      if (now - s->second_started >= std::chrono::seconds(1)) {
        s->second_started = now;
        s->answers_this_second = 0;
        std::erase_if(s->answered, [&](const auto& kv) { return now - kv.second >= kAnswerEvery; });
      }
      if (s->answers_this_second >= kAnswersPerSecond) return;
      ++s->answers_this_second;
      s->answered[origin] = now;
      at = s->round();
    }
    (void)gossip.send(origin, kSpecTopic, encode_spec(spec, at, /*full=*/true));
  });
}

SpecAnnouncer::~SpecAnnouncer() {
  std::lock_guard lock(state_->mu);
  state_->gone = true;
}

void ask_for_spec(HeardSpec& heard) {
  if (heard.gossip == nullptr) return;
  {
    std::lock_guard lock(heard.mu);
    if (heard.asked && heard.clock->now() - *heard.asked < std::chrono::seconds(1)) return;
  }
  // A few live members at random: most hold the spec, and it asks again a second later (at once
  // once it knows a member, when it knew none yet).
  const auto members = heard.gossip->sample(kAsked);
  for (const auto& m : members) (void)heard.gossip->send(m.id, kSpecTopic, encode_want());
  if (members.empty()) return;
  std::lock_guard lock(heard.mu);
  heard.asked = heard.clock->now();
}

std::shared_ptr<HeardSpec> listen_for_spec(transport::Gossip& gossip, Clock& clock) {
  auto heard = std::make_shared<HeardSpec>();
  heard->clock = &clock;
  heard->signal = clock.make_signal();
  heard->gossip = &gossip;
  gossip.subscribe(kSpecTopic, [heard](transport::PeerId origin, const Bytes& payload) {
    auto m = decode_spec(payload, "peer " + origin.to_string());
    if (m.ok() && m->kind == kWant) return;  // for the announcers
    std::lock_guard lock(heard->mu);
    if (m.ok()) {
      if (m->kind == kFullSpec && !heard->spec) heard->spec = std::move(m->spec);
      heard->latest_round = std::max(heard->latest_round, m->round);
      heard->signal->notify_all();
      return;
    }
    std::string problem = m.status().code() == ErrorCode::kMalformed ? m.status().message() : m.status().to_string();
    if (problem != heard->last_problem) spdlog::warn("ignored a run spec: {}", problem);
    heard->last_problem = std::move(problem);
  });
  return heard;
}

std::string reachable_address(const transport::Gossip& gossip, transport::PeerId id, const std::string& address) {
  if (!transport::is_wildcard_address(address)) return address;
  for (const auto& m : gossip.members()) {
    if (m.id == id && !transport::is_wildcard_address(m.address)) return transport::with_host(address, transport::host_of(m.address));
  }
  return address;
}

Result<Spec> receive_spec(HeardSpec& heard, Nanos timeout, const std::atomic<bool>* stop) {
  Clock& clock = *heard.clock;
  std::unique_lock lock(heard.mu);
  const Nanos until = clock.now() + timeout;
  std::optional<RunGoneWatch> watch;
  if (heard.gossip != nullptr) watch.emplace(*heard.gossip, clock, std::chrono::seconds(3));
  // In slices, so that a stop request (Ctrl-C) ends the wait within a tenth of a second.
  while (!heard.spec.has_value() && clock.now() < until) {
    if (stop != nullptr && stop->load()) return error(ErrorCode::kAborted, "stop requested while waiting for the run spec");
    if (watch && watch->gone()) return error(ErrorCode::kUnavailable, "every peer this one heard of has left or died: the run is over");
    if (heard.gossip != nullptr && (!heard.asked || clock.now() - *heard.asked >= std::chrono::seconds(1))) {
      lock.unlock();
      ask_for_spec(heard);
      lock.lock();
      if (heard.spec.has_value()) break;
    }
    heard.signal->wait(lock, Deadline::at(std::min(until, clock.now() + std::chrono::milliseconds(100))), [&] { return heard.spec.has_value(); });
  }
  if (!heard.spec.has_value()) {
    return error(ErrorCode::kTimeout, "no run spec heard from the peers joined within " + std::to_string(timeout.count() / 1000000000) + " s" +
                                          (heard.last_problem.empty() ? std::string(": check the --join addresses (and that every peer has the same --key)")
                                                                      : ": " + heard.last_problem));
  }
  return *heard.spec;
}

bool RunGoneWatch::gone() {
  const std::uint64_t version = gossip_.members_version();
  if (version == 0 || version != version_) {
    version_ = version;
    live_.clear();
    const auto members = gossip_.members();
    known_any_ = !members.empty();
    for (const auto& m : members) {
      if (m.state == transport::MemberState::kAlive || m.state == transport::MemberState::kSuspect) live_.push_back(m.id);
    }
  }
  const bool alive = std::any_of(live_.begin(), live_.end(), [&](transport::PeerId id) { return !(outside_ && outside_(id)); });
  if (alive || !known_any_) {
    if (alive) since_ = clock_.now();
    return false;
  }
  return clock_.now() - since_ > patience_;
}

std::shared_ptr<JoinBoard> JoinBoard::make(transport::Gossip& gossip, const Clock& clock) {
  auto b = std::make_shared<JoinBoard>(gossip, clock);
  gossip.subscribe(kStateTopic, [weak = std::weak_ptr<JoinBoard>(b)](transport::PeerId origin, const Bytes& payload) {
    if (auto self = weak.lock()) self->on_message(origin, payload);
  });
  return b;
}

void JoinBoard::ask_to_join(double link_bytes_per_s) {
  const bool known = std::isfinite(link_bytes_per_s) && link_bytes_per_s >= 1;
  const Bytes m = encode(kJoin, 0, "", known ? static_cast<std::uint64_t>(std::min(link_bytes_per_s, 1e15)) : 0);
  std::vector<transport::PeerId> to;
  {
    std::lock_guard lock(mu_);
    // The same members each time (those that offer keep their snapshot while it asks), less the ones
    // gone; the two lowest live ids among them (most likely the leader, who then waits for it), the
    // rest at random; more of them while none offers.
    std::set<transport::PeerId> live;
    for (const auto& m2 : gossip_.members()) {
      if (m2.state == transport::MemberState::kAlive) live.insert(m2.id);
    }
    std::erase_if(targets_, [&](transport::PeerId id) { return live.count(id) == 0; });
    const Nanos now = clock_.now();
    if (!asked_since_) asked_since_ = now;
    if (offers_.empty() && now - *asked_since_ >= std::chrono::seconds(10) && target_count_ < kMaxJoinTargets) {
      target_count_ = std::min(kMaxJoinTargets, target_count_ + kJoinTargets);
      asked_since_ = now;
    }
    for (transport::PeerId id : live) {
      if (targets_.size() >= 2 || target_count_ == 0) break;
      targets_.insert(id);
    }
    std::vector<transport::PeerId> rest;
    for (transport::PeerId id : live) {
      if (targets_.count(id) == 0) rest.push_back(id);
    }
    std::shuffle(rest.begin(), rest.end(), rng_);
    for (std::size_t i = 0; i < rest.size() && targets_.size() < target_count_; ++i) targets_.insert(rest[i]);
    to.assign(targets_.begin(), targets_.end());
  }
  for (transport::PeerId id : to) (void)gossip_.send(id, kStateTopic, m);
}

std::optional<double> JoinBoard::link_of(transport::PeerId id) const {
  std::lock_guard lock(mu_);
  auto it = links_.find(id);
  if (it == links_.end()) return std::nullopt;
  return it->second;
}

void JoinBoard::set_member(bool member) {
  std::lock_guard lock(mu_);
  member_ = member;
}

bool JoinBoard::absent(transport::PeerId id, Nanos within) const {
  std::lock_guard lock(mu_);
  auto it = absent_.find(id);
  return it != absent_.end() && clock_.now() - it->second <= within;
}

void JoinBoard::offer(std::int64_t round, const std::string& address) {
  const Bytes m = encode(kOffer, round, address);
  for (transport::PeerId id : waiting()) (void)gossip_.send(id, kStateTopic, m);
}

std::vector<transport::PeerId> JoinBoard::offerers(std::int64_t round) const {
  std::lock_guard lock(mu_);
  std::vector<transport::PeerId> ids;
  if (auto it = offers_.find(round); it != offers_.end()) {
    for (const auto& [id, address] : it->second) ids.push_back(id);
  }
  return ids;
}

std::vector<transport::PeerId> JoinBoard::waiting() const {
  std::lock_guard lock(mu_);
  std::vector<transport::PeerId> ids;
  const Nanos now = clock_.now();
  for (const auto& [id, until] : wanted_until_) {
    if (now < until) ids.push_back(id);
  }
  return ids;
}

std::optional<std::pair<std::int64_t, std::vector<Donor>>> JoinBoard::newest_offer(Nanos settle) const {
  std::size_t others = 0;  // live members it asked: once each of them offers a round, waiting longer gains nothing
  std::set<transport::PeerId> asked;
  {
    std::lock_guard lock(mu_);
    asked = targets_;
  }
  {
    // (Asked at every poll of a newcomer's wait: gossip's table is copied only when it changed.)
    std::lock_guard lock(mu_);
    const std::uint64_t version = gossip_.members_version();
    if (version == 0 || version != alive_version_) {
      alive_.clear();
      for (const auto& m : gossip_.members()) {
        if (m.state == transport::MemberState::kAlive) alive_.insert(m.id);
      }
      alive_version_ = version;
    }
    for (transport::PeerId id : asked) others += alive_.count(id);
  }
  std::lock_guard lock(mu_);
  const Nanos now = clock_.now();
  for (auto it = offers_.rbegin(); it != offers_.rend(); ++it) {
    if (now < first_seen_.at(it->first) + settle && it->second.size() < others) continue;
    std::vector<Donor> out;
    for (const auto& [id, address] : it->second) out.push_back(Donor{reachable_address(gossip_, id, address), id.to_string()});
    return std::make_pair(it->first, out);
  }
  return std::nullopt;
}

void JoinBoard::forget(std::int64_t round) {
  std::lock_guard lock(mu_);
  offers_.erase(offers_.begin(), offers_.upper_bound(round));
  std::erase_if(first_seen_, [&](const auto& kv) { return kv.first <= round; });
}

Bytes JoinBoard::encode(std::uint8_t kind, std::int64_t round, const std::string& address, std::uint64_t link) const {
  return encode_board(BoardMessage{kind, gossip_.self().value, round, address, kind == kJoin ? link : 0});
}

void JoinBoard::on_message(transport::PeerId origin, const Bytes& payload) {
  auto m = decode_board(payload, "peer " + origin.to_string());
  if (!m.ok()) {
    spdlog::warn("dropped a state message from peer {}: {}", origin.to_string(), m.status().message());
    return;
  }
  const std::uint8_t kind = m->kind;
  const transport::PeerId id{m->id};
  const std::int64_t round = m->round;
  const std::string& address = m->address;
  const std::uint64_t link = m->link;
  std::unique_lock lock(mu_);
  const Nanos now = clock_.now();
  if (kind == kAbsent) {
    absent_[origin] = now;
    return;
  }
  if (kind == kJoin && !member_) {
    // Not in the run (waiting to start, or joining too): said at once, so that a newcomer among
    // newcomers only sees the run is over.
    lock.unlock();
    (void)gossip_.send(origin, kStateTopic, encode(kAbsent, 0, ""));
    return;
  }
  if (kind == kOffer) absent_.erase(id);
  if (kind == kJoin) {
    std::erase_if(wanted_until_, [&](const auto& kv) { return kv.second <= now; });  // bounded by who asked lately
    std::erase_if(links_, [&](const auto& kv) { return wanted_until_.count(kv.first) == 0; });
    wanted_until_[id] = now + 5s;
    if (link > 0) links_[id] = static_cast<double>(link);
  } else {
    offers_[round][id] = address;
    first_seen_.try_emplace(round, now);
    // Only the newest rounds offered matter (a newcomer takes the newest): the board keeps a few.
    while (offers_.size() > kKeptRounds) {
      first_seen_.erase(offers_.begin()->first);
      offers_.erase(offers_.begin());
    }
  }
}

}  // namespace gossamer::runtime
