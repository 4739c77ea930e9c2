// Relays for peers behind NAT (transport/relay.h): two transports that accept nothing from each other
// link through a third; the request's codec; refusals; the bound on connections in their handshake.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <thread>
#include <vector>

#include "support/eventually.h"
#include "support/mutate.h"
#include "transport/protocol.h"
#include "transport/reach_probe.h"
#include "transport/relay.h"
#include "transport/tcp_transport.h"

using namespace gossamer;
using namespace gossamer::transport;
using gossamer::testing::eventually;
using gossamer::testing::mutate;
using namespace std::chrono_literals;

namespace {

RunId run_of(std::uint8_t b) {
  RunId r;
  r.bytes[0] = b;
  return r;
}

std::unique_ptr<Transport> make(std::uint64_t id, std::optional<RunKey> key, Nanos relay_wait = 5s, std::size_t max_handshakes = 256) {
  TcpOptions o;
  o.run = run_of(7);
  o.self = PeerId{id};
  o.key = std::move(key);
  o.handshake_timeout = 1s;
  o.relay_wait = relay_wait;
  o.max_handshakes = max_handshakes;
  auto t = make_tcp_transport(o);
  REQUIRE(t.ok());
  return std::move(*t);
}

Deadline in(Nanos d) { return Deadline::after(real_clock(), d); }

Bytes text(const std::string& s) { return Bytes(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size()); }

// Both ends ask the relay at once; each gets a link to the other.
std::pair<Result<std::shared_ptr<Link>>, Result<std::shared_ptr<Link>>> relayed_pair(Transport& a, Transport& b, Transport& relay,
                                                                                    std::uint64_t session, Nanos wait = 5s) {
  Result<std::shared_ptr<Link>> from_b = error(ErrorCode::kTimeout, "not run");
  std::thread other([&] { from_b = b.connect_relayed(relay.address(), relay.self(), a.self(), session, false, in(wait)); });
  auto from_a = a.connect_relayed(relay.address(), relay.self(), b.self(), session, true, in(wait));
  other.join();
  return {std::move(from_a), std::move(from_b)};
}

// A TCP connection that sends nothing, from `source` (an address of this machine; empty: any).
int raw_connect(const std::string& address, const std::string& source = "") {
  const auto colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1))));
  ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (!source.empty()) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    ::inet_pton(AF_INET, source.c_str(), &from.sin_addr);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) == 0);
  }
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
  return fd;
}

}  // namespace

TEST_CASE("relay: two peers link through a third, both ways, and every relayed byte is counted on each side") {
  {
    const std::optional<RunKey> key = generate_run_key();
    auto relay = make(1, key), a = make(2, key), b = make(3, key);
    auto [ab, ba] = relayed_pair(*a, *b, *relay, 11);
    REQUIRE(ab.ok());
    REQUIRE(ba.ok());
    CHECK((*ab)->peer() == b->self());
    CHECK((*ba)->peer() == a->self());
    CHECK((*ab)->remote_address().find(relay->address()) != std::string::npos);
    Bytes big(3 << 20);
    std::mt19937_64 rng(1);
    for (auto& x : big) x = static_cast<std::byte>(rng());
    REQUIRE((*ab)->send(5, big, in(10s)).ok());
    REQUIRE((*ba)->send(6, text("back"), in(10s)).ok());
    auto got = (*ba)->recv(5, in(10s));
    REQUIRE(got.ok());
    CHECK((*got == big));
    auto back = (*ab)->recv(6, in(10s));
    REQUIRE(back.ok());
    CHECK((*back == text("back")));
    // The relay copied at least what both sent (more with records and frames); each end counts its own.
    const TransportStats rs = relay->stats();
    CHECK(rs.relay_pairs == 1);
    CHECK(eventually([&] { return relay->stats().relay_forwarded_bytes >= big.size() + 4; }, 5s));
    CHECK(a->stats().relayed_bytes_sent >= big.size());
    CHECK(b->stats().relayed_bytes_received >= big.size());
    // Counts survive the links.
    (*ab)->close();
    const std::uint64_t sent = a->stats().relayed_bytes_sent;
    ab = error(ErrorCode::kAborted, "dropped");
    CHECK(a->stats().relayed_bytes_sent == sent);
    CHECK(relay->accept(in(200ms)).status().code() == ErrorCode::kTimeout);  // nothing reached the relay's own accept queue
  }
}

