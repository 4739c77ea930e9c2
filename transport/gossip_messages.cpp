// GossipCore's messages as they go on the wire (gossip_core.h states the layout): the header every
// message starts with, the updates it carries, and each kind of message.
#include "core/wire.h"
#include "transport/endpoint.h"
#include "transport/gossip_core.h"

namespace gossamer::transport {

void GossipCore::write_header(Writer& w, MsgType type) const {
  w.raw(as_bytes(std::string_view(kMagic, 4)));
  w.u8(kVersion);
  w.u8(static_cast<std::uint8_t>(type));
  w.u64(options_.self.value);
  // An ack or nack answers a message sent to this node's address: its receiver knows where we are.
  const bool with_address = type != MsgType::kAck && type != MsgType::kNack;
  w.u8(static_cast<std::uint8_t>((outbound_only_ ? kOutboundFlag : 0) | (with_address ? kAddressFlag : 0)));
  if (with_address) write_address(w, announced());
  w.uvar(table_.incarnation());
  w.u8(static_cast<std::uint8_t>(health_));
  w.uvar(rto_ms());
}

void GossipCore::write_updates(Writer& w, std::size_t budget) {
  const std::vector<Bytes> updates = table_.take_piggyback(budget);
  w.uvar(updates.size());
  for (const auto& u : updates) w.raw(u);
}

Bytes GossipCore::broadcast_message(std::uint64_t origin, std::uint64_t seq, std::uint8_t hops, const std::string& topic,
                                    ByteView payload) const {
  Writer w;
  write_header(w, MsgType::kBroadcast);
  w.u64(origin);
  w.uvar(seq);
  w.u8(hops);
  w.vstr(topic);
  w.vblob(payload);
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

Bytes GossipCore::news_message(const MemberUpdate& u) const {
  Writer w;
  write_header(w, MsgType::kGossip);
  w.uvar(1);
  write_update(w, u);
  return std::move(w).take();
}

Bytes GossipCore::seq_message(MsgType type, std::uint32_t seq, bool with_updates) {
  Writer w;
  write_header(w, type);
  w.u32(seq);
  if (with_updates) write_updates(w, kPiggybackBudget);
  return std::move(w).take();
}

Bytes GossipCore::sync_message(std::uint8_t mode, std::uint32_t mask) const {
  Writer w;
  write_header(w, MsgType::kSync);
  w.u8(mode);
  for (std::uint64_t h : table_.digest()) w.u64(h);
  const auto rows = mode == kSyncOffer ? std::vector<MemberUpdate>{} : table_.rows_in(mask);
  w.uvar(rows.size());
  for (const auto& row : rows) write_update(w, row);
  return std::move(w).take();
}

Bytes GossipCore::direct_message(std::uint64_t origin, std::uint64_t to, const std::string& topic, ByteView payload) const {
  Writer w;
  write_header(w, MsgType::kDirect);
  const bool relayed = origin != options_.self.value;
  w.u8(relayed ? kRelayedFlag : 0);
  if (relayed) w.u64(origin);
  w.u64(to);
  w.vstr(topic);
  w.vblob(payload);
  return std::move(w).take();
}

}  // namespace gossamer::transport
