#include "transport/member_table.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <spdlog/spdlog.h>

#include "transport/endpoint.h"

namespace gossamer::transport {

namespace {
constexpr std::uint8_t kOutboundFlag = 2;

// splitmix64's finalizer: a well-mixed 64-bit hash of a row, so bucket sums of different views collide
// only by chance (2^-64).
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void write_update(Writer& w, const MemberUpdate& u) {
  w.u8(static_cast<std::uint8_t>(u.kind));
  w.u64(u.id);
  w.uvar(u.incarnation);
  if (u.kind == UpdateKind::kAlive || u.kind == UpdateKind::kLeft) {
    w.u8(u.outbound_only ? kOutboundFlag : 0);
    write_address(w, u.address);
    if (u.kind == UpdateKind::kAlive) {
      w.u8(u.health);
      w.uvar(u.rto_ms);
    }
  } else if (u.kind == UpdateKind::kSuspect) {
    w.u64(u.accuser);
  }
}

MemberUpdate read_update(Reader& r) {
  MemberUpdate u;
  const std::uint8_t kind = r.u8();
  if (r.ok() && kind > static_cast<std::uint8_t>(UpdateKind::kLeft)) {
    r.fail(ErrorCode::kMalformed, "unknown member update kind " + std::to_string(kind));
    return u;
  }
  u.kind = static_cast<UpdateKind>(kind);
  u.id = r.u64();
  u.incarnation = static_cast<std::uint32_t>(r.uvar(UINT32_MAX));
  if (u.kind == UpdateKind::kAlive || u.kind == UpdateKind::kLeft) {
    const std::uint8_t flags = r.u8();
    if (r.ok() && (flags & ~kOutboundFlag) != 0) r.fail(ErrorCode::kMalformed, "unknown member flags " + std::to_string(flags));
    u.outbound_only = (flags & kOutboundFlag) != 0;
    u.address = read_address(r);
    if (u.kind == UpdateKind::kAlive) {
      u.health = r.u8();
      u.rto_ms = static_cast<std::uint16_t>(r.uvar(UINT16_MAX));
    }
  } else if (u.kind == UpdateKind::kSuspect) {
    u.accuser = r.u64();
  }
  return u;
}

std::size_t digest_bucket(std::uint64_t id) { return static_cast<std::size_t>(mix(id) >> 59) % kDigestBuckets; }

MemberTable::MemberTable(MemberTableOptions options) : options_(std::move(options)) {}

MemberTable::Entry* MemberTable::find(std::uint64_t id) {
  auto it = table_.find(id);
  return it == table_.end() ? nullptr : &it->second;
}

const MemberTable::Entry* MemberTable::find(std::uint64_t id) const {
  auto it = table_.find(id);
  return it == table_.end() ? nullptr : &it->second;
}

void MemberTable::set_state(std::uint64_t id, Entry& e, MemberState state, Nanos now) {
  ++version_;
  const MemberState was = e.state;
  if (!is_live(was)) gone_.erase({e.changed, id});
  e.state = state;
  e.changed = now;
  if (!is_live(state)) gone_.insert({now, id});
  if (is_live(was) != is_live(state)) live_count_ = is_live(state) ? live_count_ + 1 : live_count_ - 1;
  if ((was == MemberState::kAlive) != (state == MemberState::kAlive)) {
    if (state == MemberState::kAlive) {
      alive_index_[id] = alive_ids_.size();
      alive_ids_.push_back(id);
    } else {
      const std::size_t at = alive_index_.at(id);
      alive_index_.erase(id);
      if (at + 1 != alive_ids_.size()) {
        alive_ids_[at] = alive_ids_.back();
        alive_index_[alive_ids_[at]] = at;
      }
      alive_ids_.pop_back();
    }
  }
  if (state == MemberState::kSuspect) {
    suspects_.insert(id);
  } else {
    suspects_.erase(id);
  }
}

std::size_t MemberTable::live_count() const { return live_count_; }

const std::vector<std::uint64_t>& MemberTable::alive_ids() const { return alive_ids_; }

MemberUpdate MemberTable::self_row() const {
  MemberUpdate u;
  u.kind = UpdateKind::kAlive;
  u.id = options_.self;
  u.incarnation = incarnation_;
  u.outbound_only = self_outbound_;
  u.address = self_address_;
  u.health = self_health_;
  u.rto_ms = self_rto_ms_;
  return u;
}

void MemberTable::queue_self() { enqueue(self_row(), kRetransmitMult); }

void MemberTable::enqueue(const MemberUpdate& u, int mult) {
  // A newer update about a member replaces what was queued about it (the incarnations decide at the
  // receiver, and the newer one carries the higher).
  Writer w;
  write_update(w, u);
  queue_[u.id] = Queued{u.id, std::move(w).take(), 0, ++queued_, mult};
  if (queue_.size() <= kMaxQueued) return;
  // Bounded: the update sent most (oldest among equals) makes room.
  auto worst = queue_.begin();
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (it->second.transmits > worst->second.transmits ||
        (it->second.transmits == worst->second.transmits && it->second.order < worst->second.order)) {
      worst = it;
    }
  }
  queue_.erase(worst);
}

MemberTable::Applied MemberTable::apply(const MemberUpdate& u, Nanos now, bool quiet) {
  if (u.id == 0) return Applied::kIgnored;
  if (u.id == options_.self) {
    // Suspected or declared dead at our incarnation: refute with a higher one (only we may raise it).
    if ((u.kind == UpdateKind::kSuspect || u.kind == UpdateKind::kDead) && u.incarnation >= incarnation_ &&
        u.incarnation < std::numeric_limits<std::uint32_t>::max()) {
      incarnation_ = u.incarnation + 1;
      queue_self();
      return Applied::kRefuted;
    }
    return Applied::kIgnored;
  }
  auto it = table_.find(u.id);
  if (it == table_.end()) {
    // A suspicion of a member we never knew is left to its accusers. A death or departure is kept
    // (never dialled, evicted first when the table is full): a newcomer that hears only of members
    // that have gone learns that the run is over instead of waiting for it. Not passed on: it is
    // old news to those who told it.
    if (u.kind == UpdateKind::kSuspect) return Applied::kIgnored;
    if (table_.size() >= options_.max_members && !evict_one(now)) {
      ++full_drops_;
      return Applied::kFull;
    }
    if (u.kind != UpdateKind::kAlive) {
      Entry& gone = table_[u.id];
      gone.state = MemberState::kLeft;  // not yet among the departed (none is at time 0)
      set_state(u.id, gone, u.kind == UpdateKind::kLeft ? MemberState::kLeft : MemberState::kDead, now);
      gone.address = u.kind == UpdateKind::kLeft ? u.address : std::string();
      gone.incarnation = u.incarnation;
      gone.outbound_only = u.outbound_only;
      return Applied::kIgnored;
    }
    Entry& e = table_[u.id];
    e.state = MemberState::kLeft;  // not yet counted (nor among the departed)
    set_state(u.id, e, MemberState::kAlive, now);
    e.address = u.address;
    e.incarnation = u.incarnation;
    e.outbound_only = u.outbound_only;
    e.health = u.health;
    e.rto = std::chrono::milliseconds(u.rto_ms);
    if (!quiet) enqueue(u, kJoinRetransmitMult);
    return Applied::kNews;
  }
  Entry& e = it->second;
  bool news = false;
  switch (u.kind) {
    case UpdateKind::kAlive:
      if (u.incarnation > e.incarnation) {
        if (!is_live(e.state)) spdlog::debug("gossip: peer {} is back (incarnation {})", PeerId{u.id}.to_string(), u.incarnation);
        e.incarnation = u.incarnation;
        set_state(u.id, e, MemberState::kAlive, now);
        e.address = u.address;
        e.outbound_only = u.outbound_only;
        e.health = u.health;
        e.rto = std::chrono::milliseconds(u.rto_ms);
        e.accusers.clear();
        news = true;
      }
      break;
    case UpdateKind::kSuspect:
      if (!is_live(e.state) || u.incarnation < e.incarnation) break;
      if (e.state == MemberState::kAlive || u.incarnation > e.incarnation) {
        set_state(u.id, e, MemberState::kSuspect, now);
        e.incarnation = u.incarnation;
        e.accusers.assign(1, u.accuser);
        news = true;
      } else if (e.accusers.size() < kMaxAccusers && std::find(e.accusers.begin(), e.accusers.end(), u.accuser) == e.accusers.end()) {
        e.accusers.push_back(u.accuser);  // an independent confirmation shortens the suspicion
        news = true;
      }
      break;
    case UpdateKind::kDead:
      if (is_live(e.state) && u.incarnation >= e.incarnation) {
        spdlog::debug("gossip: peer {} declared dead", PeerId{u.id}.to_string());
        set_state(u.id, e, MemberState::kDead, now);
        e.incarnation = u.incarnation;
        news = true;
      }
      break;
    case UpdateKind::kLeft:
      if (e.state != MemberState::kLeft && u.incarnation >= e.incarnation) {
        spdlog::debug("gossip: peer {} left", PeerId{u.id}.to_string());
        set_state(u.id, e, MemberState::kLeft, now);
        e.incarnation = u.incarnation;
        news = true;
      }
      break;
  }
  if (!news) return Applied::kIgnored;
  if (!quiet) enqueue(u, kRetransmitMult);
  return Applied::kNews;
}

Nanos MemberTable::suspicion_timeout(std::uint64_t id, const Entry& e) const {
  // The minimum grows with log10 of the membership (a refutation needs about that many periods to
  // spread, as in memberlist's SuspicionMult x log10(n) x interval) and with the suspect's own health.
  const double n = static_cast<double>(live_count());
  const Nanos by_size = std::chrono::duration_cast<Nanos>(kRetransmitMult * std::max(1.0, std::log10(n)) * options_.period);
  // A member whose answers run late (its own rto) gets twice that more: its refutation leaves as late.
  const double by_health = 1.0 + std::min<int>(e.health, 8) / 4.0;  // up to 3x
  Nanos min = std::chrono::duration_cast<Nanos>(std::max(options_.suspicion_min, by_size) * by_health) + 2 * remote_rto(e);
  // Lifeguard: starts at kSuspicionMaxMult x the minimum, and each independent accuser beyond the
  // first brings it down, to the minimum at kConfirmations (fewer when there are fewer to ask).
  // Who could confirm: alive members other than the suspect that messages pass between and us (an
  // outbound-only member never heard from first-hand has no way to us). Enough to know up to k.
  int reachable = 0;
  for (std::uint64_t other : alive_ids_) {
    if (reachable >= kConfirmations) break;
    if (other == id) continue;
    const Entry& o = table_.at(other);
    reachable += !o.outbound_only || o.heard != Nanos::min() ? 1 : 0;
  }
  const int k = reachable;
  if (k < 1) return min;
  const Nanos max = kSuspicionMaxMult * min;
  const int c = static_cast<int>(e.accusers.size()) - 1;
  const double frac = std::log(static_cast<double>(c) + 1.0) / std::log(static_cast<double>(k) + 1.0);
  const auto t = max - std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::nano>(static_cast<double>((max - min).count()) * frac));
  return std::max(min, t);
}

