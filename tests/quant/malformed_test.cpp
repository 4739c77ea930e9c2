// Decoding is a hostile-input boundary: every malformed payload gets the right error, never a crash,
// an out-of-bounds read or an unbounded allocation.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <random>

#include "core/wire.h"
#include "quant/codec.h"

using namespace gossamer;
using namespace gossamer::quant;

namespace {

Bytes sample(CodecId c, bool zstd = false) {
  EncodeOptions o;
  o.codec = c;
  o.block_size = 16;
  o.zstd = zstd;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(c) + 1);
  return encode(torch::randn({5, 20}, gen), o);
}

// Header offsets (see codec.h).
constexpr std::size_t kVersion = 4, kCodec = 5, kDtype = 6, kFlags = 7, kNdim = 8, kScaleFmt = 9, kReserved = 10,
                      kBlock = 12, kDims = 16;

ErrorCode code_of(const Bytes& b) { return decode(b).status().code(); }

void put_u32(Bytes& b, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<std::byte>(v >> (8 * i));
}
void put_i64(Bytes& b, std::size_t at, std::int64_t v) {
  for (int i = 0; i < 8; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<std::byte>(static_cast<std::uint64_t>(v) >> (8 * i));
}

}  // namespace

TEST_CASE("every truncation is reported as data loss or malformed, never decoded") {
  for (int c = 0; c < kNumCodecs; ++c) {
    for (bool zstd : {false, true}) {
      const Bytes good = sample(static_cast<CodecId>(c), zstd);
      REQUIRE(decode(good).ok());
      for (std::size_t n = 0; n < good.size(); ++n) {
        auto r = decode(ByteView(good).first(n));
        REQUIRE_FALSE(r.ok());
        const ErrorCode e = r.status().code();
        CHECK((e == ErrorCode::kDataLoss || e == ErrorCode::kMalformed));
      }
    }
  }
}

TEST_CASE("inconsistent or absurd headers are refused with the right error") {
  const Bytes good = sample(CodecId::kInt8);
  Bytes b = good;
  SUBCASE("bad magic") {
    b[0] = std::byte{'X'};
    CHECK(code_of(b) == ErrorCode::kMalformed);
  }
  SUBCASE("newer version") {
    b[kVersion] = std::byte{2};
    CHECK(code_of(b) == ErrorCode::kVersionMismatch);
    CHECK(decode(b).status().message().find("upgrade") != std::string::npos);
  }
  SUBCASE("unknown codec") {
    b[kCodec] = std::byte{200};
    CHECK(code_of(b) == ErrorCode::kMalformed);
    CHECK(decode(b).status().message().find("unknown codec") != std::string::npos);
  }
  SUBCASE("unknown dtype, flags, scale format, reserved bits") {
    Bytes d = b, f = b, s = b, r = b;
    d[kDtype] = std::byte{9};
    f[kFlags] = std::byte{0x80};
    s[kScaleFmt] = std::byte{7};
    r[kReserved] = std::byte{1};
    CHECK(code_of(d) == ErrorCode::kMalformed);
    CHECK(code_of(f) == ErrorCode::kMalformed);
    CHECK(code_of(s) == ErrorCode::kMalformed);
    CHECK(code_of(r) == ErrorCode::kMalformed);
  }
  SUBCASE("absurd block sizes") {
    put_u32(b, kBlock, 0);
    CHECK(code_of(b) == ErrorCode::kMalformed);
    put_u32(b, kBlock, 0xFFFFFFFFu);
    CHECK(code_of(b) == ErrorCode::kMalformed);
  }
  SUBCASE("shape that does not match the byte count") {
    put_i64(b, kDims, 6);  // 6 x 20 instead of 5 x 20
    CHECK(code_of(b) == ErrorCode::kMalformed);
    CHECK(decode(b).status().message().find("does not match") != std::string::npos);
  }
  SUBCASE("oversized shapes are refused before any allocation") {
    put_i64(b, kDims, std::int64_t{1} << 40);
    CHECK(code_of(b) == ErrorCode::kMalformed);
    put_i64(b, kDims, std::int64_t{1} << 30);
    put_i64(b, kDims + 8, std::int64_t{1} << 30);  // product overflows the cap
    CHECK(code_of(b) == ErrorCode::kMalformed);
    put_i64(b, kDims, -1);
    CHECK(code_of(b) == ErrorCode::kMalformed);
  }
  SUBCASE("too many dimensions") {
    b[kNdim] = std::byte{40};
    CHECK(code_of(b) == ErrorCode::kMalformed);
  }
  SUBCASE("trailing bytes") {
    b.push_back(std::byte{0});
    CHECK(code_of(b) == ErrorCode::kDataLoss);
  }
}

