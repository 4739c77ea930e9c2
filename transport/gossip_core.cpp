#include "transport/gossip_core.h"

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "core/wire.h"
#include "transport/endpoint.h"

namespace gossamer::transport {

namespace {
constexpr std::size_t kMaxTopic = 64, kMaxPayload = 64 * 1024, kMaxUpdates = 65536;

std::uint32_t differing(const Digest& a, const Digest& b) {
  std::uint32_t mask = 0;
  for (std::size_t i = 0; i < kDigestBuckets; ++i) mask |= a[i] != b[i] ? (1U << i) : 0U;
  return mask;
}

MemberTableOptions table_options(const GossipOptions& o) {
  MemberTableOptions t;
  t.self = o.self.value;
  t.max_members = o.max_members;
  t.period = o.period;
  t.suspicion_min = o.dead_after > o.suspect_after ? o.dead_after - o.suspect_after : o.dead_after;
  return t;
}

}  // namespace

GossipCore::GossipCore(GossipOptions options, std::string bound, const Clock& clock, std::uint64_t seed)
    : options_(std::move(options)),
      bound_(std::move(bound)),
      clock_(clock),
      table_(table_options(options_)),
      rng_(seed),
      outbound_only_(options_.outbound_only) {
  table_.set_self_row(announced(), outbound_only_);
  // Members offer their digests at different ticks, so the exchanges spread over the interval.
  sync_phase_ = std::uniform_int_distribution<std::uint64_t>(0, kSyncPeriods - 1)(rng_);
}

std::vector<GossipSend> GossipCore::counted(std::vector<GossipSend> sends) {
  std::uint64_t n = 0, membership = 0;
  for (const auto& s : sends) {
    n += s.message.size();
    // The type byte follows the magic and the version.
    const bool carried = s.message.size() > 5 && (s.message[5] == static_cast<std::byte>(MsgType::kBroadcast) ||
                                                  s.message[5] == static_cast<std::byte>(MsgType::kDirect));
    if (!carried) membership += s.message.size();
  }
  bytes_sent_.fetch_add(n);
  membership_bytes_sent_.fetch_add(membership);
  return sends;
}

std::vector<Member> GossipCore::members() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Member> out;
  for (const auto& [id, e] : table_.entries()) out.push_back(Member{PeerId{id}, e.address, e.incarnation, e.state, e.outbound_only});
  return out;
}

std::uint64_t GossipCore::members_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.version();
}

std::vector<Member> GossipCore::sample(std::size_t k) {
  std::vector<Member> live_members;
  for (auto& m : members()) {
    if (m.state == MemberState::kAlive) live_members.push_back(std::move(m));
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::shuffle(live_members.begin(), live_members.end(), rng_);
  if (live_members.size() > k) live_members.resize(k);
  return live_members;
}

Status GossipCore::broadcast(const std::string& topic, ByteView payload) {
  if (topic.size() > kMaxTopic) return error(ErrorCode::kInvalidArgument, "gossip topic longer than 64 bytes");
  if (payload.size() > kMaxPayload) return error(ErrorCode::kInvalidArgument, "gossip broadcasts are limited to 64 KiB");
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return error(ErrorCode::kAborted, "this node has left the gossip");
  outbox_.push_back(Outgoing{topic, Bytes(payload.begin(), payload.end()), PeerId{}});
  return Status();
}

Status GossipCore::send(PeerId to, const std::string& topic, ByteView payload) {
  if (topic.size() > kMaxTopic) return error(ErrorCode::kInvalidArgument, "gossip topic longer than 64 bytes");
  if (payload.size() > kMaxPayload) return error(ErrorCode::kInvalidArgument, "gossip messages are limited to 64 KiB");
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return error(ErrorCode::kAborted, "this node has left the gossip");
  if (to != options_.self && !target_of(to.value)) {
    const auto* e = table_.find(to.value);
    if (e == nullptr || !is_live(e->state)) return error(ErrorCode::kNotFound, "gossip knows no live member " + to.to_string());
  }
  outbox_.push_back(Outgoing{topic, Bytes(payload.begin(), payload.end()), to});
  return Status();
}

void GossipCore::subscribe(const std::string& topic, Gossip::Handler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  handlers_[topic].push_back(std::move(handler));
}

GossipCore::Stats GossipCore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int GossipCore::local_health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return health_;
}

