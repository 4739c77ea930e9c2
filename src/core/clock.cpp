#include "core/clock.h"

#include <thread>

namespace gossamer {

Nanos RealClock::now() const {
  return std::chrono::duration_cast<Nanos>(std::chrono::steady_clock::now().time_since_epoch());
}

void RealClock::sleep_until(Nanos t) {
  const auto target = std::chrono::steady_clock::time_point(std::chrono::duration_cast<std::chrono::steady_clock::duration>(t));
  std::this_thread::sleep_until(target);
}

Clock& real_clock() {
  static RealClock clock;
  return clock;
}

std::chrono::steady_clock::time_point Deadline::steady_time() const {
  if (is_never()) return std::chrono::steady_clock::time_point::max();
  return std::chrono::steady_clock::time_point(std::chrono::duration_cast<std::chrono::steady_clock::duration>(at_));
}

Nanos Deadline::remaining(const Clock& clock) const {
  if (is_never()) return Nanos::max();
  const Nanos now = clock.now();
  return now >= at_ ? Nanos::zero() : at_ - now;
}

}  // namespace gossamer
