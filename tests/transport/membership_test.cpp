// SWIM membership alone (no model, no sockets) at up to 1,024 members, in virtual time and seeded:
// how fast members learn of each other, how fast a crash is known, what being a member costs, and
// that lossy links and a member whose uplink is held up by a long transfer never make a live member
// dead. docs/gossip.md states the bounds these tests check.
#include <doctest/doctest.h>

#include <cmath>

#include "swarm.h"

using namespace gossamer;
using namespace std::chrono_literals;
using gossamer::testing::Swarm;
using gossamer::testing::SwarmOptions;

namespace {

struct Totals {
  std::uint64_t suspected = 0, refuted = 0, declared_dead = 0, bytes = 0;
  friend bool operator==(const Totals&, const Totals&) = default;
};

Totals totals(Swarm& s) {
  Totals t;
  for (int i = 0; i < s.size(); ++i) {
    if (!s.up(i)) continue;
    const auto st = s.core(i).stats();
    t.suspected += st.suspected;
    t.refuted += st.refuted;
    t.declared_dead += st.declared_dead;
    t.bytes += s.bytes_sent(i);
  }
  return t;
}

// Runs until every member knows every other as live (checked every 5 periods); the time it took.
Nanos until_all_known(Swarm& s, Nanos cap) {
  Nanos done{-1};
  int periods = 0;
  s.run_until(cap, [&] {
    if (done >= Nanos{0} || ++periods % 5 != 0) return;
    for (int i = 0; i < s.size(); ++i) {
      if (s.known_live(i) != static_cast<std::size_t>(s.size() - 1)) return;
    }
    done = s.now();
  });
  return done;
}

double periods_of(Nanos t) { return std::chrono::duration<double>(t).count() / 0.1; }

// Gossip bytes each member sends per second over `span`, averaged over the members.
double bytes_per_member_per_s(Swarm& s, Nanos span) {
  const std::uint64_t before = totals(s).bytes;
  s.run_until(s.now() + span);
  return static_cast<double>(totals(s).bytes - before) / s.size() / std::chrono::duration<double>(span).count();
}

}  // namespace

TEST_CASE("SWIM at 64 and 1,024 members: all know all within 3 log2(n) periods, a member costs under 1 KB/s flat in n, crashes are known within 4 s") {
  std::map<int, double> cost;
  for (const int n : {64, 1024}) {
    CAPTURE(n);
    SwarmOptions o;
    o.n = n;  // 40 ms one way: 80 ms round trips, as sim.network = wan-100m-80ms
    Swarm s(o);
    const Nanos known = until_all_known(s, 30s);
    REQUIRE(known >= Nanos{0});
    MESSAGE(n << " members joining through one seed at once: all know all after " << periods_of(known) << " periods");
    CHECK(periods_of(known) <= 3 * std::log2(n));
    s.run_until(s.now() + 10s);  // the joiners' news has been sent its times
    const double join_bytes = static_cast<double>(totals(s).bytes) / n;
    MESSAGE(n << " members: " << join_bytes / 1000 << " KB sent per member from the start to " << s.now() / 1s << " s");
    // Each must learn of n - 1 others (about 21 bytes each): the news of a join is sent a few times,
    // the digest exchanges fill in the rest, so joining at once costs a small multiple of that.
    CHECK(join_bytes < 40 * 700 + 150.0 * n);
    cost[n] = bytes_per_member_per_s(s, 30s);
    MESSAGE(n << " members: " << cost[n] << " gossip bytes per member per second, steady");
    CHECK(cost[n] < 1000);
    CHECK(totals(s).declared_dead == 0);
    // Ten members crash at once, with no farewell.
    const int crashed = 10;
    for (int i = 1; i <= crashed; ++i) s.crash(n - i);
    const Nanos at = s.now();
    const std::uint64_t bytes_before = totals(s).bytes;
    Nanos all_dead{-1};
    s.run_until(at + 20s, [&] {
      if (all_dead >= Nanos{0}) return;
      for (int i = 0; i < n - crashed; ++i) {
        std::size_t dead = 0;
        for (const auto& m : s.core(i).members()) dead += m.state == transport::MemberState::kDead ? 1 : 0;
        if (dead < crashed) return;
      }
      all_dead = s.now() - at;
    });
    REQUIRE(all_dead >= Nanos{0});
    MESSAGE(n << " members: " << crashed << " crashes known dead by every member after " << std::chrono::duration<double>(all_dead).count() << " s");
    const double crash_bytes = static_cast<double>(totals(s).bytes - bytes_before) / (n - crashed) - cost[n] * 20;
    MESSAGE(n << " members: the ten crashes cost each member " << crash_bytes / 1000 << " KB over its steady cost in 20 s");
    // Each crash is news three ways (suspect, up to 8 confirmations, dead), each sent
    // 4 ceil(log10(n + 1)) times by every member, at about 18 bytes: about a kilobyte a crash.
    CHECK(crash_bytes < 1500.0 * crashed);
    CHECK(all_dead < 4s);
    // Nobody else was declared dead: each live member holds exactly the ten verdicts.
    CHECK(totals(s).declared_dead == static_cast<std::uint64_t>(crashed * (n - crashed)));
  }
  CHECK(cost[1024] < 1.25 * cost[64]);
}

