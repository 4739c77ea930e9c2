// Authentication and encryption of links with vetted primitives only (libsodium): no home-made
// cipher. A run is secured by one 32-byte key (RunKey) that every peer holds, written by
// `gossamer keygen`.
//
// Handshake, after the plaintext HELLOs (both must announce kCapEncrypted):
//   each side sends AUTH = ephemeral X25519 public key (32) | HMAC-SHA-256 tag (32), the tag keyed
//   with the run key over ("gossamer-auth-v1", its role, both HELLOs, its ephemeral key); a peer
//   whose tag does not verify does not hold the run key and is refused. Session keys come from
//   crypto_kx (X25519, forward secret) bound to the run key with keyed BLAKE2b; each direction is
//   then a crypto_secretstream_xchacha20poly1305 stream (its 24-byte header is sent next).
// Records on the wire: ciphertext length u32 | ciphertext (<= kRecordPlaintext + 17 bytes).
// A record that fails authentication (tampered, replayed, reordered, wrong key) fails the link.
// Threading: a KeyExchange or a direction's stream state is used by one thread at a time.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>

#include <sodium.h>

#include "core/bytes.h"
#include "core/status.h"
#include "transport/ids.h"

namespace gossamer::transport {

inline constexpr std::size_t kAuthBytes = 64;
inline constexpr std::size_t kStreamHeaderBytes = crypto_secretstream_xchacha20poly1305_HEADERBYTES;
inline constexpr std::size_t kRecordOverhead = crypto_secretstream_xchacha20poly1305_ABYTES;
inline constexpr std::size_t kRecordPlaintext = std::size_t{1} << 20;

struct RunKey {
  std::array<std::uint8_t, 32> bytes{};
};

RunKey generate_run_key();
// Key files hold one line: "gossamer-run-key-v1 <64 hex digits>". Written with mode 0600.
[[nodiscard]] Status write_run_key(const std::filesystem::path& path, const RunKey& key);
[[nodiscard]] Result<RunKey> read_run_key(const std::filesystem::path& path);

struct SessionKeys {
  std::array<std::uint8_t, 32> tx{}, rx{};
};

// One side of the authenticated key exchange.
class KeyExchange {
 public:
  // `initiator`: this side connected. The HELLOs are the exact bytes each side sent.
  KeyExchange(const RunKey& key, bool initiator, ByteView hello_initiator, ByteView hello_responder);
  ~KeyExchange();
  KeyExchange(const KeyExchange&) = delete;
  KeyExchange& operator=(const KeyExchange&) = delete;

  const std::array<std::uint8_t, kAuthBytes>& auth_message() const { return auth_; }
  // Verifies the peer's AUTH and derives the session keys. kUnauthenticated if the peer does not
  // hold the run key.
  [[nodiscard]] Result<SessionKeys> finish(ByteView peer_auth, PeerId peer) const;

 private:
  std::array<std::uint8_t, 32> tag_for(bool initiator_side, const std::uint8_t* ephemeral_pk) const;
  RunKey key_;
  bool initiator_;
  Bytes transcript_;  // both HELLOs
  std::array<std::uint8_t, 32> pk_{}, sk_{};
  std::array<std::uint8_t, kAuthBytes> auth_{};
};

// Sealing side of one direction.
class StreamSealer {
 public:
  explicit StreamSealer(const std::array<std::uint8_t, 32>& key);
  const std::array<std::uint8_t, kStreamHeaderBytes>& header() const { return header_; }
  // Writes u32 length + ciphertext of `plain` (<= kRecordPlaintext) to out; returns bytes written.
  std::size_t seal(ByteView plain, std::uint8_t* out);

 private:
  crypto_secretstream_xchacha20poly1305_state state_;
  std::array<std::uint8_t, kStreamHeaderBytes> header_{};
};

// Opening side of one direction.
class StreamOpener {
 public:
  [[nodiscard]] Status init(const std::array<std::uint8_t, 32>& key, ByteView header);
  // Decrypts one record's ciphertext into out (room for ciphertext.size() - kRecordOverhead bytes).
  [[nodiscard]] Result<std::size_t> open(ByteView ciphertext, std::uint8_t* out);

 private:
  crypto_secretstream_xchacha20poly1305_state state_;
};

}  // namespace gossamer::transport
