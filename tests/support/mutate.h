// Seeded mutations of valid wire messages, for the hostile-input tests of every network decoder:
// each call changes a copy in one of the ways a broken or malicious sender would (flipped bits, bytes
// set to boundary values, a cut, junk appended, a span repeated or dropped, a 4- or 8-byte field set
// to a huge or zero value). Deterministic for a seed, so a failure reproduces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>

#include "core/bytes.h"

namespace gossamer::testing {

inline Bytes mutate(const Bytes& in, std::mt19937_64& rng) {
  Bytes out = in;
  const auto pick = [&](std::size_t n) { return n == 0 ? std::size_t{0} : static_cast<std::size_t>(rng() % n); };
  const int rounds = 1 + static_cast<int>(rng() % 3);
  for (int k = 0; k < rounds; ++k) {
    switch (rng() % 8) {
      case 0:  // a flipped bit
        if (!out.empty()) out[pick(out.size())] ^= static_cast<std::byte>(1u << (rng() % 8));
        break;
      case 1: {  // a byte set to a boundary value
        static constexpr std::uint8_t kEdges[] = {0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF};
        if (!out.empty()) out[pick(out.size())] = static_cast<std::byte>(kEdges[rng() % 6]);
        break;
      }
      case 2:  // cut short
        out.resize(pick(out.size() + 1));
        break;
      case 3: {  // junk appended
        const std::size_t n = 1 + pick(64);
        for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<std::byte>(rng()));
        break;
      }
      case 4: {  // a span repeated
        if (out.empty()) break;
        const std::size_t at = pick(out.size()), n = 1 + pick(std::min<std::size_t>(out.size() - at, 32));
        Bytes span(out.begin() + static_cast<std::ptrdiff_t>(at), out.begin() + static_cast<std::ptrdiff_t>(at + n));
        out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), span.begin(), span.end());
        break;
      }
      case 5: {  // a span dropped
        if (out.empty()) break;
        const std::size_t at = pick(out.size()), n = 1 + pick(std::min<std::size_t>(out.size() - at, 32));
        out.erase(out.begin() + static_cast<std::ptrdiff_t>(at), out.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 6: {  // a 4-byte field (a count or a length) made huge or zero
        if (out.size() < 4) break;
        const std::uint32_t v = rng() % 2 == 0 ? 0xFFFFFFFFu : (rng() % 2 == 0 ? 0u : 0x7FFFFFFFu);
        std::memcpy(out.data() + pick(out.size() - 3), &v, 4);
        break;
      }
      default: {  // an 8-byte field made huge
        if (out.size() < 8) break;
        const std::uint64_t v = rng() % 2 == 0 ? ~std::uint64_t{0} : (std::uint64_t{1} << 63);
        std::memcpy(out.data() + pick(out.size() - 7), &v, 8);
        break;
      }
    }
  }
  return out;
}

}  // namespace gossamer::testing
