// The Coordinator's round messages read as values (their layout in coordinator.h), with every check
// that needs no state: ranges, flags, sorted members, the end of the message. The handlers
// (coordinator.cpp, coordinator_group.cpp, coordinator_commit.cpp) then judge them against what the
// peer holds, and the wire registry (wire_formats.h) decodes whole messages with the same functions.
// Internal to src/run; pure functions.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/wire.h"
#include "runtime/coordinator.h"
#include "runtime/coordinator_parts.h"

namespace gossamer::runtime::coordinator_parts {

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
