// Link probes (runtime/link_probe.h): every pair measured once, one link per node at a time; a shaped
// node's latency and bandwidth found within bounds; rows from other processes checked.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "runtime/link_probe.h"
#include "support/mutate.h"
#include "transport/memory_link.h"
#include "transport/shaped_link.h"

using namespace gossamer;
using namespace gossamer::runtime;

TEST_CASE("probe rounds: a round-robin in which every pair meets once and each node has one partner a round") {
  for (int n = 1; n <= 11; ++n) {
    CAPTURE(n);
    std::set<std::pair<int, int>> met;
    for (int round = 0; round < probe_rounds(n); ++round) {
      const auto partner = probe_partners(n, round);
      REQUIRE(partner.size() == static_cast<std::size_t>(n));
      for (int v = 0; v < n; ++v) {
        const int p = partner[static_cast<std::size_t>(v)];
        if (p < 0) continue;
        CHECK(p != v);
        CHECK(partner[static_cast<std::size_t>(p)] == v);
        if (v < p) CHECK(met.insert({v, p}).second);  // not met before
      }
    }
    CHECK(met.size() == static_cast<std::size_t>(n * (n - 1) / 2));
  }
}

TEST_CASE("probing links: a node whose sends are shaped shows its latency and bandwidth, the others are fast, and every node gets the same network") {
  const int n = 4;
  // links[a][b]: a's end towards b. Node 0 sends through a shaper: 8 MB/s, 10 ms one way.
  std::vector<std::vector<std::shared_ptr<transport::Link>>> links(n, std::vector<std::shared_ptr<transport::Link>>(n));
  transport::LinkProfile slow;
  slow.bandwidth_bytes_per_s = 8e6;
  slow.latency = std::chrono::milliseconds(10);
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      auto [ab, ba] = transport::make_memory_link_pair(transport::PeerId{static_cast<std::uint64_t>(a + 1)}, transport::PeerId{static_cast<std::uint64_t>(b + 1)});
      if (a == 0) {
        auto shaped = transport::make_shaped_link(ab, slow);
        REQUIRE(shaped.ok());
        ab = *shaped;
      }
      links[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)] = ab;
      links[static_cast<std::size_t>(b)][static_cast<std::size_t>(a)] = ba;
    }
  }
  ProbeOptions o;
  o.bulk_bytes = 400'000;  // 50 ms at 8 MB/s
  o.deadline = Deadline::after(real_clock(), std::chrono::seconds(30));
  std::vector<Result<ProbeRow>> rows(n, error(ErrorCode::kInternal, "not run"));
  std::vector<std::thread> threads;
  for (int v = 0; v < n; ++v) threads.emplace_back([&, v] { rows[static_cast<std::size_t>(v)] = probe_links(links[static_cast<std::size_t>(v)], v, o); });
  for (auto& t : threads) t.join();
  std::vector<ProbeRow> all;
  for (int v = 0; v < n; ++v) {
    REQUIRE_MESSAGE(rows[static_cast<std::size_t>(v)].ok(), rows[static_cast<std::size_t>(v)].status().to_string());
    ProbeRow r = *rows[static_cast<std::size_t>(v)];
    r.forward_s = 0.001 * (v + 1);
    // What travels is what arrives.
    auto back = decode_probe_row(encode_probe_row(r), n, v);
    REQUIRE(back.ok());
    CHECK(back->latency_s == r.latency_s);
    CHECK(back->bandwidth_Bps == r.bandwidth_Bps);
    all.push_back(std::move(*back));
  }
  auto measured = measured_network(all);
  REQUIRE_MESSAGE(measured.ok(), measured.status().to_string());
  const auto& net = measured->network;
  CHECK(measured->forward_s == std::vector<double>{0.001, 0.002, 0.003, 0.004});
  for (int b = 1; b < n; ++b) {
    CAPTURE(b);
    // Node 0's pings wait 10 ms one way, the answers none: half the round trip, about 5 ms.
    CHECK(net.latency(0, b) > 0.004);
    CHECK(net.latency(0, b) < 0.02);
    CHECK(net.latency(b, 0) == net.latency(0, b));
    // The bulk leaves node 0 at 8 MB/s.
    CHECK(net.bandwidth(0, b) > 8e6 * 0.6);
    CHECK(net.bandwidth(0, b) < 8e6 * 1.4);
    for (int c = b + 1; c < n; ++c) {
      CHECK(net.latency(b, c) < 0.002);
      CHECK(net.bandwidth(b, c) > 8e6 * 10);
    }
  }
}

TEST_CASE("probe rows from another process: the wrong version, counts or values are refused, garbage never crashes") {
  ProbeRow r;
  r.forward_s = 0.01;
  r.latency_s = {0.02, 0.03};
  r.bandwidth_Bps = {1e7, 2e7};
  const Bytes good = encode_probe_row(r);
  CHECK(decode_probe_row(good, 4, 1).ok());
  CHECK(decode_probe_row(good, 5, 1).status().code() == ErrorCode::kMalformed);  // node 1 of 5 has 3 pairs above it
  Bytes v2 = good;
  v2[0] = std::byte{2};
  CHECK(decode_probe_row(v2, 4, 1).status().code() == ErrorCode::kVersionMismatch);
  CHECK(!decode_probe_row(ByteView(good.data(), good.size() - 1), 4, 1).ok());
  for (double bad : {std::nan(""), -1.0, 1e300}) {
    ProbeRow b = r;
    b.latency_s[1] = bad;
    CHECK(decode_probe_row(encode_probe_row(b), 4, 1).status().code() == ErrorCode::kMalformed);
    b = r;
    b.bandwidth_Bps[0] = bad;
    CHECK(decode_probe_row(encode_probe_row(b), 4, 1).status().code() == ErrorCode::kMalformed);
    b = r;
    b.forward_s = bad;
    CHECK(decode_probe_row(encode_probe_row(b), 4, 1).status().code() == ErrorCode::kMalformed);
  }
  std::mt19937_64 rng(7);
  int refused = 0;
  for (int k = 0; k < 2000; ++k) {
    auto got = decode_probe_row(testing::mutate(good, rng), 4, 1);
    if (!got.ok()) {
      ++refused;
      continue;
    }
    CHECK(got->latency_s.size() == 2);
    for (double l : got->latency_s) CHECK(std::isfinite(l));
  }
  CHECK(refused > 0);
  // Rows that do not fit together make no network.
  ProbeRow short_row = r;
  short_row.latency_s.pop_back();
  short_row.bandwidth_Bps.pop_back();
  CHECK(!measured_network({r, short_row, ProbeRow{0.01, {0.01}, {1e6}}, ProbeRow{}}).ok());
}

TEST_CASE("probing gives up when told to stop, a wait for a node that does not answer included") {
  auto [ab, ba] = transport::make_memory_link_pair(transport::PeerId{1}, transport::PeerId{2});
  std::atomic<bool> stop{false};
  ProbeOptions o;
  o.deadline = Deadline::after(real_clock(), std::chrono::seconds(30));
  o.stop = &stop;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto row = probe_links({nullptr, ab}, 0, o);  // node 1 never answers
  stopper.join();
  CHECK(row.status().code() == ErrorCode::kAborted);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  (void)ba;
}
