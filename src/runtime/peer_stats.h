// The statistics of a Peer's parts (peer_runtime.h), each kept by its part and written to the
// records and the summary by itself: a newcomer's joins, a member's group keeping (its donor duty's
// are DonorStats, donor_duty.h).
// The JSON keys are the ones docs/peers.md lists.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "core/clock.h"

namespace gossamer::runtime {

// A newcomer's joins (a member left out of a round joins again the same way): the last one's
// figures, and what the transfers came to.
struct JoinStats {
  std::int64_t joins = 0;            // states adopted
  double fetch_s = 0;                // the last join: from asking for the state to taking part
  double transfer_s = 0;             // the last join: the snapshot's transfer alone (manifests and chunks)
  std::uint64_t snapshot_bytes = 0;  // the last join: the snapshot's size
  std::int64_t rounds_behind = 0;    // the last join: rounds the run went on while the state came
  std::int64_t updates_replayed = 0;
  std::uint64_t resumed_bytes = 0;   // of snapshots, kept from a transfer cut short
  std::uint64_t bytes_received = 0;  // snapshots and updates, every join
  // The last snapshot's transfer: when it began, the run's round then (as announced), and the
  // bytes/s it came at; catching up reads its pace from them.
  Nanos transfer_started{0};
  std::int64_t round_at_transfer = -1;
  double transfer_rate = 0;

  // joins, state_fetch_s, state_transfer_s, state_snapshot_bytes, state_resumed_bytes,
  // join_rounds_behind, updates_replayed.
  void write(nlohmann::json& out) const {
    out["joins"] = joins;
    out["state_fetch_s"] = fetch_s;
    out["state_transfer_s"] = transfer_s;
    out["state_snapshot_bytes"] = snapshot_bytes;
    out["state_resumed_bytes"] = resumed_bytes;
    out["join_rounds_behind"] = rounds_behind;
    out["updates_replayed"] = updates_replayed;
  }
};

// A member's group keeping: rounds it applied alone (no group could be agreed), and the work it
// computed in rounds it was left out of, carried into a later contribution or dropped.
struct GroupKeepingStats {
  std::int64_t solo_rounds = 0;
  std::int64_t late_carried = 0;
  std::int64_t late_dropped = 0;

  void write(nlohmann::json& out) const {
    out["solo_rounds"] = solo_rounds;
    out["late_contributions_carried"] = late_carried;
    out["late_contributions_dropped"] = late_dropped;
  }
};

}  // namespace gossamer::runtime
