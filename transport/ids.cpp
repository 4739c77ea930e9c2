#include "transport/ids.h"

#include "core/check.h"

#include <sodium.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

namespace gossamer::transport {

namespace {
void ensure_sodium() {
  static const int rc = sodium_init();  // thread-safe, idempotent; < 0 only if no entropy source exists
  GOSSAMER_CHECK(rc >= 0, "libsodium failed to initialize (no entropy source?)");
}
}  // namespace

std::string PeerId::to_string() const {
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, value);
  return buf;
}

std::string RunId::to_string() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (auto b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

PeerId random_peer_id() {
  ensure_sodium();
  PeerId id;
  while (id.value == 0) randombytes_buf(&id.value, sizeof(id.value));
  return id;
}

RunId random_run_id() {
  ensure_sodium();
  RunId id;
  randombytes_buf(id.bytes.data(), id.bytes.size());
  return id;
}

}  // namespace gossamer::transport
