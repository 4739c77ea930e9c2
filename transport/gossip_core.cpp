#include "transport/gossip_core.h"

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "core/wire.h"
#include "transport/endpoint.h"

namespace gossamer::transport {

namespace {
constexpr char kMagic[4] = {'G', 'S', 'G', 'P'};
// 3: SWIM membership (probes, incarnations, piggybacked updates, digests) in place of whole tables.
constexpr std::uint8_t kVersion = 3;
constexpr std::uint8_t kOutboundFlag = 2;
constexpr std::size_t kMaxAddress = 256, kMaxTopic = 64, kMaxPayload = 64 * 1024, kMaxUpdates = 65536;
constexpr std::uint8_t kSyncOffer = 0, kSyncRowsReply = 1, kSyncRows = 2;

bool live(MemberState s) { return s == MemberState::kAlive || s == MemberState::kSuspect; }

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
    if (s.message.size() > 5 && s.message[5] != static_cast<std::byte>(MsgType::kBroadcast)) membership += s.message.size();
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
  outbox_.push_back(Outgoing{topic, Bytes(payload.begin(), payload.end())});
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

std::uint32_t GossipCore::incarnation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.incarnation();
}

void GossipCore::write_header(Writer& w, MsgType type) const {
  w.raw(as_bytes(std::string_view(kMagic, 4)));
  w.u8(kVersion);
  w.u8(static_cast<std::uint8_t>(type));
  w.u64(options_.self.value);
  w.str(announced());
  w.u32(table_.incarnation());
  w.u8(static_cast<std::uint8_t>(health_));
  w.u16(rto_ms());
  w.u8(outbound_only_ ? kOutboundFlag : 0);
}

void GossipCore::write_updates(Writer& w, std::size_t budget) {
  const std::vector<Bytes> updates = table_.take_piggyback(budget);
  w.u32(static_cast<std::uint32_t>(updates.size()));
  for (const auto& u : updates) w.raw(u);
}

Bytes GossipCore::broadcast_message(std::uint64_t origin, std::uint64_t seq, std::uint8_t hops, const std::string& topic,
                                    ByteView payload) const {
  Writer w;
  write_header(w, MsgType::kBroadcast);
  w.u64(origin);
  w.u64(seq);
  w.u8(hops);
  w.str(topic);
  w.blob(payload);
  return std::move(w).take();
}

Bytes GossipCore::ping_message(std::uint32_t seq, std::uint64_t target) {
  Writer w;
  write_header(w, MsgType::kPing);
  w.u32(seq);
  w.u64(target);
  write_updates(w, kPiggybackBudget);
  return std::move(w).take();
}

Bytes GossipCore::sync_message(std::uint8_t mode, std::uint32_t mask) const {
  Writer w;
  write_header(w, MsgType::kSync);
  w.u8(mode);
  for (std::uint64_t h : table_.digest()) w.u64(h);
  const auto rows = mode == kSyncOffer ? std::vector<MemberUpdate>{} : table_.rows_in(mask);
  w.u32(static_cast<std::uint32_t>(rows.size()));
  for (const auto& row : rows) write_update(w, row);
  return std::move(w).take();
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

void GossipCore::set_health(int h) { health_ = std::clamp(h, 0, kMaxHealth); }

void GossipCore::rtt_sample(Nanos rtt) {
  const double r = std::chrono::duration<double>(rtt).count();
  if (!rtt_known_) {
    srtt_s_ = r;
    rttvar_s_ = r / 2;
    rtt_known_ = true;
    return;
  }
  rttvar_s_ = 0.75 * rttvar_s_ + 0.25 * std::abs(srtt_s_ - r);
  srtt_s_ = 0.875 * srtt_s_ + 0.125 * r;
}

Nanos GossipCore::own_rto() const {
  return rtt_known_ ? std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(srtt_s_ + 4 * rttvar_s_)) : Nanos{0};
}

std::uint16_t GossipCore::rto_ms() const {
  return static_cast<std::uint16_t>(std::min<std::int64_t>(65535, std::chrono::duration_cast<std::chrono::milliseconds>(own_rto()).count()));
}

Nanos GossipCore::direct_timeout() const { return std::max(options_.suspect_after / 2, own_rto()) * (1 + health_); }

Nanos GossipCore::round_timeout() const {
  // After the direct timeout a ping-req's answer crosses four links (asker, helper, target, helper,
  // asker): two round trips, with room for their spread.
  return direct_timeout() + std::max(options_.suspect_after / 2, 3 * own_rto()) * (1 + health_);
}

Nanos GossipCore::direct_timeout(std::uint64_t target) const {
  const auto* e = table_.find(target);
  return std::max(direct_timeout(), e != nullptr ? table_.remote_rto(*e) : Nanos{0});
}

Nanos GossipCore::round_timeout(std::uint64_t target) const {
  // Its answer to a helper leaves as late as its answer to us: that much more again.
  const auto* e = table_.find(target);
  const Nanos late = e != nullptr ? table_.remote_rto(*e) : Nanos{0};
  return std::max(round_timeout(), direct_timeout(target) + late) + late;
}

void GossipCore::take_outbox_locked(std::vector<GossipSend>* sends, Nanos now) {
  while (!outbox_.empty()) {
    Outgoing o = std::move(outbox_.front());
    outbox_.pop_front();
    const std::uint64_t seq = ++broadcast_seq_;
    seen_.emplace(std::make_pair(options_.self.value, seq), now);
    deliver_locked(options_.self, o.topic, o.payload);
    rumors_.push_back(Rumor{broadcast_message(options_.self.value, seq, 0, o.topic, o.payload), kRumorRounds});
    if (sends != nullptr) {
      send_to(*sends, random_live(static_cast<std::size_t>(options_.fanout), now), rumors_.back().message);
    }
  }
}

void GossipCore::probe_locked(std::vector<GossipSend>& sends, Nanos now) {
  if (random_live(1, now).empty()) {
    // Nobody to probe (a new node, or one that lost every member): ask the seeds for their state.
    for (const auto& seed : options_.seeds) sends.push_back(GossipSend{seed, sync_message(kSyncRowsReply, ~0U), PeerId{}});
    return;
  }
  // Lifeguard: an unhealthy node probes less often, as it times out later.
  if (ticks_ - last_probe_tick_ < static_cast<std::uint64_t>(1 + health_)) return;
  for (int pass = 0; pass < 2; ++pass) {
    while (probe_next_ < probe_order_.size()) {
      const std::uint64_t id = probe_order_[probe_next_++];
      const auto* e = table_.find(id);
      if (e == nullptr || !live(e->state)) continue;
      bool busy = false;
      for (const auto& [seq, p] : probes_) busy = busy || p.target == id;
      if (busy) continue;
      // Heard from first-hand within the last period: what a probe would prove, its message just
      // did (in a small group, members that ping each other then ping half as often).
      if (e->heard != Nanos::min() && now - e->heard < options_.period) {
        last_probe_tick_ = ticks_;
        return;
      }
      auto target = target_of(id);
      if (!target) continue;
      const std::uint32_t seq = ++probe_seq_;
      sends.push_back(GossipSend{target->address, ping_message(seq, id), target->route});
      probes_[seq] = Probe{id, e->incarnation, now, false, 0, 0};
      last_probe_tick_ = ticks_;
      return;
    }
    // A new round: every live member once, in a fresh random order (SWIM's bound on detection).
    probe_order_.clear();
    for (const auto& [id, e] : table_.entries()) {
      if (live(e.state)) probe_order_.push_back(id);
    }
    std::shuffle(probe_order_.begin(), probe_order_.end(), rng_);
    probe_next_ = 0;
  }
}

void GossipCore::check_probes_locked(std::vector<GossipSend>& sends, Nanos now) {
  for (auto it = probes_.begin(); it != probes_.end();) {
    Probe& p = it->second;
    const Nanos elapsed = now - p.sent;
    const Nanos direct = direct_timeout(p.target), round = round_timeout(p.target);
    if (!p.indirect && elapsed >= direct) {
      p.indirect = true;
      const auto* e = table_.find(p.target);
      if (e != nullptr) {
        const auto helpers = random_live(kIndirectProbes, now, p.target);
        if (!helpers.empty()) {
          Writer w;
          write_header(w, MsgType::kPingReq);
          w.u32(it->first);
          w.u64(p.target);
          w.str(e->address);
          write_updates(w, kPiggybackBudget);
          send_to(sends, helpers, std::move(w).take());
        }
        p.helpers = static_cast<int>(helpers.size());
        // And the direct ping once more: on a lossy link the first or its ack is the likeliest to
        // have been lost. Under a sequence of its own, so that its answer times a round trip.
        if (auto t = target_of(p.target)) {
          p.resend_seq = ++probe_seq_;
          p.resent = now;
          resends_[p.resend_seq] = it->first;
          sends.push_back(GossipSend{t->address, ping_message(p.resend_seq, p.target), t->route});
        }
      }
    }
    if (elapsed < round) {
      ++it;
      continue;
    }
    // No answer, direct or indirect. Helpers that did not even say they failed point at our own
    // link (Lifeguard's missed nack): this node then waits longer before it suspects anyone.
    if (p.nacks < p.helpers) set_health(health_ + 1);
    const auto* e = table_.find(p.target);
    if (e != nullptr && live(e->state) && e->incarnation == p.incarnation) {
      MemberUpdate u;
      u.kind = UpdateKind::kSuspect;
      u.id = p.target;
      u.incarnation = p.incarnation;
      u.accuser = options_.self.value;
      if (table_.apply(u, now) == MemberTable::Applied::kNews) ++stats_.suspected;
      // Told first-hand, a live suspect refutes at once instead of when the rumor reaches it.
      if (auto t = target_of(p.target)) {
        Writer w;
        write_header(w, MsgType::kGossip);
        w.u32(1);
        write_update(w, u);
        sends.push_back(GossipSend{t->address, std::move(w).take(), t->route});
      }
    }
    if (late_.size() < 64) {
      late_.emplace(it->first, p);
    } else if (p.resend_seq != 0) {
      resends_.erase(p.resend_seq);
    }
    it = probes_.erase(it);
  }
  // A late answer measures a round trip up to ten round timeouts long; beyond that it is noise.
  for (auto it = late_.begin(); it != late_.end();) {
    if (now - it->second.sent <= 10 * round_timeout()) {
      ++it;
      continue;
    }
    if (it->second.resend_seq != 0) resends_.erase(it->second.resend_seq);
    it = late_.erase(it);
  }
  for (auto it = relays_.begin(); it != relays_.end();) {
    if (now < it->second.nack_at) {
      ++it;
      continue;
    }
    Writer w;
    write_header(w, MsgType::kNack);
    w.u32(it->second.seq);
    sends.push_back(GossipSend{it->second.requester.address, std::move(w).take(), it->second.requester.route});
    it = relays_.erase(it);
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
  take_outbox_locked(nullptr, now);
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
  if (!left_) take_outbox_locked(&sends, clock_.now());
  return counted(std::move(sends));
}

std::vector<GossipSend> GossipCore::farewell() {
  std::vector<GossipSend> sends;
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return sends;
  const Nanos now = clock_.now();
  // Broadcasts queued just before leaving go first (a round's last GROUP, announced by a leader that
  // then leaves at once): dropped, the peers waiting for it would elect one leader after another.
  take_outbox_locked(&sends, now);
  // Left at a raised incarnation overrides anything said of this node at the old one. Sent to every
  // member it can reach: each needs the news once, and first-hand it is not passed on again.
  table_.bump_incarnation();
  Writer w;
  write_header(w, MsgType::kLeave);
  const Bytes bye = std::move(w).take();
  for (const auto& [id, e] : table_.entries()) {
    if (!live(e.state)) continue;
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
  const std::uint32_t n = r.u32();
  if (r.ok() && n > kMaxUpdates) {
    count_drop(std::to_string(n) + " member updates in one message");
    return false;
  }
  // Read whole first: a malformed message changes nothing.
  std::vector<MemberUpdate> updates;
  updates.reserve(std::min<std::size_t>(n, r.remaining() / 13));  // an update takes at least 13 bytes
  for (std::uint32_t i = 0; i < n && r.ok(); ++i) updates.push_back(read_update(r));
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

void GossipCore::handle_broadcast_locked(Reader& r, std::vector<GossipSend>& sends, Nanos now) {
  const std::uint64_t origin = r.u64(), seq = r.u64();
  const std::uint8_t hops = r.u8();
  const std::string topic = r.str(kMaxTopic);
  ByteView payload = r.blob(kMaxPayload);
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
  MemberUpdate hello;
  hello.kind = UpdateKind::kAlive;
  hello.id = r.u64();
  hello.address = r.str(kMaxAddress);
  hello.incarnation = r.u32();
  const std::uint8_t health = r.u8();
  hello.rto_ms = r.u16();
  const std::uint8_t flags = r.u8();
  if (r.ok() && (flags & ~kOutboundFlag) != 0) r.fail(ErrorCode::kMalformed, "unknown sender flags " + std::to_string(flags));
  if (!r.ok()) {
    count_drop(r.status().message());
    return sends;
  }
  hello.outbound_only = (flags & kOutboundFlag) != 0;
  hello.health = static_cast<std::uint8_t>(std::min<int>(health, kMaxHealth));
  if (hello.id == options_.self.value || hello.id == 0) return sends;
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return sends;
  const Nanos now = clock_.now();
  if (type < static_cast<std::uint8_t>(MsgType::kPing) || type > static_cast<std::uint8_t>(MsgType::kLeave)) {
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
  apply_locked(hello, now, false, observed_ip, true);
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
      Writer w;
      write_header(w, MsgType::kGossip);
      w.u32(1);
      write_update(w, u);
      sends.push_back(GossipSend{e->address, std::move(w).take(), e->outbound_only ? PeerId{hello.id} : PeerId{}});
    }
  } else if (is_wildcard_address(reply.address) && !observed_ip.empty() && !is_loopback_ip(observed_ip)) {
    reply.address = with_host(reply.address, observed_ip);
  }
  if (hello.outbound_only) reply.route = PeerId{hello.id};
  switch (msg) {
    case MsgType::kPing: {
      const std::uint32_t seq = r.u32();
      const std::uint64_t target = r.u64();
      if (!r.ok()) break;
      if (!read_updates_locked(r, now, false)) return counted(std::move(sends));
      if (target != options_.self.value) break;  // meant for a member that had this address before
      Writer w;
      write_header(w, MsgType::kAck);
      w.u32(seq);
      write_updates(w, kPiggybackBudget);
      sends.push_back(GossipSend{reply.address, std::move(w).take(), reply.route});
      break;
    }
    case MsgType::kPingReq: {
      const std::uint32_t seq = r.u32();
      const std::uint64_t target = r.u64();
      (void)r.str(kMaxAddress);  // where the asker knows it: we ask only members we know ourselves
      if (!r.ok()) break;
      if (!read_updates_locked(r, now, false)) return counted(std::move(sends));
      auto t = target == options_.self.value ? std::nullopt : target_of(target);
      if (!t || relays_.size() >= 4 * kIndirectProbes * static_cast<std::size_t>(1 + kMaxHealth)) {
        Writer w;
        write_header(w, MsgType::kNack);
        w.u32(seq);
        sends.push_back(GossipSend{reply.address, std::move(w).take(), reply.route});
        break;
      }
      const std::uint32_t ours = ++probe_seq_;
      sends.push_back(GossipSend{t->address, ping_message(ours, target), t->route});
      relays_[ours] = Relay{reply, seq, now + direct_timeout(target)};
      break;
    }
    case MsgType::kAck: {
      const std::uint32_t seq = r.u32();
      if (!r.ok()) break;
      if (!read_updates_locked(r, now, false)) return counted(std::move(sends));
      // Which probe it answers, and which of its pings (the first, or the one sent again).
      std::uint32_t probe_seq = seq;
      bool resent = false;
      if (auto rs = resends_.find(seq); rs != resends_.end()) {
        probe_seq = rs->second;
        resent = true;
      }
      const auto timed = [&](const Probe& p) {
        if (p.target == hello.id) rtt_sample(now - (resent ? p.resent : p.sent));  // direct, late ones included
        if (p.resend_seq != 0) resends_.erase(p.resend_seq);
      };
      if (auto it = probes_.find(probe_seq); it != probes_.end()) {
        timed(it->second);
        probes_.erase(it);
        set_health(health_ - 1);
      } else if (auto late = late_.find(probe_seq); late != late_.end()) {
        timed(late->second);
        late_.erase(late);
      } else if (auto rel = relays_.find(seq); rel != relays_.end()) {
        Writer w;
        write_header(w, MsgType::kAck);
        w.u32(rel->second.seq);
        write_updates(w, kPiggybackBudget);
        sends.push_back(GossipSend{rel->second.requester.address, std::move(w).take(), rel->second.requester.route});
        relays_.erase(rel);
      }
      break;
    }
    case MsgType::kNack: {
      const std::uint32_t seq = r.u32();
      r.expect_end();
      if (!r.ok()) break;
      if (auto it = probes_.find(seq); it != probes_.end()) ++it->second.nacks;
      break;
    }
    case MsgType::kGossip:
      (void)read_updates_locked(r, now, false);
      return counted(std::move(sends));
    case MsgType::kSync:
      handle_sync_locked(r, reply, sends, now);
      return counted(std::move(sends));
    case MsgType::kBroadcast:
      handle_broadcast_locked(r, sends, now);
      return counted(std::move(sends));
    case MsgType::kLeave:
      break;
  }
  if (!r.ok()) count_drop(r.status().message());
  return counted(std::move(sends));
}

}  // namespace gossamer::transport
