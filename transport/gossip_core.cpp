#include "transport/gossip_core.h"

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "core/wire.h"
#include "transport/endpoint.h"

namespace gossamer::transport {

namespace {
constexpr char kMagic[4] = {'G', 'S', 'G', 'P'};
constexpr std::uint8_t kVersion = 2;  // 2: a row's last byte is flags (left, outbound-only)
constexpr std::uint8_t kLeftFlag = 1, kOutboundFlag = 2;
constexpr std::size_t kMaxAddress = 256, kMaxTopic = 64, kMaxPayload = 64 * 1024, kMaxMembers = 65536;

}  // namespace

GossipCore::GossipCore(GossipOptions options, std::string bound, const Clock& clock, std::uint64_t seed)
    : options_(std::move(options)), bound_(std::move(bound)), clock_(clock), rng_(seed), outbound_only_(options_.outbound_only) {}

std::vector<GossipSend> GossipCore::counted(std::vector<GossipSend> sends) {
  std::uint64_t n = 0;
  for (const auto& s : sends) n += s.message.size();
  bytes_sent_.fetch_add(n);
  return sends;
}

MemberState GossipCore::state_of(const Entry& e, Nanos now) const {
  if (e.left) return MemberState::kLeft;
  const Nanos quiet = now - e.changed;
  if (quiet >= options_.dead_after) return MemberState::kDead;
  if (quiet >= options_.suspect_after) return MemberState::kSuspect;
  return MemberState::kAlive;
}

std::vector<Member> GossipCore::members() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Member> out;
  const Nanos now = clock_.now();
  for (const auto& [id, e] : table_) out.push_back(Member{PeerId{id}, e.address, e.heartbeat, state_of(e, now), e.outbound_only});
  return out;
}

