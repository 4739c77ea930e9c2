#include "core/hash.h"

#include <sodium.h>

#include <cstring>

#include "core/check.h"

namespace gossamer {

static_assert(sizeof(crypto_generichash_state) <= 384, "Hasher::state_ too small for libsodium's state");

namespace {
crypto_generichash_state* as_state(std::array<unsigned char, 384>& s) {
  return reinterpret_cast<crypto_generichash_state*>(s.data());
}
void ensure_sodium() {
  static const int rc = sodium_init();  // thread-safe, idempotent
  GOSSAMER_CHECK(rc >= 0, "libsodium failed to initialize");
}
}  // namespace

std::string Digest::hex() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (auto b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xF]);
  }
  return out;
}

Hasher::Hasher() {
  ensure_sodium();
  crypto_generichash_init(as_state(state_), nullptr, 0, 32);
}

Hasher::~Hasher() { sodium_memzero(state_.data(), state_.size()); }

void Hasher::update(ByteView data) {
  crypto_generichash_update(as_state(state_), reinterpret_cast<const unsigned char*>(data.data()), data.size());
}

Digest Hasher::finish() {
  Digest d;
  crypto_generichash_final(as_state(state_), d.bytes.data(), d.bytes.size());
  return d;
}

Digest digest_of(ByteView data) {
  Hasher h;
  h.update(data);
  return h.finish();
}

}  // namespace gossamer
