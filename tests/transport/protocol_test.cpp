#include <doctest/doctest.h>

#include <string>

#include "transport/link_profile.h"
#include "transport/protocol.h"

using namespace gossamer;
using namespace gossamer::transport;

namespace {
std::string hex(ByteView b) {
  static constexpr char k[] = "0123456789abcdef";
  std::string s;
  for (auto x : b) {
    s += k[static_cast<int>(x) >> 4];
    s += k[static_cast<int>(x) & 15];
  }
  return s;
}
Hello sample_hello() {
  Hello h;
  h.capabilities = 1;
  h.peer.value = 0x0102030405060708ull;
  for (std::size_t i = 0; i < 16; ++i) h.run.bytes[i] = static_cast<std::uint8_t>(0xA0 + i);
  return h;
}
}  // namespace

TEST_CASE("HELLO and frame header golden bytes pin the wire format") {
  const Bytes hello = encode_hello(sample_hello());
  REQUIRE(hello.size() == kHelloBytes);
  CHECK(hex(hello) == "47534d5701000000" "0100000000000000" "0807060504030201" "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf");
  std::uint8_t frame[kFrameHeaderBytes];
  encode_frame_header(FrameHeader{FrameType::kData, 0, 0x11223344u, 0x55667788ull}, frame);
  CHECK(hex(ByteView(reinterpret_cast<const std::byte*>(frame), kFrameHeaderBytes)) == "4746010044332211" "8877665500000000");
  static_assert(kWireMajor == 1 && kWireMinor == 0, "wire version changed: update the golden bytes deliberately");
}

TEST_CASE("HELLO round-trips and refuses what it must") {
  auto back = decode_hello(encode_hello(sample_hello()));
  REQUIRE(back.ok());
  CHECK(back->peer == sample_hello().peer);
  CHECK(back->run == sample_hello().run);
  Bytes bad = encode_hello(sample_hello());
  bad[0] = std::byte{'H'};  // an HTTP client, say
  CHECK(decode_hello(bad).status().code() == ErrorCode::kMalformed);
  CHECK(decode_hello(ByteView(encode_hello(sample_hello())).first(39)).status().code() == ErrorCode::kDataLoss);

  Hello ours = sample_hello(), theirs = sample_hello();
  theirs.peer.value = 99;
  CHECK(check_hello(ours, theirs).ok());
  theirs.minor = 7;  // a newer minor is compatible
  CHECK(check_hello(ours, theirs).ok());
  theirs.major = 2;
  Status st = check_hello(ours, theirs);
  CHECK(st.code() == ErrorCode::kVersionMismatch);
  CHECK(st.message().find("speaks wire 2.7, we speak 1.0: upgrade this node") != std::string::npos);
  CHECK(check_hello(theirs, ours).message().find("that peer must upgrade") != std::string::npos);
  theirs = sample_hello();
  theirs.peer.value = 99;
  theirs.run.bytes[0] ^= 1;
  CHECK(check_hello(ours, theirs).code() == ErrorCode::kUnauthenticated);
  CHECK(check_hello(ours, ours).code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("frame headers from the wire are validated before anything is allocated") {
  std::uint8_t f[kFrameHeaderBytes];
  auto view = [&] { return ByteView(reinterpret_cast<const std::byte*>(f), kFrameHeaderBytes); };
  encode_frame_header(FrameHeader{FrameType::kData, 0, 5, 1000}, f);
  REQUIRE(decode_frame_header(view(), 1000).ok());
  CHECK(decode_frame_header(view(), 999).status().code() == ErrorCode::kOutOfRange);
  f[0] = 'X';
  CHECK(decode_frame_header(view(), 1000).status().code() == ErrorCode::kMalformed);
  encode_frame_header(FrameHeader{FrameType::kData, 0, 5, 10}, f);
  f[2] = 9;
  CHECK(decode_frame_header(view(), 1000).status().code() == ErrorCode::kMalformed);
  encode_frame_header(FrameHeader{FrameType::kData, 0, 5, 10}, f);
  f[3] = 1;
  CHECK(decode_frame_header(view(), 1000).status().code() == ErrorCode::kMalformed);
  encode_frame_header(FrameHeader{FrameType::kClose, 0, 0, 10}, f);
  CHECK(decode_frame_header(view(), 1000).status().code() == ErrorCode::kMalformed);
}

TEST_CASE("link profiles: presets, ideal transfer time, validation") {
  auto home = link_profile_preset("home");
  REQUIRE(home.ok());
  CHECK(home->bandwidth_bytes_per_s == 12.5e6);
  // 1 MB of payload = 691 packets of 1448 bytes, 1,045,606 bytes on the wire: 83.65 ms at 12.5 MB/s,
  // plus 15 ms latency.
  CHECK(home->wire_bytes(1'000'000) == 1'000'000 + 691 * 66);
  CHECK(std::chrono::duration<double>(home->ideal_transfer_time(1'000'000)).count() == doctest::Approx(0.015 + 1045606 / 12.5e6));
  CHECK(link_profile_preset("loopback")->ideal_transfer_time(1 << 30) == Nanos(0));
  CHECK(link_profile_preset("mars").status().message().find("cross-region") != std::string::npos);
  for (const auto& name : link_profile_names()) CHECK(link_profile_preset(name)->validate().ok());
  LinkProfile bad = *home;
  bad.loss = 1.0;
  CHECK_FALSE(bad.validate().ok());
}

#include "transport/tags.h"

TEST_CASE("tags: the table's ranges are disjoint, and the check catches an overlap") {
  CHECK(tags::disjoint());
  // Group epochs once sat inside Streaming DiLoCo's fragment range (0x0E90C000 is fragment 0x90).
  CHECK(tags::overlaps(tags::kStreaming, tags::kStreaming | 0xFFFFFFu, 0x0E90C000u, 0x0E90C000u));
  CHECK_FALSE(tags::overlaps(tags::kStreaming, tags::kStreaming | 0xFFFFFFu, tags::kEpoch, tags::kEpoch));
  for (const auto& r : tags::kRanges) {
    CHECK(r.first <= r.last);
    if (r.collective) CHECK((r.last & tags::kMeanPhase) == 0);
  }
  // Pinned values: they travel on the wire.
  CHECK(tags::kDiLoCo == 0x0D010000u);
  CHECK(tags::kStreaming == 0x0E000000u);
  CHECK(tags::kEpoch == 0x0F0E0000u);
  CHECK(tags::kLane == 0xFFFFFFF0u);
}
