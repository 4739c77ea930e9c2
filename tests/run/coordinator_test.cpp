// Round agreement over in-process gossip nodes: one group for everyone, a new epoch per group, the
// leader's departure, and messages of another protocol version or malformed ones dropped.
#include <doctest/doctest.h>

#include <future>
#include <thread>

#include "core/wire.h"
#include "run/coordinator.h"
#include "support/eventually.h"

using namespace gossamer;
using namespace gossamer::run;
using gossamer::testing::eventually;
using namespace std::chrono_literals;

namespace {

Deadline in(Nanos d) { return Deadline::after(real_clock(), d); }

std::unique_ptr<transport::Gossip> node(std::vector<std::string> seeds = {}) {
  transport::GossipOptions o;
  o.seeds = std::move(seeds);
  o.period = 50ms;
  auto g = transport::make_gossip(o);
  REQUIRE(g.ok());
  return std::move(*g);
}

// Runs agree(round, after) on every coordinator at once.
std::vector<Result<GroupView>> agree_all(std::vector<std::shared_ptr<Coordinator>>& cs, std::int64_t round, std::uint64_t after = 0) {
  std::vector<Result<GroupView>> out(cs.size(), error(ErrorCode::kAborted, "not run"));
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < cs.size(); ++i) threads.emplace_back([&, i] { out[i] = cs[i]->agree(round, after, in(20s)); });
  for (auto& t : threads) t.join();
  return out;
}

// Three gossip nodes that know each other, each with a coordinator waiting for all three at the start.
struct Trio {
  std::vector<std::unique_ptr<transport::Gossip>> nodes;
  std::vector<std::shared_ptr<Coordinator>> cs;
};
Trio trio(CoordinatorOptions o) {
  Trio t;
  t.nodes.push_back(node());
  for (int i = 0; i < 2; ++i) t.nodes.push_back(node({t.nodes[0]->address()}));
  o.min_members = 3;
  for (std::size_t i = 0; i < t.nodes.size(); ++i) t.cs.push_back(Coordinator::make(*t.nodes[i], "addr-" + std::to_string(i), o));
  return t;
}

}  // namespace

TEST_CASE("peers agree on one group per round, keep its epoch while the members stay, and the lowest id leads") {
  CoordinatorOptions o;
  o.straggler_grace = 10s;
  auto [nodes, cs] = trio(o);
  auto start = agree_all(cs, 0);
  for (auto& r : start) REQUIRE(r.ok());
  const transport::PeerId lowest = std::min({nodes[0]->self(), nodes[1]->self(), nodes[2]->self()});
  for (auto& r : start) {
    CHECK(r->members.size() == 3);
    const bool same_members = r->members == start[0]->members;
    CHECK(same_members);
    CHECK(r->epoch == start[0]->epoch);
    CHECK(r->leader == lowest);
  }
  // The same members: the group goes on under its epoch (and links).
  auto next = agree_all(cs, 1);
  for (auto& r : next) {
    REQUIRE(r.ok());
    CHECK(r->epoch == start[0]->epoch);
    CHECK(r->members.size() == 3);
  }
  // A retry after a failed epoch gets a still newer one.
  auto retry = agree_all(cs, 1, next[0]->epoch);
  for (auto& r : retry) {
    REQUIRE(r.ok());
    CHECK(r->epoch > next[0]->epoch);
  }

  // Asked ahead from other threads (as peers do to overlap the agreement with training): the group
  // after a retry goes on under the retry's epoch.
  std::vector<std::future<Result<GroupView>>> ahead;
  for (auto& c : cs) ahead.push_back(std::async(std::launch::async, [c] { return c->agree(2, 0, in(20s)); }));
  for (auto& f : ahead) {
    auto r = f.get();
    REQUIRE(r.ok());
    CHECK(r->epoch == retry[0]->epoch);
    CHECK(r->members.size() == 3);
  }

  // The leader leaves: the others agree on round 3 without it, led by the next lowest id, over a new epoch.
  std::size_t leader = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i]->self() == lowest) leader = i;
  }
  nodes[leader]->leave();
  std::vector<std::shared_ptr<Coordinator>> rest;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    if (i != leader) rest.push_back(cs[i]);
  }
  auto after = agree_all(rest, 3);
  for (auto& r : after) {
    REQUIRE(r.ok());
    CHECK(r->epoch > retry[0]->epoch);
    CHECK(r->members.size() == 2);
    CHECK(r->rank_of(lowest) == -1);
    CHECK(r->leader != lowest);
  }
}

