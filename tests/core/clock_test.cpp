#include <doctest/doctest.h>

#include <mutex>

#include "core/clock.h"
#include "core/signal.h"

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

TEST_CASE("a real Signal returns true when notified and false at its deadline, threads start and join") {
  std::mutex mu;
  auto sig = real_clock().make_signal();
  bool flag = false;
  {
    std::unique_lock<std::mutex> lock(mu);
    CHECK_FALSE(sig->wait(lock, Deadline::after(real_clock(), 20ms), [&] { return flag; }));
  }
  auto t = real_clock().start_thread([&] {
    std::lock_guard<std::mutex> lock(mu);
    flag = true;
    sig->notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    CHECK(sig->wait(lock, Deadline::after(real_clock(), 10s), [&] { return flag; }));
  }
  t->join();
  t->join();  // joining twice is harmless
  CHECK(Deadline::never().steady_time() == std::chrono::steady_clock::time_point::max());
}

TEST_CASE("a Signal of another clock honours that clock's deadline") {
  ManualClock clock;
  std::mutex mu;
  auto sig = clock.make_signal();
  std::unique_lock<std::mutex> lock(mu);
  clock.sleep_for(5ms);  // the manual deadline below is already past: no real waiting
  CHECK_FALSE(sig->wait(lock, Deadline::at(Nanos(1)), [] { return false; }));
}

#include "core/log.h"

TEST_CASE("log limiter: a flood writes at most the burst per period, and the rest is counted") {
  gossamer::LogLimiter limiter("test events", /*burst=*/3, std::chrono::seconds(3600));
  int allowed = 0;
  for (int i = 0; i < 10000; ++i) allowed += limiter.allow() ? 1 : 0;
  CHECK(allowed == 3);
  CHECK(limiter.suppressed_total() == 9997);
  gossamer::LogLimiter quick("test events", /*burst=*/1, std::chrono::seconds(0));
  CHECK(quick.allow());
  CHECK(quick.allow());  // a period of 0 s: every event starts a new window
  CHECK(quick.suppressed_total() == 0);
}
