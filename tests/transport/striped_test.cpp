#include <doctest/doctest.h>

#include <cstring>
#include <thread>

#include "transport/striped_link.h"
#include "transport/tcp_transport.h"

using namespace gossamer;
using namespace gossamer::transport;
using namespace std::chrono_literals;

namespace {
std::unique_ptr<Transport> make() {
  auto t = make_tcp_transport(TcpOptions{});
  REQUIRE(t.ok());
  return std::move(*t);
}
Deadline in(Nanos d) { return Deadline::after(real_clock(), d); }
}  // namespace

TEST_CASE("a striped link carries small and large messages over several lanes") {
  auto a = make(), b = make();
  StripedAcceptor acceptor(*b);
  std::shared_ptr<Link> ba;
  std::thread server([&] {
    auto l = acceptor.accept(in(10s));
    REQUIRE(l.ok());
    ba = *l;
  });
  StripeOptions o;
  o.lanes = 4;
  o.min_stripe_bytes = 1 << 16;
  auto ab = connect_striped(*a, b->address(), o, in(10s));
  server.join();
  REQUIRE(ab.ok());
  REQUIRE(ba);
  CHECK(ba->remote_address().find("(4 lanes)") != std::string::npos);
  for (std::size_t size : {std::size_t{0}, std::size_t{10}, std::size_t{131071}, std::size_t{131072}, std::size_t{(8 << 20) + 3}}) {
    Bytes m(size);
    for (std::size_t i = 0; i < size; ++i) m[i] = static_cast<std::byte>(i * 13 + size);
    REQUIRE((*ab)->send(5, m, in(10s)).ok());
    REQUIRE((*ab)->send(6, as_bytes("after"), in(10s)).ok());
    auto got = ba->recv(5, in(10s));
    REQUIRE(got.ok());
    CAPTURE(size);
    CHECK((*got == m));
    CHECK(ba->recv(6, in(10s)).ok());
  }
  // Replies go the other way over the same lanes.
  const Bytes reply(3 << 20, std::byte{9});
  REQUIRE(ba->send(7, reply, in(10s)).ok());
  CHECK((*(*ab)->recv(7, in(10s)) == reply));
  CHECK((*ab)->stats().bytes_sent > (8u << 20));
  (*ab)->close();
  CHECK(ba->recv(5, in(5s)).status().code() == ErrorCode::kPeerLost);
}

TEST_CASE("the striped acceptor drops connections whose lane announcement is malformed") {
  auto a = make(), b = make();
  StripedAcceptor acceptor(*b);
  auto plain = a->connect(b->address(), in(5s));
  REQUIRE(plain.ok());
  REQUIRE((*plain)->send(kLaneTag, as_bytes("nonsense"), in(5s)).ok());
  auto r = acceptor.accept(in(1s));
  CHECK(r.status().code() == ErrorCode::kTimeout);
  CHECK((*plain)->recv(1, in(5s)).status().code() == ErrorCode::kPeerLost);
  StripeOptions bad;
  bad.lanes = 0;
  CHECK(connect_striped(*a, b->address(), bad, in(1s)).status().code() == ErrorCode::kInvalidArgument);
}