TEST_CASE("NaN, Inf and negative scales from a peer are dropped, not decoded") {
  SUBCASE("fp32 NaN") {
    Bytes b = sample(CodecId::kFp32);
    put_u32(b, b.size() - 4, 0x7FC00000u);
    CHECK(code_of(b) == ErrorCode::kMalformed);
  }
  SUBCASE("negative and infinite scales") {
    Bytes b = sample(CodecId::kInt8);
    auto info = inspect(b);
    REQUIRE(info.ok());
    const std::size_t scale_at = info->header_bytes;
    Bytes neg = b, inf = b;
    put_u32(neg, scale_at, std::bit_cast<std::uint32_t>(-1.0f));
    put_u32(inf, scale_at, 0x7F800000u);
    CHECK(code_of(neg) == ErrorCode::kMalformed);
    CHECK(code_of(inf) == ErrorCode::kMalformed);
  }
  SUBCASE("fp8 E4M3 NaN code") {
    Bytes b = sample(CodecId::kFp8E4M3);
    b.back() = std::byte{0x7F};
    CHECK(code_of(b) == ErrorCode::kMalformed);
  }
  SUBCASE("a zstd bomb cannot lie about its size") {
    Bytes b = sample(CodecId::kFp32, true);
    auto info = inspect(b);
    REQUIRE(info.ok());
    // raw_len sits just before the body; claim a bigger raw size than the shape implies.
    put_i64(b, info->header_bytes - 8, std::int64_t{1} << 33);
    CHECK(code_of(b) == ErrorCode::kMalformed);
  }
}

TEST_CASE("a receiver's element cap bounds what a small zstd payload can make it allocate") {
  EncodeOptions o;
  o.codec = CodecId::kFp32;
  o.zstd = true;
  const Bytes bomb = encode(torch::zeros({1 << 20}), o);  // 4 MiB of zeros in a few hundred bytes
  CHECK(bomb.size() < 4096);
  auto r = decode(bomb, 1 << 16);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == ErrorCode::kOutOfRange);
  CHECK(r.status().message().find("this receiver accepts") != std::string::npos);
  CHECK(decode(bomb, 1 << 20).ok());
}

TEST_CASE("seeded mutation: 30000 mutated payloads decode or fail cleanly") {
  std::mt19937_64 rng(2024);
  std::vector<Bytes> seeds;
  for (int c = 0; c < kNumCodecs; ++c) {
    seeds.push_back(sample(static_cast<CodecId>(c)));
    seeds.push_back(sample(static_cast<CodecId>(c), true));
  }
  int ok = 0, failed = 0;
  for (int trial = 0; trial < 30000; ++trial) {
    Bytes b = seeds[rng() % seeds.size()];
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 4) {
        case 0: b[rng() % b.size()] ^= static_cast<std::byte>(1u << (rng() % 8)); break;  // bit flip
        case 1: b[rng() % b.size()] = static_cast<std::byte>(rng()); break;               // random byte
        case 2: b.resize(rng() % (b.size() + 1)); break;                                   // truncate
        case 3: b.insert(b.begin() + static_cast<std::ptrdiff_t>(rng() % (b.size() + 1)), static_cast<std::byte>(rng())); break;
      }
      if (b.empty()) b.push_back(std::byte{0});
    }
    auto r = decode(b);
    if (r.ok()) {
      ++ok;
      auto info = inspect(b);
      REQUIRE(info.ok());
      CHECK(r->numel() == info->numel);
      CHECK(torch::isfinite(*r).all().item<bool>());
    } else {
      ++failed;
    }
  }
  MESSAGE("mutated payloads: " << ok << " decoded, " << failed << " refused");
  CHECK(failed > 0);
  CHECK(ok > 0);  // bit flips inside values still decode: the mutation reached the body
}