std::vector<Member> GossipCore::sample(std::size_t k) {
  std::vector<Member> live;
  for (auto& m : members()) {
    if (m.state == MemberState::kAlive) live.push_back(std::move(m));
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::shuffle(live.begin(), live.end(), rng_);
  if (live.size() > k) live.resize(k);
  return live;
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

void GossipCore::write_header(Writer& w, MsgType type) const {
  w.raw(as_bytes(std::string_view(kMagic, 4)));
  w.u8(kVersion);
  w.u8(static_cast<std::uint8_t>(type));
  w.u64(options_.self.value);
  w.str(announced());
}

Bytes GossipCore::table_message(bool leaving) const {
  Writer w;
  write_header(w, MsgType::kTable);
  w.u32(static_cast<std::uint32_t>(table_.size() + 1));
  w.u64(options_.self.value);
  w.str(announced());
  w.u64(heartbeat_);
  w.u8(static_cast<std::uint8_t>((leaving ? kLeftFlag : 0) | (outbound_only_ ? kOutboundFlag : 0)));
  for (const auto& [id, e] : table_) {
    w.u64(id);
    w.str(e.address);
    w.u64(e.heartbeat);
    w.u8(static_cast<std::uint8_t>((e.left ? kLeftFlag : 0) | (e.outbound_only ? kOutboundFlag : 0)));
  }
  return std::move(w).take();
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

std::vector<GossipCore::Target> GossipCore::random_live(std::size_t k, Nanos now) {
  std::vector<Target> live;
  for (const auto& [id, e] : table_) {
    if (state_of(e, now) != MemberState::kAlive) continue;
    if (!e.outbound_only) {
      live.push_back(Target{e.address, PeerId{}});
    } else if (e.heard != Nanos::min() && now - e.heard < options_.suspect_after) {  // (min: never heard; now - min overflows)
      live.push_back(Target{e.address, PeerId{id}});
    }
  }
  std::shuffle(live.begin(), live.end(), rng_);
  if (live.size() > k) live.resize(k);
  return live;
}

void GossipCore::send_to(std::vector<GossipSend>& sends, const std::vector<Target>& targets, const Bytes& message) const {
  for (const auto& t : targets) sends.push_back(GossipSend{t.address, message, t.route});
}

void GossipCore::set_outbound_only(bool outbound_only) {
  std::lock_guard<std::mutex> lock(mu_);
  outbound_only_ = outbound_only;
}

bool GossipCore::outbound_only() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outbound_only_;
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

std::vector<GossipSend> GossipCore::tick() {
  std::vector<GossipSend> sends;
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return sends;
  const Nanos now = clock_.now();
  ++heartbeat_;
  // A delivered broadcast is remembered far beyond the life of its rumor (at most
  // (kRumorRounds + 1) x max_hops periods, under 5 s at the defaults).
  const Nanos seen_for = std::max<Nanos>(std::chrono::seconds(60), 4 * (kRumorRounds + 1) * options_.max_hops * options_.period);
  if (now - seen_pruned_ >= seen_for) {
    std::erase_if(seen_, [&](const auto& kv) { return now - kv.second > seen_for; });
    seen_pruned_ = now;
  }
  const Bytes table = table_message(false);
  auto targets = random_live(static_cast<std::size_t>(options_.fanout), now);
  if (targets.empty()) {
    for (const auto& seed : options_.seeds) targets.push_back(Target{seed, PeerId{}});
  }
  send_to(sends, targets, table);
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
  // Broadcasts queued just before leaving go first (a round's last GROUP, announced by a leader that
  // then leaves at once): dropped, the peers waiting for it would elect one leader after another.
  take_outbox_locked(&sends, clock_.now());
  ++heartbeat_;
  const Bytes bye = table_message(true);
  send_to(sends, random_live(table_.size(), clock_.now()), bye);
  left_ = true;
  return counted(std::move(sends));
}

bool GossipCore::left() const {
  std::lock_guard<std::mutex> lock(mu_);
  return left_;
}

bool GossipCore::knows_anyone() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !table_.empty();
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

void GossipCore::merge_table_locked(Reader& r, std::uint64_t sender, const std::string& observed_ip, Nanos now) {
  const std::uint32_t n = r.u32();
  if (r.ok() && n > kMaxMembers) return count_drop("member table of " + std::to_string(n) + " entries");
  // Rows are read whole first (a malformed table changes nothing), as views into the message: most
  // rows carry no news, and only news is copied.
  struct Row {
    std::uint64_t id;
    std::string_view address;
    std::uint64_t heartbeat;
    std::uint8_t flags;
  };
  std::vector<Row> rows;
  rows.reserve(std::min<std::size_t>(n, r.remaining() / 21));  // a row takes at least 21 bytes
  for (std::uint32_t i = 0; i < n && r.ok(); ++i) {
    Row row;
    row.id = r.u64();
    row.address = as_string_view(r.blob(kMaxAddress));
    row.heartbeat = r.u64();
    row.flags = r.u8();
    rows.push_back(row);
  }
  r.expect_end();
  if (!r.ok()) return count_drop(r.status().message());
  for (const auto& row : rows) {
    if (row.id == options_.self.value || row.id == 0 || row.flags > (kLeftFlag | kOutboundFlag)) continue;
    auto it = table_.find(row.id);
    if (it != table_.end() && row.heartbeat <= it->second.heartbeat) continue;  // nothing new
    std::string address(row.address);
    if (is_wildcard_address(address)) {
      // A peer listening on every address announces a wildcard: its own row takes the IP its
      // messages come from; another's is left until a peer that heard it directly relays it. From
      // this very host (a loopback IP) the wildcard itself reaches it, and is kept as it is: a
      // loopback address relayed to other hosts would send them to themselves.
      if (row.id != sender || observed_ip.empty()) continue;
      if (!is_loopback_ip(observed_ip)) address = with_host(address, observed_ip);
    }
    if (it == table_.end() && table_.size() >= options_.max_members && !evict_one_locked(now)) {
      count_drop("member table full (" + std::to_string(table_.size()) + " members, none dead or departed)");
      continue;
    }
    Entry& e = it != table_.end() ? it->second : table_[row.id];
    e.address = std::move(address);
    e.heartbeat = row.heartbeat;
    e.changed = now;
    const bool left = (row.flags & kLeftFlag) != 0;
    if (left && !e.left) spdlog::debug("gossip: peer {} left", PeerId{row.id}.to_string());
    e.left = left;
    e.outbound_only = (row.flags & kOutboundFlag) != 0;
  }
}

bool GossipCore::evict_one_locked(Nanos now) {
  for (auto it = table_.begin(); it != table_.end(); ++it) {
    const MemberState st = state_of(it->second, now);
    if (st == MemberState::kDead || st == MemberState::kLeft) {
      table_.erase(it);
      return true;
    }
  }
  return false;
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
  const std::uint64_t sender = r.u64();
  (void)r.str(kMaxAddress);  // the sender's own table row carries its address (and heartbeat)
  if (!r.ok()) {
    count_drop(r.status().message());
    return sends;
  }
  if (version != kVersion) {
    count_drop("gossip version " + std::to_string(version) + " (we speak " + std::to_string(kVersion) + ")");
    return sends;
  }
  if (sender == options_.self.value) return sends;
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return sends;
  const Nanos now = clock_.now();
  if (type == static_cast<std::uint8_t>(MsgType::kTable)) {
    merge_table_locked(r, sender, observed_ip, now);
  } else if (type == static_cast<std::uint8_t>(MsgType::kBroadcast)) {
    handle_broadcast_locked(r, sends, now);
  } else {
    count_drop("unknown gossip message type " + std::to_string(type));
    return counted(std::move(sends));
  }
  // It reached us directly: an outbound-only sender can be answered through its connection.
  if (auto it = table_.find(sender); it != table_.end()) it->second.heard = now;
  return counted(std::move(sends));
}

}  // namespace gossamer::transport