std::vector<std::uint64_t> MemberTable::expire_suspicions(Nanos now) {
  std::vector<std::uint64_t> dead;
  for (std::uint64_t id : suspects_) {
    const Entry& e = table_.at(id);
    if (now - e.changed >= suspicion_timeout(id, e)) dead.push_back(id);
  }
  for (std::uint64_t id : dead) {
    MemberUpdate u;
    u.kind = UpdateKind::kDead;
    u.id = id;
    u.incarnation = table_[id].incarnation;
    (void)apply(u, now);
  }
  return dead;
}

std::vector<Bytes> MemberTable::take_piggyback(std::size_t budget) {
  std::vector<Bytes> out;
  if (queue_.empty()) return out;
  const int times = static_cast<int>(std::ceil(std::log10(static_cast<double>(live_count()) + 1.0)));
  std::vector<Queued*> order;
  order.reserve(queue_.size());
  for (auto& [id, q] : queue_) order.push_back(&q);
  std::sort(order.begin(), order.end(), [](const Queued* a, const Queued* b) {
    return a->transmits != b->transmits ? a->transmits < b->transmits : a->order > b->order;
  });
  std::size_t used = 0;
  for (Queued* q : order) {
    if (used + q->encoded.size() > budget) continue;
    used += q->encoded.size();
    out.push_back(q->encoded);
    ++q->transmits;
  }
  std::erase_if(queue_, [&](const auto& kv) { return kv.second.transmits >= kv.second.mult * times; });
  return out;
}

