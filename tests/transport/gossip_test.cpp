// Gossip membership: ephemeral ports, deadlines, raw ZeroMQ sockets for misbehaving peers.
#include <doctest/doctest.h>

#include <atomic>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <zmq.hpp>

#include "core/wire.h"
#include "support/eventually.h"
#include "transport/gossip.h"
#include "transport/endpoint.h"

using namespace gossamer;
using namespace gossamer::transport;
using gossamer::testing::eventually;
using namespace std::chrono_literals;

namespace {

// Heartbeats every 50 ms. Failure detection is slow (2 s) unless a test is about it: a stall of the
// shared test machine must not make a live peer look suspect where a test counts live members.
GossipOptions fast(std::vector<std::string> seeds = {}, Nanos suspect_after = 2s, Nanos dead_after = 4s) {
  GossipOptions o;
  o.seeds = std::move(seeds);
  o.period = 50ms;
  o.suspect_after = suspect_after;
  o.dead_after = dead_after;
  return o;
}

std::unique_ptr<Gossip> node(std::vector<std::string> seeds = {}, Nanos suspect_after = 2s, Nanos dead_after = 4s) {
  auto g = make_gossip(fast(std::move(seeds), suspect_after, dead_after));
  REQUIRE(g.ok());
  return std::move(*g);
}

std::size_t count_state(const Gossip& g, MemberState s) {
  std::size_t n = 0;
  for (const auto& m : g.members()) n += m.state == s ? 1 : 0;
  return n;
}

// A gossip message from a fake peer, in the wire format of transport/gossip_core.h: news with no
// updates, whose header tells the receiver the fake is alive at `incarnation`.
Bytes fake_table(std::uint64_t id, const std::string& address, std::uint32_t incarnation) {
  Writer w;
  w.raw(as_bytes("GSGP"));
  w.u8(4);  // version
  w.u8(6);  // news (kGossip)
  w.u64(id);
  w.u8(1);  // flags: the address follows
  w.u8(0);  // as text
  w.vstr(address);
  w.uvar(incarnation);
  w.u8(0);    // health
  w.uvar(0);  // rto (ms)
  w.uvar(0);  // no updates
  return std::move(w).take();
}

}  // namespace

TEST_CASE("16 gossip peers reach full membership through one seed") {
  std::vector<std::unique_ptr<Gossip>> nodes;
  nodes.push_back(node());
  const std::string seed = nodes[0]->address();
  for (int i = 1; i < 16; ++i) nodes.push_back(node({seed}));
  Stopwatch w(real_clock());
  const bool full = eventually(
      [&] {
        for (auto& n : nodes) {
          if (count_state(*n, MemberState::kAlive) != 15) return false;
        }
        return true;
      },
      10s);
  CHECK(full);
  MESSAGE("16 peers: full membership after " << w.elapsed_seconds() << " s (" << w.elapsed_seconds() / 0.05 << " periods)");
  // Peer sampling: distinct live members.
  auto s = nodes[3]->sample(5);
  CHECK(s.size() == 5);
  std::set<std::uint64_t> ids;
  for (auto& m : s) ids.insert(m.id.value);
  CHECK(ids.size() == 5);
  CHECK(ids.count(nodes[3]->self().value) == 0);
}

