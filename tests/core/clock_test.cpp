#include <doctest/doctest.h>

#include "core/clock.h"

using namespace gossamer;
using namespace std::chrono_literals;

namespace {
// A manual clock: proves Deadline and Stopwatch only use the Clock interface.
class ManualClock final : public Clock {
 public:
  Nanos now() const override { return t_; }
  void sleep_until(Nanos t) override { t_ = std::max(t_, t); }
  Nanos t_{0};
};
}  // namespace

TEST_CASE("Deadline and Stopwatch follow the clock they are given") {
  ManualClock clock;
  const Deadline d = Deadline::after(clock, 10ms);
  CHECK_FALSE(d.expired(clock));
  CHECK(d.remaining(clock) == 10ms);
  Stopwatch w(clock);
  clock.sleep_for(4ms);
  CHECK(d.remaining(clock) == 6ms);
  CHECK(w.elapsed() == 4ms);
  clock.sleep_for(6ms);
  CHECK(d.expired(clock));
  CHECK(d.remaining(clock) == 0ms);
  CHECK(Deadline::never().is_never());
  CHECK_FALSE(Deadline::never().expired(clock));
  CHECK(Deadline::never().remaining(clock) == Nanos::max());
}

TEST_CASE("RealClock is monotonic and sleeps at least as long as asked") {
  Clock& clock = real_clock();
  const Nanos a = clock.now();
  clock.sleep_for(2ms);
  const Nanos b = clock.now();
  CHECK(b - a >= 2ms);
}
