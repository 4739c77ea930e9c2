// In-process ranks for optim tests: a full mesh of in-memory links and one thread per rank.
#pragma once

#include <exception>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "optim/collectives.h"
#include "quant/format.h"
#include "transport/memory_link.h"

namespace gossamer::optim::testing {

inline std::vector<Group> mesh(int m) {
  std::vector<Group> groups(static_cast<std::size_t>(m));
  for (int r = 0; r < m; ++r) {
    groups[static_cast<std::size_t>(r)].rank = r;
    groups[static_cast<std::size_t>(r)].size = m;
    groups[static_cast<std::size_t>(r)].peers.resize(static_cast<std::size_t>(m));
  }
  for (int a = 0; a < m; ++a) {
    for (int b = a + 1; b < m; ++b) {
      auto [ab, ba] = transport::make_memory_link_pair(transport::PeerId{static_cast<std::uint64_t>(a + 1)},
                                                       transport::PeerId{static_cast<std::uint64_t>(b + 1)});
      groups[static_cast<std::size_t>(a)].peers[static_cast<std::size_t>(b)] = ab;
      groups[static_cast<std::size_t>(b)].peers[static_cast<std::size_t>(a)] = ba;
    }
  }
  return groups;
}

// Encoding options of one codec, its defaults otherwise.
inline quant::EncodeOptions codec(quant::CodecId id) {
  quant::EncodeOptions o;
  o.codec = id;
  return o;
}

// A real-time deadline d from now.
inline Deadline in(Nanos d) { return Deadline::after(real_clock(), d); }

// Runs fn(rank) on one thread per rank. A failed REQUIRE (an exception) inside a rank is caught there
// and rethrown here after every thread joined, so it fails the test instead of terminating the run.
template <typename F>
void on_ranks(int m, F fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(m));
  for (int r = 0; r < m; ++r) {
    threads.emplace_back([&fn, &failures, r] {
      try {
        fn(r);
      } catch (...) {
        failures[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) {
    if (f) std::rethrow_exception(f);
  }
}

}  // namespace gossamer::optim::testing
