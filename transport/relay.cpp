#include "transport/relay.h"

#include <chrono>
#include <cstring>

#include <sodium.h>

#include "core/wire.h"

namespace gossamer::transport {

namespace {

constexpr char kMagic[4] = {'G', 'S', 'R', 'Y'};
constexpr std::size_t kSignedBytes = 80;

// The tag's key: the run key, labelled for this use only.
std::array<std::uint8_t, crypto_auth_hmacsha256_BYTES> relay_tag(const RunKey& key, const std::uint8_t* signed_bytes) {
  static constexpr char kLabel[] = "gossamer-relay-v2";
  std::array<std::uint8_t, 32> derived{};
  crypto_generichash(derived.data(), derived.size(), reinterpret_cast<const unsigned char*>(kLabel), sizeof(kLabel) - 1, key.bytes.data(),
                     key.bytes.size());
  std::array<std::uint8_t, crypto_auth_hmacsha256_BYTES> tag{};
  crypto_auth_hmacsha256(tag.data(), signed_bytes, kSignedBytes, derived.data());
  sodium_memzero(derived.data(), derived.size());
  return tag;
}

}  // namespace

std::uint64_t relay_time_now() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

bool is_relay_magic(ByteView first4) { return first4.size() >= 4 && std::memcmp(first4.data(), kMagic, 4) == 0; }

Bytes encode_relay_request(const RelayRequest& request, const std::optional<RunKey>& key) {
  Writer w(kRelayRequestBytes);
  w.raw(as_bytes(std::string_view(kMagic, 4)));
  w.u8(kRelayVersion);
  w.u8(0);
  w.u16(0);
  w.raw(ByteView(reinterpret_cast<const std::byte*>(request.run.bytes.data()), request.run.bytes.size()));
  w.u64(request.from.value);
  w.u64(request.to.value);
  w.u64(request.session);
  w.u64(request.relay.value);
  w.u64(request.time_ms);
  w.raw(ByteView(reinterpret_cast<const std::byte*>(request.nonce.data()), request.nonce.size()));
  Bytes out = std::move(w).take();
  std::array<std::uint8_t, crypto_auth_hmacsha256_BYTES> tag{};
  if (key) tag = relay_tag(*key, reinterpret_cast<const std::uint8_t*>(out.data()));
  const auto* t = reinterpret_cast<const std::byte*>(tag.data());
  out.insert(out.end(), t, t + tag.size());
  return out;
}

Result<RelayRequest> decode_relay_request(ByteView bytes, const std::optional<RunKey>& key) {
  if (bytes.size() != kRelayRequestBytes) return error(ErrorCode::kMalformed, "a relay request is " + std::to_string(kRelayRequestBytes) + " bytes");
  Reader r(bytes, "relay request");
  ByteView magic = r.raw(4);
  const std::uint8_t version = r.u8(), zero8 = r.u8();
  const std::uint16_t zero16 = r.u16();
  RelayRequest out;
  ByteView run = r.raw(out.run.bytes.size());
  out.from = PeerId{r.u64()};
  out.to = PeerId{r.u64()};
  out.session = r.u64();
  out.relay = PeerId{r.u64()};
  out.time_ms = r.u64();
  ByteView nonce = r.raw(out.nonce.size());
  ByteView tag = r.raw(crypto_auth_hmacsha256_BYTES);
  r.expect_end();
  if (!r.ok()) return r.status();
  if (std::memcmp(magic.data(), kMagic, 4) != 0) return error(ErrorCode::kMalformed, "not a relay request");
  if (version != kRelayVersion) return error(ErrorCode::kVersionMismatch, "relay request version " + std::to_string(version) + " (we speak " + std::to_string(kRelayVersion) + ")");
  if (zero8 != 0 || zero16 != 0) return error(ErrorCode::kMalformed, "relay request with reserved bytes set");
  std::memcpy(out.run.bytes.data(), run.data(), out.run.bytes.size());
  std::memcpy(out.nonce.data(), nonce.data(), out.nonce.size());
  std::array<std::uint8_t, crypto_auth_hmacsha256_BYTES> want{};
  if (key) want = relay_tag(*key, reinterpret_cast<const std::uint8_t*>(bytes.data()));
  if (sodium_memcmp(want.data(), tag.data(), want.size()) != 0) {
    return error(ErrorCode::kUnauthenticated, key ? "relay request not signed with this run's key" : "a signed relay request in a run without a key");
  }
  if (out.relay.value == 0) return error(ErrorCode::kMalformed, "relay request naming no relay");
  if (out.from.value == 0 || out.to.value == 0 || out.from == out.to) return error(ErrorCode::kMalformed, "relay request between peers " + out.from.to_string() + " and " + out.to.to_string());
  return out;
}

Bytes encode_relay_answer(RelayStatus status) {
  Writer w(kRelayAnswerBytes);
  w.raw(as_bytes(std::string_view(kMagic, 4)));
  w.u8(static_cast<std::uint8_t>(status));
  w.u8(0);
  w.u16(0);
  return std::move(w).take();
}

Result<RelayStatus> decode_relay_answer(ByteView bytes) {
  if (bytes.size() != kRelayAnswerBytes || !is_relay_magic(bytes)) return error(ErrorCode::kMalformed, "not a relay answer");
  const auto status = static_cast<std::uint8_t>(bytes[4]);
  if (status > static_cast<std::uint8_t>(RelayStatus::kStale) || bytes[5] != std::byte{0} || bytes[6] != std::byte{0} || bytes[7] != std::byte{0}) {
    return error(ErrorCode::kMalformed, "relay answer with status " + std::to_string(status));
  }
  return static_cast<RelayStatus>(status);
}

}  // namespace gossamer::transport
