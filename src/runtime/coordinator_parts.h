// The Coordinator's round messages as its two source files share them (coordinator.h has their
// layout): the version, the kinds, the flags and bounds, and the header every message starts with.
// Internal to src/run.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include <string>

#include "core/wire.h"
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

}  // namespace gossamer::runtime::coordinator_parts