bool MemberTable::has_fresh(int times) const {
  return std::any_of(queue_.begin(), queue_.end(), [&](const auto& kv) { return kv.second.mult == kRetransmitMult && kv.second.transmits < times; });
}

Digest MemberTable::digest() const {
  Digest d{};
  d[digest_bucket(options_.self)] += mix(options_.self ^ mix(incarnation_));
  for (const auto& [id, e] : table_) {
    if (is_live(e.state)) d[digest_bucket(id)] += mix(id ^ mix(e.incarnation));
  }
  return d;
}

std::vector<MemberUpdate> MemberTable::rows_in(std::uint32_t mask) const {
  std::vector<MemberUpdate> rows;
  if ((mask >> digest_bucket(options_.self)) & 1U) rows.push_back(self_row());
  for (const auto& [id, e] : table_) {
    if (!((mask >> digest_bucket(id)) & 1U)) continue;
    MemberUpdate u;
    u.id = id;
    u.incarnation = e.incarnation;
    u.outbound_only = e.outbound_only;
    u.address = e.address;
    u.health = e.health;
    u.rto_ms = static_cast<std::uint16_t>(std::min<std::int64_t>(65535, std::chrono::duration_cast<std::chrono::milliseconds>(e.rto).count()));
    switch (e.state) {
      case MemberState::kAlive: u.kind = UpdateKind::kAlive; break;
      case MemberState::kSuspect:
        u.kind = UpdateKind::kSuspect;
        u.accuser = e.accusers.empty() ? options_.self : e.accusers.front();
        break;
      case MemberState::kDead: u.kind = UpdateKind::kDead; break;
      case MemberState::kLeft: u.kind = UpdateKind::kLeft; break;
    }
    // A suspect's address rides on an alive row of the same incarnation first, so a member that never
    // knew it learns where it is; the suspicion then applies on top.
    if (u.kind == UpdateKind::kSuspect) {
      MemberUpdate known = u;
      known.kind = UpdateKind::kAlive;
      rows.push_back(std::move(known));
    }
    rows.push_back(std::move(u));
  }
  return rows;
}

bool MemberTable::evict_one(Nanos now) {
  (void)now;
  if (gone_.empty()) return false;
  // The one dead or departed longest ago: a recent verdict is the likeliest to meet a stale alive.
  const std::uint64_t id = gone_.begin()->second;
  gone_.erase(gone_.begin());
  table_.erase(id);
  ++version_;
  queue_.erase(id);
  return true;
}

}  // namespace gossamer::transport
