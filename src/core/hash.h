// Digest: BLAKE2b-256 through libsodium (a vetted implementation, about 1 GB/s per core). Used to
// verify checkpoints and, later, that peers hold bit-identical state. Incremental hashing through
// Hasher; Hasher is a single-threaded value.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/bytes.h"

namespace gossamer {

struct Digest {
  std::array<std::uint8_t, 32> bytes{};
  std::string hex() const;
  friend bool operator==(const Digest&, const Digest&) = default;
  friend auto operator<=>(const Digest&, const Digest&) = default;
};

class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void update(ByteView data);
  Digest finish();

 private:
  alignas(64) std::array<unsigned char, 384> state_;  // crypto_generichash_state, kept opaque here
};

Digest digest_of(ByteView data);

}  // namespace gossamer
