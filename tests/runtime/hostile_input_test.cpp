// Seeded mutations of valid round messages (READY, GROUP, INTENT), state-transfer manifests and
// chunk answers, run-spec announcements and join-board messages fed to their decoders: refused (and
// counted where the decoder counts), or taken within bounds as exactly what they say; nothing
// crashes, and valid messages are still taken afterwards.
#include <doctest/doctest.h>

#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "core/hash.h"
#include "core/wire.h"
#include "runtime/announcements.h"
#include "runtime/coordinator.h"
#include "runtime/state_sync.h"
#include "support/mutate.h"
#include "transport/memory_link.h"

using namespace gossamer;
using namespace gossamer::runtime;
using gossamer::testing::mutate;
using namespace std::chrono_literals;

namespace {

// A gossip node that knows the members the test gives it: what is broadcast or sent is recorded,
// and the test delivers messages to the subscribers itself.
class RecordingGossip final : public transport::Gossip {
 public:
  explicit RecordingGossip(std::uint64_t id) : self_{id} {}
  transport::PeerId self() const override { return self_; }
  std::string address() const override { return "tcp://192.0.2." + std::to_string(self_.value) + ":7000"; }
  std::vector<transport::Member> members() const override { return known; }
  std::vector<transport::Member> sample(std::size_t) override { return known; }
  Status broadcast(const std::string& topic, ByteView payload) override {
    sent.emplace_back(topic, Bytes(payload.begin(), payload.end()));
    return Status();
  }
  Status send(transport::PeerId to, const std::string& topic, ByteView payload) override {
    direct.emplace_back(to, topic, Bytes(payload.begin(), payload.end()));
    return Status();
  }
  void subscribe(const std::string& topic, Handler handler) override { handlers[topic].push_back(std::move(handler)); }
  void leave() override {}
  std::uint64_t dropped_messages() const override { return 0; }
  std::pair<std::uint64_t, std::uint64_t> bytes() const override { return {0, 0}; }
  void deliver(transport::PeerId origin, const std::string& topic, const Bytes& payload) {
    for (auto& h : handlers[topic]) h(origin, payload);
  }

  std::vector<std::pair<std::string, Bytes>> sent;
  std::vector<std::tuple<transport::PeerId, std::string, Bytes>> direct;
  std::vector<transport::Member> known;  // what members() says
  std::map<std::string, std::vector<Handler>> handlers;

 private:
  transport::PeerId self_;
};

// Time stands still: a JOIN heard during a test is still wanted at its end.
class StillClock final : public Clock {
 public:
  Nanos now() const override { return std::chrono::seconds(100); }
  void sleep_until(Nanos) override {}
};

// The newcomer's end of a state link whose donor sends every chunk answer mutated (manifest answers
// pass unchanged), as a broken or malicious donor would.
class ForgingLink final : public transport::Link {
 public:
  ForgingLink(std::shared_ptr<transport::Link> inner, std::mt19937_64& rng) : inner_(std::move(inner)), rng_(rng) {}
  transport::PeerId peer() const override { return inner_->peer(); }
  std::string remote_address() const override { return inner_->remote_address(); }
  Status send(transport::Tag tag, ByteView payload, Deadline deadline) override {
    if (tag == kStateRequestTag && payload.size() > 1) chunk_asked_ = payload[1] == std::byte{2};
    return inner_->send(tag, payload, deadline);
  }
  Result<Bytes> recv(transport::Tag tag, Deadline deadline) override {
    auto got = inner_->recv(tag, deadline);
    if (got.ok() && tag == kStateResponseTag && chunk_asked_) return mutate(*got, rng_);
    return got;
  }
  void close() override { inner_->close(); }
  transport::LinkStats stats() const override { return inner_->stats(); }

 private:
  std::shared_ptr<transport::Link> inner_;
  std::mt19937_64& rng_;
  bool chunk_asked_ = false;
};

// Connects a newcomer to one StateServer over in-process links; the donor at address "forger" mutates
// its chunk answers.
class LocalTransport final : public transport::Transport {
 public:
  LocalTransport(StateServer& server, std::mt19937_64& rng) : server_(server), rng_(rng) {}
  transport::PeerId self() const override { return transport::PeerId{1}; }
  const transport::RunId& run() const override { return run_; }
  std::string address() const override { return "192.0.2.1:7001"; }
  Result<std::shared_ptr<transport::Link>> connect(const std::string& address, Deadline) override {
    auto [near_end, far_end] = transport::make_memory_link_pair(transport::PeerId{1}, transport::PeerId{2});
    server_.serve(far_end);
    if (address == "forger") return std::shared_ptr<transport::Link>(std::make_shared<ForgingLink>(near_end, rng_));
    return near_end;
  }
  Result<std::shared_ptr<transport::Link>> accept(Deadline) override { return error(ErrorCode::kUnavailable, "a newcomer only dials"); }

