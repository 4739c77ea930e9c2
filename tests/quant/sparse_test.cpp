#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/check.h"
#include "quant/sparse.h"

using namespace gossamer;
using namespace gossamer::quant;

namespace {

std::vector<float> gaussian(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> decode(const Bytes& payload, std::size_t n) {
  std::vector<float> out(n, 0.0f);
  REQUIRE(decode_sparse_add(payload, out).ok());
  return out;
}

}  // namespace

TEST_CASE("sparse payload: keeps the top-k of each chunk at two levels, as a hand computation says") {
  // One chunk of 8 with k = 4: kept |v| = 8, 5, 4, 1 (indices 1, 3, 6, 7); t = mean = 4.5, so the low bin
  // holds 4 and 1 (level 2.5) and the high bin 8 and 5 (level 6.5).
  const std::vector<float> v = {0.5f, -8.0f, 0.25f, 5.0f, 0.0f, -0.75f, 4.0f, -1.0f};
  const SparseOptions o{8, 4};
  std::vector<float> decoded(v.size());
  const Bytes p = encode_sparse(v, o, decoded);
  const std::vector<float> want = {0, -6.5f, 0, 6.5f, 0, 0, 2.5f, -2.5f};
  CHECK((decoded == want));
  CHECK((decode(p, v.size()) == want));
  CHECK(p.size() == sparse_payload_bytes(v.size(), o));
  // header + levels 8 + indices 4 x 3 bits (2 bytes) + codes 4 x 2 bits (1 byte)
  CHECK(p.size() == kSparseHeaderBytes + 8 + 2 + 1);
  auto info = inspect_sparse(p, 8);
  REQUIRE(info.ok());
  CHECK(info->numel == 8);
  CHECK(info->options.topk == 4);
  auto n2 = sparse_norm2(p, 8);
  REQUIRE(n2.ok());
  CHECK(*n2 == doctest::Approx(2 * 6.5 * 6.5 + 2 * 2.5 * 2.5));
}

TEST_CASE("sparse payload: version 1's bytes are pinned (a golden payload)") {
  // The hand example above, byte for byte: a change here is a wire-format change (docs/wire.md).
  const std::vector<float> v = {0.5f, -8.0f, 0.25f, 5.0f, 0.0f, -0.75f, 4.0f, -1.0f};
  const std::vector<unsigned> golden = {0x47, 0x53, 0x50, 0x52, 0x01, 0x02, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                        0x00, 0x08, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x00, 0x00, 0x00, 0x00,
                                        0x00, 0x00, 0x00, 0x00, 0x20, 0x40, 0x00, 0x00, 0xd0, 0x40, 0x99, 0x0f, 0x87};
  const Bytes p = encode_sparse(v, SparseOptions{8, 4});
  REQUIRE(p.size() == golden.size());
  for (std::size_t i = 0; i < golden.size(); ++i) CHECK(static_cast<unsigned>(p[i]) == golden[i]);
}

TEST_CASE("sparse payload: ties go to the lower index, a short last chunk keeps min(k, its length)") {
  const std::vector<float> v = {1, 1, 1, 1, 1, 2, -2};  // chunks of 5 and 2, k = 2
  std::vector<float> decoded(v.size());
  const Bytes p = encode_sparse(v, SparseOptions{5, 2}, decoded);
  CHECK((decoded == std::vector<float>{1, 1, 0, 0, 0, 2, -2}));
  CHECK(sparse_kept(7, SparseOptions{5, 2}) == 4);
  CHECK((decode(p, v.size()) == decoded));
}

TEST_CASE("sparse payload: its bytes are within 1% of the formula, and about 136x fewer than fp32") {
  const std::size_t n = 1'000'003;  // 245 chunks, the last one short
  const SparseOptions o;            // 64 of 4096
  const auto v = gaussian(n, 7);
  const Bytes p = encode_sparse(v, o);
  // Per full chunk: two fp32 levels, 64 indices of 12 bits, 64 codes of 2 bits.
  const double formula = 32 + static_cast<double>(n) / 4096 * (8 + 64 * (12 + 2) / 8.0);
  CHECK(std::abs(static_cast<double>(p.size()) - formula) / formula < 0.01);
  CHECK(static_cast<double>(n * 4) / static_cast<double>(p.size()) > 130);
  CHECK(sparse_bits_per_value(o) == doctest::Approx((64 + 64 * 14) / 4096.0));
}

TEST_CASE("sparse payload: a scale of -1 flips what travels, not what the sender keeps") {
  const auto v = gaussian(300, 3);
  std::vector<float> honest(v.size()), flipped(v.size());
  const Bytes a = encode_sparse(v, SparseOptions{100, 10}, honest);
  const Bytes b = encode_sparse(v, SparseOptions{100, 10}, flipped, -1.0);
  CHECK((honest == flipped));
  const auto da = decode(a, v.size()), db = decode(b, v.size());
  for (std::size_t i = 0; i < v.size(); ++i) CHECK(db[i] == -da[i]);
}

TEST_CASE("sparse payload: encoding NaN or bad options is a caller bug") {
  std::vector<float> v = {1, 2, std::nanf(""), 4};
  CHECK_THROWS_AS(encode_sparse(v, SparseOptions{4, 2}), ContractError);
  v[2] = 3;
  CHECK_THROWS_AS(encode_sparse(v, SparseOptions{4, 5}), ContractError);
  CHECK_THROWS_AS(encode_sparse(v, SparseOptions{1, 1}), ContractError);
}

TEST_CASE("sparse payload: every malformed or hostile variant is refused and leaves the sum untouched") {
  const auto v = gaussian(64, 11);
  const SparseOptions o{16, 4};
  const Bytes good = encode_sparse(v, o);
  std::vector<float> acc(64, 1.0f);
  auto refused = [&](const Bytes& bad) {
    std::vector<float> before = acc;
    const Status st = decode_sparse_add(bad, acc);
    CHECK_FALSE(st.ok());
    CHECK((acc == before));
    return st.code();
  };
  // Truncation anywhere, and a trailing byte.
  for (std::size_t len = 0; len < good.size(); len += 3) refused(Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)));
  Bytes longer = good;
  longer.push_back(std::byte{0});
  refused(longer);
  // The good payload with one header byte changed.
  auto with_byte = [&](std::size_t at, unsigned value) {
    Bytes changed = good;
    changed[at] = static_cast<std::byte>(value);
    return changed;
  };
  refused(with_byte(0, 'X'));                                       // magic
  CHECK(refused(with_byte(4, 9)) == ErrorCode::kVersionMismatch);  // version
  refused(with_byte(5, 3));                                         // value bits
  refused(with_byte(6, 1));                                         // reserved
  refused(with_byte(20, 17));                                       // topk > chunk
  refused(with_byte(16, 1));                                        // chunk of 1
  // More values than the receiver expects, and fewer.
  CHECK(inspect_sparse(good, 63).status().code() == ErrorCode::kOutOfRange);
  std::vector<float> small(32);
  CHECK_FALSE(decode_sparse_add(good, small).ok());
  Bytes b;
  // A level that is NaN, negative or out of order.
  const std::size_t levels = kSparseHeaderBytes;
  for (float bad : {std::nanf(""), -1.0f, INFINITY}) {
    b = good;
    std::memcpy(b.data() + levels, &bad, 4);
    refused(b);
  }
  b = good;
  const float big = 1e30f;
  std::memcpy(b.data() + levels, &big, 4);  // low level above the high one
  refused(b);
  // Indices: the first two of chunk 0 made equal (not strictly increasing). 4 bits each.
  b = good;
  const std::size_t idx = levels + 4 * 8;
  const auto first = static_cast<unsigned>(b[idx]) & 0x0Fu;
  b[idx] = static_cast<std::byte>(first | (first << 4));
  refused(b);
  // Nothing that was accepted is ever non-finite: a fuzz-like sweep of single-byte flips.
  std::mt19937 rng(5);
  for (int t = 0; t < 2000; ++t) {
    b = good;
    b[rng() % b.size()] ^= static_cast<std::byte>(1u << (rng() % 8));
    std::vector<float> out(64, 0.0f);
    if (decode_sparse_add(b, out).ok()) {
      for (float x : out) CHECK(std::isfinite(x));
    }
  }
}
