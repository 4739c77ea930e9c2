// A kept update's bytes (runtime/update_codec.h): fp32 and the codec's own payloads round-trip bit for
// bit, golden bytes pin the layout, and malformed or mutated updates are refused without a crash.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "quant/codec.h"
#include "runtime/update_codec.h"
#include "support/mutate.h"

using namespace gossamer;
using namespace gossamer::runtime;

namespace {

std::vector<float> values(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i)) * 3.0f;
  return v;
}

// The payloads of `v` in int8, cut in segments as the all-reduce cuts a chunk.
std::vector<Bytes> int8_payloads(const std::vector<float>& v, std::size_t segment) {
  quant::EncodeOptions o;
  o.codec = quant::CodecId::kInt8;
  o.block_size = 32;
  std::vector<Bytes> out;
  for (std::size_t at = 0; at < v.size(); at += segment) {
    const auto n = std::min(segment, v.size() - at);
    out.push_back(quant::encode_view(std::span<const float>(v.data() + at, n), o).head);
  }
  return out;
}

// What a rank holds after the all-reduce: the payloads decoded one after another.
std::vector<float> decoded(const std::vector<Bytes>& payloads) {
  std::vector<float> out;
  for (const auto& p : payloads) {
    auto t = quant::decode(p);
    REQUIRE(t.ok());
    out.insert(out.end(), t->data_ptr<float>(), t->data_ptr<float>() + t->numel());
  }
  return out;
}

Status decode(const Bytes& b, std::vector<float>& out, std::int64_t max = 1 << 20) {
  auto n = update_values(b, max);
  if (!n.ok()) return n.status();
  out.assign(static_cast<std::size_t>(*n), 0.0f);
  return decode_update(b, out);
}

std::string hex(const Bytes& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (std::byte x : b) {
    s += d[static_cast<unsigned>(x) >> 4];
    s += d[static_cast<unsigned>(x) & 15];
  }
  return s;
}

}  // namespace

TEST_CASE("an update round-trips bit for bit in fp32 and in the codec's own payloads, which cost a fraction of fp32") {
  const auto v = values(1000);
  const Bytes fp32 = encode_update(v);
  CHECK(fp32.size() == kUpdateHeaderBytes + 4000);
  std::vector<float> back;
  REQUIRE(decode(fp32, back).ok());
  CHECK(back == v);

  const auto payloads = int8_payloads(v, 300);  // 4 payloads, the last one short
  const auto held = decoded(payloads);
  const Bytes packed = encode_update(held, payloads);
  CHECK(packed.size() < fp32.size() / 3);  // int8 with a scale per 32 values, plus headers
  REQUIRE(decode(packed, back).ok());
  CHECK(std::memcmp(back.data(), held.data(), held.size() * 4) == 0);

  const Bytes empty = encode_update(std::span<const float>());
  REQUIRE(decode(empty, back).ok());
  CHECK(back.empty());
}

TEST_CASE("golden bytes pin the update layout") {
  const std::vector<float> v{1.0f, -2.0f};
  CHECK(hex(encode_update(v)) == "47555044" "01" "00" "0000" "0200000000000000" "0000803f" "000000c0");
  // One fp32 payload of the two values: count 1, its length, then the quantized tensor's own bytes.
  quant::EncodeOptions o;
  const Bytes p = quant::encode_view(std::span<const float>(v), o).head;
  const Bytes b = encode_update(v, std::vector<Bytes>{p});
  CHECK(hex(Bytes(b.begin(), b.begin() + 24)) == "47555044" "01" "01" "0000" "0200000000000000" "01000000" + hex(Bytes{
                                                       static_cast<std::byte>(p.size()), std::byte{0}, std::byte{0}, std::byte{0}}));
  CHECK(b.size() == kUpdateHeaderBytes + 4 + 4 + p.size());
}