 private:
  StateServer& server_;
  std::mt19937_64& rng_;
  transport::RunId run_;
};

}  // namespace

// Round messages of version 5, by the layout in coordinator.h.
Writer round_message(std::uint8_t kind, std::int64_t round) {
  Writer w;
  w.u8(5);
  w.u8(kind);
  w.uvar(static_cast<std::uint64_t>(round));
  return w;
}
// A link address as the round messages write it: a form (2: IPv4 and port), 4 bytes and a port.
void link_address(Writer& w, std::uint64_t host) {
  w.u8(2);
  for (std::uint8_t b : {192, 0, 2}) w.u8(b);
  w.u8(static_cast<std::uint8_t>(host));
  w.u16(7001);
}
// GROUP of `round` over `epoch` from leader 1, whole: members 1 and 2, as a full mesh.
Bytes whole_group(std::int64_t round, std::uint64_t epoch) {
  Writer w = round_message(2, round);
  w.uvar(epoch);
  w.u64(1);
  w.uvar(0);
  w.uvar(0);  // prior
  w.u8(0);
  w.uvar(2);
  for (std::uint64_t id : {1, 2}) {
    w.u64(id);
    link_address(w, id);
  }
  return std::move(w).take();
}
Bytes ready_message(std::int64_t round, std::uint64_t after, std::uint64_t id, std::uint64_t known, std::uint8_t flags) {
  Writer w = round_message(1, round);
  w.uvar(after);
  w.uvar(after > 0 ? 12 : 0);
  w.u64(id);
  w.uvar(known);
  w.u8(flags);
  link_address(w, id % 250);
  return std::move(w).take();
}

TEST_CASE("mutated READY, GROUP, INTENT, AT, ABANDON, DONE and COMMIT messages are dropped and counted or taken, and the coordinator still agrees") {
  // Valid messages: what a coordinator leading a group of one sends, and the other kinds by their layout.
  RecordingGossip a(1);
  auto ca = Coordinator::make(a, "192.0.2.1:7001", CoordinatorOptions{}, real_clock());
  REQUIRE(ca->agree(0, 0, Deadline::after(real_clock(), 5s)).ok());
  REQUIRE(ca->agree(1, 1, Deadline::after(real_clock(), 5s), 12).ok());  // a retry after epoch 1, at step 12: it leads, so ABANDON
  std::vector<Bytes> valid;
  for (auto& [topic, payload] : a.sent) valid.push_back(payload);
  REQUIRE(valid.size() == 1);
  CHECK(valid[0][1] == std::byte{5});
  valid.push_back(ready_message(2, 0, 1, 2, 0));  // to the leader
  valid.push_back(ready_message(2, 0, 7, 0, 1));  // passed on for peer 7
  valid.push_back(whole_group(3, 4));
  Writer change = round_message(2, 4);  // from epoch 1 (b's own group of one): peer 3 added
  change.uvar(5);
  change.u64(2);
  change.uvar(0);
  change.uvar(4);  // prior
  change.u8(1);
  change.uvar(1);
  change.uvar(2);
  change.u64(0x1234);  // (its check fails: not applied, the whole group asked for)
  change.uvar(0);
  change.uvar(1);
  change.u64(3);
  link_address(change, 3);
  valid.push_back(change.bytes());
  Writer intent = round_message(3, 5);
  intent.u64(1);
  intent.u8(0);
  valid.push_back(intent.bytes());
  valid.push_back(round_message(4, 6).bytes());  // AT
  Writer abandon = round_message(5, 7);
  abandon.uvar(3);
  valid.push_back(abandon.bytes());
  Writer done = round_message(6, 7);
  done.uvar(3);
  valid.push_back(done.bytes());
  Writer commit = round_message(7, 7);
  commit.uvar(3);
  commit.uvar(2);
  commit.u64(1);
  commit.u64(5);
  valid.push_back(commit.bytes());

  RecordingGossip b(2);
  CoordinatorOptions committing;
  committing.commit_rounds = true;
  auto cb = Coordinator::make(b, "192.0.2.2:7001", committing, real_clock());
  REQUIRE(cb->agree(0, 0, Deadline::after(real_clock(), 5s)).ok());  // a member, not a newcomer
  std::mt19937_64 rng(4);
  const int n = 20000;
  for (int i = 0; i < n; ++i) b.deliver(a.self(), "gossamer.round", mutate(valid[static_cast<std::size_t>(i) % valid.size()], rng));
  CHECK(cb->stats().dropped > n / 4);
  // A GROUP whose epoch would wrap the next one to 0 is refused, not taken.
  const std::int64_t dropped = cb->stats().dropped;
  Writer wrap = round_message(2, 40);
  wrap.uvar(~std::uint64_t{0});
  wrap.u64(1);
  wrap.uvar(0);
  wrap.u8(0);
  wrap.uvar(1);
  wrap.u64(1);
  link_address(wrap, 1);
  b.deliver(a.self(), "gossamer.round", wrap.bytes());
  CHECK(cb->stats().dropped == dropped + 1);
  // Whatever the junk said about rounds 0 to 2, a later round is agreed as usual.
  auto g = cb->agree(50, 0, Deadline::after(real_clock(), 5s));
  REQUIRE(g.ok());
  CHECK(g->rank_of(b.self()) >= 0);
}

