// UpdateLog: the updates a member applied to its shared state in the last rounds (optim/updates.h),
// kept for newcomers that catch up: a newcomer fetches a snapshot of round r while the run goes on,
// then the updates of the rounds since, replays them and takes part from the next round, bit-
// identical to the members (docs/joining.md). Each update is served like a snapshot (a manifest with
// a hash per chunk, see state_sync.h), so an update of any size travels the same way.
//
// The log records only while a member offers a snapshot (start(): from that snapshot's step on);
// stop() drops everything. It keeps the updates of at most `keep_steps` steps back from the newest
// and at most `max_bytes` in all, dropping the oldest first; complete_after() is the step after which
// it holds every update applied (a newcomer whose state is older must fetch a newer snapshot).
//
// While it records, it switches on the mean tap it was given (optim/mean_tap.h), so the all-reduces
// keep the codec's bytes of their means and an update can be kept in them (update_codec.h).
//
// Threading: thread-safe; add() is called from the training thread, the rest from the state
// server's threads too.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/bytes.h"
#include "core/hash.h"
#include "optim/mean_tap.h"
#include "runtime/state_sync.h"

namespace gossamer::runtime {

class UpdateLog {
 public:
  UpdateLog(std::int64_t keep_steps, std::uint64_t max_bytes, std::shared_ptr<optim::MeanTap> tap = nullptr)
      : keep_steps_(keep_steps), max_bytes_(max_bytes), tap_(std::move(tap)) {}

  // Records from now on the updates after `step` (a snapshot's); a log that records already keeps
  // what it has.
  void start(std::int64_t step);
  // Stops recording and drops what it holds.
  void stop();
  bool recording() const;
  // The update applied at `step` (its bytes; `round` and `shards` go into its manifest). Ignored when
  // not recording, at or before complete_after(), or when it holds one for that step already.
  void add(std::int64_t step, std::int64_t round, std::uint32_t shards, Bytes update);

  // The step after which every update applied is here (meaningful while recording).
  std::int64_t complete_after() const;
  // What it holds after `step`, oldest first, at most `max` of them.
  std::vector<UpdateInfo> index(std::int64_t step, std::size_t max) const;
  // complete_after() and index() read together (nothing trimmed in between).
  std::pair<std::int64_t, std::vector<UpdateInfo>> complete_index(std::int64_t step, std::size_t max) const;
  // The update applied at `step`, or null.
  std::shared_ptr<const Snapshot> find(std::int64_t step) const;
  std::uint64_t bytes() const;       // held now
  std::uint64_t peak_bytes() const;  // the most it held at once
  std::uint64_t dropped() const;     // updates dropped to stay within its bounds

 private:
  void trim_locked(std::int64_t newest);
  const std::int64_t keep_steps_;
  const std::uint64_t max_bytes_;
  const std::shared_ptr<optim::MeanTap> tap_;
  mutable std::mutex mu_;
  bool recording_ = false;
  std::int64_t complete_after_ = 0;
  std::map<std::int64_t, std::shared_ptr<const Snapshot>> updates_;  // by step
  std::uint64_t bytes_ = 0, peak_ = 0, dropped_ = 0;
};

}  // namespace gossamer::runtime
