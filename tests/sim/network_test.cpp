#include <doctest/doctest.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "optim/collectives.h"
#include "sim/network.h"
#include "transport/protocol.h"

using namespace gossamer;
using namespace gossamer::sim;
using namespace std::chrono_literals;

namespace {

transport::LinkProfile profile(double bytes_per_s, Nanos latency) {
  transport::LinkProfile p;
  p.bandwidth_bytes_per_s = bytes_per_s;
  p.latency = latency;
  return p;
}

NetworkSpec uniform(int n, const transport::LinkProfile& p) {
  NetworkSpec spec;
  for (int i = 0; i < n; ++i) spec.nodes.push_back(NodeSpec{p, -1});
  return spec;
}

// The payload size whose bytes on the wire (frame header and packet headers included) are `wire`.
std::size_t payload_for_wire(const transport::LinkProfile& p, double wire) {
  std::size_t lo = 0, hi = static_cast<std::size_t>(wire);
  while (lo < hi) {
    const std::size_t mid = (lo + hi + 1) / 2;
    if (p.wire_bytes(mid + transport::kFrameHeaderBytes) <= wire) lo = mid; else hi = mid - 1;
  }
  return lo;
}

}  // namespace

TEST_CASE("a message of n wire bytes over b bytes/s and latency l arrives at exactly l + n/b") {
  const auto p = profile(1e8, 20ms);
  Scheduler s;
  Network net(s, uniform(2, p));
  const std::size_t payload = 1'000'000;
  const double wire = p.wire_bytes(payload + transport::kFrameHeaderBytes);
  Nanos sent{-1}, arrived{-1};
  auto a = s.start_thread([&] {
    REQUIRE(net.link(0, 1)->send(5, Bytes(payload, std::byte{7}), Deadline::never()).ok());
    sent = s.now();
  });
  auto b = s.start_thread([&] {
    auto got = net.link(1, 0)->recv(5, Deadline::never());
    REQUIRE(got.ok());
    CHECK(got->size() == payload);
    arrived = s.now();
  });
  REQUIRE(s.run().ok());
  const Nanos transfer(static_cast<std::int64_t>(std::ceil(wire / 1e8 * 1e9 - 1e-3)));
  CHECK(sent == transfer);
  CHECK(arrived == 20ms + transfer);
  CHECK(net.traffic(0).wire_bytes_sent == static_cast<std::uint64_t>(wire));
}

TEST_CASE("two flows through one uplink share it, flows on separate links do not") {
  const auto p = profile(1e8, 10ms);
  const std::size_t payload = payload_for_wire(p, 4'000'000);
  const double wire = p.wire_bytes(payload + transport::kFrameHeaderBytes);
  const double one = wire / 1e8;  // seconds alone on a link
  auto run = [&](std::vector<std::pair<int, int>> pairs) {
    Scheduler s;
    Network net(s, uniform(5, p));
    std::vector<Nanos> arrivals(pairs.size());
    std::vector<std::unique_ptr<ClockThread>> threads;
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      auto [from, to] = pairs[i];
      threads.push_back(s.start_thread([&, from, to] { REQUIRE(net.link(from, to)->send(1, Bytes(payload), Deadline::never()).ok()); }));
      threads.push_back(s.start_thread([&, from, to, i] {
        REQUIRE(net.link(to, from)->recv(1, Deadline::never()).ok());
        arrivals[i] = s.now();
      }));
    }
    REQUIRE(s.run().ok());
    return arrivals;
  };
  const auto shared = run({{0, 1}, {0, 2}});  // both leave through node 0's uplink
  for (Nanos t : shared) CHECK(std::chrono::duration<double>(t - 10ms).count() == doctest::Approx(2 * one).epsilon(1e-6));
  const auto apart = run({{0, 1}, {2, 3}});
  for (Nanos t : apart) CHECK(std::chrono::duration<double>(t - 10ms).count() == doctest::Approx(one).epsilon(1e-6));
  const auto incast = run({{0, 2}, {1, 2}});  // both enter through node 2's downlink
  for (Nanos t : incast) CHECK(std::chrono::duration<double>(t - 10ms).count() == doctest::Approx(2 * one).epsilon(1e-6));
  // Max-min, not an equal split: three flows into node 3 get a third of its downlink each, so node 2's
  // second flow (to node 4) gets the two thirds of node 2's uplink that the first leaves unused.
  const auto maxmin = run({{0, 3}, {1, 3}, {2, 3}, {2, 4}});
  for (int i = 0; i < 3; ++i) {
    CHECK(std::chrono::duration<double>(maxmin[static_cast<std::size_t>(i)] - 10ms).count() == doctest::Approx(3 * one).epsilon(1e-6));
  }
  CHECK(std::chrono::duration<double>(maxmin[3] - 10ms).count() == doctest::Approx(1.5 * one).epsilon(1e-6));
}

