// Coordinator, the GROUP message (coordinator.h): written whole or as the change from a group its
// receiver holds, and read back, untrusted.
#include <map>
#include <set>

#include "core/hash.h"
#include "run/coordinator.h"
#include "run/coordinator_parts.h"
#include "transport/endpoint.h"

namespace gossamer::run {

using namespace coordinator_parts;

namespace {

// What a change's receiver checks the members it made against.
std::uint64_t check_of(const std::vector<MemberInfo>& members) {
  Writer w;
  for (const auto& m : members) {
    w.u64(m.id.value);
    w.str(m.address);
  }
  const Digest d = digest_of(w.bytes());
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(d.bytes[i]) << (8 * i);
  return v;
}

}  // namespace

Bytes Coordinator::group_message_locked(const GroupView& g, std::uint64_t known) const {
  Writer w = start_message(Kind::kGroup, g.round);
  w.uvar(g.epoch);
  w.u64(g.leader.value);
  w.uvar(g.width);
  w.uvar(g.prior);
  // (A change only from an epoch up to the group's own: one from a later group, which a peer that
  // went on holds while it asks about an earlier round, is refused by its reader.)
  auto base = known == 0 || known > g.epoch ? known_.end() : known_.find(known);
  if (base == known_.end()) {
    w.u8(kWhole);
    w.uvar(g.members.size());
    for (const auto& m : g.members) {
      w.u64(m.id.value);
      transport::write_address(w, m.address);
    }
    return std::move(w).take();
  }
  std::vector<transport::PeerId> removed;
  std::vector<MemberInfo> added;
  const std::map<transport::PeerId, std::string> before = [&] {
    std::map<transport::PeerId, std::string> b;
    for (const auto& m : base->second) b[m.id] = m.address;
    return b;
  }();
  std::set<transport::PeerId> now;
  for (const auto& m : g.members) {
    now.insert(m.id);
    auto it = before.find(m.id);
    if (it != before.end() && it->second == m.address) continue;
    if (it != before.end()) removed.push_back(m.id);  // (a new address: out and in again)
    added.push_back(m);
  }
  for (const auto& [id, address] : before) {
    if (now.count(id) == 0) removed.push_back(id);
  }
  std::sort(removed.begin(), removed.end());
  w.u8(kChange);
  w.uvar(known);
  w.uvar(g.members.size());
  w.u64(check_of(g.members));
  w.uvar(removed.size());
  for (transport::PeerId id : removed) w.u64(id.value);
  w.uvar(added.size());
  for (const auto& m : added) {
    w.u64(m.id.value);
    transport::write_address(w, m.address);
  }
  return std::move(w).take();
}

bool Coordinator::on_group_locked(transport::PeerId origin, std::int64_t round, Reader& r, std::vector<Outgoing>& out) {
  GroupView g;
  g.round = round;
  g.epoch = r.uvar();
  g.leader = transport::PeerId{r.u64()};
  g.width = static_cast<std::uint32_t>(r.uvar(kMaxMembers));
  g.prior = r.uvar(kMaxEpoch - 1);
  const std::uint8_t form = r.u8();
  if (r.ok() && (g.width == 1 || g.width > kMaxMembers)) r.fail(ErrorCode::kMalformed, "a layout of width " + std::to_string(g.width));
  // (An epoch near 2^64 would wrap the next one to 0, which no peer ever takes: every later round would stall.)
  if (r.ok() && (g.epoch == 0 || g.epoch >= kMaxEpoch)) r.fail(ErrorCode::kMalformed, "epoch " + std::to_string(g.epoch) + " out of range");
  if (r.ok() && form != kWhole && form != kChange) r.fail(ErrorCode::kMalformed, "unknown group form " + std::to_string(form));
  const auto read_member = [&] {
    MemberInfo m;
    m.id = transport::PeerId{r.u64()};
    m.address = transport::read_address(r);
    return m;
  };
  bool readable = true;  // a change from a group this peer holds, which checks out
  if (r.ok() && form == kWhole) {
    const std::uint64_t count = r.uvar();
    if (r.ok() && (count == 0 || count > kMaxMembers)) r.fail(ErrorCode::kMalformed, "a group of " + std::to_string(count) + " members");
    for (std::uint64_t i = 0; r.ok() && i < count; ++i) {
      MemberInfo m = read_member();
      if (r.ok() && i > 0 && !(g.members.back().id < m.id)) r.fail(ErrorCode::kMalformed, "members not sorted by id");
      g.members.push_back(std::move(m));
    }
    r.expect_end();
  } else if (r.ok()) {
    const std::uint64_t base = r.uvar();
    const std::uint64_t count = r.uvar();
    const std::uint64_t check = r.u64();
    if (r.ok() && (count == 0 || count > kMaxMembers)) r.fail(ErrorCode::kMalformed, "a group of " + std::to_string(count) + " members");
    if (r.ok() && (base == 0 || base > g.epoch)) r.fail(ErrorCode::kMalformed, "a change from epoch " + std::to_string(base));
    std::map<transport::PeerId, std::string> members;
    auto held = known_.find(base);
    readable = held != known_.end();
    if (readable) {
      for (const auto& m : held->second) members[m.id] = m.address;
    }
    const std::uint64_t removed = r.uvar();
    if (r.ok() && removed > kMaxMembers) r.fail(ErrorCode::kMalformed, std::to_string(removed) + " members removed");
    for (std::uint64_t i = 0; r.ok() && i < removed; ++i) {
      const transport::PeerId id{r.u64()};
      if (r.ok() && readable && members.erase(id) == 0) readable = false;
    }
    const std::uint64_t added = r.uvar();
    if (r.ok() && added > kMaxMembers) r.fail(ErrorCode::kMalformed, std::to_string(added) + " members added");
    for (std::uint64_t i = 0; r.ok() && i < added; ++i) {
      MemberInfo m = read_member();
      if (r.ok() && readable && !members.emplace(m.id, m.address).second) readable = false;
    }
    r.expect_end();
    if (r.ok() && readable) {
      for (auto& [id, address] : members) g.members.push_back(MemberInfo{id, std::move(address)});
      readable = g.members.size() == count && check_of(g.members) == check;
    }
  }
  // (Any peer holding the group may answer with it, so the origin need not be the leader.)
  if (!r.ok()) {
    drop_locked("a malformed GROUP", origin, r.status().to_string());
    return false;
  }
  max_epoch_ = std::max(max_epoch_, g.epoch);
  if (!readable) {
    // A change from a group this peer does not hold: it asks the sender for the whole group.
    const auto mine = ready_.find(round);
    if (mine != ready_.end()) {
      if (auto it = mine->second.find(gossip_.self()); it != mine->second.end()) {
        out.push_back(Outgoing{origin, encode_ready(round, it->second.after_epoch, it->second.step, gossip_.self(), 0,
                                                    it->second.unlinked ? kUnlinked : 0, address_)});
      }
    }
    return true;
  }
  remember_locked(g);
  auto& slot = groups_[round];
  // Two leaders at once (views differ for a moment): the larger epoch wins, then the lower leader.
  if (slot.members.empty() || g.epoch > slot.epoch || (g.epoch == slot.epoch && g.leader < slot.leader)) slot = std::move(g);
  return true;
}

}  // namespace gossamer::run