TEST_CASE("malformed updates are refused with the right error") {
  const auto v = values(64);
  const Bytes good = encode_update(v);
  std::vector<float> out;
  auto refused = [&](Bytes b, ErrorCode code, std::int64_t max = 1 << 20) {
    const Status st = decode(b, out, max);
    CHECK_FALSE(st.ok());
    CHECK(st.code() == code);
  };
  Bytes b = good;
  b[0] = std::byte{'X'};
  refused(b, ErrorCode::kMalformed);  // not an update
  b = good;
  b[4] = std::byte{2};
  refused(b, ErrorCode::kVersionMismatch);
  b = good;
  b[5] = std::byte{7};
  refused(b, ErrorCode::kMalformed);  // unknown kind
  b = good;
  b[6] = std::byte{1};
  refused(b, ErrorCode::kMalformed);  // reserved
  refused(good, ErrorCode::kOutOfRange, 63);  // more values than the caller expects
  b = good;
  b.pop_back();
  refused(b, ErrorCode::kMalformed);  // body short of its values
  b = good;
  b.push_back(std::byte{0});
  refused(b, ErrorCode::kMalformed);
  auto nan = v;
  nan[5] = std::numeric_limits<float>::quiet_NaN();
  refused(encode_update(nan), ErrorCode::kMalformed);
  refused(Bytes(good.begin(), good.begin() + 10), ErrorCode::kDataLoss);  // cut in its header

  // Payloads: fewer values than the header says, more, a count that cannot fit, trailing bytes.
  const auto payloads = int8_payloads(v, 32);
  const auto held = decoded(payloads);
  refused(encode_update(std::span<const float>(held.data(), held.size()), std::vector<Bytes>{payloads[0]}), ErrorCode::kMalformed);
  CHECK_FALSE(decode(encode_update(std::span<const float>(held.data(), 32), payloads), out).ok());  // more values than it says
  b = encode_update(held, payloads);
  b[16] = std::byte{0xFF};
  b[17] = std::byte{0xFF};
  refused(b, ErrorCode::kMalformed);
  b = encode_update(held, payloads);
  b.push_back(std::byte{0});
  CHECK_FALSE(decode(b, out).ok());
  // decode_update wants exactly the values update_values() named.
  out.assign(10, 0.0f);
  CHECK(decode_update(good, out).code() == ErrorCode::kOutOfRange);
}

TEST_CASE("seeded mutations of updates are refused or taken within bounds, never a crash") {
  std::mt19937_64 rng(2026);
  const auto v = values(200);
  const auto payloads = int8_payloads(v, 64);
  const std::vector<Bytes> valid{encode_update(v), encode_update(decoded(payloads), payloads)};
  int accepted = 0, refused = 0;
  for (int k = 0; k < 4000; ++k) {
    const Bytes m = testing::mutate(valid[static_cast<std::size_t>(k) % valid.size()], rng);
    std::vector<float> out;
    const Status st = decode(m, out, 256);
    if (!st.ok()) {
      ++refused;
      continue;
    }
    ++accepted;
    CHECK(out.size() <= 256);
    for (float f : out) CHECK(std::isfinite(f));
  }
  CHECK(refused > 0);
  MESSAGE("mutations accepted " << accepted << ", refused " << refused);
}

TEST_CASE("an all-reduce's empty segment (a payload of no values) is part of a valid update") {
  const auto v = values(10);
  quant::EncodeOptions o;
  o.codec = quant::CodecId::kInt8;
  o.block_size = 32;
  const std::vector<Bytes> payloads{quant::encode_view(std::span<const float>(v.data(), 10), o).head,
                                    quant::encode_view(std::span<const float>(v.data(), std::size_t{0}), o).head};
  const auto held = decoded(payloads);
  std::vector<float> out;
  REQUIRE(decode(encode_update(held, payloads), out).ok());
  CHECK(std::memcmp(out.data(), held.data(), held.size() * 4) == 0);
}