TEST_CASE("pair links: each pair its own latency and bandwidth, shared by its own flows only, the slower of access and pair link ruling") {
  // Access links unlimited and instant: the pairs alone set the times (the SkipPipe geo table).
  const auto access = profile(std::numeric_limits<double>::infinity(), 0ms);
  const std::size_t payload = 1'000'000;
  const double wire = access.wire_bytes(payload + transport::kFrameHeaderBytes);
  auto run = [&](const std::vector<std::pair<int, int>>& flows, double access_bytes_per_s) {
    Scheduler s;
    NetworkSpec spec = uniform(4, profile(access_bytes_per_s, 0ms));
    spec.pairs.resize(16);
    for (int a = 0; a < 4; ++a) {
      for (int b = 0; b < 4; ++b) {
        if (a == b) continue;
        // Pair (a, b): (a + b) x 10 ms, (1 + |a - b|) x 1e7 bytes/s.
        spec.pairs[static_cast<std::size_t>(a * 4 + b)] = PairSpec{(1.0 + std::abs(a - b)) * 1e7, Nanos(std::chrono::milliseconds(10 * (a + b)))};
      }
    }
    Network net(s, spec);
    std::vector<double> arrivals(flows.size());
    std::vector<std::unique_ptr<ClockThread>> threads;
    for (std::size_t i = 0; i < flows.size(); ++i) {
      auto [from, to] = flows[i];
      threads.push_back(s.start_thread([&, from, to] { REQUIRE(net.link(from, to)->send(1, Bytes(payload), Deadline::never()).ok()); }));
      threads.push_back(s.start_thread([&, from, to, i] {
        REQUIRE(net.link(to, from)->recv(1, Deadline::never()).ok());
        arrivals[i] = std::chrono::duration<double>(s.now()).count();
      }));
    }
    REQUIRE(s.run().ok());
    CHECK(net.path_latency(0, 3) == 30ms);
    return arrivals;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const auto alone = run({{0, 1}}, inf);
  CHECK(alone[0] == doctest::Approx(0.010 + wire / 2e7).epsilon(1e-6));
  const auto far = run({{0, 3}}, inf);
  CHECK(far[0] == doctest::Approx(0.030 + wire / 4e7).epsilon(1e-6));
  const auto shared = run({{0, 1}, {0, 1}}, inf);  // one pair, two flows: half each
  for (double t : shared) CHECK(t == doctest::Approx(0.010 + 2 * wire / 2e7).epsilon(1e-6));
  const auto apart = run({{0, 1}, {0, 2}}, inf);  // two pairs from one node with an unlimited uplink: no sharing
  CHECK(apart[0] == doctest::Approx(0.010 + wire / 2e7).epsilon(1e-6));
  CHECK(apart[1] == doctest::Approx(0.020 + wire / 3e7).epsilon(1e-6));
  const auto slow_access = run({{0, 3}}, 1e7);  // the access link is the slower one
  CHECK(slow_access[0] == doctest::Approx(0.030 + wire / 1e7).epsilon(1e-3));
}

TEST_CASE("workers behind one site uplink share it when they talk to the outside") {
  const auto p = profile(1e8, 5ms);
  NetworkSpec spec = uniform(4, p);
  spec.sites.push_back(SiteSpec{"office", 1e8, 3ms});
  spec.nodes[0].site = spec.nodes[1].site = 0;
  const std::size_t payload = payload_for_wire(p, 2'000'000);
  const double one = p.wire_bytes(payload + transport::kFrameHeaderBytes) / 1e8;
  Scheduler s;
  Network net(s, spec);
  CHECK(net.path_latency(0, 2) == 8ms);
  CHECK(net.path_latency(0, 1) == 5ms);
  std::vector<Nanos> arrivals(2);
  std::vector<std::unique_ptr<ClockThread>> threads;
  for (int i = 0; i < 2; ++i) {
    threads.push_back(s.start_thread([&, i] { REQUIRE(net.link(i, 2 + i)->send(1, Bytes(payload), Deadline::never()).ok()); }));
    threads.push_back(s.start_thread([&, i] {
      REQUIRE(net.link(2 + i, i)->recv(1, Deadline::never()).ok());
      arrivals[static_cast<std::size_t>(i)] = s.now();
    }));
  }
  REQUIRE(s.run().ok());
  for (Nanos t : arrivals) CHECK(std::chrono::duration<double>(t - 8ms).count() == doctest::Approx(2 * one).epsilon(1e-6));
}

TEST_CASE("a crashed node's peers get kPeerLost instead of waiting forever") {
  Scheduler s;
  Network net(s, uniform(2, profile(1e9, 1ms)));
  Status got;
  auto waiter = s.start_thread([&] { got = net.link(0, 1)->recv(1, Deadline::never()).status(); });
  auto killer = s.start_thread([&] {
    s.sleep_for(50ms);
    net.crash(1);
  });
  REQUIRE(s.run().ok());
  CHECK(got.code() == ErrorCode::kPeerLost);
  CHECK(s.now() == 50ms);
}

TEST_CASE("jitter and loss are seeded: same seed, same arrival times, messages never reorder") {
  auto arrivals = [](std::uint64_t seed) {
    transport::LinkProfile p = profile(1e7, 40ms);
    p.jitter = 5ms;
    p.loss = 0.01;
    NetworkSpec spec = uniform(2, p);
    spec.seed = seed;
    Scheduler s;
    Network net(s, spec);
    std::vector<std::int64_t> out;
    auto a = s.start_thread([&] {
      for (int i = 0; i < 20; ++i) REQUIRE(net.link(0, 1)->send(1, Bytes(10'000, std::byte(i)), Deadline::never()).ok());
    });
    auto b = s.start_thread([&] {
      for (int i = 0; i < 20; ++i) {
        auto m = net.link(1, 0)->recv(1, Deadline::never());
        REQUIRE(m.ok());
        CHECK((*m)[0] == std::byte(i));
        out.push_back(s.now().count());
      }
    });
    REQUIRE(s.run().ok());
    return out;
  };
  const auto x = arrivals(1), y = arrivals(1), z = arrivals(2);
  CHECK(x == y);
  CHECK(x != z);
  CHECK(std::is_sorted(x.begin(), x.end()));
}

TEST_CASE("the all-reduce runs unchanged over emulated links and moves 2(M-1)/M n b bytes") {
  constexpr int m = 4;
  constexpr std::int64_t n = 1 << 16;
  Scheduler s;
  Network net(s, uniform(m, profile(1.25e7, 40ms)));  // 100 Mbit/s, 80 ms round trip
  std::vector<optim::Group> groups(m);
  std::vector<at::Tensor> out(m);
  std::vector<optim::CommStats> stats(m);
  std::vector<std::unique_ptr<ClockThread>> threads;
  for (int r = 0; r < m; ++r) {
    auto& g = groups[static_cast<std::size_t>(r)];
    g.rank = r;
    g.size = m;
    g.clock = &s;
    g.peers.resize(m);
    for (int j = 0; j < m; ++j) {
      if (j != r) g.peers[static_cast<std::size_t>(j)] = net.link(r, j);
    }
    threads.push_back(s.start_thread([&, r] {
      at::Tensor t = torch::full({n}, static_cast<float>(r + 1));
      quant::EncodeOptions fp32;
      REQUIRE(optim::allreduce_mean(groups[static_cast<std::size_t>(r)], t, fp32, 3, Deadline::after(s, 60s), &stats[static_cast<std::size_t>(r)]).ok());
      out[static_cast<std::size_t>(r)] = t;
    }));
  }
  REQUIRE(s.run().ok());
  for (int r = 0; r < m; ++r) {
    CHECK(torch::equal(out[static_cast<std::size_t>(r)], torch::full({n}, 2.5f)));
    const double ideal = 2.0 * (m - 1) / m * n * 4;
    CHECK(static_cast<double>(stats[static_cast<std::size_t>(r)].bytes_sent) >= ideal);
    CHECK(static_cast<double>(stats[static_cast<std::size_t>(r)].bytes_sent) <= ideal * 1.01);
    CHECK(stats[static_cast<std::size_t>(r)].seconds > 0.08);  // two latency-bound phases at least
  }
}

TEST_CASE("a hub's one link is shared by every message, whoever sends it") {
  const auto p = profile(1e8, 2ms);
  NetworkSpec spec = uniform(4, p);
  spec.hub_bytes_per_s = 1e8;
  const std::size_t payload = payload_for_wire(p, 1'000'000);
  const double one = p.wire_bytes(payload + transport::kFrameHeaderBytes) / 1e8;
  Scheduler s;
  Network net(s, spec);
  std::vector<Nanos> arrivals(2);
  std::vector<std::unique_ptr<ClockThread>> threads;
  for (int i = 0; i < 2; ++i) {  // 0 -> 1 and 2 -> 3: disjoint access links, one hub
    threads.push_back(s.start_thread([&, i] { REQUIRE(net.link(2 * i, 2 * i + 1)->send(1, Bytes(payload), Deadline::never()).ok()); }));
    threads.push_back(s.start_thread([&, i] {
      REQUIRE(net.link(2 * i + 1, 2 * i)->recv(1, Deadline::never()).ok());
      arrivals[static_cast<std::size_t>(i)] = s.now();
    }));
  }
  REQUIRE(s.run().ok());
  for (Nanos t : arrivals) CHECK(std::chrono::duration<double>(t - 2ms).count() == doctest::Approx(2 * one).epsilon(1e-6));
}

TEST_CASE("a graceful close delivers what was sent first, then tells the peer the link is gone") {
  const auto p = profile(1e8, 20ms);
  Scheduler s;
  Network net(s, uniform(2, p));
  Nanos closed_seen{-1};
  auto a = s.start_thread([&] {
    REQUIRE(net.link(0, 1)->send(5, Bytes(1000, std::byte{1}), Deadline::never()).ok());
    net.close(0, 1, 0);  // the message is still on its way
    CHECK(net.link(0, 1)->send(5, Bytes(10), Deadline::never()).code() == ErrorCode::kPeerLost);
  });
  auto b = s.start_thread([&] {
    s.sleep_for(1ms);
    auto first = net.link(1, 0)->recv(5, Deadline::never());
    REQUIRE(first.ok());
    CHECK(first->size() == 1000);
    CHECK(s.now() >= 20ms);
    auto second = net.link(1, 0)->recv(5, Deadline::never());
    CHECK(second.status().code() == ErrorCode::kPeerLost);
    closed_seen = s.now();
    // b's sends to a node that hung up fail at once.
    CHECK(net.link(1, 0)->send(6, Bytes(10), Deadline::never()).code() == ErrorCode::kPeerLost);
  });
  REQUIRE(s.run().ok());
  CHECK(closed_seen >= 20ms);
}
