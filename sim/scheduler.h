// Scheduler: the simulator's virtual Clock and its deterministic scheduler.
//
// Simulated threads ("actors": workers, their communication threads) are fibers: each has its own
// stack, all run on the thread that calls run(), exactly one at a time, and control passes from one
// to the next by a user-space context switch (no kernel wake-up; LibTorch's thread-local state, such
// as grad mode, is saved and restored with each). Time only moves when every actor is waiting. An actor runs until it waits:
// sleep_until(t) parks it until virtual time t; a Signal wait parks it until notified or its deadline.
// When no actor can run, the scheduler advances virtual time to the earliest pending event (a wake-up
// or a timer callback such as a network delivery) in (time, sequence) order, so a run with the same
// inputs always takes the same path: bit-identical results, whatever the host's speed. Real compute
// inside an actor takes no virtual time; the caller accounts for it with sleep_for (a compute model).
//
// Ownership: the Scheduler owns its actors and their stacks (8 MiB reserved each, committed as used,
// with a guard region; a stack is unmapped as soon as its actor has finished and control has left it). Threading: start threads and call_at() before run() from the owning thread,
// or from inside actors and callbacks during run(); now() from anywhere while the scheduler holds
// still. An actor must not hold a mutex across a wait other than the one it waits with (another actor
// locking it would block the one OS thread all actors share). Errors: run() returns kAborted when
// actors wait on each other with nothing left that could wake them (a simulated deadlock), and
// rethrows an exception that escaped an actor; the remaining actors are unwound (their waits throw
// SimulationStopped) when the Scheduler is destroyed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>

#include "core/clock.h"
#include "core/signal.h"
#include "core/status.h"

namespace gossamer::sim {

// Thrown inside actors that are still waiting when the simulation stops; not to be caught by them.
struct SimulationStopped : std::runtime_error {
  SimulationStopped() : std::runtime_error("simulation stopped") {}
};

class Scheduler final : public Clock {
 public:
  Scheduler();
  ~Scheduler() override;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  Nanos now() const override;
  void sleep_until(Nanos t) override;  // from an actor
  std::unique_ptr<Signal> make_signal() override;
  std::unique_ptr<ClockThread> start_thread(std::function<void()> body) override;

  // Runs `fn` in the scheduler's own context at virtual time t (t >= now()). Callbacks must not wait.
  void call_at(Nanos t, std::function<void()> fn);
  // Runs until every actor has finished.
  [[nodiscard]] Status run();
  // Unwinds every actor that has not finished (their waits throw SimulationStopped; joins give up),
  // so nothing they reference is touched afterwards. Call it before destroying what actors use when
  // run() failed; the destructor calls it too. Not from an actor.
  void stop();

  bool in_actor() const;  // true on an actor's thread while it runs

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gossamer::sim
