#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/wire.h"

using namespace gossamer;

TEST_CASE("Writer output is little-endian, field by field (golden bytes)") {
  Writer w;
  w.u8(0x01);
  w.u16(0x0203);
  w.u32(0x04050607);
  w.u64(0x08090A0B0C0D0E0Full);
  w.f32(1.0f);
  w.str("hi");
  const std::vector<int> expected = {0x01, 0x03, 0x02, 0x07, 0x06, 0x05, 0x04, 0x0F, 0x0E, 0x0D, 0x0C, 0x0B, 0x0A,
                                     0x09, 0x08, 0x00, 0x00, 0x80, 0x3F, 0x02, 0x00, 0x00, 0x00, 'h',  'i'};
  REQUIRE(w.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(static_cast<int>(w.bytes()[i]) == expected[i]);
}

TEST_CASE("Reader round-trips every field type") {
  Writer w;
  w.u8(250);
  w.u16(65000);
  w.u32(4000000000u);
  w.u64(std::numeric_limits<std::uint64_t>::max());
  w.i32(-5);
  w.i64(std::numeric_limits<std::int64_t>::min());
  w.f32(-2.5f);
  w.f64(std::numeric_limits<double>::denorm_min());
  w.str("gossamer");
  Reader r(w.bytes());
  CHECK(r.u8() == 250);
  CHECK(r.u16() == 65000);
  CHECK(r.u32() == 4000000000u);
  CHECK(r.u64() == std::numeric_limits<std::uint64_t>::max());
  CHECK(r.i32() == -5);
  CHECK(r.i64() == std::numeric_limits<std::int64_t>::min());
  CHECK(r.f32() == -2.5f);
  CHECK(r.f64() == std::numeric_limits<double>::denorm_min());
  CHECK(r.str(100) == "gossamer");
  r.expect_end();
  CHECK(r.ok());
}

TEST_CASE("Reader rejects truncation, oversized lengths and trailing bytes without reading out of bounds") {
  Writer w;
  w.u32(7);
  w.str("abcdef");
  const Bytes& b = w.bytes();

  SUBCASE("truncated") {
    Reader r(ByteView(b).first(6), "test frame");
    CHECK(r.u32() == 7);
    CHECK(r.str(100).empty());
    CHECK_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::kDataLoss);
    CHECK(r.status().message().find("test frame") != std::string::npos);
    // Sticky: later reads return zero and keep the first error.
    CHECK(r.u64() == 0);
    CHECK(r.status().code() == ErrorCode::kDataLoss);
  }
  SUBCASE("length above the cap is refused before reading") {
    Reader r(b);
    (void)r.u32();
    CHECK(r.str(5).empty());
    CHECK(r.status().code() == ErrorCode::kOutOfRange);
  }
  SUBCASE("huge declared length") {
    Writer evil;
    evil.u32(0xFFFFFFFFu);
    Reader r(evil.bytes());
    CHECK(r.blob(std::numeric_limits<std::size_t>::max()).empty());
    CHECK(r.status().code() == ErrorCode::kDataLoss);
  }
  SUBCASE("trailing bytes") {
    Reader r(b);
    (void)r.u32();
    r.expect_end();
    CHECK(r.status().code() == ErrorCode::kMalformed);
  }
}

TEST_CASE("Reader survives random garbage") {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    Bytes junk(static_cast<std::size_t>(rng() % 64));
    for (auto& x : junk) x = static_cast<std::byte>(rng());
    Reader r(junk);
    (void)r.u16();
    (void)r.str(32);
    (void)r.blob(1 << 20);
    (void)r.f64();
    CHECK(r.position() <= junk.size());
  }
}

TEST_CASE("varints: golden bytes, round trips at every width, and the malformed ones refused") {
  Writer w;
  w.uvar(0);
  w.uvar(127);
  w.uvar(128);
  w.uvar(300);
  const std::vector<int> expected = {0x00, 0x7F, 0x80, 0x01, 0xAC, 0x02};
  REQUIRE(w.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(static_cast<int>(w.bytes()[i]) == expected[i]);

  for (int bits = 0; bits <= 64; ++bits) {
    const std::uint64_t v = bits == 64 ? std::numeric_limits<std::uint64_t>::max() : (std::uint64_t{1} << bits) - 1;
    Writer one;
    one.uvar(v);
    CHECK(one.size() == static_cast<std::size_t>(std::max(1, (bits + 6) / 7)));
    Reader r(one.bytes());
    CHECK(r.uvar() == v);
    r.expect_end();
    CHECK(r.ok());
  }
  Writer text;
  text.vstr("tcp");
  text.vblob(as_bytes(std::string_view("")));
  Reader tr(text.bytes());
  CHECK(tr.vstr(3) == "tcp");
  CHECK(tr.vblob(0).empty());
  tr.expect_end();
  CHECK(tr.ok());

  const auto refused = [](std::vector<std::uint8_t> bytes, std::uint64_t max) {
    Bytes b;
    for (auto x : bytes) b.push_back(static_cast<std::byte>(x));
    Reader r(b);
    (void)r.uvar(max);
    return r.ok() ? ErrorCode::kOk : r.status().code();
  };
  CHECK(refused({0x80, 0x80}, UINT64_MAX) == ErrorCode::kDataLoss);                          // truncated
  CHECK(refused({0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x02}, UINT64_MAX) == ErrorCode::kMalformed);  // 65 bits
  CHECK(refused({0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x81, 0x00}, UINT64_MAX) == ErrorCode::kMalformed);  // 11 bytes
  CHECK(refused({0xAC, 0x02}, 299) == ErrorCode::kOutOfRange);  // over the caller's cap
  CHECK(refused({0xAC, 0x02}, 300) == ErrorCode::kOk);
  // A text's length over its cap is refused before anything is read.
  Writer big;
  big.vstr(std::string(100, 'x'));
  Reader br(big.bytes());
  CHECK(br.vstr(99).empty());
  CHECK(br.status().code() == ErrorCode::kOutOfRange);
}