TEST_CASE("a READY to everyone is answered by the group's leader alone, a READY to a member by any member holding the group") {
  // Peers 1 (the leader) and 2 both hold round 5's group of {1, 2}; peer 7 is still waiting for it.
  const Bytes whole = whole_group(5, 3);
  const auto holder = [&](std::uint64_t self, std::uint64_t other) {
    auto g = std::make_unique<RecordingGossip>(self);
    g->known.push_back(transport::Member{transport::PeerId{other}, "tcp://192.0.2.9:7000", 0, transport::MemberState::kAlive, false});
    g->known.push_back(transport::Member{transport::PeerId{7}, "tcp://192.0.2.7:7000", 0, transport::MemberState::kAlive, false});
    return g;
  };
  auto leader = holder(1, 2), member = holder(2, 1);
  auto cl = Coordinator::make(*leader, "192.0.2.1:7001", CoordinatorOptions{}, real_clock());
  auto cm = Coordinator::make(*member, "192.0.2.2:7001", CoordinatorOptions{}, real_clock());
  leader->deliver(transport::PeerId{1}, "gossamer.round", whole);  // (its own: ignored)
  leader->deliver(transport::PeerId{2}, "gossamer.round", whole);
  member->deliver(transport::PeerId{1}, "gossamer.round", whole);
  const Bytes to_everyone = ready_message(5, 0, 7, 0, 2), to_one = ready_message(5, 0, 7, 0, 0);
  member->deliver(transport::PeerId{7}, "gossamer.round", to_everyone);
  CHECK(member->direct.empty());
  leader->deliver(transport::PeerId{7}, "gossamer.round", to_everyone);
  REQUIRE(leader->direct.size() == 1);
  CHECK(std::get<0>(leader->direct[0]) == transport::PeerId{7});
  CHECK(std::get<2>(leader->direct[0])[1] == std::byte{2});  // a GROUP
  member->deliver(transport::PeerId{7}, "gossamer.round", to_one);
  REQUIRE(member->direct.size() == 1);
  CHECK(std::get<0>(member->direct[0]) == transport::PeerId{7});
  CHECK(cl->stats().dropped == 0);
  CHECK(cm->stats().dropped == 0);
}

TEST_CASE("mutated state manifests are refused, or decode to a consistent manifest that re-encodes to its bytes") {
  Bytes state(5000);
  for (std::size_t i = 0; i < state.size(); ++i) state[i] = static_cast<std::byte>(i * 7);
  const Bytes valid = Snapshot::make(3, 30, 4, state, 1024)->manifest.encode();
  std::mt19937_64 rng(5);
  int refused = 0;
  for (int i = 0; i < 20000; ++i) {
    const Bytes m = mutate(valid, rng);
    auto got = StateManifest::decode(m);
    if (!got.ok()) {
      ++refused;
      continue;
    }
    CHECK(got->round >= 0);
    CHECK(got->step >= 0);
    CHECK(got->shards > 0);
    CHECK(got->chunks.size() * std::uint64_t{got->chunk_bytes} >= got->total);
    CHECK((got->encode() == m));
  }
  CHECK(refused > 10000);
}

