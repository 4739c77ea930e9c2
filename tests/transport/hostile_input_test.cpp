// Seeded mutations of valid messages fed to the transport's decoders: HELLO and frame headers,
// sealed records and gossip messages. Each mutated message is refused with a Status or decoded into
// something within bounds; nothing crashes, and what is refused is counted.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "core/clock.h"
#include "core/wire.h"
#include "support/mutate.h"
#include "transport/gossip_core.h"
#include "transport/protocol.h"
#include "transport/secure_channel.h"

using namespace gossamer;
using namespace gossamer::transport;
using gossamer::testing::mutate;

namespace {
constexpr int kMutations = 20000;
ByteView view_of(const std::uint8_t* p, std::size_t n) { return ByteView(reinterpret_cast<const std::byte*>(p), n); }
}  // namespace

TEST_CASE("mutated HELLOs and frame headers are refused or decode within bounds, and an accepted HELLO re-encodes to its bytes") {
  Hello h;
  h.capabilities = kCapEncrypted;
  h.peer = PeerId{0x1234567890ABCDEFull};
  h.run.bytes.fill(std::uint8_t{0x5A});
  const Bytes hello = encode_hello(h);
  std::uint8_t header[kFrameHeaderBytes];
  encode_frame_header(FrameHeader{FrameType::kData, 0, 77, 4096}, header);
  const Bytes frame(reinterpret_cast<const std::byte*>(header), reinterpret_cast<const std::byte*>(header) + kFrameHeaderBytes);
  std::mt19937_64 rng(1);
  int hellos_refused = 0, frames_refused = 0;
  for (int i = 0; i < kMutations; ++i) {
    const Bytes m = mutate(hello, rng);
    auto got = decode_hello(m);
    if (!got.ok()) {
      ++hellos_refused;
      continue;
    }
    CHECK((encode_hello(*got) == m));  // nothing is ignored: what is accepted is exactly what it says
  }
  for (int i = 0; i < kMutations; ++i) {
    const Bytes f = mutate(frame, rng);
    auto fh = decode_frame_header(f, 1 << 20);
    if (!fh.ok()) {
      ++frames_refused;
      continue;
    }
    CHECK(f.size() == kFrameHeaderBytes);
    CHECK(fh->length <= (1u << 20));
  }
  CHECK(hellos_refused > kMutations / 2);
  CHECK(frames_refused > 0);
}

TEST_CASE("a sealed record with any byte changed, cut or extended is refused as unauthenticated") {
  std::array<std::uint8_t, 32> k{};
  k[3] = 7;
  std::mt19937_64 rng(2);
  for (int i = 0; i < 2000; ++i) {
    StreamSealer sealer(k);
    StreamOpener opener;
    REQUIRE(opener.init(k, view_of(sealer.header().data(), kStreamHeaderBytes)).ok());
    const Bytes plain(1 + rng() % 300, static_cast<std::byte>(i));
    std::vector<std::uint8_t> record(4 + plain.size() + kRecordOverhead);
    const std::size_t n = sealer.seal(plain, record.data());
    const Bytes sealed(reinterpret_cast<const std::byte*>(record.data()) + 4, reinterpret_cast<const std::byte*>(record.data()) + n);
    const Bytes m = mutate(sealed, rng);
    if (m == sealed) continue;
    std::vector<std::uint8_t> out(m.size() + 1);
    if (m.size() < kRecordOverhead) continue;  // the reader refuses such a length before opening
    auto opened = opener.open(m, out.data());
    REQUIRE_FALSE(opened.ok());
    CHECK(opened.status().code() == ErrorCode::kUnauthenticated);
  }
}

