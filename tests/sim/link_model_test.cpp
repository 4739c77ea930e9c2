// One link model: the same LinkProfile gives the same delay distribution in the real-time shaped
// link, in shaped gossip and in the simulator's network (a two-sample Kolmogorov-Smirnov test on the
// delays each path shows its receiver).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "sim/network.h"
#include "transport/gossip.h"
#include "transport/link_model.h"
#include "transport/memory_link.h"
#include "transport/protocol.h"
#include "transport/shaped_link.h"

using namespace gossamer;
using namespace std::chrono_literals;

namespace {

constexpr int kMessages = 200;
constexpr Nanos kSpacing = 60ms;
constexpr std::size_t kPayload = 100;  // one packet on every path

transport::LinkProfile profile() {
  transport::LinkProfile p;
  p.latency = 40ms;  // wide enough that the real paths' own scheduling noise (a millisecond) is small beside it
  p.jitter = 10ms;
  p.loss = 0.25;  // one message in four pays a round trip more, so a path that ignores loss shows
  return p;
}

double ms(Nanos n) { return static_cast<double>(n.count()) / 1e6; }

// The two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical distributions.
double ks_statistic(std::vector<double> a, std::vector<double> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::size_t i = 0, j = 0;
  double d = 0;
  while (i < a.size() && j < b.size()) {
    const double x = std::min(a[i], b[j]);
    while (i < a.size() && a[i] <= x) ++i;
    while (j < b.size() && b[j] <= x) ++j;
    d = std::max(d, std::abs(static_cast<double>(i) / a.size() - static_cast<double>(j) / b.size()));
  }
  return d;
}

// The statistic's critical value at significance 0.001 for two samples of n.
double ks_critical(std::size_t n) { return 1.95 * std::sqrt(2.0 / static_cast<double>(n)); }

std::uint32_t index_of(const Bytes& m) {
  std::uint32_t i = 0;
  std::memcpy(&i, m.data(), sizeof i);
  return i;
}

Bytes numbered(std::uint32_t i) {
  Bytes m(kPayload);
  std::memcpy(m.data(), &i, sizeof i);
  return m;
}

// Sends kMessages one every kSpacing with `send`; the delay of each from the start of its send call
// to `arrived[i]`, which the receiving side fills.
std::vector<double> real_delays(const std::function<void(std::uint32_t)>& send, std::vector<std::chrono::steady_clock::time_point>& arrived,
                                std::mutex& mu) {
  std::vector<std::chrono::steady_clock::time_point> sent(kMessages);
  const auto t0 = std::chrono::steady_clock::now() + 50ms;
  for (std::uint32_t i = 0; i < kMessages; ++i) {
    std::this_thread::sleep_until(t0 + i * kSpacing);
    sent[i] = std::chrono::steady_clock::now();
    send(i);
  }
  std::this_thread::sleep_for(1s);  // the last ones land
  std::lock_guard<std::mutex> lock(mu);
  std::vector<double> out;
  for (int i = 0; i < kMessages; ++i) {
    if (arrived[static_cast<std::size_t>(i)] != std::chrono::steady_clock::time_point{}) out.push_back(ms(arrived[static_cast<std::size_t>(i)] - sent[static_cast<std::size_t>(i)]));
  }
  return out;
}

std::vector<double> simulated_delays() {
  sim::NetworkSpec spec;
  spec.nodes = {sim::NodeSpec{profile(), -1}, sim::NodeSpec{profile(), -1}};
  spec.seed = 17;
  sim::Scheduler s;
  sim::Network net(s, spec);
  std::vector<double> out(kMessages);
  auto a = s.start_thread([&] {
    for (std::uint32_t i = 0; i < kMessages; ++i) {
      s.sleep_until(i * kSpacing);
      REQUIRE(net.link(0, 1)->send(1, numbered(i), Deadline::never()).ok());
    }
  });
  auto b = s.start_thread([&] {
    for (int k = 0; k < kMessages; ++k) {
      auto m = net.link(1, 0)->recv(1, Deadline::never());
      REQUIRE(m.ok());
      const std::uint32_t i = index_of(*m);
      out[i] = ms(s.now() - i * kSpacing);
    }
  });
  REQUIRE(s.run().ok());
  return out;
}

std::vector<double> shaped_link_delays() {
  auto [ab, ba] = transport::make_memory_link_pair(transport::PeerId{1}, transport::PeerId{2});
  auto shaped = transport::make_shaped_link(ab, profile(), 23);
  REQUIRE(shaped.ok());
  std::mutex mu;
  std::vector<std::chrono::steady_clock::time_point> arrived(kMessages);
  std::thread receiver([&] {
    for (int k = 0; k < kMessages; ++k) {
      auto m = ba->recv(1, Deadline::after(real_clock(), 30s));
      if (!m.ok()) return;
      const auto now = std::chrono::steady_clock::now();
      std::lock_guard<std::mutex> lock(mu);
      arrived[index_of(*m)] = now;
    }
  });
  auto out = real_delays([&](std::uint32_t i) { REQUIRE((*shaped)->send(1, numbered(i), Deadline::never()).ok()); }, arrived, mu);
  receiver.join();
  return out;
}

std::vector<double> gossip_delays() {
  transport::GossipOptions ob;
  ob.period = 2s;  // few probes of its own beside the measured messages
  ob.self = transport::PeerId{101};
  auto b = transport::make_gossip(ob);
  REQUIRE(b.ok());
  transport::GossipOptions oa = ob;
  oa.seeds = {(*b)->address()};
  oa.self = transport::PeerId{202};  // its shaping draws are seeded by its id
  oa.shape = profile();
  auto a = transport::make_gossip(oa);
  REQUIRE(a.ok());
  std::mutex mu;
  std::vector<std::chrono::steady_clock::time_point> arrived(kMessages);
  (*b)->subscribe("delay", [&](transport::PeerId, const Bytes& m) {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu);
    if (m.size() == kPayload && index_of(m) < kMessages) arrived[index_of(m)] = now;
  });
  const auto joined_by = std::chrono::steady_clock::now() + 20s;
  while ((*a)->members().empty() && std::chrono::steady_clock::now() < joined_by) std::this_thread::sleep_for(10ms);
  REQUIRE(!(*a)->members().empty());
  std::this_thread::sleep_for(300ms);  // the join's own messages are through
  return real_delays([&](std::uint32_t i) { REQUIRE((*a)->send((*b)->self(), "delay", numbered(i)).ok()); }, arrived, mu);
}

}  // namespace

