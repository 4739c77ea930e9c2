// Coordinator, the GROUP message (coordinator.h): written whole or as the change from a group its
// receiver holds, and read back, untrusted.
#include <map>

#include "runtime/coordinator.h"
#include "runtime/coordinator_messages.h"

namespace gossamer::runtime {

using namespace coordinator_parts;

Bytes Coordinator::group_message_locked(const GroupView& g, std::uint64_t known) const {
  // (A change only from an epoch up to the group's own: one from a later group, which a peer that
  // went on holds while it asks about an earlier round, is refused by its reader.)
  auto base = known == 0 || known > g.epoch ? known_.end() : known_.find(known);
  return encode_group(g, known, base == known_.end() ? nullptr : &base->second);
}

bool Coordinator::on_group_locked(transport::PeerId origin, std::int64_t round, Reader& r, std::vector<Outgoing>& out) {
  GroupMessage m = read_group(r);
  GroupView g;
  g.round = round;
  g.epoch = m.epoch;
  g.leader = m.leader;
  g.width = m.width;
  g.prior = m.prior;
  bool readable = true;  // a change from a group this peer holds, which checks out
  if (r.ok() && m.form == kWhole) {
    g.members = std::move(m.members);
  } else if (r.ok()) {
    std::map<transport::PeerId, std::string> members;
    auto held = known_.find(m.base);
    readable = held != known_.end();
    if (readable) {
      for (const auto& k : held->second) members[k.id] = k.address;
    }
    for (const transport::PeerId id : m.removed) readable = readable && members.erase(id) == 1;
    for (auto& k : m.members) readable = readable && members.emplace(k.id, std::move(k.address)).second;
    if (readable) {
      for (auto& [id, address] : members) g.members.push_back(MemberInfo{id, std::move(address)});
      readable = g.members.size() == m.count && check_of(g.members) == m.check;
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

}  // namespace gossamer::runtime