TEST_CASE("a silent peer is suspected, then declared dead within a few heartbeats") {
  // Suspect after 1 s of silence, dead after 2 s: windows wide enough to be seen on a busy machine.
  auto a = node({}, 1s, 2s), b = node({a->address()}, 1s, 2s);
  REQUIRE(eventually([&] { return count_state(*a, MemberState::kAlive) == 1; }, 5s));
  zmq::context_t ctx;
  zmq::socket_t fake(ctx, zmq::socket_type::dealer);
  fake.set(zmq::sockopt::linger, 0);
  fake.connect(a->address());
  const Bytes hello = fake_table(777, "tcp://127.0.0.1:1", 1);
  auto state_of_fake = [&](const Gossip& g) -> std::optional<MemberState> {
    for (const auto& m : g.members()) {
      if (m.id.value == 777) return m.state;
    }
    return std::nullopt;  // not known
  };
  Stopwatch w(real_clock());  // the fake is last heard of after this
  (void)fake.send(zmq::buffer(hello.data(), hello.size()));
  REQUIRE(eventually([&] { return state_of_fake(*a).has_value(); }, 2s));
  CHECK(eventually([&] { return state_of_fake(*a) == MemberState::kSuspect; }, 4s));
  CHECK(eventually([&] { return state_of_fake(*a) == MemberState::kDead; }, 4s));
  MESSAGE("declared dead " << w.elapsed_seconds() << " s after it was heard of (dead_after 2 s)");
  CHECK(w.elapsed() >= 2s);  // never early
  CHECK(w.elapsed() < 4s);
  // The live peer stays alive on both sides, and the dead one is never sampled.
  CHECK(eventually([&] { return count_state(*a, MemberState::kAlive) == 1 && count_state(*b, MemberState::kAlive) == 1; }, 2s));
  for (auto& m : a->sample(10)) CHECK(m.id.value != 777);
}

TEST_CASE("a peer that leaves is known to have left at once") {
  auto a = node(), b = node({a->address()}), c = node({a->address()});
  REQUIRE(eventually([&] { return count_state(*a, MemberState::kAlive) == 2 && count_state(*c, MemberState::kAlive) == 2; }, 5s));
  const PeerId bid = b->self();
  b->leave();
  auto left_on = [&](const Gossip& g) {
    for (const auto& m : g.members()) {
      if (m.id == bid) return m.state == MemberState::kLeft;
    }
    return false;
  };
  Stopwatch w(real_clock());
  CHECK(eventually([&] { return left_on(*a) && left_on(*c); }, 2s));
  CHECK(w.elapsed() < 2s);  // faster than failure detection could even suspect it (2 s)
  CHECK(b->broadcast("t", {}).code() == ErrorCode::kAborted);
}

TEST_CASE("broadcasts reach every subscriber exactly once") {
  std::vector<std::unique_ptr<Gossip>> nodes;
  nodes.push_back(node());
  for (int i = 1; i < 8; ++i) nodes.push_back(node({nodes[0]->address()}));
  REQUIRE(eventually(
      [&] {
        for (auto& n : nodes) {
          if (count_state(*n, MemberState::kAlive) != 7) return false;
        }
        return true;
      },
      10s));
  std::mutex mu;
  std::map<std::uint64_t, std::vector<std::string>> got;  // receiver -> payloads
  for (auto& n : nodes) {
    const std::uint64_t me = n->self().value;
    n->subscribe("round", [&, me](PeerId, const Bytes& p) {
      std::lock_guard<std::mutex> lock(mu);
      got[me].emplace_back(reinterpret_cast<const char*>(p.data()), p.size());
    });
  }
  REQUIRE(nodes[5]->broadcast("round", as_bytes("round 1 starts")).ok());
  REQUIRE(nodes[2]->broadcast("other-topic", as_bytes("ignored")).ok());
  CHECK(eventually(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return got.size() == nodes.size();
      },
      5s));
  std::this_thread::sleep_for(300ms);  // let any duplicate arrive: none may be delivered
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [id, payloads] : got) {
    REQUIRE(payloads.size() == 1);
    CHECK(payloads[0] == "round 1 starts");
  }
}