TEST_CASE("relay: a run without a key has no relays, and says so") {
  auto relay = make(1, std::nullopt), a = make(2, std::nullopt), b = make(3, std::nullopt);
  auto [ab, ba] = relayed_pair(*a, *b, *relay, 11, 3s);
  CHECK_FALSE(ab.ok());
  CHECK_FALSE(ba.ok());
  CHECK(relay->stats().relay_pairs == 0);
}

TEST_CASE("relay: a request of another key, with no other end, or to itself is refused, and nothing hangs") {
  const RunKey key = generate_run_key();
  auto relay = make(1, key, 500ms);
  auto a = make(2, key);
  auto stranger = make(3, generate_run_key());
  // Another key: the relay refuses at once.
  auto refused = stranger->connect_relayed(relay->address(), relay->self(), a->self(), 1, true, in(5s));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("refused") != std::string::npos);
  // Nobody on the other end: the relay says so after its wait.
  const auto t0 = std::chrono::steady_clock::now();
  auto alone = a->connect_relayed(relay->address(), relay->self(), PeerId{99}, 2, true, in(5s));
  REQUIRE_FALSE(alone.ok());
  CHECK(alone.status().code() == ErrorCode::kTimeout);
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  // A request naming the relay as an end.
  auto itself = a->connect_relayed(relay->address(), relay->self(), relay->self(), 3, true, in(5s));
  REQUIRE_FALSE(itself.ok());
  // The two ends of different sessions are not paired.
  auto b = make(4, key);
  Result<std::shared_ptr<Link>> other = error(ErrorCode::kTimeout, "not run");
  std::thread t([&] { other = b->connect_relayed(relay->address(), relay->self(), a->self(), 5, false, in(5s)); });
  auto mine = a->connect_relayed(relay->address(), relay->self(), b->self(), 6, true, in(5s));
  t.join();
  CHECK_FALSE(mine.ok());
  CHECK_FALSE(other.ok());
  CHECK(relay->stats().relay_pairs == 0);
  CHECK(relay->stats().refused >= 2);
}

TEST_CASE("relay: requests are refused unless signed with the run key, and mutated requests never decode as another") {
  const RunKey key = generate_run_key();
  RelayRequest req;
  req.run = run_of(7);
  req.from = PeerId{2};
  req.to = PeerId{3};
  req.session = 9;
  req.relay = PeerId{1};
  req.time_ms = 1234567;
  req.nonce[0] = 1;
  const Bytes good = encode_relay_request(req, key);
  REQUIRE(good.size() == kRelayRequestBytes);
  auto back = decode_relay_request(good, key);
  REQUIRE(back.ok());
  CHECK(back->from == req.from);
  CHECK(back->to == req.to);
  CHECK(back->session == 9);
  CHECK(back->relay == PeerId{1});
  CHECK(back->time_ms == 1234567);
  CHECK(decode_relay_request(good, generate_run_key()).status().code() == ErrorCode::kUnauthenticated);
  CHECK(decode_relay_request(good, std::nullopt).status().code() == ErrorCode::kUnauthenticated);
  CHECK(decode_relay_request(encode_relay_request(req, std::nullopt), std::nullopt).ok());
  std::mt19937_64 rng(3);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    const Bytes m = mutate(good, rng);
    if (m == good) continue;
    auto got = decode_relay_request(m, key);
    accepted += got.ok() ? 1 : 0;  // any change to a signed request breaks its tag
  }
  CHECK(accepted == 0);
  for (std::uint8_t s = 0; s < 5; ++s) CHECK(decode_relay_answer(encode_relay_answer(static_cast<RelayStatus>(s))).ok());
  Bytes bad = encode_relay_answer(RelayStatus::kPaired);
  bad[4] = std::byte{9};
  CHECK_FALSE(decode_relay_answer(bad).ok());
}

