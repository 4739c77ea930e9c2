#include "transport/secure_channel.h"

#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <string>

#include "core/check.h"
#include "core/file.h"

namespace gossamer::transport {

namespace {

constexpr const char* kKeyFileTag = "gossamer-run-key-v1";

void ensure_sodium() {
  static const int rc = sodium_init();
  GOSSAMER_CHECK(rc >= 0, "libsodium failed to initialize");
}

}  // namespace

RunKey generate_run_key() {
  ensure_sodium();
  RunKey k;
  randombytes_buf(k.bytes.data(), k.bytes.size());
  return k;
}

Status write_run_key(const std::filesystem::path& path, const RunKey& key) {
  char hex[65];
  sodium_bin2hex(hex, sizeof(hex), key.bytes.data(), key.bytes.size());
  const std::string text = std::string(kKeyFileTag) + " " + hex + "\n";
  sodium_memzero(hex, sizeof(hex));
  if (Status st = write_file_atomic(path, as_bytes(text)); !st.ok()) return st;
  if (::chmod(path.c_str(), 0600) != 0) return error(ErrorCode::kIoError, "cannot restrict permissions of " + path.string());
  return Status();
}

Result<RunKey> read_run_key(const std::filesystem::path& path) {
  ensure_sodium();
  auto text = read_text_file(path, 4096);
  if (!text.ok()) return text.status().with_context("run key");
  const std::string prefix = std::string(kKeyFileTag) + " ";
  std::string s = *text;
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  if (s.rfind(prefix, 0) != 0 || s.size() != prefix.size() + 64) {
    return error(ErrorCode::kInvalidArgument, path.string() + " is not a Gossamer run key (make one with `gossamer keygen --out FILE`)");
  }
  RunKey k;
  std::size_t len = 0;
  if (sodium_hex2bin(k.bytes.data(), k.bytes.size(), s.data() + prefix.size(), 64, nullptr, &len, nullptr) != 0 || len != 32) {
    return error(ErrorCode::kInvalidArgument, path.string() + ": the key is not 64 hex digits");
  }
  return k;
}

KeyExchange::KeyExchange(const RunKey& key, bool initiator, ByteView hello_initiator, ByteView hello_responder)
    : key_(key), initiator_(initiator) {
  ensure_sodium();
  transcript_.assign(hello_initiator.begin(), hello_initiator.end());
  transcript_.insert(transcript_.end(), hello_responder.begin(), hello_responder.end());
  crypto_kx_keypair(pk_.data(), sk_.data());
  std::memcpy(auth_.data(), pk_.data(), 32);
  const auto tag = tag_for(initiator_, pk_.data());
  std::memcpy(auth_.data() + 32, tag.data(), 32);
}

KeyExchange::~KeyExchange() {
  sodium_memzero(sk_.data(), sk_.size());
  sodium_memzero(key_.bytes.data(), key_.bytes.size());
}

std::array<std::uint8_t, 32> KeyExchange::tag_for(bool initiator_side, const std::uint8_t* ephemeral_pk) const {
  static constexpr char kLabel[] = "gossamer-auth-v1";
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, key_.bytes.data(), key_.bytes.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(kLabel), sizeof(kLabel) - 1);
  const unsigned char role = initiator_side ? 'I' : 'R';
  crypto_auth_hmacsha256_update(&st, &role, 1);
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(transcript_.data()), transcript_.size());
  crypto_auth_hmacsha256_update(&st, ephemeral_pk, 32);
  std::array<std::uint8_t, 32> out{};
  crypto_auth_hmacsha256_final(&st, out.data());
  return out;
}

Result<SessionKeys> KeyExchange::finish(ByteView peer_auth, PeerId peer) const {
  if (peer_auth.size() != kAuthBytes) return error(ErrorCode::kMalformed, "AUTH message of the wrong size");
  const auto* p = reinterpret_cast<const std::uint8_t*>(peer_auth.data());
  const auto expected = tag_for(!initiator_, p);
  if (sodium_memcmp(expected.data(), p + 32, 32) != 0) {
    return error(ErrorCode::kUnauthenticated, "peer " + peer.to_string() + " does not hold this run's key: refused (check --key)");
  }
  SessionKeys raw, out;
  const int rc = initiator_ ? crypto_kx_client_session_keys(raw.rx.data(), raw.tx.data(), pk_.data(), sk_.data(), p)
                            : crypto_kx_server_session_keys(raw.rx.data(), raw.tx.data(), pk_.data(), sk_.data(), p);
  if (rc != 0) return error(ErrorCode::kUnauthenticated, "peer " + peer.to_string() + " sent an invalid ephemeral key");
  // Bind the session to the run key as well: a leaked ephemeral secret alone opens nothing.
  crypto_generichash(out.tx.data(), 32, raw.tx.data(), 32, key_.bytes.data(), key_.bytes.size());
  crypto_generichash(out.rx.data(), 32, raw.rx.data(), 32, key_.bytes.data(), key_.bytes.size());
  sodium_memzero(&raw, sizeof(raw));
  return out;
}

StreamSealer::StreamSealer(const std::array<std::uint8_t, 32>& key) {
  ensure_sodium();
  crypto_secretstream_xchacha20poly1305_init_push(&state_, header_.data(), key.data());
}

std::size_t StreamSealer::seal(ByteView plain, std::uint8_t* out) {
  GOSSAMER_CHECK(plain.size() <= kRecordPlaintext, "record plaintext too large");
  unsigned long long clen = 0;
  crypto_secretstream_xchacha20poly1305_push(&state_, out + 4, &clen, reinterpret_cast<const unsigned char*>(plain.data()), plain.size(),
                                             nullptr, 0, crypto_secretstream_xchacha20poly1305_TAG_MESSAGE);
  const auto n = static_cast<std::uint32_t>(clen);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(n >> (8 * i));
  return 4 + static_cast<std::size_t>(clen);
}

Status StreamOpener::init(const std::array<std::uint8_t, 32>& key, ByteView header) {
  ensure_sodium();
  if (header.size() != kStreamHeaderBytes ||
      crypto_secretstream_xchacha20poly1305_init_pull(&state_, reinterpret_cast<const unsigned char*>(header.data()), key.data()) != 0) {
    return error(ErrorCode::kUnauthenticated, "invalid stream header");
  }
  return Status();
}

Result<std::size_t> StreamOpener::open(ByteView ciphertext, std::uint8_t* out) {
  unsigned long long mlen = 0;
  unsigned char tag = 0;
  if (ciphertext.size() < kRecordOverhead ||
      crypto_secretstream_xchacha20poly1305_pull(&state_, out, &mlen, &tag, reinterpret_cast<const unsigned char*>(ciphertext.data()),
                                                 ciphertext.size(), nullptr, 0) != 0) {
    return error(ErrorCode::kUnauthenticated, "an encrypted record failed authentication (tampered, reordered or wrong key)");
  }
  if (tag != crypto_secretstream_xchacha20poly1305_TAG_MESSAGE) return error(ErrorCode::kMalformed, "unexpected stream tag");
  return static_cast<std::size_t>(mlen);
}

}  // namespace gossamer::transport