TEST_CASE("garbage sent to a gossip port is dropped and counted, the node keeps working") {
  auto a = node(), b = node({a->address()});
  zmq::context_t ctx;
  zmq::socket_t junk(ctx, zmq::socket_type::dealer);
  junk.set(zmq::sockopt::linger, 0);
  junk.connect(a->address());
  (void)junk.send(zmq::str_buffer("GET / HTTP/1.1\r\n\r\n"));
  Bytes truncated = fake_table(55, "tcp://127.0.0.1:2", 3);
  truncated.resize(truncated.size() - 5);
  (void)junk.send(zmq::buffer(truncated.data(), truncated.size()));
  CHECK(eventually([&] { return a->dropped_messages() >= 2; }, 2s));
  CHECK(eventually([&] { return count_state(*a, MemberState::kAlive) == 1 && count_state(*b, MemberState::kAlive) == 1; }, 3s));
  for (const auto& m : a->members()) CHECK(m.id.value != 55);
}

TEST_CASE("secured gossip admits only peers holding the run key") {
  const RunKey key = generate_run_key();
  auto secured = [&](std::optional<RunKey> k, std::vector<std::string> seeds) {
    GossipOptions o = fast(std::move(seeds));
    o.key = k;
    auto g = make_gossip(o);
    REQUIRE(g.ok());
    return std::move(*g);
  };
  auto a = secured(key, {});
  auto b = secured(key, {a->address()});
  CHECK(eventually([&] { return count_state(*a, MemberState::kAlive) == 1 && count_state(*b, MemberState::kAlive) == 1; }, 5s));
  auto stranger = secured(generate_run_key(), {a->address()});
  auto insecure = secured(std::nullopt, {a->address()});
  CHECK(eventually([&] { return a->dropped_messages() >= 2; }, 5s));  // both refusals logged and counted
  std::this_thread::sleep_for(300ms);  // time for a wrongly admitted stranger to show up
  CHECK(eventually([&] { return count_state(*a, MemberState::kAlive) == 1 && count_state(*b, MemberState::kAlive) == 1; }, 2s));
  CHECK(a->members().size() == 1);
  CHECK(b->members().size() == 1);
  CHECK(stranger->members().empty());
  CHECK(insecure->members().empty());
}

TEST_CASE("gossip: a node listening on 0.0.0.0 is reached through its wildcard on its own host, and others learn it second-hand") {
  GossipOptions wild = fast();
  wild.bind = "tcp://0.0.0.0:*";
  auto a_or = make_gossip(wild);
  REQUIRE(a_or.ok());
  auto& a = **a_or;
  const std::string port = a.address().substr(a.address().rfind(':'));
  CHECK(a.address().rfind("tcp://0.0.0.0:", 0) == 0);
  auto b = node({"tcp://127.0.0.1" + port});
  REQUIRE(eventually([&] { return count_state(*b, MemberState::kAlive) == 1 && count_state(a, MemberState::kAlive) == 1; }, 10s));
  const auto members = b->members();
  REQUIRE(members.size() == 1);
  CHECK(members[0].id == a.self());
  // Heard from this host (a loopback IP), the wildcard is kept: it reaches `a` here, where a loopback
  // address relayed to other hosts would not. (Other hosts get the IP `a`'s messages come from:
  // tests/runtime/netns_test.sh.)
  CHECK(members[0].address == "tcp://0.0.0.0" + port);
  // A third node hears of `a` through `b` (a wildcard row it does not dial) and then from `a` itself.
  auto c = node({b->address()});
  REQUIRE(eventually([&] { return count_state(*c, MemberState::kAlive) == 2 && count_state(a, MemberState::kAlive) == 2; }, 10s));
}