std::optional<Nanos> GossipCore::round_trip() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!rtt_known_) return std::nullopt;
  return std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(srtt_s_));
}

std::uint32_t GossipCore::incarnation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.incarnation();
}

std::optional<GossipCore::Target> GossipCore::target_of(std::uint64_t id) const {
  auto it = table_.entries().find(id);
  if (it == table_.entries().end()) return std::nullopt;
  const auto& e = it->second;
  if (!e.outbound_only) return Target{e.address, PeerId{}};
  if (e.heard != Nanos::min()) return Target{e.address, PeerId{id}};  // through the connection it opened
  return std::nullopt;
}

std::vector<GossipCore::Target> GossipCore::random_live(std::size_t k, Nanos now, std::uint64_t except) {
  (void)now;
  std::vector<Target> out;
  const auto& ids = table_.alive_ids();
  if (k == 0 || ids.empty()) return out;
  if (2 * k >= ids.size()) {
    for (std::uint64_t id : ids) {
      if (id == except) continue;
      if (auto t = target_of(id)) out.push_back(std::move(*t));
    }
    std::shuffle(out.begin(), out.end(), rng_);
    if (out.size() > k) out.resize(k);
    return out;
  }
  // Few of many: distinct draws, so a period's work does not grow with the membership.
  std::vector<std::size_t> picked;
  std::uniform_int_distribution<std::size_t> pick(0, ids.size() - 1);
  for (std::size_t tries = 0; out.size() < k && tries < 8 * k + 32; ++tries) {
    const std::size_t i = pick(rng_);
    if (std::find(picked.begin(), picked.end(), i) != picked.end()) continue;
    picked.push_back(i);
    if (ids[i] == except) continue;
    if (auto t = target_of(ids[i])) out.push_back(std::move(*t));
  }
  return out;
}

void GossipCore::send_to(std::vector<GossipSend>& sends, const std::vector<Target>& targets, const Bytes& message) const {
  for (const auto& t : targets) sends.push_back(GossipSend{t.address, message, t.route});
}

void GossipCore::set_outbound_only(bool outbound_only) {
  std::lock_guard<std::mutex> lock(mu_);
  if (outbound_only_ == outbound_only) return;
  outbound_only_ = outbound_only;
  table_.set_self_row(announced(), outbound_only_);
  table_.bump_incarnation();  // the news must win over what others hold of this node
  table_.queue_self();
}

bool GossipCore::outbound_only() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outbound_only_;
}

void GossipCore::take_outbox_locked(std::vector<GossipSend>& sends, Nanos now, bool broadcasts_now) {
  while (!outbox_.empty()) {
    Outgoing o = std::move(outbox_.front());
    outbox_.pop_front();
    if (o.to.value != 0) {
      if (o.to == options_.self) {
        deliver_locked(options_.self, o.topic, o.payload);
        continue;
      }
      const Bytes m = direct_message(options_.self.value, o.to.value, o.topic, o.payload);
      if (auto t = target_of(o.to.value)) {
        sends.push_back(GossipSend{t->address, m, t->route});
        continue;
      }
      // Behind NAT and not connected to this node: through two members that accept connections
      // (the member probes every one in turn, so they hold its connection), which pass it on once.
      std::size_t relays = 0;
      for (const auto& t : random_live(8, now)) {
        if (t.route.value != 0 || relays == kDirectRelays) continue;  // (an outbound-only one)
        sends.push_back(GossipSend{t.address, m, PeerId{}});
        ++relays;
      }
      continue;
    }
    const std::uint64_t seq = ++broadcast_seq_;
    seen_.emplace(std::make_pair(options_.self.value, seq), now);
    deliver_locked(options_.self, o.topic, o.payload);
    rumors_.push_back(Rumor{broadcast_message(options_.self.value, seq, 0, o.topic, o.payload), kRumorRounds});
    if (broadcasts_now) send_to(sends, random_live(static_cast<std::size_t>(options_.fanout), now), rumors_.back().message);
  }
}

