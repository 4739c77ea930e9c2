// The real gossip over the simulated network: membership, failure detection and broadcasts in
// virtual time, deterministic, with its bytes counted.
#include <doctest/doctest.h>

#include <atomic>
#include <algorithm>
#include <map>
#include <set>

#include "runtime/announcements.h"
#include "sim/gossip_fabric.h"
#include "tiny.h"

using namespace gossamer;
using namespace gossamer::sim;
using namespace std::chrono_literals;

namespace {

using testing::lan;

std::string address_of(int i) { return "tcp://198.18.0." + std::to_string(i + 1) + ":7000"; }

transport::GossipOptions options_of(int i) {
  transport::GossipOptions o;
  o.bind = address_of(i);
  if (i > 0) o.seeds = {address_of(0)};
  o.self = transport::PeerId{static_cast<std::uint64_t>(1000 + i)};
  return o;
}

std::size_t count(const transport::Gossip& g, transport::MemberState s) {
  std::size_t k = 0;
  for (const auto& m : g.members()) k += m.state == s ? 1 : 0;
  return k;
}

struct Outcome {
  Nanos all_known{0};
  std::uint64_t bytes = 0;
  std::vector<std::size_t> alive_after_crash;
  friend bool operator==(const Outcome&, const Outcome&) = default;
};

// n nodes join through node 0; once all know all, node n-1 crashes and node n-2 leaves.
Outcome membership_run(int n) {
  Scheduler scheduler;
  Network net(scheduler, lan(n));
  GossipFabric fabric(scheduler, net);
  Outcome out;
  auto actor = scheduler.start_thread([&] {
    std::vector<std::unique_ptr<transport::Gossip>> nodes;
    for (int i = 0; i < n; ++i) {
      auto g = fabric.make(i, options_of(i), 7 + static_cast<std::uint64_t>(i));
      REQUIRE(g.ok());
      nodes.push_back(std::move(*g));
    }
    for (;;) {
      bool all = true;
      for (auto& g : nodes) all = all && count(*g, transport::MemberState::kAlive) == static_cast<std::size_t>(n - 1);
      if (all) break;
      REQUIRE(scheduler.now() < 20s);
      scheduler.sleep_for(10ms);
    }
    out.all_known = scheduler.now();
    fabric.crash(address_of(n - 1));
    nodes[static_cast<std::size_t>(n - 2)]->leave();
    scheduler.sleep_for(100ms);
    // A farewell is known within a few hops; the crash only after dead_after (1 s) of silence.
    for (int i = 0; i < n - 2; ++i) CHECK(count(*nodes[static_cast<std::size_t>(i)], transport::MemberState::kLeft) == 1);
    scheduler.sleep_for(1500ms);
    for (int i = 0; i < n - 2; ++i) {
      CHECK(count(*nodes[static_cast<std::size_t>(i)], transport::MemberState::kDead) == 1);
      out.alive_after_crash.push_back(count(*nodes[static_cast<std::size_t>(i)], transport::MemberState::kAlive));
    }
    nodes.clear();
  });
  REQUIRE(scheduler.run().ok());
  for (int i = 0; i < n; ++i) out.bytes += net.traffic(i).datagram_bytes_sent;
  return out;
}

}  // namespace

TEST_CASE("simulated gossip: 64 nodes learn of each other through one seed in a few periods, and notice a crash and a leave") {
  const Outcome a = membership_run(64);
  // O(log n) periods of 100 ms, plus latency: far below the 20 s cap.
  CHECK(a.all_known < 3s);
  CHECK(a.all_known > 100ms);
  for (std::size_t alive : a.alive_after_crash) CHECK(alive == 61);
  CHECK(a.bytes > 0);
  SUBCASE("a rerun is identical, bytes and timing") { CHECK(membership_run(64) == a); }
}

