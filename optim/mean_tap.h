// MeanTap: the codec's own bytes of the means a group's all-reduces decoded, kept while switched on,
// so that catch-up can keep a round's update as the all-reduce sent it instead of in fp32
// (runtime/update_codec.h; docs/joining.md). With int8 an update then takes a quarter of its fp32 size,
// with fp4 an eighth, and a newcomer fetching it gains on the members where fp32 would not.
//
// allreduce_mean (collectives.h) hands a tap set in its Group the payloads of the mean, in the
// tensor's order, whenever the codec is not fp32 (fp32 gains nothing) and the tap is on. A method
// hands out the update afterwards (optim/updates.h), possibly from another thread and a few
// all-reduces later (Streaming DiLoCo's and CO2's overlapped ones); take() finds the record whose
// payloads decode bit for bit to the update, so what a newcomer replays is exactly what the members
// applied, whatever happened in between. An update that no record matches (a solo round, a method
// that transforms the mean, an fp32 codec) is kept in fp32 by the caller.
//
// Memory: at most kMaxRecords records, the oldest dropped first; off, it holds nothing.
// Threading: thread-safe; add() from the all-reduce's thread, the rest from any.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "core/bytes.h"

namespace gossamer::optim {

class MeanTap {
 public:
  static constexpr std::size_t kMaxRecords = 8;

  // On: all-reduces record from now on. Off: drops what it holds.
  void enable(bool on);
  bool enabled() const;
  // The payloads of one all-reduce's mean, in the tensor's order (`numel` values in all).
  void add(std::int64_t numel, std::vector<Bytes> payloads);
  // The payloads of the newest record that decodes bit for bit to `values`; it and every older
  // record are dropped. Empty when none does.
  std::optional<std::vector<Bytes>> take(std::span<const float> values);
  std::size_t size() const;

 private:
  struct Record {
    std::int64_t numel = 0;
    std::vector<Bytes> payloads;
  };
  mutable std::mutex mu_;
  bool on_ = false;
  std::deque<Record> records_;  // oldest first
};

// True when `payloads` (untrusted: decoded with bounds) decode, one after another, to exactly
// `values`, bit for bit.
bool decodes_to(const std::vector<Bytes>& payloads, std::span<const float> values);

}  // namespace gossamer::optim
