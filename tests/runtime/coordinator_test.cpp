// Round agreement over in-process gossip nodes: one group for everyone, a new epoch per group, the
// leader's departure, and messages of another protocol version or malformed ones dropped.
#include <doctest/doctest.h>

#include <future>
#include <thread>

#include "core/wire.h"
#include "runtime/coordinator.h"
#include "support/eventually.h"

using namespace gossamer;
using namespace gossamer::runtime;
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
  for (std::size_t i = 0; i < t.nodes.size(); ++i) t.cs.push_back(Coordinator::make(*t.nodes[i], "addr-" + std::to_string(i), o, real_clock()));
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
  auto ca = Coordinator::make(*a, "addr-a", CoordinatorOptions{}, real_clock());
  auto cb = Coordinator::make(*b, "addr-b", CoordinatorOptions{}, real_clock());
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
  Writer commit;  // a COMMIT of this version naming epoch 0, which no group has
  commit.u8(5);
  commit.u8(7);
  commit.uvar(1);
  commit.uvar(0);
  commit.uvar(0);
  REQUIRE(b->broadcast("gossamer.round", commit.bytes()).ok());
  Writer done;  // a DONE with bytes after its end
  done.u8(5);
  done.u8(6);
  done.uvar(1);
  done.uvar(3);
  done.u8(0);
  REQUIRE(b->broadcast("gossamer.round", done.bytes()).ok());
  CHECK(eventually([&] { return ca->stats().dropped >= 4; }, 10s));
  CHECK(ca->stats().dropped == 4);
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

// All-or-nothing rounds (commit_rounds): a crash mid-collective leaves some members with the round
// applied and others without it.
namespace {

// Each node sees the other two alive (who leads is read from that view).
bool all_know(const Trio& t) {
  for (const auto& n : t.nodes) {
    int alive = 0;
    for (const auto& m : n->members()) alive += m.state == transport::MemberState::kAlive ? 1 : 0;
    if (alive < 2) return false;
  }
  return true;
}

Trio committing(Nanos grace) {
  CoordinatorOptions o;
  o.straggler_grace = grace;
  o.commit_rounds = true;
  Trio t = trio(o);
  REQUIRE(eventually([&] { return all_know(t); }, 10s));
  return t;
}

std::size_t index_of_lowest(const Trio& t) {
  std::size_t low = 0;
  for (std::size_t i = 1; i < t.nodes.size(); ++i) {
    if (t.nodes[i]->self() < t.nodes[low]->self()) low = i;
  }
  return low;
}

}  // namespace

TEST_CASE("a round that went through for some members is committed: those retrying it are left out, the rest go on at once") {
  // The one that missed it is the decider itself (the lowest id), or another member.
  for (bool decider_missed : {true, false}) {
    CAPTURE(decider_missed);
    Trio t = committing(20s);
    auto start = agree_all(t.cs, 0);
    for (auto& r : start) REQUIRE(r.ok());
    const std::uint64_t e = start[0]->epoch;
    const std::size_t low = index_of_lowest(t);
    const std::size_t missed = decider_missed ? low : (low + 1) % 3;
    std::vector<std::shared_ptr<Coordinator>> holders;
    for (std::size_t i = 0; i < 3; ++i) {
      if (i != missed) holders.push_back(t.cs[i]);
    }
    // Two applied round 1 over e; the third's collective failed and it asks to retry.
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& c : holders) c->applied(1, e);
    auto retried = t.cs[missed]->agree(1, e, in(20s), 10);
    REQUIRE_FALSE(retried.ok());
    CHECK(retried.status().code() == ErrorCode::kAborted);
    CHECK(retried.status().message().find("went through for the other members") != std::string::npos);
    CHECK(t.cs[missed]->went_through(1, e));
    CHECK(t.cs[missed]->stats().missed_commits == 1);
    std::int64_t commits = 0;
    for (auto& c : t.cs) commits += c->stats().committed;
    CHECK(commits == 1);
    // The holders keep it: nothing abandoned, and the next round is theirs, without waiting out a
    // grace for the one left out (it is alive, catching up).
    for (auto& c : holders) CHECK_FALSE(c->abandoned(1, e));
    auto next = agree_all(holders, 2);
    for (auto& r : next) {
      REQUIRE(r.ok());
      CHECK(r->members.size() == 2);
      CHECK(r->rank_of(t.nodes[missed]->self()) == -1);
      CHECK(r->epoch > e);
      CHECK(r->prior == e);
    }
    CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  }
}

