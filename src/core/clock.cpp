#include "core/clock.h"

#include <condition_variable>
#include <thread>

#include "core/signal.h"

namespace gossamer {

Nanos RealClock::now() const {
  return std::chrono::duration_cast<Nanos>(std::chrono::steady_clock::now().time_since_epoch());
}

void RealClock::sleep_until(Nanos t) { std::this_thread::sleep_until(Deadline::at(t).steady_time()); }

namespace {

class RealSignal final : public Signal {
 public:
  explicit RealSignal(const Clock& clock) : clock_(clock) {}
  bool wait(std::unique_lock<std::mutex>& lock, Deadline deadline, const std::function<bool()>& ready) override {
    if (deadline.is_never()) {
      cv_.wait(lock, ready);
      return true;
    }
    if (&clock_ == &real_clock()) return cv_.wait_until(lock, deadline.steady_time(), ready);
    // Another clock (a test's manual clock): wait in short real slices and re-check its deadline.
    while (!ready()) {
      if (deadline.expired(clock_)) return false;
      const Nanos left = deadline.remaining(clock_);
      cv_.wait_for(lock, std::min<Nanos>(left, std::chrono::milliseconds(50)));
    }
    return true;
  }
  void notify_all() override { cv_.notify_all(); }

 private:
  const Clock& clock_;
  std::condition_variable cv_;
};

class RealThread final : public ClockThread {
 public:
  explicit RealThread(std::function<void()> body) : thread_(std::move(body)) {}
  ~RealThread() override { join(); }
  void join() override {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Signal> Clock::make_signal() { return std::make_unique<RealSignal>(*this); }
std::unique_ptr<ClockThread> Clock::start_thread(std::function<void()> body) { return std::make_unique<RealThread>(std::move(body)); }

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