TEST_CASE("one link model: the same profile gives the same delay distribution in the shaped link, in gossip and in the simulator") {
  const std::vector<double> simulated = simulated_delays();
  std::vector<double> shaped, gossiped;
  std::thread gossip_thread([&] { gossiped = gossip_delays(); });  // both in real time, side by side
  shaped = shaped_link_delays();
  gossip_thread.join();
  // Gossip messages are datagrams to the caller; on loopback with no loss of its own, all arrive.
  REQUIRE(shaped.size() == kMessages);
  REQUIRE(gossiped.size() >= kMessages - 2);
  const double critical = ks_critical(kMessages);
  const double sim_shaped = ks_statistic(simulated, shaped), sim_gossip = ks_statistic(simulated, gossiped),
               shaped_gossip = ks_statistic(shaped, gossiped);
  const auto quantiles = [](std::vector<double> d) {
    std::sort(d.begin(), d.end());
    std::string out;
    for (double q : {0.1, 0.25, 0.5, 0.75, 0.9}) out += std::to_string(d[static_cast<std::size_t>(q * (d.size() - 1))]).substr(0, 5) + " ";
    return out;
  };
  MESSAGE("delay quantiles 0.1 0.25 0.5 0.75 0.9 (ms): simulated " << quantiles(simulated) << "| shaped link " << quantiles(shaped) << "| gossip "
                                                                    << quantiles(gossiped));
  MESSAGE("KS statistics (critical " << critical << " at 0.001): sim-shaped " << sim_shaped << ", sim-gossip " << sim_gossip << ", shaped-gossip "
                                     << shaped_gossip);
  CHECK(sim_shaped < critical);
  CHECK(sim_gossip < critical);
  CHECK(shaped_gossip < critical);
  // Loss shows: about a quarter of the messages pay at least one round trip (80 ms) more.
  const auto late = [](const std::vector<double>& d) { return std::count_if(d.begin(), d.end(), [](double x) { return x > 90.0; }); };
  CHECK(late(simulated) > kMessages / 8);
  CHECK(late(gossiped) > kMessages / 8);
  // The test tells models apart: jitter folded positive (the shaper's old model) and no loss (old
  // gossip's) are both far from the simulator's.
  std::mt19937_64 rng(5);
  std::vector<double> folded, lossless;
  for (int i = 0; i < kMessages; ++i) {
    folded.push_back(40.0 + std::abs(std::normal_distribution<double>(0, 10)(rng)) +
                     (std::bernoulli_distribution(0.25)(rng) ? 80.0 : 0.0));
    lossless.push_back(std::max(0.0, 40.0 + std::normal_distribution<double>(0, 10)(rng)));
  }
  CHECK(ks_statistic(simulated, folded) > critical);
  CHECK(ks_statistic(simulated, lossless) > critical);
}

TEST_CASE("the link model: wire time, order, never below zero, and the same draws from the same seed") {
  transport::LinkProfile p = profile();
  p.bandwidth_bytes_per_s = 1e6;
  transport::LinkModel a(p, 3), b(p, 3);
  Nanos last_due{0};
  for (int i = 0; i < 100; ++i) {
    const Nanos now = i * 1ms;
    const Nanos would = a.would_send(now, 10'000);
    const auto x = a.carry(now, 10'000), y = b.carry(now, 10'000);
    CHECK(x.sent == would);
    CHECK(x.sent == y.sent);
    CHECK(x.due == y.due);
    CHECK(x.due >= last_due);
    CHECK(x.due >= x.sent);
    last_due = x.due;
  }
  // 100 messages of 10,000 bytes at 1 MB/s back to back: the link is busy for their wire bytes.
  CHECK(a.would_send(0ns, 0) >= Nanos(static_cast<std::int64_t>(100 * p.wire_bytes(10'000) / 1e6 * 1e9)) - 1us);
  transport::PathShape wide;
  wide.latency = 1ms;
  wide.jitter_ns = 50e6;  // far wider than the latency: draws below zero are cut at zero
  std::mt19937_64 rng(1);
  int zeros = 0;
  for (int i = 0; i < 1000; ++i) {
    const Nanos d = transport::draw_propagation(wide, 100, rng);
    CHECK(d >= 0ns);
    zeros += d == 0ns ? 1 : 0;
  }
  CHECK(zeros > 300);
}
