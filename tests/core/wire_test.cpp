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