TEST_CASE("SWIM at 1,024 members on links with 5% loss and 20 ms jitter: suspicions are refuted, no live member is declared dead") {
  SwarmOptions o;
  o.n = 1024;
  o.loss = 0.05;
  o.jitter = 20ms;
  Swarm s(o);
  REQUIRE(until_all_known(s, 30s) >= Nanos{0});
  s.run_until(s.now() + 60s);
  const Totals t = totals(s);
  MESSAGE("in 60 s: " << t.suspected << " suspicions, " << t.refuted << " refuted, " << t.declared_dead << " declared dead");
  CHECK(t.declared_dead == 0);
  CHECK(t.refuted >= 1);  // the loss was felt, and answered
  for (int i = 0; i < s.size(); i += 97) CHECK(s.known_live(i) == 1023u);
}

TEST_CASE("SWIM at 1,024 members: a member whose uplink holds its messages 0.5 s behind a long transfer is never declared dead") {
  SwarmOptions o;
  o.n = 1024;
  Swarm s(o);
  REQUIRE(until_all_known(s, 30s) >= Nanos{0});
  s.run_until(s.now() + 5s);
  const int slow = 512;
  s.set_egress_delay(slow, 500ms);  // 80 s: 1 GB over 100 Mbit/s
  s.run_until(s.now() + 80s);
  const Totals t = totals(s);
  MESSAGE("while its uplink was held: " << t.suspected << " suspicions, " << t.refuted << " refuted");
  CHECK(t.declared_dead == 0);
  // It measured its own lateness, and the others learned it: they wait that long for it.
  std::size_t told = 0;
  for (int i = 0; i < s.size(); ++i) {
    for (const auto& m : s.core(i).members()) {
      if (m.id.value == static_cast<std::uint64_t>(slow + 1)) told += m.state == transport::MemberState::kAlive ? 1 : 0;
    }
  }
  CHECK(told == 1023u);
  s.set_egress_delay(slow, Nanos{0});
  s.run_until(s.now() + 20s);
  CHECK(totals(s).declared_dead == 0);
}

TEST_CASE("SWIM membership is deterministic: a seeded rerun gives the same bytes and verdicts") {
  const auto run = [] {
    SwarmOptions o;
    o.n = 128;
    o.loss = 0.05;
    o.jitter = 10ms;
    o.seed = 3;
    Swarm s(o);
    s.run_until(10s);
    s.crash(7);
    s.run_until(20s);
    return totals(s);
  };
  const Totals a = run();
  CHECK(a.declared_dead == 127u);  // every live member holds the one crash dead, and nobody else
  CHECK(run() == a);
}