TEST_CASE("a retry where members failed at different steps: those at the later step go on, those behind are left out") {
  CoordinatorOptions o;
  o.straggler_grace = 10s;
  auto [nodes, cs] = trio(o);
  auto start = agree_all(cs, 0);
  for (auto& r : start) REQUIRE(r.ok());
  // A crash cut step 7's collective short for two members; the third finished it and failed at step 8.
  const std::size_t ahead = 1;  // neither the lowest nor the highest id necessarily: any one
  std::vector<Result<GroupView>> out(cs.size(), error(ErrorCode::kAborted, "not run"));
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = cs[i]->agree(0, start[0]->epoch, in(20s), i == ahead ? 8 : 7); });
  }
  for (auto& t : threads) t.join();
  REQUIRE(out[ahead].ok());
  CHECK(out[ahead]->epoch > start[0]->epoch);
  REQUIRE(out[ahead]->members.size() == 1);
  CHECK(out[ahead]->members[0].id == nodes[ahead]->self());
  for (std::size_t i = 0; i < cs.size(); ++i) {
    if (i == ahead) continue;
    REQUIRE_FALSE(out[i].ok());
    CHECK(out[i].status().code() == ErrorCode::kAborted);
  }
  std::int64_t left_out = 0;
  for (auto& c : cs) left_out += c->stats().left_out;
  CHECK(left_out == 2);
}

TEST_CASE("round messages of another protocol version, or malformed, are dropped and counted") {
  auto a = node(), b = node({a->address()});
  auto ca = Coordinator::make(*a, "addr-a", CoordinatorOptions{});
  auto cb = Coordinator::make(*b, "addr-b", CoordinatorOptions{});
  // Wait until each hears the other: b's broadcasts go to the peers it knows.
  auto knows = [](const transport::Gossip& g, transport::PeerId id) {
    for (const auto& m : g.members()) {
      if (m.id == id && m.state == transport::MemberState::kAlive) return true;
    }
    return false;
  };
  REQUIRE(eventually([&] { return knows(*a, b->self()) && knows(*b, a->self()); }, 10s));
  Writer future;
  future.u8(99);  // a version from the future
  future.u8(1);
  future.i64(0);
  REQUIRE(b->broadcast("gossamer.round", future.bytes()).ok());
  Writer truncated;
  truncated.u8(2);
  truncated.u8(2);
  truncated.i64(0);
  truncated.u64(5);  // a GROUP cut short
  REQUIRE(b->broadcast("gossamer.round", truncated.bytes()).ok());
  CHECK(eventually([&] { return ca->stats().dropped >= 2; }, 10s));
  CHECK(ca->stats().dropped == 2);
  // And the round protocol still works between them.
  std::vector<std::shared_ptr<Coordinator>> cs{ca, cb};
  auto start = agree_all(cs, 0);
  for (auto& r : start) {
    REQUIRE(r.ok());
    CHECK(r->members.size() == 2);
  }
}

TEST_CASE("the leader's grace adapts to the usual lag: a straggler far past it is left out at once") {
  CoordinatorOptions o;
  o.straggler_grace = 20s;  // what a straggler would cost without the adaptation
  o.min_grace = 300ms;
  auto [nodes, cs] = trio(o);
  // Rounds where everyone is ready at once teach the leader that the lag is small.
  for (std::int64_t round = 0; round < 5; ++round) {
    for (auto& r : agree_all(cs, round)) REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  }
  // Round 5: the peer with the highest id does not come.
  std::size_t straggler = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[straggler]->self() < nodes[i]->self()) straggler = i;
  }
  std::vector<std::shared_ptr<Coordinator>> prompt;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    if (i != straggler) prompt.push_back(cs[i]);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto next = agree_all(prompt, 5);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& r : next) {
    REQUIRE(r.ok());
    CHECK(r->members.size() == 2);
    CHECK(r->rank_of(nodes[straggler]->self()) == -1);
  }
  CHECK(waited < 5.0);  // the adapted grace (>= 300 ms), far below the 20 s cap
  std::int64_t left_out = 0;
  for (auto& c : prompt) left_out += c->stats().left_out;
  CHECK(left_out == 1);
  // The straggler, arriving late, learns it was left out.
  auto late = cs[straggler]->agree(5, 0, in(5s));
  REQUIRE_FALSE(late.ok());
  CHECK(late.status().code() == ErrorCode::kAborted);
}