TEST_CASE("transport: connections held open without a handshake are bounded, closed at the deadline, and a peer gets in after") {
  auto t = make(1, std::nullopt, 5s, /*max_handshakes=*/4);
  auto peer = make(2, std::nullopt);
  std::vector<int> junk;
  for (int i = 0; i < 12; ++i) junk.push_back(raw_connect(t->address()));
  // Beyond the bound the oldest give their places to the newer ones at once.
  CHECK(eventually([&] { return t->stats().refused >= 8; }, 5s));
  // The ones held are closed at the handshake deadline (1 s), and a real peer then connects.
  CHECK(eventually([&] { return t->stats().refused >= 12; }, 5s));
  auto link = peer->connect(t->address(), in(5s));
  CHECK(link.ok());
  CHECK(t->accept(in(5s)).ok());
  for (int fd : junk) ::close(fd);
}

TEST_CASE("relay and dial-back messages keep their golden bytes") {
  RelayRequest req;
  req.run = run_of(7);
  req.from = PeerId{0x0102030405060708};
  req.to = PeerId{0x1112131415161718};
  req.session = 0x21;
  req.relay = PeerId{0x31};
  req.time_ms = 0x41;
  req.nonce[15] = 0xEE;
  const Bytes unsigned_request = encode_relay_request(req, std::nullopt);
  Bytes want(kRelayRequestBytes, std::byte{0});
  const std::uint8_t head[] = {'G', 'S', 'R', 'Y', 2, 0, 0, 0, 7};
  for (std::size_t i = 0; i < sizeof(head); ++i) want[i] = std::byte{head[i]};
  for (std::size_t i = 0; i < 8; ++i) {
    want[24 + i] = static_cast<std::byte>(8 - i);     // from, little-endian
    want[32 + i] = static_cast<std::byte>(0x18 - i);  // to
  }
  want[40] = std::byte{0x21};  // session
  want[48] = std::byte{0x31};  // relay
  want[56] = std::byte{0x41};  // time
  want[79] = std::byte{0xEE};  // the nonce's last byte; the tag (80..111) is zero without a key
  CHECK((unsigned_request == want));
  const Bytes answer = encode_relay_answer(RelayStatus::kNoMatch);
  CHECK((answer == Bytes{std::byte{'G'}, std::byte{'S'}, std::byte{'R'}, std::byte{'Y'}, std::byte{2}, std::byte{0}, std::byte{0}, std::byte{0}}));

  ReachRequest rr;
  rr.nonce = 5;
  rr.requester = PeerId{9};
  rr.addresses = {"a:1"};
  const Bytes request = encode_reach_request(rr);
  const std::uint8_t golden[] = {'G', 'S', 'R', 'P', 1, 1, 5, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 3, 0, 0, 0, 'a', ':', '1'};
  CHECK((request == Bytes(reinterpret_cast<const std::byte*>(golden), reinterpret_cast<const std::byte*>(golden) + sizeof(golden))));
  CHECK(reach_type(request) == ReachType::kRequest);
  ReachAnswer ra;
  ra.nonce = 5;
  ra.observed_ip = "192.0.2.9";
  ra.results = {ReachResult{ReachOutcome::kUnreached, "refused"}};
  auto back = decode_reach_answer(encode_reach_answer(ra));
  REQUIRE(back.ok());
  CHECK(back->observed_ip == "192.0.2.9");
  REQUIRE(back->results.size() == 1);
  CHECK(back->results[0].outcome == ReachOutcome::kUnreached);
  CHECK(back->results[0].detail == "refused");
}

TEST_CASE("dial-back messages: mutated ones are refused or re-encode to their bytes, and a run without a key is dialled back only at its own IP") {
  ReachRequest rr;
  rr.nonce = 77;
  rr.requester = PeerId{3};
  rr.addresses = {"0.0.0.0:7000", "203.0.113.5:7001"};
  ReachAnswer ra;
  ra.nonce = 77;
  ra.observed_ip = "203.0.113.5";
  ra.results = {ReachResult{ReachOutcome::kReached, ""}, ReachResult{ReachOutcome::kUnchecked, "not the request's IP"}};
  const Bytes good_request = encode_reach_request(rr), good_answer = encode_reach_answer(ra);
  std::mt19937_64 rng(11);
  int refused = 0;
  for (int i = 0; i < 20000; ++i) {
    const Bytes q = mutate(good_request, rng), a = mutate(good_answer, rng);
    if (auto got = decode_reach_request(q); got.ok()) {
      CHECK(got->addresses.size() <= kMaxReachAddresses);
      CHECK((encode_reach_request(*got) == q));
    } else {
      ++refused;
    }
    if (auto got = decode_reach_answer(a); got.ok()) {
      CHECK((encode_reach_answer(*got) == a));
    } else {
      ++refused;
    }
  }
  CHECK(refused > 10000);  // of 40,000
  // Where a helper dials: a wildcard at the request's IP, the request's IP itself, a name only when
  // it resolves to that IP; anything else is not dialled (not checked), whatever the run's key.
  CHECK(*reach_target("0.0.0.0:7000", "203.0.113.5") == "203.0.113.5:7000");
  CHECK(*reach_target("203.0.113.5:7001", "203.0.113.5") == "203.0.113.5:7001");
  CHECK(reach_target("198.51.100.1:22", "203.0.113.5").status().code() == ErrorCode::kNotFound);
  CHECK(reach_target("127.0.0.1:22", "203.0.113.5").status().code() == ErrorCode::kNotFound);
  CHECK(*reach_target("localhost:7000", "127.0.0.1") == "127.0.0.1:7000");
  CHECK_FALSE(reach_target("203.0.113.5:0", "203.0.113.5").ok());
}

