// Polling for tests of components that work on their own threads (gossip, coordinators, servers).
#pragma once

#include <chrono>
#include <thread>

#include "core/clock.h"

namespace gossamer::testing {

// Polls `done` every 10 ms until it holds or `within` has passed; the last answer of `done`.
template <typename F>
bool eventually(F done, Nanos within) {
  const Deadline d = Deadline::after(real_clock(), within);
  while (!d.expired(real_clock())) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

}  // namespace gossamer::testing
