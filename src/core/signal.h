// Signal and ClockThread: waiting and threads in a Clock's time.
//
// A Signal is a condition variable that a Clock hands out (Clock::make_signal); a ClockThread is a
// thread that a Clock starts (Clock::start_thread). With the real clock they are a
// std::condition_variable and a std::thread. With the simulator's virtual clock a wait parks the
// simulated thread and lets virtual time advance, and threads run one at a time in a deterministic
// order. Code that waits for another thread (Work handles, communication threads) uses these instead
// of the std primitives so that it runs unchanged in a simulation.
//
// Threading: wait() is called with `lock` held (it unlocks while waiting, as std::condition_variable
// does); notify_all() from any thread of the same clock. join() from a thread of the same clock, or
// after the clock stopped scheduling.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "core/clock.h"

namespace gossamer {

class Signal {
 public:
  virtual ~Signal() = default;
  // Blocks until ready() holds (checked with `lock` held) or the deadline (on the clock that made the
  // signal) passes; returns ready().
  virtual bool wait(std::unique_lock<std::mutex>& lock, Deadline deadline, const std::function<bool()>& ready) = 0;
  virtual void notify_all() = 0;
};

class ClockThread {
 public:
  virtual ~ClockThread() = default;  // a thread that was not joined is joined here
  virtual void join() = 0;
};

}  // namespace gossamer