TEST_CASE("transport: a flood of silent connections from many addresses does not keep a peer's handshake out") {
  // Places for 8 handshakes, 2 per address, and a deadline far off (30 s): 24 connections from 12
  // loopback addresses that send nothing would hold every place until then. The oldest are evicted
  // instead, so a genuine peer connecting in the middle of the flood gets its handshake done.
  TcpOptions o;
  o.run = run_of(7);
  o.self = PeerId{1};
  o.handshake_timeout = 30s;
  o.max_handshakes = 8;
  o.max_handshakes_per_ip = 2;
  auto t = make_tcp_transport(o);
  REQUIRE(t.ok());
  auto peer = make(2, std::nullopt);
  std::vector<int> junk;
  for (int i = 0; i < 24; ++i) junk.push_back(raw_connect((*t)->address(), "127.0.0." + std::to_string(2 + i % 12)));
  CHECK(eventually([&] { return (*t)->stats().refused >= 16; }, 5s));  // 16 evicted, 8 held
  const auto start = std::chrono::steady_clock::now();
  auto link = peer->connect((*t)->address(), in(5s));
  CHECK(link.ok());
  CHECK((*t)->accept(in(5s)).ok());
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  // One address beyond its share is refused without evicting anyone.
  const auto before = (*t)->stats().refused;
  for (int i = 0; i < 3; ++i) junk.push_back(raw_connect((*t)->address(), "127.0.0.99"));
  // (7 places held after the peer's went: the first takes the free one, the second evicts the
  // oldest, the third is refused.)
  CHECK(eventually([&] { return (*t)->stats().refused >= before + 2; }, 5s));
  for (int fd : junk) ::close(fd);
}

namespace {
// The link ended (an error other than a timeout on a read).
bool gone(Link& link) {
  auto r = link.recv(1, in(100ms));
  return !r.ok() && r.status().code() != ErrorCode::kTimeout;
}

// Sends `request` to the relay at `address` on a raw connection; its answer, or nullopt when the
// connection closed without one.
std::optional<RelayStatus> ask_raw(const std::string& address, const Bytes& request, int* keep_fd = nullptr) {
  const int fd = raw_connect(address);
  REQUIRE(::send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size()));
  std::array<std::byte, kRelayAnswerBytes> answer{};
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::size_t got = 0;
  while (got < answer.size()) {
    const ssize_t n = ::recv(fd, answer.data() + got, answer.size() - got, 0);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (keep_fd != nullptr) {
    *keep_fd = fd;
  } else {
    ::close(fd);
  }
  if (got != answer.size()) return std::nullopt;
  auto status = decode_relay_answer(ByteView(answer.data(), answer.size()));
  if (!status.ok()) return std::nullopt;
  return *status;
}
}  // namespace

