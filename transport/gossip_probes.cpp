// GossipCore's failure detector (gossip_core.h): choosing whom to probe, the probe's timeouts, the
// messages of a probe (ping, ping-req, ack, nack) and what an unanswered one leads to.
#include <algorithm>

#include "core/wire.h"
#include "transport/gossip_core.h"

namespace gossamer::transport {

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
      if (e == nullptr || !is_live(e->state)) continue;
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
      if (is_live(e.state)) probe_order_.push_back(id);
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
    if (e != nullptr && is_live(e->state) && e->incarnation == p.incarnation) {
      MemberUpdate u;
      u.kind = UpdateKind::kSuspect;
      u.id = p.target;
      u.incarnation = p.incarnation;
      u.accuser = options_.self.value;
      if (table_.apply(u, now) == MemberTable::Applied::kNews) ++stats_.suspected;
      // Told first-hand, a live suspect refutes at once instead of when the rumor reaches it.
      if (auto t = target_of(p.target)) {
        sends.push_back(GossipSend{t->address, news_message(u), t->route});
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
    sends.push_back(GossipSend{it->second.requester.address, seq_message(MsgType::kNack, it->second.seq, false), it->second.requester.route});
    it = relays_.erase(it);
  }
}

bool GossipCore::handle_probe_locked(MsgType msg, Reader& r, std::uint64_t sender, const Target& reply, std::vector<GossipSend>& sends,
                                     Nanos now) {
  switch (msg) {
    case MsgType::kPing: {
      const std::uint32_t seq = r.u32();
      const std::uint64_t target = r.u64();
      if (!r.ok()) break;
      if (!read_updates_locked(r, now, false)) return false;
      if (target != options_.self.value) break;  // meant for a member that had this address before
      sends.push_back(GossipSend{reply.address, seq_message(MsgType::kAck, seq, true), reply.route});
      break;
    }
    case MsgType::kPingReq: {
      const std::uint32_t seq = r.u32();
      const std::uint64_t target = r.u64();  // asked of members that know it (found in our own table)
      if (!r.ok()) break;
      if (!read_updates_locked(r, now, false)) return false;
      auto t = target == options_.self.value ? std::nullopt : target_of(target);
      if (!t || relays_.size() >= 4 * kIndirectProbes * static_cast<std::size_t>(1 + kMaxHealth)) {
        sends.push_back(GossipSend{reply.address, seq_message(MsgType::kNack, seq, false), reply.route});
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
      if (!read_updates_locked(r, now, false)) return false;
      // Which probe it answers, and which of its pings (the first, or the one sent again).
      std::uint32_t probe_seq = seq;
      bool resent = false;
      if (auto rs = resends_.find(seq); rs != resends_.end()) {
        probe_seq = rs->second;
        resent = true;
      }
      const auto timed = [&](const Probe& p) {
        if (p.target == sender) rtt_sample(now - (resent ? p.resent : p.sent));  // direct, late ones included
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
        sends.push_back(GossipSend{rel->second.requester.address, seq_message(MsgType::kAck, rel->second.seq, true), rel->second.requester.route});
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
    default:
      break;
  }
  return true;
}

}  // namespace gossamer::transport
