// libFuzzer target: round messages (READY, GROUP, INTENT, AT, ABANDON, DONE, COMMIT; src/runtime/coordinator.h) from
// arbitrary bytes, delivered to a Coordinator on topic "gossamer.round". The input is a sequence of
// records (records.h): the selector picks the origin (peers 1 to 4; this peer is 1), the payload is
// the message. The coordinator first leads round 0's group of one, so it is a member when the junk
// comes. After each message: it was ignored (this peer's own, echoed back), or dropped and counted
// once, or its header was well-formed (version 5, a known kind, a round below 2^62, a READY naming its
// origin unless passed on, an INTENT, an AT, an ABANDON, a DONE and a COMMIT of exactly their size,
// the ABANDON's epoch superseded after it, a COMMIT's epoch gone through after it); a whole GROUP taken supersedes the epoch before its own; a message causes no
// broadcast beyond one ABANDON (a retry reaching it as leader) and at most two direct messages (an
// answer, or a READY or INTENT passed on to two). At the end the coordinator still agrees at once on
// a round after all the junk, as the only member, with an epoch no smaller than that of any whole
// GROUP it took.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "core/wire.h"
#include "fake_gossip.h"
#include "records.h"
#include "runtime/coordinator.h"
#include "transport/endpoint.h"

namespace {

using namespace gossamer;

constexpr std::int64_t kLastRoundChecked = std::int64_t{1} << 62;

// A link address as the round messages write it (transport/member_table.h): IPv4 and port.
void link_address(Writer& w, std::uint8_t host) {
  w.u8(2);
  for (std::uint8_t b : {192, 0, 2}) w.u8(b);
  w.u8(host);
  w.u16(7001);
}

// Reads a message's version, kind and round; false when they are not there.
bool read_head(Reader& r, std::uint8_t& version, std::uint8_t& kind, std::uint64_t& round) {
  version = r.u8();
  kind = r.u8();
  round = r.uvar();
  return r.ok();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // every dropped message is logged
  if (fuzz::seeds_wanted()) {
    // What peer 2 says retrying round 1 after epoch 1 at step 12 (to everyone), and the other kinds
    // by the layout in the header: a READY, a whole GROUP, a change, an INTENT and an AT.
    fuzz::FakeGossip peer(transport::PeerId{2});
    auto c = runtime::Coordinator::make(peer, "192.0.2.2:7001", runtime::CoordinatorOptions{}, real_clock());
    (void)c->agree(0, 0, Deadline::after(real_clock(), std::chrono::seconds(5)));
    (void)c->agree(1, 1, Deadline::after(real_clock(), std::chrono::seconds(5)), 12);
    std::vector<std::pair<std::uint8_t, Bytes>> records;
    for (const auto& [topic, payload] : peer.sent()) records.emplace_back(1, payload);  // selector 1: from peer 2
    const auto start = [](std::uint8_t kind, std::int64_t round) {
      Writer w;
      w.u8(5);
      w.u8(kind);
      w.uvar(static_cast<std::uint64_t>(round));
      return w;
    };
    Writer ready = start(1, 2);
    ready.uvar(0);
    ready.uvar(0);
    ready.u64(2);
    ready.uvar(1);
    ready.u8(0);
    link_address(ready, 2);
    records.emplace_back(1, ready.bytes());
    Writer whole = start(2, 3);
    whole.uvar(4);
    whole.u64(2);
    whole.uvar(0);
    whole.uvar(0);
    whole.u8(0);
    whole.uvar(1);
    whole.u64(1);
    link_address(whole, 1);
    records.emplace_back(1, whole.bytes());
    Writer change = start(2, 4);
    change.uvar(5);
    change.u64(2);
    change.uvar(0);
    change.uvar(4);
    change.u8(1);
    change.uvar(4);
    change.uvar(2);
    change.u64(0);
    change.uvar(0);
    change.uvar(1);
    change.u64(3);
    link_address(change, 3);
    records.emplace_back(1, change.bytes());
    Writer intent = start(3, 5);
    intent.u64(2);
    intent.u8(0);
    records.emplace_back(1, intent.bytes());
    records.emplace_back(1, start(4, 6).bytes());
    Writer abandon = start(5, 7);
    abandon.uvar(3);
    records.emplace_back(1, abandon.bytes());
    Writer done = start(6, 8);
    done.uvar(3);
    records.emplace_back(1, done.bytes());
    Writer commit = start(7, 8);
    commit.uvar(3);
    commit.uvar(1);
    commit.u64(4);
    records.emplace_back(1, commit.bytes());
    fuzz::write_seed("round", fuzz::join_records(records));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const transport::PeerId self{1};
  fuzz::FakeGossip gossip(self);
  auto coordinator = runtime::Coordinator::make(gossip, "192.0.2.1:7001", runtime::CoordinatorOptions{}, real_clock());
  auto first = coordinator->agree(0, 0, Deadline::after(real_clock(), std::chrono::seconds(5)));
  if (!first.ok() || first->rank_of(self) != 0) __builtin_trap();

  std::int64_t last_round = 0;
  std::uint64_t largest_epoch = first->epoch;
  std::map<std::uint64_t, std::uint64_t> committed;  // round -> the latest epoch a COMMIT named
  for (const auto& record : fuzz::split_records(data, size)) {
    const transport::PeerId origin{1u + record.selector % 4u};
    const ByteView m = record.payload;
    const std::int64_t dropped = coordinator->stats().dropped;
    const std::uint64_t broadcasts = gossip.broadcasts(), directs = gossip.directs();
    gossip.deliver(origin, "gossamer.round", m);
    const std::int64_t dropped_now = coordinator->stats().dropped;
    if (dropped_now != dropped && dropped_now != dropped + 1) __builtin_trap();
    if (gossip.broadcasts() > broadcasts + 1 || gossip.directs() > directs + 2) __builtin_trap();
    if (origin == self) {  // its own broadcast echoed back: ignored, neither taken nor dropped
      if (dropped_now != dropped || gossip.directs() != directs || gossip.broadcasts() != broadcasts) __builtin_trap();
      continue;
    }
    std::uint8_t version = 0, kind = 0;
    std::uint64_t round = 0;
    Reader r(m);
    const bool head = read_head(r, version, kind, round);
    if (head && round < static_cast<std::uint64_t>(kLastRoundChecked)) last_round = std::max(last_round, static_cast<std::int64_t>(round));
    if (head && round >= static_cast<std::uint64_t>(kLastRoundChecked)) last_round = kLastRoundChecked;
    if (dropped_now != dropped) continue;
    // Taken: what it said must have been well-formed.
    if (!head || version != 5) __builtin_trap();
    if (kind == 1) {
      (void)r.uvar();  // after epoch
      (void)r.uvar();  // step
      const std::uint64_t id = r.u64();
      (void)r.uvar();  // known epoch
      const std::uint8_t flags = r.u8();
      (void)transport::read_address(r);
      r.expect_end();
      if (!r.ok() || ((flags & 1) == 0 && id != origin.value)) __builtin_trap();
    } else if (kind == 2) {
      const std::uint64_t epoch = r.uvar();
      (void)r.u64();   // leader
      (void)r.uvar();  // width
      (void)r.uvar();  // prior
      const std::uint8_t form = r.u8();
      if (!r.ok() || epoch == 0) __builtin_trap();
      if (form == 0) {
        if (r.uvar() == 0 || !r.ok() || !coordinator->superseded(static_cast<std::int64_t>(round), epoch - 1)) __builtin_trap();  // a group has a member
        largest_epoch = std::max(largest_epoch, epoch);
      } else if (form != 1) {
        __builtin_trap();
      }
    } else if (kind == 5) {
      const std::uint64_t epoch = r.uvar();
      r.expect_end();
      if (!r.ok() || !coordinator->superseded(static_cast<std::int64_t>(round), epoch)) __builtin_trap();  // the epoch is abandoned
    } else if (kind == 6) {
      const std::uint64_t epoch = r.uvar();
      r.expect_end();
      if (!r.ok() || epoch == 0) __builtin_trap();
    } else if (kind == 7) {
      const std::uint64_t epoch = r.uvar();
      const std::uint64_t count = r.uvar();
      for (std::uint64_t i = 0; r.ok() && i < count; ++i) (void)r.u64();
      r.expect_end();
      if (!r.ok() || epoch == 0 || count > 4096) __builtin_trap();
      // Gone through, unless a later attempt of the round was committed before it.
      auto& latest = committed[round];
      if (epoch >= latest && !coordinator->went_through(static_cast<std::int64_t>(round), epoch)) __builtin_trap();
      latest = std::max(latest, epoch);
    } else if (kind == 3) {
      (void)r.u64();
      (void)r.u8();
      r.expect_end();
      if (!r.ok()) __builtin_trap();
    } else if (kind == 4) {
      r.expect_end();
      if (!r.ok()) __builtin_trap();
    } else {
      __builtin_trap();
    }
  }
  if (last_round < kLastRoundChecked) {
    auto later = coordinator->agree(last_round + 1, 0, Deadline::after(real_clock(), std::chrono::seconds(5)));
    if (!later.ok() || later->members.size() != 1 || later->rank_of(self) != 0 || later->epoch < largest_epoch) __builtin_trap();
  }
  return 0;
}