std::vector<GossipSend> GossipCore::tick() {
  std::vector<GossipSend> sends;
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return sends;
  const Nanos now = clock_.now();
  ++ticks_;
  sync_replies_ = 0;
  // A delivered broadcast is remembered far beyond the life of its rumor (at most
  // (kRumorRounds + 1) x max_hops periods, under 5 s at the defaults).
  const Nanos seen_for = std::max<Nanos>(std::chrono::seconds(60), 4 * (kRumorRounds + 1) * options_.max_hops * options_.period);
  if (now - seen_pruned_ >= seen_for) {
    std::erase_if(seen_, [&](const auto& kv) { return now - kv.second > seen_for; });
    seen_pruned_ = now;
  }
  check_probes_locked(sends, now);
  table_.set_self_health(static_cast<std::uint8_t>(health_), rto_ms());
  stats_.declared_dead += table_.expire_suspicions(now).size();
  probe_locked(sends, now);
  // Fresh news goes out at once to a few members, beside riding on probes: a death or a refutation
  // spreads in O(log n) periods. Each message takes its own updates, so each counts as a
  // transmission; news already sent kPushTimes times rides on probes only, which go out anyway.
  if (table_.has_fresh(kPushTimes)) {
    for (const auto& t : random_live(static_cast<std::size_t>(options_.fanout), now)) {
      if (!table_.has_queued()) break;
      Writer w;
      write_header(w, MsgType::kGossip);
      write_updates(w, kPushBudget);
      sends.push_back(GossipSend{t.address, std::move(w).take(), t.route});
    }
  }
  // Anti-entropy: now and then one member compares digests with this one, and at doubling intervals
  // soon after joining (2, 4, 8, 16, 32 periods: what a crowd of joiners missed in the first rush is
  // repaired in a few periods).
  if (joined_tick_ == 0 && !table_.alive_ids().empty()) joined_tick_ = ticks_;
  const std::uint64_t since_join = joined_tick_ == 0 ? 0 : ticks_ - joined_tick_;
  const bool early = since_join >= 2 && since_join <= 32 && (since_join & (since_join - 1)) == 0;
  if ((ticks_ + sync_phase_) % kSyncPeriods == 0 || early) {
    for (const auto& t : random_live(1, now)) sends.push_back(GossipSend{t.address, sync_message(kSyncOffer, 0), t.route});
  }
  take_outbox_locked(sends, now, /*broadcasts_now=*/false);  // (the rumors below send them)
  // Every live rumor goes to `fanout` random peers for a few periods, so it survives lost messages
  // and peers that join late.
  for (auto& rumor : rumors_) {
    send_to(sends, random_live(static_cast<std::size_t>(options_.fanout), now), rumor.message);
    --rumor.rounds_left;
  }
  std::erase_if(rumors_, [](const Rumor& r) { return r.rounds_left <= 0; });
  return counted(std::move(sends));
}

std::vector<GossipSend> GossipCore::take_broadcasts() {
  std::vector<GossipSend> sends;
  std::lock_guard<std::mutex> lock(mu_);
  if (!left_) take_outbox_locked(sends, clock_.now(), true);
  return counted(std::move(sends));
}

std::vector<GossipSend> GossipCore::farewell() {
  std::vector<GossipSend> sends;
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return sends;
  const Nanos now = clock_.now();
  // Broadcasts queued just before leaving go first (a round's last GROUP, announced by a leader that
  // then leaves at once): dropped, the peers waiting for it would elect one leader after another.
  take_outbox_locked(sends, now, true);
  // Left at a raised incarnation overrides anything said of this node at the old one. Sent to every
  // member it can reach (about 26 bytes each, once in a member's life, as joining costs): each needs
  // the news once, and first-hand it is not passed on again. (Sent to a few, to be spread as news, it
  // would not reach members that leave at the same moment, as a whole run does when it ends, and a
  // worker restarting then would have to find each of them dead by probing.)
  table_.bump_incarnation();
  Writer w;
  write_header(w, MsgType::kLeave);
  const Bytes bye = std::move(w).take();
  for (const auto& [id, e] : table_.entries()) {
    if (!is_live(e.state)) continue;
    if (auto t = target_of(id)) sends.push_back(GossipSend{t->address, bye, t->route});
  }
  left_ = true;
  return counted(std::move(sends));
}

