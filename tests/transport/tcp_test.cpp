// TCP links: ephemeral ports, deadlines instead of sleeps, misbehaving peers played by raw sockets.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include "transport/protocol.h"
#include "transport/tcp_transport.h"

using namespace gossamer;
using namespace gossamer::transport;
using namespace std::chrono_literals;

namespace {

RunId test_run() {
  RunId r;
  r.bytes[0] = 42;
  return r;
}

std::unique_ptr<Transport> make(std::uint64_t max_message = std::uint64_t{1} << 30, RunId run = test_run()) {
  TcpOptions o;
  o.run = run;
  o.max_message_bytes = max_message;
  o.handshake_timeout = 2s;
  auto t = make_tcp_transport(o);
  REQUIRE(t.ok());
  return std::move(*t);
}

Deadline in(Nanos d) { return Deadline::after(real_clock(), d); }

std::pair<std::shared_ptr<Link>, std::shared_ptr<Link>> connect_pair(Transport& a, Transport& b) {
  auto ab = a.connect(b.address(), in(5s));
  REQUIRE(ab.ok());
  auto ba = b.accept(in(5s));
  REQUIRE(ba.ok());
  return {*ab, *ba};
}

Bytes bytes_of(const std::string& s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return Bytes(p, p + s.size());
}
std::string text_of(const Bytes& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

// A raw TCP client that plays a misbehaving peer.
struct RawPeer {
  int fd = -1;
  explicit RawPeer(const std::string& address) {
    const auto colon = address.rfind(':');
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1))));
    ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
  }
  ~RawPeer() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  void write_all(const void* p, std::size_t n) {
    const auto* c = static_cast<const char*>(p);
    while (n > 0) {
      const auto w = ::write(fd, c, n);
      REQUIRE(w > 0);
      c += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  void write_all(const Bytes& b) { write_all(b.data(), b.size()); }
  // Bytes read until EOF or `n` bytes.
  std::size_t read_up_to(std::size_t n) {
    std::vector<char> buf(n);
    std::size_t got = 0;
    while (got < n) {
      const auto r = ::read(fd, buf.data() + got, n - got);
      if (r <= 0) break;
      got += static_cast<std::size_t>(r);
    }
    return got;
  }
  void handshake(std::uint16_t major = kWireMajor, RunId run = test_run()) {
    Hello h;
    h.major = major;
    h.run = run;
    h.peer.value = 0xBAD;
    write_all(encode_hello(h));
    REQUIRE(read_up_to(kHelloBytes) == kHelloBytes);
  }
};

std::size_t count_entries(const char* dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

}  // namespace

TEST_CASE("small messages round-trip both ways, routed by tag and in order") {
  auto a = make(), b = make();
  auto [ab, ba] = connect_pair(*a, *b);
  CHECK(ab->peer() == b->self());
  CHECK(ba->peer() == a->self());
  REQUIRE(ab->send(1, bytes_of("hello"), in(2s)).ok());
  REQUIRE(ab->send(2, bytes_of("world"), in(2s)).ok());
  REQUIRE(ab->send(3, {}, in(2s)).ok());  // empty messages are messages too
  CHECK(text_of(*ba->recv(2, in(2s))) == "world");
  CHECK(text_of(*ba->recv(1, in(2s))) == "hello");
  CHECK(ba->recv(3, in(2s))->empty());
  for (int i = 0; i < 500; ++i) REQUIRE(ba->send(7, bytes_of(std::to_string(i)), in(2s)).ok());
  for (int i = 0; i < 500; ++i) CHECK(text_of(*ab->recv(7, in(2s))) == std::to_string(i));
  CHECK(ab->stats().messages_sent == 3);
  CHECK(ab->stats().messages_received == 500);
  CHECK(ab->stats().bytes_sent == 3 * kFrameHeaderBytes + 10);
}

TEST_CASE("a gathered send arrives as one message, and a recycled buffer receives the next one") {
  auto a = make(), b = make();
  auto [ab, ba] = connect_pair(*a, *b);
  const Bytes head = bytes_of("head:"), body = bytes_of("the body"), none;
  const std::array<ByteView, 3> parts = {ByteView(head), ByteView(none), ByteView(body)};
  REQUIRE(ab->send_parts(4, parts, in(2s)).ok());
  auto got = ba->recv(4, in(2s));
  REQUIRE(got.ok());
  CHECK(text_of(*got) == "head:the body");
  CHECK(ab->stats().bytes_sent == kFrameHeaderBytes + 13);
  CHECK(ab->stats().messages_sent == 1);
  // A 1 MiB message, recycled: the next message of up to that size lands in the same memory.
  const Bytes big(1 << 20, std::byte{3});
  REQUIRE(ab->send(5, big, in(2s)).ok());
  auto first = ba->recv(5, in(2s));
  REQUIRE(first.ok());
  const std::byte* memory = first->data();
  ba->recycle(std::move(*first));
  const Bytes smaller(1000, std::byte{9});
  REQUIRE(ab->send(5, smaller, in(2s)).ok());
  auto second = ba->recv(5, in(2s));
  REQUIRE(second.ok());
  CHECK(second->data() == memory);
  CHECK((*second == smaller));
}

TEST_CASE("a 256 MiB message round-trips intact") {
  auto a = make(), b = make();
  auto [ab, ba] = connect_pair(*a, *b);
  Bytes big(std::size_t{256} << 20);
  for (std::size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<std::byte>(i / 4096 * 31);
  big.back() = std::byte{0x5A};
  // The receiver's I/O thread drains the socket while send() blocks, so no recv() is needed yet.
  REQUIRE(ab->send(9, big, in(60s)).ok());
  auto got = ba->recv(9, in(60s));
  REQUIRE(got.ok());
  REQUIRE(got->size() == big.size());
  CHECK(std::memcmp(got->data(), big.data(), big.size()) == 0);
}

TEST_CASE("a peer speaking another major version is refused on both sides") {
  auto b = make();
  SUBCASE("incoming") {
    RawPeer raw(b->address());
    raw.handshake(/*major=*/2);
    CHECK(raw.read_up_to(1) == 0);  // refused: the connection is closed after the HELLOs
    CHECK(b->accept(in(300ms)).status().code() == ErrorCode::kTimeout);
  }
  SUBCASE("outgoing") {
    // A raw server answering with a newer major version.
    int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
    REQUIRE(::listen(listener, 1) == 0);
    socklen_t len = sizeof(sa);
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len);
    std::thread server([&] {
      const int c = ::accept(listener, nullptr, nullptr);
      Hello h;
      h.major = 3;
      h.run = test_run();
      h.peer.value = 5;
      const Bytes hb = encode_hello(h);
      (void)!::write(c, hb.data(), hb.size());
      char buf[64];
      while (::read(c, buf, sizeof(buf)) > 0) {
      }
      ::close(c);
    });
    auto link = b->connect("127.0.0.1:" + std::to_string(ntohs(sa.sin_port)), in(2s));
    REQUIRE_FALSE(link.ok());
    CHECK(link.status().code() == ErrorCode::kVersionMismatch);
    CHECK(link.status().message().find("upgrade this node") != std::string::npos);
    server.join();
    ::close(listener);
  }
}

TEST_CASE("a peer of another run is refused") {
  RunId other = test_run();
  other.bytes[1] = 7;
  auto a = make(std::uint64_t{1} << 30, other), b = make();
  auto link = a->connect(b->address(), in(2s));
  CHECK(link.status().code() == ErrorCode::kUnauthenticated);
  CHECK(b->accept(in(300ms)).status().code() == ErrorCode::kTimeout);
}

TEST_CASE("garbage, oversized and truncated frames drop that link only") {
  auto a = make(), b = make(/*max_message=*/1 << 20);
  auto [ab, ba] = connect_pair(*a, *b);
  RawPeer raw(b->address());
  raw.handshake();
  auto bad = b->accept(in(2s));
  REQUIRE(bad.ok());

  SUBCASE("garbage") {
    raw.write_all("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
    CHECK((*bad)->recv(1, in(2s)).status().code() == ErrorCode::kMalformed);
  }
  SUBCASE("oversized") {
    std::uint8_t h[kFrameHeaderBytes];
    encode_frame_header(FrameHeader{FrameType::kData, 0, 1, (1u << 20) + 1}, h);
    raw.write_all(h, sizeof(h));
    auto r = (*bad)->recv(1, in(2s));
    CHECK(r.status().code() == ErrorCode::kOutOfRange);
    CHECK(r.status().message().find("exceeds the cap") != std::string::npos);
  }
  SUBCASE("killed mid-message: reported lost within its deadline") {
    std::uint8_t h[kFrameHeaderBytes];
    encode_frame_header(FrameHeader{FrameType::kData, 0, 1, 1000}, h);
    raw.write_all(h, sizeof(h));
    raw.write_all("0123456789", 10);
    raw.close();
    Stopwatch w(real_clock());
    auto r = (*bad)->recv(1, in(5s));
    CHECK(r.status().code() == ErrorCode::kPeerLost);
    CHECK(w.elapsed() < 3s);  // well before the 5 s deadline: nothing waits it out
  }
  // The well-behaved link keeps working.
  REQUIRE(ab->send(4, bytes_of("still here"), in(2s)).ok());
  CHECK(text_of(*ba->recv(4, in(2s))) == "still here");
}

// Large frames are read with a receive low-water mark (the reader is woken per half MiB, not per
// segment): a frame whose bytes trickle in, its last few long after the rest, must still arrive
// whole, the small frame behind it too, and a peer that dies mid-frame must still be noticed.
TEST_CASE("a large frame arriving in uneven pieces, its tail late, is delivered whole and promptly") {
  auto b = make();
  RawPeer raw(b->address());
  raw.handshake();
  auto link = b->accept(in(2s));
  REQUIRE(link.ok());
  const std::size_t n = (std::size_t{3} << 20) + 7;
  Bytes big(n);
  for (std::size_t i = 0; i < n; ++i) big[i] = static_cast<std::byte>((i * 131) ^ (i >> 11));
  std::uint8_t h[kFrameHeaderBytes];

  SUBCASE("whole, again at once, then a small frame behind them") {
    encode_frame_header(FrameHeader{FrameType::kData, 0, 7, n}, h);
    raw.write_all(h, sizeof(h));
    const std::size_t cuts[] = {1000, 100 << 10, (1 << 20) + 3, (2 << 20) + 999, n - 5, n};
    std::size_t at = 0;
    for (std::size_t cut : cuts) {
      std::this_thread::sleep_for(20ms);  // each piece on its own, the reader waiting in between
      raw.write_all(big.data() + at, cut - at);
      at = cut;
    }
    // The same frame at once, then after a pause a frame smaller than the mark was.
    raw.write_all(h, sizeof(h));
    raw.write_all(big);
    std::this_thread::sleep_for(20ms);
    encode_frame_header(FrameHeader{FrameType::kData, 0, 8, 3}, h);
    raw.write_all(h, sizeof(h));
    raw.write_all("end", 3);
    Stopwatch w(real_clock());
    for (int i = 0; i < 2; ++i) {
      auto got = (*link)->recv(7, in(5s));
      REQUIRE(got.ok());
      CHECK(*got == big);
    }
    auto small = (*link)->recv(8, in(5s));
    REQUIRE(small.ok());
    CHECK(text_of(*small) == "end");
    CHECK(w.elapsed() < 3s);  // well before the 5 s deadline: nothing waits it out
  }
  SUBCASE("the peer dies a megabyte into it: reported lost promptly") {
    encode_frame_header(FrameHeader{FrameType::kData, 0, 7, n}, h);
    raw.write_all(h, sizeof(h));
    raw.write_all(big.data(), (1 << 20) + 1);
    std::this_thread::sleep_for(20ms);
    raw.close();
    Stopwatch w(real_clock());
    CHECK((*link)->recv(7, in(5s)).status().code() == ErrorCode::kPeerLost);
    CHECK(w.elapsed() < 3s);  // well before the 5 s deadline: nothing waits it out
  }
}

TEST_CASE("deadlines: a silent peer times out, a closed peer is lost, nothing hangs") {
  auto a = make(), b = make();
  auto [ab, ba] = connect_pair(*a, *b);
  Stopwatch w(real_clock());
  auto r = ba->recv(1, in(200ms));
  CHECK(r.status().code() == ErrorCode::kTimeout);
  CHECK(w.elapsed() >= 200ms);
  CHECK(w.elapsed() < 3s);  // ends at its deadline, nothing hangs (3 s: room for a stalled host)
  // A goodbye: the other side learns at once.
  ab->close();
  CHECK(ba->recv(1, in(5s)).status().code() == ErrorCode::kPeerLost);
  CHECK(ab->send(1, bytes_of("x"), in(1s)).code() == ErrorCode::kPeerLost);
  // Nothing listens there any more: connecting fails fast.
  std::string gone;
  {
    auto c = make();
    gone = c->address();
  }
  CHECK(a->connect(gone, in(2s)).status().code() == ErrorCode::kPeerLost);
  // A handshake that never comes: accept() gives nothing, the connection is dropped.
  RawPeer silent(b->address());
  CHECK(b->accept(in(200ms)).status().code() == ErrorCode::kTimeout);
}

TEST_CASE("destroying a transport leaks no thread and no socket, and fails its links") {
  const std::size_t fds = count_entries("/proc/self/fd"), threads = count_entries("/proc/self/task");
  std::shared_ptr<Link> survivor;
  {
    auto a = make(), b = make();
    auto [ab, ba] = connect_pair(*a, *b);
    REQUIRE(ab->send(1, bytes_of("x"), in(2s)).ok());
    survivor = ab;
  }
  CHECK(survivor->send(1, bytes_of("y"), in(1s)).code() == ErrorCode::kPeerLost);
  CHECK(survivor->recv(1, in(1s)).status().code() == ErrorCode::kPeerLost);
  survivor.reset();
  CHECK(count_entries("/proc/self/fd") == fds);
  // A joined thread can still be listed for a moment: the kernel wakes the joiner before it removes
  // the task. Bounded wait (a leak never goes away).
  const auto until = std::chrono::steady_clock::now() + 2s;
  while (count_entries("/proc/self/task") != threads && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  CHECK(count_entries("/proc/self/task") == threads);
}

TEST_CASE("any congestion-control choice, one the kernel lacks included, leaves links working") {
  for (const char* cc : {"cubic", "reno", "no-such-algorithm"}) {
    TcpOptions o;
    o.run = test_run();
    o.congestion_control = cc;  // an unknown one is warned about once and the default is kept
    auto a = make_tcp_transport(o), b = make_tcp_transport(o);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    auto ab = (*a)->connect((*b)->address(), in(5s));
    REQUIRE(ab.ok());
    auto ba = (*b)->accept(in(5s));
    REQUIRE(ba.ok());
    REQUIRE((*ab)->send(1, bytes_of(cc), in(5s)).ok());
    CHECK(text_of(*(*ba)->recv(1, in(5s))) == cc);
  }
}
