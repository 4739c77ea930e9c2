// libFuzzer target: round messages (READY, GROUP, INTENT; src/run/coordinator.h) from arbitrary bytes,
// delivered to a Coordinator on topic "gossamer.round". The input is a sequence of records
// (records.h): the selector picks the origin (peers 1 to 4; this peer is 1), the payload is the
// message. The coordinator first leads round 0's group of one, so it is a member when the junk comes.
// After each message: it was dropped and counted once, or its header was well-formed (version 2, a
// known kind, a round >= 0, a READY naming its origin, an INTENT of exactly its size); a GROUP taken
// supersedes the epoch before its own; a message causes at most one broadcast (a group repeated).
// At the end the coordinator still agrees at once on a round after all the junk, as the only member,
// with an epoch no smaller than that of any GROUP it took.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "fake_gossip.h"
#include "records.h"
#include "run/coordinator.h"

namespace {

using namespace gossamer;

std::uint64_t u64_at(ByteView b, std::size_t at) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(b[at + i]) << (8 * i);
  return v;
}

constexpr std::int64_t kLastRoundChecked = std::int64_t{1} << 62;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // every dropped message is logged
  if (fuzz::seeds_wanted()) {
    // What peer 2 says leading round 0, retrying round 1 after epoch 1 at step 12, and intending round 2.
    fuzz::FakeGossip peer(transport::PeerId{2});
    auto c = run::Coordinator::make(peer, "192.0.2.2:7001", run::CoordinatorOptions{});
    (void)c->agree(0, 0, Deadline::after(real_clock(), std::chrono::seconds(5)));
    (void)c->agree(1, 1, Deadline::after(real_clock(), std::chrono::seconds(5)), 12);
    c->intend(2);
    std::vector<std::pair<std::uint8_t, Bytes>> records;
    for (const auto& [topic, payload] : peer.sent()) records.emplace_back(1, payload);  // selector 1: from peer 2
    fuzz::write_seed("round", fuzz::join_records(records));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const transport::PeerId self{1};
  fuzz::FakeGossip gossip(self);
  auto coordinator = run::Coordinator::make(gossip, "192.0.2.1:7001", run::CoordinatorOptions{});
  auto first = coordinator->agree(0, 0, Deadline::after(real_clock(), std::chrono::seconds(5)));
  if (!first.ok() || first->rank_of(self) != 0) __builtin_trap();

  std::int64_t last_round = 0;
  std::uint64_t largest_epoch = first->epoch;
  for (const auto& record : fuzz::split_records(data, size)) {
    const transport::PeerId origin{1u + record.selector % 4u};
    const ByteView m = record.payload;
    const std::int64_t dropped = coordinator->stats().dropped;
    const std::uint64_t broadcasts = gossip.broadcasts();
    gossip.deliver(origin, "gossamer.round", m);
    const std::int64_t dropped_now = coordinator->stats().dropped;
    if (dropped_now != dropped && dropped_now != dropped + 1) __builtin_trap();
    if (gossip.broadcasts() > broadcasts + 1) __builtin_trap();
    if (m.size() >= 10) last_round = std::max(last_round, static_cast<std::int64_t>(u64_at(m, 2)));
    if (dropped_now != dropped) continue;
    // Taken: what it said must have been well-formed.
    if (m.size() < 10 || m[0] != std::byte{2}) __builtin_trap();
    const auto kind = static_cast<std::uint8_t>(m[1]);
    const auto round = static_cast<std::int64_t>(u64_at(m, 2));
    if (round < 0) __builtin_trap();
    if (kind == 1) {
      if (m.size() < 38 || u64_at(m, 26) != origin.value) __builtin_trap();
    } else if (kind == 2) {
      if (m.size() < 42) __builtin_trap();  // a group has a member
      const std::uint64_t epoch = u64_at(m, 10);
      if (epoch == 0 || !coordinator->superseded(round, epoch - 1)) __builtin_trap();
      largest_epoch = std::max(largest_epoch, epoch);
    } else if (kind != 3 || m.size() != 18) {
      __builtin_trap();
    }
  }
  if (last_round < kLastRoundChecked) {
    auto later = coordinator->agree(last_round + 1, 0, Deadline::after(real_clock(), std::chrono::seconds(5)));
    if (!later.ok() || later->members.size() != 1 || later->rank_of(self) != 0 || later->epoch < largest_epoch) __builtin_trap();
  }
  return 0;
}
