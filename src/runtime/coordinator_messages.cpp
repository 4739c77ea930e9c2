#include "runtime/coordinator_messages.h"

#include <algorithm>
#include <map>

#include "core/hash.h"
#include "transport/endpoint.h"

namespace gossamer::runtime::coordinator_parts {

namespace {

void check_epoch(Reader& r, std::uint64_t epoch) {
  if (r.ok() && (epoch == 0 || epoch >= kMaxEpoch)) r.fail(ErrorCode::kMalformed, "epoch " + std::to_string(epoch) + " out of range");
}

MemberInfo read_member(Reader& r) {
  MemberInfo m;
  m.id = transport::PeerId{r.u64()};
  m.address = transport::read_address(r);
  return m;
}

}  // namespace

Header read_header(Reader& r) {
  Header h;
  h.version = r.u8();
  h.kind = static_cast<Kind>(r.u8());
  h.round = static_cast<std::int64_t>(r.uvar(kMaxRound));
  return h;
}

ReadyMessage read_ready(Reader& r) {
  ReadyMessage m;
  m.after_epoch = r.uvar();
  m.step = static_cast<std::int64_t>(r.uvar(kMaxRound));
  m.id = transport::PeerId{r.u64()};
  m.known_epoch = r.uvar();
  m.flags = r.u8();
  m.address = transport::read_address(r);
  r.expect_end();
  if (r.ok() && (m.after_epoch >= kMaxEpoch || m.known_epoch >= kMaxEpoch)) r.fail(ErrorCode::kMalformed, "epoch out of range");
  if (r.ok() && (m.flags & ~(kPassedOn | kToEveryone | kUnlinked)) != 0) r.fail(ErrorCode::kMalformed, "unknown flags " + std::to_string(m.flags));
  if (r.ok() && m.id.value == 0) r.fail(ErrorCode::kMalformed, "it names peer 0");
  return m;
}

GroupMessage read_group(Reader& r) {
  GroupMessage g;
  g.epoch = r.uvar();
  g.leader = transport::PeerId{r.u64()};
  g.width = static_cast<std::uint32_t>(r.uvar(kMaxMembers));
  g.prior = r.uvar(kMaxEpoch - 1);
  g.form = r.u8();
  if (r.ok() && (g.width == 1 || g.width > kMaxMembers)) r.fail(ErrorCode::kMalformed, "a layout of width " + std::to_string(g.width));
  // (An epoch near 2^64 would wrap the next one to 0, which no peer ever takes: every later round would stall.)
  check_epoch(r, g.epoch);
  if (r.ok() && g.form != kWhole && g.form != kChange) r.fail(ErrorCode::kMalformed, "unknown group form " + std::to_string(g.form));
  if (!r.ok()) return g;
  if (g.form == kWhole) {
    const std::uint64_t count = r.uvar();
    if (r.ok() && (count == 0 || count > kMaxMembers)) r.fail(ErrorCode::kMalformed, "a group of " + std::to_string(count) + " members");
    for (std::uint64_t i = 0; r.ok() && i < count; ++i) {
      MemberInfo m = read_member(r);
      if (r.ok() && i > 0 && !(g.members.back().id < m.id)) r.fail(ErrorCode::kMalformed, "members not sorted by id");
      g.members.push_back(std::move(m));
    }
    r.expect_end();
    return g;
  }
  g.base = r.uvar();
  g.count = r.uvar();
  g.check = r.u64();
  if (r.ok() && (g.count == 0 || g.count > kMaxMembers)) r.fail(ErrorCode::kMalformed, "a group of " + std::to_string(g.count) + " members");
  if (r.ok() && (g.base == 0 || g.base > g.epoch)) r.fail(ErrorCode::kMalformed, "a change from epoch " + std::to_string(g.base));
  const std::uint64_t removed = r.uvar();
  if (r.ok() && removed > kMaxMembers) r.fail(ErrorCode::kMalformed, std::to_string(removed) + " members removed");
  for (std::uint64_t i = 0; r.ok() && i < removed; ++i) g.removed.push_back(transport::PeerId{r.u64()});
  const std::uint64_t added = r.uvar();
  if (r.ok() && added > kMaxMembers) r.fail(ErrorCode::kMalformed, std::to_string(added) + " members added");
  for (std::uint64_t i = 0; r.ok() && i < added; ++i) g.members.push_back(read_member(r));
  r.expect_end();
  return g;
}

IntentMessage read_intent(Reader& r) {
  IntentMessage m;
  m.id = transport::PeerId{r.u64()};
  m.flags = r.u8();
  r.expect_end();
  if (r.ok() && (m.flags & ~kPassedOn) != 0) r.fail(ErrorCode::kMalformed, "unknown flags " + std::to_string(m.flags));
  if (r.ok() && m.id.value == 0) r.fail(ErrorCode::kMalformed, "it names peer 0");
  return m;
}

void read_at(Reader& r) { r.expect_end(); }

std::uint64_t read_epoch(Reader& r) {
  const std::uint64_t epoch = r.uvar();
  r.expect_end();
  check_epoch(r, epoch);
  return epoch;
}

CommitMessage read_commit(Reader& r) {
  CommitMessage m;
  m.epoch = r.uvar();
  const std::uint64_t count = r.uvar();
  check_epoch(r, m.epoch);
  if (r.ok() && count > kMaxMembers) r.fail(ErrorCode::kMalformed, std::to_string(count) + " members left out");
  for (std::uint64_t i = 0; r.ok() && i < count; ++i) m.left.insert(transport::PeerId{r.u64()});
  r.expect_end();
  return m;
}

Bytes encode_group(const GroupView& g, std::uint64_t known, const std::vector<MemberInfo>* base) {
  Writer w = start_message(Kind::kGroup, g.round);
  w.uvar(g.epoch);
  w.u64(g.leader.value);
  w.uvar(g.width);
  w.uvar(g.prior);
  if (base == nullptr) {
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
    for (const auto& m : *base) b[m.id] = m.address;
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

Status check_round_message(ByteView payload) {
  Reader r(payload, "a round message");
  const Header h = read_header(r);
  if (r.ok() && h.version != kVersion) {
    return error(ErrorCode::kVersionMismatch, "round protocol " + std::to_string(h.version) + ", this build's is " + std::to_string(kVersion));
  }
  if (!r.ok()) return r.status();
  switch (h.kind) {
    case Kind::kReady: read_ready(r); break;
    case Kind::kGroup: read_group(r); break;
    case Kind::kIntent: read_intent(r); break;
    case Kind::kAt: read_at(r); break;
    case Kind::kAbandon:
    case Kind::kDone: read_epoch(r); break;
    case Kind::kCommit: read_commit(r); break;
    default: return error(ErrorCode::kMalformed, "a round message of unknown kind " + std::to_string(static_cast<int>(h.kind)));
  }
  return r.status();
}

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

}  // namespace gossamer::runtime::coordinator_parts
