// libFuzzer target: the secure channel's decoders on arbitrary bytes (transport/secure_channel.h).
// The first byte picks what the rest is:
//   0  a record's ciphertext, opened as a stream's first record
//   1  a mask XORed over a valid first record (and bytes beyond it appended): near-valid records
//   2  the same over the stream's second record, after the first was opened (replays, reorders)
//   3  a stream header given to StreamOpener::init, then a valid first record opened with it
//   4  a peer's AUTH given to KeyExchange::finish
//   5  a mask XORed over a valid AUTH
//   6  the two HELLOs of a responder's KeyExchange (cut where the rest's first byte says), whose finish
//      is given the initiator's valid AUTH
// Nothing may crash, and nothing may be accepted that is not exactly what a holder of the key sent:
// an accepted record opens to its plaintext, an accepted AUTH gives the session keys of the exchange.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "transport/secure_channel.h"

namespace {

using namespace gossamer;
using namespace gossamer::transport;

Bytes bytes_of(const std::uint8_t* p, std::size_t n) {
  return Bytes(reinterpret_cast<const std::byte*>(p), reinterpret_cast<const std::byte*>(p) + n);
}

ByteView view_of(const Bytes& b) { return ByteView(b.data(), b.size()); }

// `base` with `mask` XORed over it; where the mask is longer, its bytes are appended.
Bytes masked(const Bytes& base, const std::uint8_t* mask, std::size_t n) {
  Bytes out = base;
  for (std::size_t i = 0; i < n; ++i) {
    if (i < out.size()) {
      out[i] ^= static_cast<std::byte>(mask[i]);
    } else {
      out.push_back(static_cast<std::byte>(mask[i]));
    }
  }
  return out;
}

// One stream sealed once per process (its header is random), and one key exchange.
struct Fixture {
  std::array<std::uint8_t, 32> key{};
  Bytes header;
  Bytes plain[2];
  Bytes sealed[2];  // ciphertexts of plain[0] and plain[1], without their length prefix
  RunKey run_key;
  Bytes hello_initiator, hello_responder;
  std::unique_ptr<KeyExchange> initiator, responder;
  SessionKeys initiator_keys;  // what the initiator derives from the responder's valid AUTH

  Fixture() {
    for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<std::uint8_t>(i * 13 + 1);
    StreamSealer sealer(key);
    header = bytes_of(sealer.header().data(), sealer.header().size());
    plain[0] = Bytes(100, std::byte{0x42});
    plain[1] = Bytes(7, std::byte{0x17});
    for (int i = 0; i < 2; ++i) {
      std::vector<std::uint8_t> record(4 + plain[i].size() + kRecordOverhead);
      const std::size_t n = sealer.seal(view_of(plain[i]), record.data());
      sealed[i] = bytes_of(record.data() + 4, n - 4);
    }
    run_key.bytes = key;
    hello_initiator = Bytes(40, std::byte{0x11});
    hello_responder = Bytes(40, std::byte{0x22});
    initiator = std::make_unique<KeyExchange>(run_key, true, view_of(hello_initiator), view_of(hello_responder));
    responder = std::make_unique<KeyExchange>(run_key, false, view_of(hello_initiator), view_of(hello_responder));
    auto keys = initiator->finish(ByteView(reinterpret_cast<const std::byte*>(responder->auth_message().data()), kAuthBytes), PeerId{2});
    auto theirs = responder->finish(ByteView(reinterpret_cast<const std::byte*>(initiator->auth_message().data()), kAuthBytes), PeerId{1});
    if (!keys.ok() || !theirs.ok() || keys->tx != theirs->rx || keys->rx != theirs->tx) __builtin_trap();
    initiator_keys = *keys;
  }

  // Opens `record` on a fresh stream after opening the first `before` records; the plaintext, or
  // nothing when refused.
  std::optional<Bytes> open(const Bytes& stream_header, int before, const Bytes& record) const {
    StreamOpener opener;
    if (!opener.init(key, view_of(stream_header)).ok()) return std::nullopt;
    std::vector<std::uint8_t> out(std::max({record.size(), sealed[0].size(), sealed[1].size()}));  // room for any of them
    for (int i = 0; i < before; ++i) {
      if (!opener.open(view_of(sealed[i]), out.data()).ok()) __builtin_trap();  // a valid record refused
    }
    auto n = opener.open(view_of(record), out.data());
    if (!n.ok()) return std::nullopt;
    if (*n > record.size()) __builtin_trap();
    return bytes_of(out.data(), *n);
  }
};

bool same_keys(const SessionKeys& a, const SessionKeys& b) { return a.tx == b.tx && a.rx == b.rx; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Fixture f;
  if (size == 0) return 0;
  const std::uint8_t mode = data[0] % 7;
  const std::uint8_t* body = data + 1;
  const std::size_t n = size - 1;
  switch (mode) {
    case 0:
    case 1:
    case 2: {
      const int before = mode == 2 ? 1 : 0;
      const Bytes& valid = f.sealed[before];
      const Bytes record = mode == 0 ? bytes_of(body, n) : masked(valid, body, n);
      const auto opened = f.open(f.header, before, record);
      if (opened.has_value() != (record == valid)) __builtin_trap();  // a forgery taken, or a valid record refused
      if (opened && *opened != f.plain[before]) __builtin_trap();
      break;
    }
    case 3: {
      const Bytes header = bytes_of(body, n);
      StreamOpener opener;
      if (opener.init(f.key, view_of(header)).ok() && header.size() != kStreamHeaderBytes) __builtin_trap();
      const auto opened = f.open(header, 0, f.sealed[0]);
      if (opened.has_value() != (header == f.header)) __builtin_trap();
      break;
    }
    case 4:
    case 5: {
      const Bytes valid = bytes_of(f.responder->auth_message().data(), kAuthBytes);
      const Bytes auth = mode == 4 ? bytes_of(body, n) : masked(valid, body, n);
      auto keys = f.initiator->finish(view_of(auth), PeerId{2});
      if (keys.ok() != (auth == valid)) __builtin_trap();
      if (keys.ok() && !same_keys(*keys, f.initiator_keys)) __builtin_trap();
      if (!keys.ok() && keys.status().code() != ErrorCode::kUnauthenticated && keys.status().code() != ErrorCode::kMalformed) __builtin_trap();
      break;
    }
    default: {
      // The tag covers both HELLOs as one transcript: a responder that saw other HELLOs refuses.
      const std::size_t cut = n == 0 ? 0 : body[0] % (n + 1);
      const Bytes hello_i = bytes_of(body, cut), hello_r = bytes_of(body + cut, n - cut);
      KeyExchange kx(f.run_key, false, view_of(hello_i), view_of(hello_r));
      auto keys = kx.finish(ByteView(reinterpret_cast<const std::byte*>(f.initiator->auth_message().data()), kAuthBytes), PeerId{1});
      Bytes transcript = hello_i, expected = f.hello_initiator;
      transcript.insert(transcript.end(), hello_r.begin(), hello_r.end());
      expected.insert(expected.end(), f.hello_responder.begin(), f.hello_responder.end());
      if (keys.ok() != (transcript == expected)) __builtin_trap();
      break;
    }
  }
  return 0;
}
