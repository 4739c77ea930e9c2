// libFuzzer target: a gossip node handling arbitrary messages (member tables, probes, rumors, direct
// messages, junk), with a subscriber; its table must stay bounded by what it was sent. With
// GOSSAMER_FUZZ_SEED_DIR set, it first writes one valid message of each kind, made by a second node's
// own encoder (records.h), so that the fuzzer starts past the header.
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>

#include "core/clock.h"
#include "records.h"
#include "transport/gossip_core.h"

namespace {

using namespace gossamer;

// What a node that knows 192.0.2.7 (and a few members) sends it: its sync, probes, news, a rumor
// and a direct message.
void write_seeds() {
  transport::GossipOptions o;
  o.self = transport::PeerId{9};
  o.seeds = {"tcp://192.0.2.7:7000"};
  transport::GossipCore other(o, "tcp://192.0.2.9:7000", real_clock(), 2);
  int n = 0;
  const auto keep = [&](const std::vector<transport::GossipSend>& sends) {
    for (const auto& s : sends) fuzz::write_seed("gossip-" + std::to_string(n++), s.message);
  };
  transport::GossipOptions m;
  m.self = transport::PeerId{7};
  transport::GossipCore seed(m, "tcp://192.0.2.7:7000", real_clock(), 3);
  const auto joining = other.tick();  // the sync a joiner sends its seeds
  keep(joining);
  for (const auto& s : joining) {
    const auto rows = seed.handle(s.message, "192.0.2.9");  // the seed's rows, back
    for (const auto& r : rows) (void)other.handle(r.message, "192.0.2.7");
  }
  (void)other.broadcast("gossamer.round", as_bytes(std::string("a round's news")));
  (void)other.send(transport::PeerId{7}, "gossamer.round", as_bytes(std::string("for the leader")));
  keep(other.take_broadcasts());
  for (int i = 0; i < 4; ++i) {  // probes of it, a period apart
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    keep(other.tick());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static transport::GossipCore* core = [] {
    if (fuzz::seeds_wanted()) write_seeds();
    transport::GossipOptions o;
    o.self = transport::PeerId{7};
    auto* c = new transport::GossipCore(o, "tcp://192.0.2.7:7000", real_clock(), 1);
    c->subscribe("gossamer.round", [](transport::PeerId, const Bytes&) {});
    return c;
  }();
  const ByteView bytes(reinterpret_cast<const std::byte*>(data), size);
  (void)core->handle(bytes, "192.0.2.9");
  core->run_deliveries();
  (void)core->tick();
  return 0;
}