bool GossipCore::left() const {
  std::lock_guard<std::mutex> lock(mu_);
  return left_;
}

bool GossipCore::knows_anyone() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !table_.entries().empty();
}

void GossipCore::deliver_locked(PeerId origin, const std::string& topic, const Bytes& payload) {
  auto it = handlers_.find(topic);
  if (it == handlers_.end()) return;
  for (auto& h : it->second) deliveries_.push_back(Delivery{h, origin, payload});
}

void GossipCore::run_deliveries() {
  std::vector<Delivery> now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    now.swap(deliveries_);
  }
  for (auto& d : now) d.handler(d.origin, d.payload);
}

void GossipCore::count_drop(const std::string& why) {
  dropped_.fetch_add(1);
  if (drop_log_.allow()) spdlog::warn("gossip: dropped a message: {}", why);
}

void GossipCore::apply_locked(MemberUpdate u, Nanos now, bool quiet, const std::string& observed_ip, bool first_hand) {
  if (u.id == 0) return;
  if ((u.kind == UpdateKind::kAlive || u.kind == UpdateKind::kLeft) && is_wildcard_address(u.address)) {
    // A peer listening on every address announces a wildcard: first-hand it takes the IP its messages
    // come from; second-hand the address already known is kept (or the row waits for a member that
    // heard it directly). From this very host (a loopback IP) the wildcard itself reaches it, and is
    // kept as it is: a loopback address relayed to other hosts would send them to themselves.
    if (first_hand && !observed_ip.empty()) {
      if (!is_loopback_ip(observed_ip)) u.address = with_host(u.address, observed_ip);
    } else if (const auto* e = table_.find(u.id); e != nullptr) {
      u.address = e->address;
    } else {
      return;
    }
  }
  const auto applied = table_.apply(u, now, quiet);
  if (applied == MemberTable::Applied::kFull) {
    count_drop("member table full (" + std::to_string(table_.entries().size()) + " members, none dead or departed)");
  } else if (applied == MemberTable::Applied::kRefuted) {
    ++stats_.refuted;
    set_health(health_ + 1);  // Lifeguard: being suspected hints that this node's messages run late
  } else if (applied == MemberTable::Applied::kNews && u.kind == UpdateKind::kDead) {
    ++stats_.declared_dead;
  }
}

bool GossipCore::read_updates_locked(Reader& r, Nanos now, bool quiet) {
  const std::uint64_t n = r.uvar();
  if (r.ok() && n > kMaxUpdates) {
    count_drop(std::to_string(n) + " member updates in one message");
    return false;
  }
  // Read whole first: a malformed message changes nothing.
  std::vector<MemberUpdate> updates;
  updates.reserve(std::min<std::size_t>(n, r.remaining() / 10));  // an update takes at least 10 bytes
  for (std::uint64_t i = 0; i < n && r.ok(); ++i) updates.push_back(read_update(r));
  r.expect_end();
  if (!r.ok()) {
    count_drop(r.status().message());
    return false;
  }
  for (auto& u : updates) apply_locked(std::move(u), now, quiet, std::string(), false);
  return true;
}

void GossipCore::handle_sync_locked(Reader& r, const Target& reply, std::vector<GossipSend>& sends, Nanos now) {
  const std::uint8_t mode = r.u8();
  Digest theirs{};
  for (auto& h : theirs) h = r.u64();
  if (r.ok() && mode > kSyncRows) return count_drop("unknown sync mode " + std::to_string(mode));
  if (!r.ok()) return count_drop(r.status().message());
  const Digest mine = table_.digest();  // before their rows: the buckets where the views differed
  if (!read_updates_locked(r, now, /*quiet=*/true)) return;
  const std::uint32_t mask = differing(theirs, mine);
  if (mask == 0 || mode == kSyncRows) return;
  // A reply can be a whole table: a few per period at most (joiners ask again each period).
  if (sync_replies_ >= kMaxSyncReplies) return;
  ++sync_replies_;
  sends.push_back(GossipSend{reply.address, sync_message(mode == kSyncOffer ? kSyncRowsReply : kSyncRows, mask), reply.route});
}