TEST_CASE("simulated gossip: broadcasts reach every subscriber exactly once, and their bytes are counted") {
  Scheduler scheduler;
  Network net(scheduler, lan(12));
  GossipFabric fabric(scheduler, net);
  std::map<int, std::multiset<std::string>> heard;
  auto actor = scheduler.start_thread([&] {
    std::vector<std::unique_ptr<transport::Gossip>> nodes;
    for (int i = 0; i < 12; ++i) {
      auto g = fabric.make(i, options_of(i), static_cast<std::uint64_t>(i));
      REQUIRE(g.ok());
      (*g)->subscribe("t", [&heard, i](transport::PeerId, const Bytes& p) { heard[i].insert(std::string(reinterpret_cast<const char*>(p.data()), p.size())); });
      nodes.push_back(std::move(*g));
    }
    scheduler.sleep_for(2s);
    const std::uint64_t before = net.traffic(3).datagram_bytes_sent;
    REQUIRE(nodes[3]->broadcast("t", as_bytes(std::string("hello"))).ok());
    REQUIRE(nodes[5]->broadcast("t", as_bytes(std::string("world"))).ok());
    scheduler.sleep_for(1s);
    CHECK(net.traffic(3).datagram_bytes_sent > before);
    nodes.clear();
  });
  REQUIRE(scheduler.run().ok());
  REQUIRE(heard.size() == 12);
  for (const auto& [i, msgs] : heard) {
    CHECK(msgs.count("hello") == 1);
    CHECK(msgs.count("world") == 1);
  }
}

TEST_CASE("simulated gossip: a broadcast made just before leaving still reaches the others") {
  Scheduler scheduler;
  Network net(scheduler, lan(6));
  GossipFabric fabric(scheduler, net);
  std::atomic<int> heard{0};
  auto actor = scheduler.start_thread([&] {
    std::vector<std::unique_ptr<transport::Gossip>> nodes;
    for (int i = 0; i < 6; ++i) {
      auto g = fabric.make(i, options_of(i), 5 + static_cast<std::uint64_t>(i));
      REQUIRE(g.ok());
      nodes.push_back(std::move(*g));
    }
    for (int i = 1; i < 6; ++i) nodes[static_cast<std::size_t>(i)]->subscribe("last", [&](transport::PeerId, const Bytes&) { ++heard; });
    scheduler.sleep_for(3s);  // everyone knows everyone
    REQUIRE(nodes[0]->broadcast("last", as_bytes(std::string("word"))).ok());
    nodes[0]->leave();  // at once, as a leader leaves after announcing the last group
    scheduler.sleep_for(3s);
    nodes.clear();
  });
  REQUIRE(scheduler.run().ok());
  CHECK(heard == 5);
}

TEST_CASE("simulated gossip: a crashed node restarted at its address under a new id is taken in, and an address in use is refused") {
  Scheduler scheduler;
  Network net(scheduler, lan(3));
  GossipFabric fabric(scheduler, net);
  auto actor = scheduler.start_thread([&] {
    std::vector<std::unique_ptr<transport::Gossip>> nodes;
    for (int i = 0; i < 3; ++i) {
      auto made = fabric.make(i, options_of(i), static_cast<std::uint64_t>(i));
      REQUIRE(made.ok());
      nodes.push_back(std::move(*made));
    }
    CHECK_FALSE(fabric.make(1, options_of(0), 9).ok());
    scheduler.sleep_for(1s);
    REQUIRE(count(*nodes[0], transport::MemberState::kAlive) == 2);
    fabric.crash(address_of(2));
    net.crash(2);
    scheduler.sleep_for(2s);
    CHECK(count(*nodes[0], transport::MemberState::kDead) == 1);
    net.revive(2);
    auto again = options_of(2);
    again.self = transport::PeerId{4242};
    auto restarted = fabric.make(2, again, 77);
    REQUIRE(restarted.ok());
    nodes[2] = std::move(*restarted);
    scheduler.sleep_for(1s);
    CHECK(count(*nodes[0], transport::MemberState::kAlive) == 2);
    bool seen = false;
    for (const auto& m : nodes[0]->members()) seen = seen || (m.id.value == 4242 && m.state == transport::MemberState::kAlive);
    CHECK(seen);
    CHECK(count(*nodes[2], transport::MemberState::kAlive) == 2);
    nodes.clear();
  });
  REQUIRE(scheduler.run().ok());
}

