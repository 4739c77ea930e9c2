#include "run/announcements.h"

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

namespace gossamer::run {

using namespace std::chrono_literals;

namespace {

constexpr const char* kSpecTopic = "gossamer.spec";
constexpr const char* kStateTopic = "gossamer.state";
constexpr std::uint8_t kStateVersion = 1;
constexpr std::uint8_t kSpecVersion = 2;
constexpr std::uint8_t kJoin = 1, kOffer = 2;
constexpr std::uint8_t kBeacon = 1, kFullSpec = 2, kWant = 3;
constexpr std::size_t kAnnouncers = 3;
constexpr Nanos kWantedFor = std::chrono::seconds(2);
constexpr Nanos kHolderSilence = std::chrono::seconds(3);  // an announcer not heard for this long has stopped

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

}  // namespace

// An announcer's state, shared with its gossip handler (which may outlive it).
struct AnnouncerState {
  std::mutex mu;
  std::unique_ptr<Signal> wake;  // stop, or a peer asked for the spec
  bool stop = false;
  std::optional<Nanos> wanted_at;  // when a peer last asked for the spec
  bool answer_now = false;         // it asked since the last announcement
  std::map<transport::PeerId, Nanos> holders;  // announcers heard, and when last

  // Whether this peer is one of the kAnnouncers lowest ids among the announcers heard in the last
  // few seconds that gossip still sees alive. Every holder announces until it hears enough lower
  // ones, and takes over again when they fall silent (under mu).
  bool among_announcers(const transport::Gossip& gossip, Nanos now) {
    std::set<transport::PeerId> alive;
    for (const auto& m : gossip.members()) {
      if (m.state == transport::MemberState::kAlive) alive.insert(m.id);
    }
    std::size_t lower = 0;
    for (auto it = holders.begin(); it != holders.end();) {
      if (now - it->second > kHolderSilence) {
        it = holders.erase(it);
        continue;
      }
      if (it->first < gossip.self() && alive.count(it->first) == 1) ++lower;
      ++it;
    }
    return lower < kAnnouncers;
  }
};

SpecAnnouncer::SpecAnnouncer(transport::Gossip& gossip, Spec spec, const std::atomic<std::int64_t>& round, Clock& clock)
    : gossip_(gossip), spec_(std::move(spec)), round_(round), clock_(clock), state_(std::make_shared<AnnouncerState>()) {
  state_->wake = clock.make_signal();
  gossip.subscribe(kSpecTopic, [weak = std::weak_ptr<AnnouncerState>(state_), &clock](transport::PeerId origin, const Bytes& payload) {
    if (payload.size() < 2 || static_cast<std::uint8_t>(payload[0]) != kSpecVersion) return;
    const auto kind = static_cast<std::uint8_t>(payload[1]);
    auto s = weak.lock();
    if (!s) return;
    if (kind == kBeacon || kind == kFullSpec) {  // (checked in full by listen_for_spec)
      std::lock_guard lock(s->mu);
      s->holders[origin] = clock.now();
      return;
    }
    if (kind != kWant || payload.size() != 2) return;
    {
      std::lock_guard lock(s->mu);
      s->wanted_at = clock.now();
      s->answer_now = true;
    }
    s->wake->notify_all();
  });
  thread_ = clock.start_thread([this] {
    auto& s = *state_;
    std::unique_lock lock(s.mu);
    while (!s.stop) {
      const bool full = s.wanted_at && clock_.now() - *s.wanted_at < kWantedFor;
      s.answer_now = false;
      const bool announce = s.among_announcers(gossip_, clock_.now());
      lock.unlock();
      if (announce) (void)gossip_.broadcast(kSpecTopic, encode_spec(spec_, round_.load(), full));
      lock.lock();
      s.wake->wait(lock, Deadline::after(clock_, 1s), [&] { return s.stop || s.answer_now; });
    }
  });
}

SpecAnnouncer::~SpecAnnouncer() {
  {
    std::lock_guard lock(state_->mu);
    state_->stop = true;
  }
  state_->wake->notify_all();
  thread_->join();
}

std::shared_ptr<HeardSpec> listen_for_spec(transport::Gossip& gossip, Clock& clock) {
  auto heard = std::make_shared<HeardSpec>();
  heard->clock = &clock;
  heard->signal = clock.make_signal();
  heard->gossip = &gossip;
  gossip.subscribe(kSpecTopic, [heard](transport::PeerId origin, const Bytes& payload) {
    Reader r(payload, "run spec from peer " + origin.to_string());
    const std::uint8_t version = r.u8();
    const std::uint8_t kind = r.u8();
    if (r.ok() && version == kSpecVersion && kind == kWant) return;  // for the announcers
    const ByteView hash = r.raw(32);
    std::string toml = kind == kFullSpec ? r.str(kMaxSpec) : std::string();
    const std::uint32_t wait_for = r.u32();
    const std::int64_t round = r.i64();
    r.expect_end();
    std::lock_guard lock(heard->mu);
    std::string problem;
    if (version != kSpecVersion) {
      problem = "peer " + origin.to_string() + " announces a run spec of version " + std::to_string(version) + ", this peer reads " +
                std::to_string(kSpecVersion) + ": run the same gossamer version on every peer";
    } else if (!r.ok() || (kind != kBeacon && kind != kFullSpec)) {
      problem = r.ok() ? "a run announcement of unknown kind " + std::to_string(kind) : r.status().to_string();
    } else if (kind == kFullSpec && std::memcmp(hash.data(), digest_of(as_bytes(toml)).bytes.data(), 32) != 0) {
      problem = "the run spec from peer " + origin.to_string() + " does not match its hash";
    } else {
      if (kind == kFullSpec && !heard->spec) heard->spec = Spec{std::move(toml), wait_for};
      heard->latest_round = std::max(heard->latest_round, round);
      heard->signal->notify_all();
      return;
    }
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
  std::optional<Nanos> asked;
  std::optional<RunGoneWatch> watch;
  if (heard.gossip != nullptr) watch.emplace(*heard.gossip, clock, std::chrono::seconds(3));
  // In slices, so that a stop request (Ctrl-C) ends the wait within a tenth of a second.
  while (!heard.spec.has_value() && clock.now() < until) {
    if (stop != nullptr && stop->load()) return error(ErrorCode::kAborted, "stop requested while waiting for the run spec");
    if (watch && watch->gone()) return error(ErrorCode::kUnavailable, "every peer this one heard of has left or died: the run is over");
    if (heard.gossip != nullptr && (!asked || clock.now() - *asked >= std::chrono::seconds(1))) {
      asked = clock.now();
      lock.unlock();
      (void)heard.gossip->broadcast(kSpecTopic, encode_want());
      lock.lock();
      continue;
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
  const auto members = gossip_.members();
  const bool alive = std::any_of(members.begin(), members.end(), [](const transport::Member& m) {
    return m.state == transport::MemberState::kAlive || m.state == transport::MemberState::kSuspect;
  });
  if (alive || members.empty()) {
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
  (void)gossip_.broadcast(kStateTopic, encode(kJoin, 0, "", known ? static_cast<std::uint64_t>(std::min(link_bytes_per_s, 1e15)) : 0));
}

std::optional<double> JoinBoard::link_of(transport::PeerId id) const {
  std::lock_guard lock(mu_);
  auto it = links_.find(id);
  if (it == links_.end()) return std::nullopt;
  return it->second;
}

void JoinBoard::offer(std::int64_t round, const std::string& address) { (void)gossip_.broadcast(kStateTopic, encode(kOffer, round, address)); }

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
  std::size_t others = 0;  // peers alive beside this one: once each of them offers a round, waiting longer gains nothing
  for (const auto& m : gossip_.members()) others += m.id != gossip_.self() && m.state == transport::MemberState::kAlive ? 1 : 0;
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
  Writer w;
  w.u8(kStateVersion);
  w.u8(kind);
  w.u64(gossip_.self().value);
  if (kind == kJoin && link > 0) w.u64(link);
  if (kind == kOffer) {
    w.i64(round);
    w.str(address);
  }
  return std::move(w).take();
}

void JoinBoard::on_message(transport::PeerId origin, const Bytes& payload) {
  Reader r(payload, "state message from peer " + origin.to_string());
  const std::uint8_t version = r.u8(), kind = r.u8();
  const transport::PeerId id{r.u64()};
  std::int64_t round = 0;
  std::string address;
  std::uint64_t link = 0;
  if (kind == kJoin && r.remaining() == 8) link = r.u64();
  if (kind == kOffer) {
    round = r.i64();
    address = r.str(256);
  }
  r.expect_end();
  if (!r.ok() || version != kStateVersion || (kind != kJoin && kind != kOffer)) {
    spdlog::warn("dropped a state message from peer {}: {}", origin.to_string(), r.ok() ? "unknown version or kind" : r.status().to_string());
    return;
  }
  std::lock_guard lock(mu_);
  const Nanos now = clock_.now();
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

}  // namespace gossamer::run