void GossipCore::handle_direct_locked(Reader& r, std::uint64_t sender, std::vector<GossipSend>& sends) {
  const std::uint8_t flags = r.u8();
  if (r.ok() && (flags & ~kRelayedFlag) != 0) r.fail(ErrorCode::kMalformed, "unknown direct message flags " + std::to_string(flags));
  const bool relayed = (flags & kRelayedFlag) != 0;
  const std::uint64_t origin = relayed ? r.u64() : sender;
  const std::uint64_t to = r.u64();
  const std::string topic = r.vstr(kMaxTopic);
  ByteView payload = r.vblob(kMaxPayload);
  r.expect_end();
  if (!r.ok()) return count_drop(r.status().message());
  if (to == options_.self.value) {
    deliver_locked(PeerId{origin}, topic, Bytes(payload.begin(), payload.end()));
    return;
  }
  // A member behind NAT that its sender cannot reach: passed on once, first-hand only.
  if (relayed) return count_drop("a direct message relayed twice");
  if (auto t = target_of(to)) sends.push_back(GossipSend{t->address, direct_message(origin, to, topic, payload), t->route});
}

void GossipCore::handle_broadcast_locked(Reader& r, std::vector<GossipSend>& sends, Nanos now) {
  const std::uint64_t origin = r.u64(), seq = r.uvar();
  const std::uint8_t hops = r.u8();
  const std::string topic = r.vstr(kMaxTopic);
  ByteView payload = r.vblob(kMaxPayload);
  r.expect_end();
  if (!r.ok()) return count_drop(r.status().message());
  if (!seen_.emplace(std::make_pair(origin, seq), now).second) return;  // already delivered
  const Bytes body(payload.begin(), payload.end());
  deliver_locked(PeerId{origin}, topic, body);
  if (hops + 1 < options_.max_hops) {
    Rumor rumor{broadcast_message(origin, seq, static_cast<std::uint8_t>(hops + 1), topic, body), kRumorRounds};
    send_to(sends, random_live(static_cast<std::size_t>(options_.fanout), now), rumor.message);
    rumors_.push_back(std::move(rumor));
  }
}

Result<MemberUpdate> GossipCore::read_sender(Reader& r, std::uint8_t type) {
  MemberUpdate hello;
  hello.kind = UpdateKind::kAlive;
  hello.id = r.u64();
  const std::uint8_t flags = r.u8();
  if (r.ok() && (flags & ~(kOutboundFlag | kAddressFlag)) != 0) r.fail(ErrorCode::kMalformed, "unknown sender flags " + std::to_string(flags));
  if ((flags & kAddressFlag) != 0) hello.address = read_address(r);
  hello.incarnation = static_cast<std::uint32_t>(r.uvar(UINT32_MAX));
  const std::uint8_t health = r.u8();
  hello.rto_ms = static_cast<std::uint16_t>(r.uvar(UINT16_MAX));
  if (r.ok() && (flags & kAddressFlag) == 0 && type != static_cast<std::uint8_t>(MsgType::kAck) && type != static_cast<std::uint8_t>(MsgType::kNack)) {
    r.fail(ErrorCode::kMalformed, "a gossip message without its sender's address");
  }
  if (!r.ok()) return r.status();
  hello.outbound_only = (flags & kOutboundFlag) != 0;
  hello.health = static_cast<std::uint8_t>(std::min<int>(health, kMaxHealth));
  return hello;
}