TEST_CASE("mutated chunk answers are refused, and the state still comes whole from an honest donor") {
  Bytes state(40000);
  for (std::size_t i = 0; i < state.size(); ++i) state[i] = static_cast<std::byte>(i * 31 + 7);
  const auto snapshot = Snapshot::make(3, 30, 2, state, 4096);  // 10 chunks
  std::mt19937_64 rng(8);
  const int n = 100;
  int refused = 0;
  for (int i = 0; i < n; ++i) {
    StateServer server(real_clock());
    server.offer(snapshot);
    LocalTransport newcomer(server, rng);
    // The forger alone: refused, or (had every mutation changed nothing) the state itself, never other bytes.
    auto alone = fetch_state(newcomer, {Donor{"forger", "forger"}}, 3, Deadline::after(real_clock(), std::chrono::seconds(10)), real_clock());
    if (alone.ok()) {
      CHECK((Bytes(alone->bytes.begin(), alone->bytes.end()) == state));
    } else {
      ++refused;
      CHECK(alone.status().code() == ErrorCode::kUnavailable);
    }
    // Beside an honest donor: the chunks the forger spoiled are fetched again from it.
    auto both = fetch_state(newcomer, {Donor{"forger", "forger"}, Donor{"honest", "honest"}}, 3,
                            Deadline::after(real_clock(), std::chrono::seconds(10)), real_clock());
    REQUIRE(both.ok());
    CHECK((Bytes(both->bytes.begin(), both->bytes.end()) == state));
  }
  CHECK(refused > n * 9 / 10);
}

TEST_CASE("mutated run-spec announcements are ignored, or taken only with the TOML their hash names") {
  const std::string toml = "[run]\nmethod = \"diloco\"\npeers = 4\n";
  const Digest d = digest_of(as_bytes(toml));
  const auto announcement = [&](std::uint8_t kind) {  // version 2: BEACON (1) or SPEC (2)
    Writer w;
    w.u8(2);
    w.u8(kind);
    w.raw(ByteView(reinterpret_cast<const std::byte*>(d.bytes.data()), d.bytes.size()));
    if (kind == 2) w.str(toml);
    w.u32(4);
    w.i64(17);
    return std::move(w).take();
  };
  const Bytes beacon = announcement(1), spec = announcement(2);
  std::mt19937_64 rng(6);
  const int n = 5000;
  int ignored = 0;
  for (int i = 0; i < n; ++i) {
    RecordingGossip g(2);  // a listener of its own each time: it keeps the first spec it takes
    auto heard = listen_for_spec(g, real_clock());
    g.deliver(transport::PeerId{1}, "gossamer.spec", mutate(i % 2 == 0 ? spec : beacon, rng));
    std::lock_guard lock(heard->mu);
    if (heard->spec) CHECK(heard->spec->toml == toml);  // the hash covers the TOML
    if (!heard->last_problem.empty()) ++ignored;
  }
  CHECK(ignored > n / 2);
  // A listener that heard only mutated BEACONs still takes a valid SPEC.
  RecordingGossip g(2);
  auto heard = listen_for_spec(g, real_clock());
  for (int i = 0; i < 2000; ++i) g.deliver(transport::PeerId{1}, "gossamer.spec", mutate(beacon, rng));
  g.deliver(transport::PeerId{1}, "gossamer.spec", spec);
  auto got = receive_spec(*heard, std::chrono::seconds(1));
  REQUIRE(got.ok());
  CHECK(got->toml == toml);
  CHECK(got->wait_for == 4);
}

