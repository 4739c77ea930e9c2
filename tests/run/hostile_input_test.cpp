// Seeded mutations of valid round messages (READY, GROUP, INTENT) and state-transfer manifests fed
// to their decoders: refused and counted, or taken within bounds; nothing crashes, and the
// coordinator still agrees on groups afterwards.
#include <doctest/doctest.h>

#include <map>
#include <random>

#include "core/wire.h"
#include "run/coordinator.h"
#include "run/state_sync.h"
#include "support/mutate.h"

using namespace gossamer;
using namespace gossamer::run;
using gossamer::testing::mutate;
using namespace std::chrono_literals;

namespace {

// A gossip node of one: what is broadcast is recorded, and the test delivers messages to the
// subscribers itself.
class RecordingGossip final : public transport::Gossip {
 public:
  explicit RecordingGossip(std::uint64_t id) : self_{id} {}
  transport::PeerId self() const override { return self_; }
  std::string address() const override { return "tcp://192.0.2." + std::to_string(self_.value) + ":7000"; }
  std::vector<transport::Member> members() const override { return {}; }
  std::vector<transport::Member> sample(std::size_t) override { return {}; }
  Status broadcast(const std::string& topic, ByteView payload) override {
    sent.emplace_back(topic, Bytes(payload.begin(), payload.end()));
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
  std::map<std::string, std::vector<Handler>> handlers;

 private:
  transport::PeerId self_;
};

}  // namespace

TEST_CASE("mutated READY, GROUP and INTENT messages are dropped and counted or taken, and the coordinator still agrees") {
  // Valid messages from a coordinator leading a group of one, and announcing an intent.
  RecordingGossip a(1);
  auto ca = Coordinator::make(a, "192.0.2.1:7001", CoordinatorOptions{});
  REQUIRE(ca->agree(0, 0, Deadline::after(real_clock(), 5s)).ok());
  REQUIRE(ca->agree(1, 1, Deadline::after(real_clock(), 5s), 12).ok());  // a retry after epoch 1, at step 12
  ca->intend(2);
  std::vector<Bytes> valid;
  for (auto& [topic, payload] : a.sent) valid.push_back(payload);
  REQUIRE(valid.size() >= 5);

  RecordingGossip b(2);
  auto cb = Coordinator::make(b, "192.0.2.2:7001", CoordinatorOptions{});
  REQUIRE(cb->agree(0, 0, Deadline::after(real_clock(), 5s)).ok());  // a member, not a newcomer
  std::mt19937_64 rng(4);
  const int n = 20000;
  for (int i = 0; i < n; ++i) b.deliver(a.self(), "gossamer.round", mutate(valid[static_cast<std::size_t>(i) % valid.size()], rng));
  CHECK(cb->stats().dropped > n / 4);
  // A GROUP whose epoch would wrap the next one to 0 is refused, not taken.
  const std::int64_t dropped = cb->stats().dropped;
  Writer wrap;
  wrap.u8(2);
  wrap.u8(2);
  wrap.i64(40);
  wrap.u64(~std::uint64_t{0});
  wrap.u64(1);
  wrap.u32(1);
  wrap.u64(1);
  wrap.str("192.0.2.1:7001");
  b.deliver(a.self(), "gossamer.round", wrap.bytes());
  CHECK(cb->stats().dropped == dropped + 1);
  // Whatever the junk said about rounds 0 to 2, a later round is agreed as usual.
  auto g = cb->agree(50, 0, Deadline::after(real_clock(), 5s));
  REQUIRE(g.ok());
  CHECK(g->rank_of(b.self()) >= 0);
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