std::vector<GossipSend> GossipCore::handle(ByteView data, const std::string& observed_ip) {
  std::vector<GossipSend> sends;
  bytes_received_.fetch_add(data.size());
  Reader r(data, "gossip message");
  ByteView magic = r.raw(4);
  if (!r.ok() || std::memcmp(magic.data(), kMagic, 4) != 0) {
    count_drop("not a Gossamer gossip message");
    return sends;
  }
  const std::uint8_t version = r.u8(), type = r.u8();
  if (r.ok() && version != kVersion) {
    count_drop("gossip version " + std::to_string(version) + " (we speak " + std::to_string(kVersion) + "): " +
               (version < kVersion ? "that peer runs an older Gossamer; upgrade it" : "this peer runs an older Gossamer; upgrade it"));
    return sends;
  }
  auto sender = read_sender(r, type);
  if (!sender.ok()) {
    count_drop(sender.status().message());
    return sends;
  }
  MemberUpdate hello = std::move(*sender);
  if (hello.id == options_.self.value || hello.id == 0) return sends;
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return sends;
  const Nanos now = clock_.now();
  if (type < static_cast<std::uint8_t>(MsgType::kPing) || type > static_cast<std::uint8_t>(MsgType::kDirect)) {
    count_drop("unknown gossip message type " + std::to_string(type));
    return sends;
  }
  const auto msg = static_cast<MsgType>(type);
  if (msg == MsgType::kLeave) {
    r.expect_end();
    if (!r.ok()) {
      count_drop(r.status().message());
      return sends;
    }
    hello.kind = UpdateKind::kLeft;
    apply_locked(hello, now, /*quiet=*/true, observed_ip, true);
    return counted(std::move(sends));
  }
  // The header is the sender's own word that it is alive: first-hand, so a wildcard takes its IP.
  // Without an address (an ack or nack) it can only confirm a member known already.
  if (hello.address.empty()) {
    if (const auto* e = table_.find(hello.id); e != nullptr) hello.address = e->address;
  }
  if (!hello.address.empty()) apply_locked(hello, now, false, observed_ip, true);
  Target reply{hello.address, PeerId{}};
  if (auto* e = table_.find(hello.id); e != nullptr) {
    e->heard = now;  // it reached us directly: an outbound-only sender can be answered through its connection
    e->health = hello.health;
    e->rto = std::chrono::milliseconds(hello.rto_ms);
    reply.address = e->address;
    // It does not know it is suspected or declared dead: tell it, so it refutes.
    if ((e->state == MemberState::kSuspect || e->state == MemberState::kDead) && e->incarnation >= hello.incarnation) {
      MemberUpdate u;
      u.kind = e->state == MemberState::kDead ? UpdateKind::kDead : UpdateKind::kSuspect;
      u.id = hello.id;
      u.incarnation = e->incarnation;
      u.accuser = e->accusers.empty() ? options_.self.value : e->accusers.front();
      sends.push_back(GossipSend{e->address, news_message(u), e->outbound_only ? PeerId{hello.id} : PeerId{}});
    }
  } else if (is_wildcard_address(reply.address) && !observed_ip.empty() && !is_loopback_ip(observed_ip)) {
    reply.address = with_host(reply.address, observed_ip);
  }
  if (hello.outbound_only) reply.route = PeerId{hello.id};
  switch (msg) {
    case MsgType::kPing:
    case MsgType::kPingReq:
    case MsgType::kAck:
    case MsgType::kNack:
      if (!handle_probe_locked(msg, r, hello.id, reply, sends, now)) return counted(std::move(sends));
      break;
    case MsgType::kGossip:
      (void)read_updates_locked(r, now, false);
      return counted(std::move(sends));
    case MsgType::kSync:
      handle_sync_locked(r, reply, sends, now);
      return counted(std::move(sends));
    case MsgType::kBroadcast:
      handle_broadcast_locked(r, sends, now);
      return counted(std::move(sends));
    case MsgType::kDirect:
      handle_direct_locked(r, hello.id, sends);
      return counted(std::move(sends));
    case MsgType::kLeave:
      break;
  }
  if (!r.ok()) count_drop(r.status().message());
  return counted(std::move(sends));
}

}  // namespace gossamer::transport
