#include "runtime/update_log.h"

#include <algorithm>

namespace gossamer::runtime {

void UpdateLog::start(std::int64_t step) {
  std::lock_guard lock(mu_);
  if (recording_) return;
  recording_ = true;
  complete_after_ = step;
  if (tap_) tap_->enable(true);
}

void UpdateLog::stop() {
  std::lock_guard lock(mu_);
  recording_ = false;
  updates_.clear();
  bytes_ = 0;
  if (tap_) tap_->enable(false);
}

bool UpdateLog::recording() const {
  std::lock_guard lock(mu_);
  return recording_;
}

void UpdateLog::add(std::int64_t step, std::int64_t round, std::uint32_t shards, Bytes update) {
  std::lock_guard lock(mu_);
  if (!recording_ || step <= complete_after_ || updates_.count(step) > 0) return;
  auto s = Snapshot::make(round, step, shards, std::move(update));
  bytes_ += s->bytes.size();
  updates_.emplace(step, std::move(s));
  trim_locked(step);
  peak_ = std::max(peak_, bytes_);
}

void UpdateLog::trim_locked(std::int64_t newest) {
  while (!updates_.empty()) {
    auto oldest = updates_.begin();
    const bool too_old = oldest->first <= newest - keep_steps_;
    const bool too_big = bytes_ > max_bytes_ && updates_.size() > 1;
    if (!too_old && !too_big) break;
    complete_after_ = std::max(complete_after_, oldest->first);  // from here on the log is complete
    bytes_ -= oldest->second->bytes.size();
    updates_.erase(oldest);
    ++dropped_;
  }
}

std::int64_t UpdateLog::complete_after() const {
  std::lock_guard lock(mu_);
  return complete_after_;
}

std::vector<UpdateInfo> UpdateLog::index(std::int64_t step, std::size_t max) const { return complete_index(step, max).second; }

std::pair<std::int64_t, std::vector<UpdateInfo>> UpdateLog::complete_index(std::int64_t step, std::size_t max) const {
  std::lock_guard lock(mu_);
  std::vector<UpdateInfo> out;
  for (auto it = updates_.upper_bound(step); it != updates_.end() && out.size() < max; ++it) {
    out.push_back(UpdateInfo{it->first, it->second->manifest.total, it->second->manifest.chunk_bytes, it->second->manifest.whole});
  }
  return {complete_after_, std::move(out)};
}

std::shared_ptr<const Snapshot> UpdateLog::find(std::int64_t step) const {
  std::lock_guard lock(mu_);
  auto it = updates_.find(step);
  return it == updates_.end() ? nullptr : it->second;
}

std::uint64_t UpdateLog::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

std::uint64_t UpdateLog::peak_bytes() const {
  std::lock_guard lock(mu_);
  return peak_;
}

std::uint64_t UpdateLog::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

}  // namespace gossamer::runtime