TEST_CASE("an attempt no member applied is abandoned once every member asks to retry it, and retried over a new group") {
  Trio t = committing(20s);
  auto start = agree_all(t.cs, 0);
  for (auto& r : start) REQUIRE(r.ok());
  const std::uint64_t e = start[0]->epoch;
  const auto t0 = std::chrono::steady_clock::now();
  auto retry = agree_all(t.cs, 1, e);
  for (auto& r : retry) {
    REQUIRE(r.ok());
    CHECK(r->epoch > e);
    CHECK(r->members.size() == 3);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // decided when all three had asked, not at the grace
  std::int64_t abandons = 0, commits = 0;
  for (auto& c : t.cs) {
    abandons += c->stats().abandoned;
    commits += c->stats().committed;
    CHECK(c->abandoned(1, e));
    CHECK_FALSE(c->went_through(1, e));
  }
  CHECK(abandons == 1);
  CHECK(commits == 0);
}

TEST_CASE("a member that applied an attempt the others abandoned catches up: the next group names the epoch its leader went on from") {
  Trio t = committing(2s);
  auto start = agree_all(t.cs, 0);
  for (auto& r : start) REQUIRE(r.ok());
  const std::uint64_t e = start[0]->epoch;
  const std::size_t low = index_of_lowest(t), late = (low + 1) % 3, other = (low + 2) % 3;
  // Two ask to retry round 1; the third says nothing (its DONE lost, say): after the decider's grace
  // the attempt is abandoned and retried over the two.
  std::vector<std::shared_ptr<Coordinator>> two{t.cs[low], t.cs[other]};
  auto retry = agree_all(two, 1, e);
  for (auto& r : retry) {
    REQUIRE(r.ok());
    CHECK(r->members.size() == 2);
  }
  const std::uint64_t e2 = retry[0]->epoch;
  for (auto& c : two) c->applied(1, e2);
  // The third went on from e, and is ready for round 2 before the others.
  t.cs[late]->applied(1, e);
  CHECK(eventually([&] { return t.cs[late]->abandoned(1, e); }, 10s));  // what a peer checks before its next round
  auto late_view = std::async(std::launch::async, [&] { return t.cs[late]->agree(2, 0, in(20s)); });
  std::this_thread::sleep_for(300ms);
  auto next = agree_all(two, 2);
  for (auto& r : next) {
    REQUIRE(r.ok());
    CHECK(r->prior == e2);
  }
  // Had it missed the ABANDON, the group still tells it: it holds another state and catches up.
  auto mine = late_view.get();
  REQUIRE_FALSE(mine.ok());
  CHECK(mine.status().code() == ErrorCode::kAborted);
  CHECK(mine.status().message().find("goes on from epoch " + std::to_string(e2)) != std::string::npos);
}

TEST_CASE("an attempt whose links never came up at one member is abandoned at once: nobody can have applied it") {
  Trio t = committing(20s);
  auto start = agree_all(t.cs, 0);
  for (auto& r : start) REQUIRE(r.ok());
  const std::uint64_t e = start[0]->epoch;
  const auto t0 = std::chrono::steady_clock::now();
  // Member 1 could not link up for round 1 over e (a peer refused it); the others still wait for
  // their links. The decider abandons the attempt without waiting for them or its grace, and they
  // learn it (their wait for links ends) and ask again.
  auto first = std::async(std::launch::async, [&] { return t.cs[1]->agree(1, e, in(20s), 10, /*unlinked=*/true); });
  for (std::size_t i : {0, 2}) CHECK(eventually([&] { return t.cs[i]->abandoned(1, e); }, 10s));
  std::vector<std::future<Result<GroupView>>> rest;
  for (std::size_t i : {0, 2}) rest.push_back(std::async(std::launch::async, [&, i] { return t.cs[i]->agree(1, e, in(20s), 10, true); }));
  auto mine = first.get();
  REQUIRE(mine.ok());
  CHECK(mine->epoch > e);
  CHECK(mine->members.size() == 3);
  for (auto& f : rest) {
    auto r = f.get();
    REQUIRE(r.ok());
    CHECK(r->epoch == mine->epoch);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
}

// Quorum and grace (CoordinatorOptions): a round closes short of a member once a quorum of the
// expected work is ready and the learned grace has passed; never on a minority of the work before
// straggler_grace.
namespace {

std::size_t index_of_highest(const std::vector<std::unique_ptr<transport::Gossip>>& nodes) {
  std::size_t high = 0;
  for (std::size_t i = 1; i < nodes.size(); ++i) {
    if (nodes[high]->self() < nodes[i]->self()) high = i;
  }
  return high;
}

// agree(round) on every coordinator, the one at `late` `delay` after the others; nothing from it when
// it is skipped.
std::vector<Result<GroupView>> agree_late(std::vector<std::shared_ptr<Coordinator>>& cs, std::int64_t round, std::size_t late, Nanos delay,
                                          bool skip_late = false) {
  std::vector<Result<GroupView>> out(cs.size(), error(ErrorCode::kAborted, "not run"));
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    if (i == late && skip_late) continue;
    threads.emplace_back([&, i] {
      if (i == late) std::this_thread::sleep_for(delay);
      out[i] = cs[i]->agree(round, 0, in(30s));
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace

TEST_CASE("the grace is learned from the usual lag and its spread: a member always late by about as much is waited for, a sudden delay is not") {
  CoordinatorOptions o;
  o.straggler_grace = 20s;
  o.min_grace = 100ms;
  auto [nodes, cs] = trio(o);
  const std::size_t late = index_of_highest(nodes);
  for (auto& r : agree_all(cs, 0)) REQUIRE(r.ok());
  // Rounds 1-6: it is ready 600 ms after the others every time; the grace learns median 0.6 s plus
  // 3 spreads (at least a quarter of the median each): about 1.05 s. It is never left out.
  for (std::int64_t round = 1; round <= 6; ++round) {
    CAPTURE(round);
    for (auto& r : agree_late(cs, round, late, 600ms)) {
      REQUIRE_MESSAGE(r.ok(), r.status().to_string());
      CHECK(r->members.size() == 3);
    }
  }
  std::int64_t left = 0;
  for (auto& c : cs) left += c->stats().left_out;
  CHECK(left == 0);
  // Round 7: it does not come. The others wait about the learned grace, far below the 20 s cap.
  const auto t0 = std::chrono::steady_clock::now();
  auto next = agree_late(cs, 7, late, 0ms, /*skip_late=*/true);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (std::size_t i = 0; i < cs.size(); ++i) {
    if (i == late) continue;
    REQUIRE(next[i].ok());
    CHECK(next[i]->members.size() == 2);
  }
  CHECK(waited > 0.5);  // above the usual lag (a member that late was waited for) ...
  CHECK(waited < 3.0);  // ... and far below the cap
  std::int64_t quorum_closes = 0;
  for (auto& c : cs) quorum_closes += c->stats().quorum_closes;
  CHECK(quorum_closes == 1);
}

TEST_CASE("a round never closes on a minority of the expected work before straggler_grace") {
  CoordinatorOptions o;
  o.straggler_grace = 4s;
  o.min_grace = 100ms;
  auto [nodes, cs] = trio(o);
  const std::size_t late = index_of_highest(nodes);
  for (std::int64_t round = 0; round < 5; ++round) {
    for (auto& r : agree_all(cs, round)) REQUIRE(r.ok());
  }
  // The member that does not come brought 8 of the last round's 10 steps (a fast machine beside two
  // slow ones, under a time budget): the two others are 20% of the work, short of the quorum.
  std::map<transport::PeerId, std::int64_t> work;
  for (std::size_t i = 0; i < nodes.size(); ++i) work[nodes[i]->self()] = i == late ? 8 : 1;
  for (auto& c : cs) c->set_work(work);
  const auto t0 = std::chrono::steady_clock::now();
  auto next = agree_late(cs, 5, late, 0ms, /*skip_late=*/true);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (std::size_t i = 0; i < cs.size(); ++i) {
    if (i == late) continue;
    REQUIRE(next[i].ok());
    CHECK(next[i]->members.size() == 2);
  }
  CHECK(waited > 3.5);  // straggler_grace, not the learned 100 ms
  std::int64_t quorum_closes = 0;
  for (auto& c : cs) quorum_closes += c->stats().quorum_closes;
  CHECK(quorum_closes == 0);
}
