// Authenticated, encrypted links: the key exchange, the record layer and refusals.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "core/file.h"
#include "transport/secure_channel.h"
#include "transport/tcp_transport.h"

using namespace gossamer;
using namespace gossamer::transport;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<Transport> make(std::optional<RunKey> key) {
  TcpOptions o;
  o.key = key;
  o.handshake_timeout = 2s;
  auto t = make_tcp_transport(o);
  REQUIRE(t.ok());
  return std::move(*t);
}

Deadline in(Nanos d) { return Deadline::after(real_clock(), d); }

}  // namespace

TEST_CASE("the key exchange agrees on session keys only when both hold the run key") {
  const RunKey key = generate_run_key();
  const Bytes h1(40, std::byte{1}), h2(40, std::byte{2});
  KeyExchange a(key, true, h1, h2), b(key, false, h1, h2);
  auto ka = a.finish(ByteView(reinterpret_cast<const std::byte*>(b.auth_message().data()), kAuthBytes), PeerId{2});
  auto kb = b.finish(ByteView(reinterpret_cast<const std::byte*>(a.auth_message().data()), kAuthBytes), PeerId{1});
  REQUIRE(ka.ok());
  REQUIRE(kb.ok());
  CHECK(ka->tx == kb->rx);
  CHECK(ka->rx == kb->tx);
  CHECK(ka->tx != ka->rx);
  // Another key, or another transcript (a tampered HELLO), fails authentication.
  KeyExchange stranger(generate_run_key(), false, h1, h2);
  CHECK(a.finish(ByteView(reinterpret_cast<const std::byte*>(stranger.auth_message().data()), kAuthBytes), PeerId{3}).status().code() ==
        ErrorCode::kUnauthenticated);
  const Bytes h2_tampered(40, std::byte{3});
  KeyExchange mitm(key, false, h1, h2_tampered);
  CHECK_FALSE(a.finish(ByteView(reinterpret_cast<const std::byte*>(mitm.auth_message().data()), kAuthBytes), PeerId{4}).ok());
  // A reflected AUTH (our own message sent back) is refused: the role is part of the tag.
  CHECK_FALSE(a.finish(ByteView(reinterpret_cast<const std::byte*>(a.auth_message().data()), kAuthBytes), PeerId{5}).ok());
}

TEST_CASE("records detect tampering, reordering and replay") {
  std::array<std::uint8_t, 32> k{};
  k[0] = 9;
  StreamSealer sealer(k);
  StreamOpener opener;
  REQUIRE(opener.init(k, ByteView(reinterpret_cast<const std::byte*>(sealer.header().data()), kStreamHeaderBytes)).ok());
  std::vector<std::uint8_t> r1(4 + 100 + kRecordOverhead), r2(r1.size());
  const Bytes m1(100, std::byte{7}), m2(100, std::byte{8});
  const std::size_t n1 = sealer.seal(m1, r1.data()), n2 = sealer.seal(m2, r2.data());
  auto view = [](const std::vector<std::uint8_t>& r, std::size_t n) { return ByteView(reinterpret_cast<const std::byte*>(r.data()) + 4, n - 4); };
  std::vector<std::uint8_t> out(200);
  SUBCASE("in order") {
    REQUIRE(opener.open(view(r1, n1), out.data()).ok());
    CHECK(std::memcmp(out.data(), m1.data(), 100) == 0);
    REQUIRE(opener.open(view(r2, n2), out.data()).ok());
    CHECK(opener.open(view(r2, n2), out.data()).status().code() == ErrorCode::kUnauthenticated);  // replay
  }
  SUBCASE("reordered") { CHECK(opener.open(view(r2, n2), out.data()).status().code() == ErrorCode::kUnauthenticated); }
  SUBCASE("tampered") {
    r1[30] ^= 1;
    CHECK(opener.open(view(r1, n1), out.data()).status().code() == ErrorCode::kUnauthenticated);
  }
}

TEST_CASE("run key files round-trip, are private, and bad ones are refused") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("gossamer_key_" + std::to_string(std::random_device{}()));
  fs::create_directories(dir);
  const RunKey k = generate_run_key();
  REQUIRE(write_run_key(dir / "run.key", k).ok());
  struct stat st {};
  REQUIRE(::stat((dir / "run.key").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto back = read_run_key(dir / "run.key");
  REQUIRE(back.ok());
  CHECK(back->bytes == k.bytes);
  REQUIRE(write_file_atomic(dir / "bad.key", as_bytes("gossamer-run-key-v1 xyz\n")).ok());
  CHECK(read_run_key(dir / "bad.key").status().message().find("gossamer keygen") != std::string::npos);
  CHECK_FALSE(read_run_key(dir / "missing.key").ok());
  fs::remove_all(dir);
}

TEST_CASE("encrypted links carry small and multi-record messages") {
  const RunKey key = generate_run_key();
  auto a = make(key), b = make(key);
  auto ab = a->connect(b->address(), in(5s));
  REQUIRE(ab.ok());
  auto ba = b->accept(in(5s));
  REQUIRE(ba.ok());
  Bytes big((std::size_t{5} << 20) + 12345);  // spans 6 records
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>(i * 7);
  for (int round = 0; round < 3; ++round) {
    REQUIRE((*ab)->send(1, as_bytes("ping"), in(5s)).ok());
    REQUIRE((*ab)->send(2, big, in(10s)).ok());
    REQUIRE((*ab)->send(3, {}, in(5s)).ok());
    auto p = (*ba)->recv(1, in(5s));
    REQUIRE(p.ok());
    CHECK(std::string(reinterpret_cast<const char*>(p->data()), p->size()) == "ping");
    auto q = (*ba)->recv(2, in(10s));
    REQUIRE(q.ok());
    CHECK((*q == big));
    CHECK((*ba)->recv(3, in(5s))->empty());
  }
  REQUIRE((*ba)->send(4, as_bytes("pong"), in(5s)).ok());
  CHECK((*ab)->recv(4, in(5s)).ok());
}

TEST_CASE("a peer without the right credentials is refused on both sides") {
  const RunKey key = generate_run_key();
  auto b = make(key);
  SUBCASE("wrong key") {
    auto a = make(generate_run_key());
    auto r = a->connect(b->address(), in(5s));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::kUnauthenticated);
    CHECK(r.status().message().find("does not hold this run's key") != std::string::npos);
  }
  SUBCASE("no key against a secured run") {
    auto a = make(std::nullopt);
    auto r = a->connect(b->address(), in(5s));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::kUnauthenticated);
    CHECK(r.status().message().find("pass --key") != std::string::npos);
  }
  SUBCASE("a key against an insecure run") {
    auto insecure = make(std::nullopt);
    auto a = make(key);
    auto r = a->connect(insecure->address(), in(5s));
    CHECK(r.status().code() == ErrorCode::kUnauthenticated);
    CHECK(r.status().message().find("--insecure") != std::string::npos);
  }
  CHECK(b->accept(in(300ms)).status().code() == ErrorCode::kTimeout);
}