TEST_CASE("mutated JOIN and OFFER messages are dropped, or taken as exactly what they say, and a valid OFFER is taken afterwards") {
  // A newcomer asks the members it knows directly; a member offers to the newcomers that asked.
  RecordingGossip asker(5);
  for (std::uint64_t id : {3, 9}) asker.known.push_back(transport::Member{transport::PeerId{id}, "tcp://192.0.2.1:700" + std::to_string(id), 0, transport::MemberState::kAlive, false});
  auto newcomer = JoinBoard::make(asker, real_clock());
  newcomer->ask_to_join();
  REQUIRE(asker.direct.size() == 2);
  CHECK(std::get<0>(asker.direct[0]) != std::get<0>(asker.direct[1]));
  CHECK(asker.sent.empty());  // never to everyone
  // A peer not in the run answers ABSENT at once, and the newcomer notes it.
  RecordingGossip outsider(7);
  auto waiting_too = JoinBoard::make(outsider, real_clock());
  outsider.deliver(asker.self(), "gossamer.state", std::get<2>(asker.direct[0]));
  CHECK(waiting_too->waiting().empty());
  REQUIRE(outsider.direct.size() == 1);
  CHECK(std::get<0>(outsider.direct[0]) == asker.self());
  asker.deliver(outsider.self(), "gossamer.state", std::get<2>(outsider.direct[0]));
  CHECK(newcomer->absent(outsider.self(), std::chrono::seconds(5)));
  CHECK_FALSE(newcomer->absent(transport::PeerId{9}, std::chrono::seconds(5)));
  RecordingGossip a(9);
  auto sender = JoinBoard::make(a, real_clock());
  sender->set_member(true);
  a.deliver(asker.self(), "gossamer.state", std::get<2>(asker.direct[0]));
  REQUIRE(sender->waiting().size() == 1);
  CHECK(sender->waiting()[0] == asker.self());
  sender->offer(12, "192.0.2.9:7001");
  REQUIRE(a.direct.size() == 1);
  CHECK(std::get<0>(a.direct[0]) == asker.self());
  CHECK(a.sent.empty());
  a.sent.emplace_back("gossamer.state", std::get<2>(asker.direct[0]));  // JOIN
  a.sent.emplace_back("gossamer.state", std::get<2>(a.direct[0]));  // OFFER
  const Bytes offer = a.sent[1].second;
  StillClock clock;
  RecordingGossip b(2);
  auto board = JoinBoard::make(b, clock);
  board->set_member(true);
  // What the well-formed ones say, read by the layout in announcements.h.
  std::set<transport::PeerId> joined;
  std::map<std::int64_t, std::set<transport::PeerId>> offered;
  std::mt19937_64 rng(7);
  const int n = 20000;
  int dropped = 0;
  for (int i = 0; i < n; ++i) {
    const Bytes m = mutate(a.sent[static_cast<std::size_t>(i) % 2].second, rng);
    b.deliver(a.self(), "gossamer.state", m);
    Reader r(m);
    const std::uint8_t version = r.u8(), kind = r.u8();
    const transport::PeerId id{r.u64()};
    std::int64_t round = 0;
    if (kind == 1 && r.remaining() == 8) (void)r.u64();  // the newcomer's link speed (optional)
    if (kind == 2) {
      round = r.i64();
      (void)r.str(256);
    }
    r.expect_end();
    if (!r.ok() || version != 1 || (kind != 1 && kind != 2)) {
      ++dropped;
    } else if (kind == 1) {
      joined.insert(id);
    } else {
      offered[round].insert(id);
    }
  }
  CHECK(dropped > n / 2);
  const auto waiting = board->waiting();
  CHECK((std::set<transport::PeerId>(waiting.begin(), waiting.end()) == joined));
  auto newest = board->newest_offer(Nanos{0});
  REQUIRE(newest.has_value() == !offered.empty());
  if (newest) {
    CHECK(newest->first == offered.rbegin()->first);
    CHECK(newest->second.size() == offered.rbegin()->second.size());
  }
  // With every offer forgotten, a valid OFFER is taken as usual.
  board->forget(std::numeric_limits<std::int64_t>::max());
  CHECK_FALSE(board->newest_offer(Nanos{0}).has_value());
  b.deliver(a.self(), "gossamer.state", offer);
  newest = board->newest_offer(Nanos{0});
  REQUIRE(newest.has_value());
  CHECK(newest->first == 12);
  REQUIRE(newest->second.size() == 1);
  CHECK(newest->second[0].address == "192.0.2.9:7001");
  CHECK(newest->second[0].name == a.self().to_string());
  REQUIRE(board->offerers(12).size() == 1);
  CHECK(board->offerers(12)[0] == a.self());
}