TEST_CASE("gossip: outbound-only nodes, which nobody can dial, are reached through the connections they open") {
  auto a = node();
  // Two nodes that announce an address where nothing listens, as a peer behind NAT would.
  const auto outbound = [&](const char* unreachable) {
    GossipOptions o = fast({a->address()});
    o.advertise = unreachable;
    o.outbound_only = true;
    auto g = make_gossip(o);
    REQUIRE(g.ok());
    return std::move(*g);
  };
  auto b = outbound("tcp://127.0.0.1:1");
  auto c = outbound("tcp://127.0.0.1:2");
  std::atomic<int> at_a{0}, at_b{0}, at_c{0};
  a->subscribe("t", [&](PeerId, const Bytes&) { ++at_a; });
  b->subscribe("t", [&](PeerId, const Bytes&) { ++at_b; });
  c->subscribe("t", [&](PeerId, const Bytes&) { ++at_c; });
  const auto knows_all = [](const Gossip& g) { return count_state(g, MemberState::kAlive) == 2; };
  REQUIRE(eventually([&] { return knows_all(*a) && knows_all(*b) && knows_all(*c); }, 10s));
  for (const auto& m : a->members()) CHECK(m.outbound_only);
  for (const auto& m : b->members()) CHECK(m.outbound_only == (m.id == c->self()));
  // Broadcasts from each reach the other two, the two outbound-only ones through a.
  REQUIRE(b->broadcast("t", as_bytes("from b")).ok());
  REQUIRE(a->broadcast("t", as_bytes("from a")).ok());
  REQUIRE(c->broadcast("t", as_bytes("from c")).ok());
  CHECK(eventually([&] { return at_a == 3 && at_b == 3 && at_c == 3; }, 10s));
  // Still alive a while later: the heartbeats of b and c keep reaching each other through a.
  std::this_thread::sleep_for(1s);
  CHECK(knows_all(*b));
  CHECK(knows_all(*c));
  // A direct message from b to c, which b cannot dial, goes through a, to c alone, from b.
  std::atomic<int> direct_at_a{0}, direct_at_c{0};
  std::atomic<std::uint64_t> direct_from{0};
  a->subscribe("d", [&](PeerId, const Bytes&) { ++direct_at_a; });
  c->subscribe("d", [&](PeerId origin, const Bytes& payload) {
    if (std::string(reinterpret_cast<const char*>(payload.data()), payload.size()) == "to c") direct_from = origin.value;
    ++direct_at_c;
  });
  const std::uint64_t carried = b->bytes().first - b->membership_bytes_sent();
  REQUIRE(b->send(c->self(), "d", as_bytes("to c")).ok());
  CHECK(eventually([&] { return direct_at_c == 1; }, 10s));
  CHECK(direct_from == b->self().value);
  std::this_thread::sleep_for(300ms);
  CHECK(direct_at_a == 0);
  CHECK(direct_at_c == 1);  // (a is the only member to go through: once)
  CHECK(b->bytes().first - b->membership_bytes_sent() > carried);  // counted outside membership
  // To a member it does not know: refused at once.
  CHECK(b->send(PeerId{12345}, "d", as_bytes("nobody")).code() == ErrorCode::kNotFound);
}

TEST_CASE("gossip: a dial-back check tells a reachable address from one nobody can connect to") {
  for (const bool keyed : {false, true}) {
    CAPTURE(keyed);
    GossipOptions oa = fast();
    GossipOptions ob = fast();
    if (keyed) oa.key = ob.key = generate_run_key();
    auto a = make_gossip(oa);
    REQUIRE(a.ok());
    ob.seeds = {(*a)->address()};
    auto b = make_gossip(ob);
    REQUIRE(b.ok());
    REQUIRE(eventually([&] { return count_state(**b, MemberState::kAlive) == 1; }, 10s));
    const std::string b_at = (*b)->address().substr(6);  // HOST:PORT of b's gossip
    // A port nobody listens on: bound, then closed.
    std::string closed;
    {
      zmq::context_t ctx;
      zmq::socket_t s(ctx, zmq::socket_type::router);
      s.bind("tcp://127.0.0.1:*");
      closed = s.get(zmq::sockopt::last_endpoint).substr(6);
    }
    auto ok = (*b)->check_reachable({b_at}, Deadline::after(real_clock(), 10s));
    REQUIRE(ok.ok());
    CHECK(ok->reachable);
    CHECK(ok->failed.empty());
    CHECK(ok->observed_ip == "127.0.0.1");
    CHECK(ok->helper == (*a)->address());
    // The wildcard form is dialled at the IP the request came from.
    auto wildcard = (*b)->check_reachable({"0.0.0.0:" + b_at.substr(b_at.rfind(':') + 1)}, Deadline::after(real_clock(), 10s));
    REQUIRE(wildcard.ok());
    CHECK(wildcard->reachable);
    auto no = (*b)->check_reachable({b_at, closed}, Deadline::after(real_clock(), 10s));
    REQUIRE(no.ok());
    CHECK_FALSE(no->reachable);
    REQUIRE(no->failed.size() == 1);
    CHECK(no->failed[0].find(closed) != std::string::npos);
    // Elsewhere than the request's own IP: not dialled, whatever the key (no port scans through a
    // member); such an address is not checked, and counts as reachable (the user advertised it).
    auto other = (*b)->check_reachable({"192.0.2.1:7"}, Deadline::after(real_clock(), 10s));
    REQUIRE(other.ok());
    CHECK(other->reachable);
    CHECK(other->failed.empty());
    REQUIRE(other->unchecked.size() == 1);
    CHECK(other->unchecked[0].find("not the address the request came from") != std::string::npos);
  }
}