TEST_CASE("mutated gossip tables and rumors are dropped and counted or merged within bounds, and the node still hears its peers") {
  GossipOptions a_opts, b_opts;
  a_opts.self = PeerId{101};
  b_opts.self = PeerId{202};
  a_opts.seeds = {"tcp://192.0.2.2:7000"};
  b_opts.seeds = {"tcp://192.0.2.1:7000"};
  GossipCore a(a_opts, "tcp://192.0.2.1:7000", real_clock(), 1), b(b_opts, "tcp://192.0.2.2:7000", real_clock(), 2);
  int delivered = 0;
  b.subscribe("news", [&](PeerId, const Bytes&) { ++delivered; });
  // Valid messages of each kind: a's member table (after it heard b) and a rumor.
  std::vector<Bytes> valid;
  for (auto& s : a.tick()) valid.push_back(s.message);
  for (auto& s : b.tick()) {
    for (auto& reply : a.handle(s.message, "192.0.2.2")) valid.push_back(reply.message);  // its rows, to b
  }
  for (auto& s : a.tick()) valid.push_back(s.message);
  REQUIRE(a.broadcast("news", as_bytes(std::string("the run goes on"))).ok());
  for (auto& s : a.take_broadcasts()) valid.push_back(s.message);
  REQUIRE(valid.size() >= 3);
  std::mt19937_64 rng(3);
  for (int i = 0; i < kMutations; ++i) {
    (void)b.handle(mutate(valid[static_cast<std::size_t>(i) % valid.size()], rng), "192.0.2.1");
    b.run_deliveries();
  }
  CHECK(b.dropped() > kMutations / 4);
  CHECK(b.members().size() <= b_opts.max_members);  // 20,000 mutated tables could name more
  // Still in working order: fresh rumors from a arrive (a mutated one may have taken a sequence
  // number of theirs, so nearly all, not all).
  const int before = delivered;
  for (int i = 0; i < 50; ++i) REQUIRE(a.broadcast("news", as_bytes(std::string("still here"))).ok());
  for (auto& s : a.take_broadcasts()) (void)b.handle(s.message, "192.0.2.1");
  b.run_deliveries();
  CHECK(delivered >= before + 45);
}

TEST_CASE("a member table stays within max_members: new rows take the place of dead ones or are dropped and counted") {
  GossipOptions o;
  o.self = PeerId{1};
  o.max_members = 10;
  o.dead_after = std::chrono::milliseconds(1);  // every row is dead a moment after it is heard
  o.suspect_after = std::chrono::microseconds(500);
  GossipCore core(o, "tcp://192.0.2.1:7000", real_clock(), 1);
  // A table of 50 members from one sender, in one message (a full-state exchange's rows). `kind`:
  // alive, or dead (as another member would declare them).
  const auto table_of = [](std::uint64_t first, int n, std::uint8_t kind = 0) {
    Writer w;
    w.raw(as_bytes(std::string_view("GSGP", 4)));
    w.u8(4);  // version
    w.u8(7);  // sync
    w.u64(first);
    w.u8(1);  // flags: the address follows
    w.u8(0);  // as text
    w.vstr("tcp://192.0.2.9:7000");
    w.uvar(0);  // incarnation
    w.u8(0);    // health
    w.uvar(0);  // rto (ms)
    w.u8(2);    // rows, no reply wanted
    for (int b = 0; b < 32; ++b) w.u64(0);
    w.uvar(static_cast<std::uint64_t>(n));
    for (int i = 0; i < n; ++i) {
      w.u8(kind);
      w.u64(first + static_cast<std::uint64_t>(i));
      w.uvar(0);
      if (kind == 0) {
        w.u8(0);
        w.u8(1);  // an IPv4 address and port
        for (std::uint8_t b : {192, 0, 2, 9}) w.u8(b);
        w.u16(static_cast<std::uint16_t>(7000 + i));
        w.u8(0);    // health
        w.uvar(0);  // rto (ms)
      }
    }
    return std::move(w).take();
  };
  (void)core.handle(table_of(100, 50), "192.0.2.9");
  CHECK(core.members().size() == 10);
  CHECK(core.dropped() == 40);
  // Once they are dead, newcomers take their places. (Under SWIM a member dies by a verdict that
  // spreads, not by silence alone: one arrives for the ten.)
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  (void)core.handle(table_of(100, 10, 2), "192.0.2.9");
  (void)core.handle(table_of(1000, 5), "192.0.2.9");
  CHECK(core.members().size() == 10);
  std::size_t fresh = 0;
  for (const auto& m : core.members()) fresh += m.id.value >= 1000 ? 1 : 0;
  CHECK(fresh == 5);
}
