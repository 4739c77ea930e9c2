// Clock: the one source of time. Everything that reads time or waits goes through a Clock, so a
// virtual clock (sim/) can stand in for the real one and a simulated run stays deterministic.
//
// Thread-safety: RealClock is stateless and safe from any thread. Deadline and Stopwatch are values.
// Blocking: only sleep_until / sleep_for and Signal waits block (RealClock) or advance time (virtual
// clocks).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

namespace gossamer {

using Nanos = std::chrono::nanoseconds;
class Signal;       // core/signal.h
class ClockThread;  // core/signal.h

class Clock {
 public:
  virtual ~Clock() = default;
  // Time since this clock's epoch. Monotonic.
  virtual Nanos now() const = 0;
  // Returns once now() >= t.
  virtual void sleep_until(Nanos t) = 0;
  void sleep_for(Nanos d) { sleep_until(now() + d); }
  // Waiting on another thread and starting one, in this clock's time (core/signal.h). The defaults are
  // the real-time std primitives; a virtual clock overrides both.
  virtual std::unique_ptr<Signal> make_signal();
  virtual std::unique_ptr<ClockThread> start_thread(std::function<void()> body);
};

// std::chrono::steady_clock.
class RealClock final : public Clock {
 public:
  Nanos now() const override;
  void sleep_until(Nanos t) override;
};

// The process's real clock. Stateless, so sharing it is safe.
Clock& real_clock();

// A point in a Clock's time after which an operation gives up. never() is an explicit value, not -1.
class Deadline {
 public:
  static Deadline at(Nanos t) { return Deadline(t); }
  static Deadline after(const Clock& clock, Nanos d) { return Deadline(clock.now() + d); }
  static Deadline never() { return Deadline(Nanos::max()); }

  bool is_never() const { return at_ == Nanos::max(); }
  Nanos time() const { return at_; }
  bool expired(const Clock& clock) const { return !is_never() && clock.now() >= at_; }
  // Zero once expired; Nanos::max() for never().
  Nanos remaining(const Clock& clock) const;
  // The deadline as a std::chrono::steady_clock time point, for condition-variable waits in real-time
  // components (valid for deadlines on the real clock); never() gives time_point::max().
  std::chrono::steady_clock::time_point steady_time() const;

 private:
  explicit Deadline(Nanos at) : at_(at) {}
  Nanos at_;
};

// Measures elapsed time on a Clock.
class Stopwatch {
 public:
  explicit Stopwatch(const Clock& clock) : clock_(&clock), start_(clock.now()) {}
  void restart() { start_ = clock_->now(); }
  Nanos elapsed() const { return clock_->now() - start_; }
  double elapsed_seconds() const { return std::chrono::duration<double>(elapsed()).count(); }

 private:
  const Clock* clock_;
  Nanos start_;
};

}  // namespace gossamer