TEST_CASE("run announcements over simulated gossip: joiners with lower ids than the one holder get the spec by asking, and nobody sends it unasked") {
  Scheduler scheduler;
  Network net(scheduler, lan(8));
  GossipFabric fabric(scheduler, net);
  const runtime::Spec spec{std::string(5000, 'x'), 3};
  auto actor = scheduler.start_thread([&] {
    std::vector<std::unique_ptr<transport::Gossip>> nodes;
    for (int i = 0; i < 8; ++i) {
      auto o = options_of(i);
      o.self = transport::PeerId{static_cast<std::uint64_t>(100 - i)};  // the first node has the highest id
      auto g = fabric.make(i, o, static_cast<std::uint64_t>(i));
      REQUIRE(g.ok());
      nodes.push_back(std::move(*g));
    }
    const auto round = [] { return std::int64_t{5}; };
    std::vector<std::unique_ptr<runtime::SpecAnnouncer>> holders;
    holders.push_back(std::make_unique<runtime::SpecAnnouncer>(*nodes[0], spec, round, scheduler));
    std::vector<std::shared_ptr<runtime::HeardSpec>> heard;
    for (int i = 1; i < 8; ++i) heard.push_back(runtime::listen_for_spec(*nodes[static_cast<std::size_t>(i)], scheduler));
    for (int i = 1; i < 8; ++i) {
      auto got = runtime::receive_spec(*heard[static_cast<std::size_t>(i - 1)], std::chrono::seconds(10));
      REQUIRE(got.ok());
      CHECK(got->toml == spec.toml);
      CHECK(got->wait_for == 3);
      CHECK(heard[static_cast<std::size_t>(i - 1)]->latest_round == 5);
    }
    CHECK(scheduler.now() < 10s);
    // Every node now holds it: nothing about the spec is sent while nobody asks.
    for (int i = 1; i < 8; ++i) holders.push_back(std::make_unique<runtime::SpecAnnouncer>(*nodes[static_cast<std::size_t>(i)], spec, round, scheduler));
    scheduler.sleep_for(5s);
    std::size_t heard_count = 0;
    bool listening = true;
    for (auto& n : nodes) {
      n->subscribe("gossamer.spec", [&](transport::PeerId, const Bytes&) {
        if (listening) ++heard_count;
      });
    }
    std::uint64_t carried = 0;  // bytes sent beside membership
    for (auto& n : nodes) carried += n->bytes().first - n->membership_bytes_sent();
    scheduler.sleep_for(10s);
    listening = false;
    CHECK(heard_count == 0);
    std::uint64_t carried_after = 0;
    for (auto& n : nodes) carried_after += n->bytes().first - n->membership_bytes_sent();
    CHECK(carried_after == carried);
    // A newcomer asking gets one answer per holder asked, at most three a second.
    const std::size_t before = heard_count;
    listening = true;
    std::size_t answers = 0;
    nodes[1]->subscribe("gossamer.spec", [&](transport::PeerId, const Bytes& payload) {
      if (payload.size() > 100) ++answers;
    });
    ask_for_spec(*heard[0]);
    ask_for_spec(*heard[0]);  // (at most once a second)
    scheduler.sleep_for(500ms);
    CHECK(answers >= 1);
    CHECK(answers <= 3);
    CHECK(heard_count >= before);
    holders.clear();
    nodes.clear();
  });
  REQUIRE(scheduler.run().ok());
}