TEST_CASE("gossip: a dial-back check with nobody to ask says so instead of waiting") {
  auto a = node();
  auto got = a->check_reachable({"127.0.0.1:7"}, Deadline::after(real_clock(), 10s));
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == ErrorCode::kUnavailable);
}

TEST_CASE("gossip: a dial-back check nobody answers ends at its deadline, or at once when stopped") {
  auto lonely = node({"tcp://127.0.0.1:9"});  // a seed where nothing listens
  const auto t0 = std::chrono::steady_clock::now();
  auto timed_out = lonely->check_reachable({"127.0.0.1:7"}, Deadline::after(real_clock(), 500ms));
  REQUIRE_FALSE(timed_out.ok());
  CHECK(timed_out.status().code() == ErrorCode::kUnavailable);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(200ms);
    stop = true;
  });
  const auto t1 = std::chrono::steady_clock::now();
  auto stopped = lonely->check_reachable({"127.0.0.1:7"}, Deadline::after(real_clock(), 30s), &stop);
  stopper.join();
  REQUIRE_FALSE(stopped.ok());
  CHECK(stopped.status().code() == ErrorCode::kAborted);
  CHECK(std::chrono::steady_clock::now() - t1 < 1s);
}

TEST_CASE("member and link addresses travel as 7 bytes when they are [tcp://]IPv4:port, as text otherwise, and come back unchanged") {
  for (const std::string a : {"tcp://192.0.2.1:7000", "tcp://0.0.0.0:1", "tcp://255.255.255.255:65535", "tcp://10.0.0.1:0", "192.0.2.1:7001"}) {
    Writer w;
    transport::write_address(w, a);
    CHECK(w.size() == 7);
    Reader r(w.bytes());
    CHECK(transport::read_address(r) == a);
    CHECK(r.ok());
  }
  // Not written back the same from four bytes and a port: kept as text.
  for (const std::string a : {"tcp://192.0.2.01:7000", "tcp://192.0.2.1:07000", "tcp://192.0.2.256:7000", "tcp://192.0.2.1:65536",
                              "tcp://[2001:db8::1]:7000", "tcp://peer.example:7000", "tcp://192.0.2.1", "tcp://1.2.3:4", "ipc:///run/g", "",
                              "udp://192.0.2.1:7000", "tcp://tcp://192.0.2.1:7000", "192.0.2.1:7001 "}) {
    Writer w;
    transport::write_address(w, a);
    CHECK(w.size() == 2 + a.size());
    Reader r(w.bytes());
    CHECK(transport::read_address(r) == a);
    r.expect_end();
    CHECK(r.ok());
  }
  Writer bad;
  bad.u8(9);  // no such form
  Reader r(bad.bytes());
  (void)transport::read_address(r);
  CHECK(r.status().code() == ErrorCode::kMalformed);
}
