// libFuzzer target: a gossip node handling arbitrary messages (member tables, rumors, junk), with a
// subscriber; its table must stay bounded by what it was sent.
#include <cstddef>
#include <cstdint>

#include "core/clock.h"
#include "transport/gossip_core.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gossamer;
  static transport::GossipCore* core = [] {
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
