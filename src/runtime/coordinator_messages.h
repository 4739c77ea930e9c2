// The Coordinator's round messages (their layout in coordinator.h): the version, the kinds, the flags
// and bounds, the encoders, and the messages read as values with every check that needs no state:
// ranges, flags, sorted members, the end of the message. The handlers
// (coordinator.cpp, coordinator_group.cpp, coordinator_commit.cpp) then judge them against what the
// peer holds, and the wire registry (wire_formats.h) decodes whole messages with the same functions.
// Internal to src/runtime; pure functions.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/wire.h"
#include "runtime/coordinator.h"
#include "transport/endpoint.h"
#include "transport/ids.h"

namespace gossamer::runtime::coordinator_parts {

// 3: READY to the leader, GROUP to each peer as a change from the one it holds. 4: varints, and link
// addresses in gossip's compact form. 5: rounds committed all-or-nothing (DONE, COMMIT, a GROUP's prior).
inline constexpr std::uint8_t kVersion = 5;
enum class Kind : std::uint8_t { kReady = 1, kGroup = 2, kIntent = 3, kAt = 4, kAbandon = 5, kDone = 6, kCommit = 7 };
inline constexpr std::uint8_t kPassedOn = 1, kToEveryone = 2, kUnlinked = 4;  // READY and INTENT flags (kUnlinked: READY only)
inline constexpr std::uint8_t kWhole = 0, kChange = 1;                        // GROUP forms
inline constexpr std::size_t kMaxMembers = 4096;
inline constexpr std::uint64_t kMaxRound = std::uint64_t{1} << 62;  // rounds and steps, far beyond any run
inline constexpr std::uint64_t kMaxEpoch = std::uint64_t{1} << 62;  // epochs grow by one per group change
inline constexpr std::size_t kInLine = 2;                           // a READY goes to the leader and its fallback

// Every round message starts the same way.
inline Writer start_message(Kind kind, std::int64_t round) {
  Writer w;
  w.u8(kVersion);
  w.u8(static_cast<std::uint8_t>(kind));
  w.uvar(static_cast<std::uint64_t>(round));
  return w;
}

// A READY (its layout in coordinator.h).
inline Bytes encode_ready(std::int64_t round, std::uint64_t after_epoch, std::int64_t step, transport::PeerId id, std::uint64_t known_epoch,
                   std::uint8_t flags, const std::string& address) {
  Writer w = start_message(Kind::kReady, round);
  w.uvar(after_epoch);
  w.uvar(static_cast<std::uint64_t>(step));
  w.u64(id.value);
  w.uvar(known_epoch);
  w.u8(flags);
  transport::write_address(w, address);
  return std::move(w).take();
}

struct Header {
  std::uint8_t version = 0;  // the caller judges another version (it names the sender's)
  Kind kind{};
  std::int64_t round = 0;
};
struct ReadyMessage {
  std::uint64_t after_epoch = 0;
  std::int64_t step = 0;
  transport::PeerId id;
  std::uint64_t known_epoch = 0;
  std::uint8_t flags = 0;
  std::string address;
};
struct GroupMessage {
  std::uint64_t epoch = 0;
  transport::PeerId leader;
  std::uint32_t width = 0;
  std::uint64_t prior = 0;
  std::uint8_t form = kWhole;
  std::vector<MemberInfo> members;  // whole: every member, sorted by id; change: those added
  // A change: from the group of epoch `base`, `removed` out and `members` in, making `count` members
  // whose check_of() is `check`.
  std::uint64_t base = 0, count = 0, check = 0;
  std::vector<transport::PeerId> removed;
};
struct IntentMessage {
  transport::PeerId id;
  std::uint8_t flags = 0;
};
struct CommitMessage {
  std::uint64_t epoch = 0;
  std::set<transport::PeerId> left;
};

// A GROUP for a peer that holds the group of epoch `known`, whose members are `base`: the change from
// it, or (base null) the whole list.
Bytes encode_group(const GroupView& g, std::uint64_t known, const std::vector<MemberInfo>* base);
// The first bytes of every message; `r` is left at the body.
Header read_header(Reader& r);
// Each body, read from `r` to its end; `r` fails (kMalformed, saying what) on anything out of range.
ReadyMessage read_ready(Reader& r);
GroupMessage read_group(Reader& r);
IntentMessage read_intent(Reader& r);
void read_at(Reader& r);
std::uint64_t read_epoch(Reader& r);  // ABANDON, DONE
CommitMessage read_commit(Reader& r);
// A whole message of this version (the wire registry's decoder): ok, or what is wrong with it.
Status check_round_message(ByteView payload);
// What a change's receiver checks the members it made against.
std::uint64_t check_of(const std::vector<MemberInfo>& members);

}  // namespace gossamer::runtime::coordinator_parts