TEST_CASE("relay: a request is good at its relay, near its time, once: captured ones cannot be replayed") {
  const RunKey key = generate_run_key();
  auto relay = make(1, key, /*relay_wait=*/500ms);
  RelayRequest req;
  req.run = run_of(7);
  req.from = PeerId{2};
  req.to = PeerId{3};
  req.session = 4;
  req.relay = relay->self();
  req.time_ms = relay_time_now();
  req.nonce[0] = 7;
  const Bytes good = encode_relay_request(req, key);
  // Taken (it waits for its other end, which does not come: no match).
  CHECK(ask_raw(relay->address(), good) == RelayStatus::kNoMatch);
  // The same bytes again: a replay, refused as stale.
  CHECK(ask_raw(relay->address(), good) == RelayStatus::kStale);
  // Made for another relay: refused.
  RelayRequest elsewhere = req;
  elsewhere.relay = PeerId{77};
  elsewhere.nonce[0] = 8;
  CHECK(ask_raw(relay->address(), encode_relay_request(elsewhere, key)) == RelayStatus::kRefused);
  // Too old, or from too far in the future.
  const auto skew_ms = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(kRelayClockSkew).count());
  RelayRequest old = req;
  old.time_ms = relay_time_now() - skew_ms - 60000;
  old.nonce[0] = 9;
  CHECK(ask_raw(relay->address(), encode_relay_request(old, key)) == RelayStatus::kStale);
  RelayRequest ahead = req;
  ahead.time_ms = relay_time_now() + skew_ms + 60000;
  ahead.nonce[0] = 10;
  CHECK(ask_raw(relay->address(), encode_relay_request(ahead, key)) == RelayStatus::kStale);
  // Within the skew, a fresh nonce: taken.
  RelayRequest late = req;
  late.time_ms = relay_time_now() - skew_ms / 2;
  late.nonce[0] = 11;
  CHECK(ask_raw(relay->address(), encode_relay_request(late, key)) == RelayStatus::kNoMatch);
  CHECK(relay->stats().relay_pairs == 0);
}

TEST_CASE("relay: pairs end when idle, and when the relay retires their session") {
  const RunKey key = generate_run_key();
  TcpOptions o;
  o.run = run_of(7);
  o.self = PeerId{1};
  o.key = key;
  o.handshake_timeout = 1s;
  o.relay_idle = 300ms;
  auto made = make_tcp_transport(o);
  REQUIRE(made.ok());
  auto& relay = **made;
  auto a = make(2, key), b = make(3, key);
  // Idle: a pair that carries nothing is closed after between one and two idle periods.
  {
    auto [ab, ba] = relayed_pair(*a, *b, relay, 21);
    REQUIRE(ab.ok());
    REQUIRE(ba.ok());
    CHECK((*ab)->send(1, text("before"), in(2s)).ok());
    CHECK((*ba)->recv(1, in(2s)).ok());
    CHECK(eventually([&] { return gone(**ba); }, 3s));
  }
  // Busy: a pair that carries messages more often than that stays up.
  auto [ab, ba] = relayed_pair(*a, *b, relay, 22);
  REQUIRE(ab.ok());
  REQUIRE(ba.ok());
  for (int i = 0; i < 10; ++i) {
    CHECK((*ab)->send(1, text("ping"), in(2s)).ok());
    CHECK((*ba)->recv(1, in(2s)).ok());
    std::this_thread::sleep_for(100ms);
  }
  // Retired: the relay's own group moved past session 22, and the pair goes with it.
  relay.retire_relayed(22);
  CHECK(eventually([&] { return gone(**ba); }, 3s));
}

TEST_CASE("transport: shutting down closes the connections still in their handshake, so their other ends see it at once") {
  TcpOptions o;
  o.run = run_of(7);
  o.self = PeerId{1};
  o.handshake_timeout = 60s;  // far beyond the test: only the shutdown can close it
  auto t = make_tcp_transport(o);
  REQUIRE(t.ok());
  Hello h;
  h.peer = PeerId{2};
  h.run = run_of(7);
  const Bytes hello = encode_hello(h);
  const int fd = raw_connect((*t)->address());
  // The HELLO's first bytes only: the transport starts the handshake and waits for the rest.
  REQUIRE(::send(fd, hello.data(), 4, 0) == 4);
  std::this_thread::sleep_for(300ms);
  const auto shut = std::chrono::steady_clock::now();
  t->reset();
  // Whatever the transport sent first, then the end of the stream (or a reset), long before the
  // handshake's deadline.
  bool ended = false;
  while (!ended && std::chrono::steady_clock::now() - shut < 5s) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) continue;
    char buf[256];
    ended = ::recv(fd, buf, sizeof buf, 0) <= 0;
  }
  CHECK(ended);
  ::close(fd);
}
