#include <doctest/doctest.h>

#include "transport/endpoint.h"

namespace gossamer::transport {

namespace {
std::string refusal(std::string_view text, EndpointUse use) {
  auto ep = parse_endpoint(text, use, "--join");
  REQUIRE_FALSE(ep.ok());
  CHECK(ep.status().code() == ErrorCode::kInvalidArgument);
  CHECK(ep.status().message().find("--join") != std::string::npos);
  return ep.status().message();
}
}  // namespace

TEST_CASE("endpoints: well-formed hosts and ports are parsed") {
  auto a = parse_endpoint("127.0.0.1:7000", EndpointUse::kDial, "--join");
  REQUIRE(a.ok());
  CHECK(a->host == "127.0.0.1");
  CHECK(a->port == 7000);
  CHECK_FALSE(a->ipv6);
  CHECK(a->to_string() == "127.0.0.1:7000");

  auto b = parse_endpoint("tcp://peer-1.example.org:65535", EndpointUse::kDial, "--join");
  REQUIRE(b.ok());
  CHECK(b->host == "peer-1.example.org");
  CHECK(b->port == 65535);

  auto c = parse_endpoint("[2001:db8::7]:7000", EndpointUse::kDial, "--join");
  REQUIRE(c.ok());
  CHECK(c->ipv6);
  CHECK(c->host == "2001:db8::7");
  CHECK(c->to_string() == "[2001:db8::7]:7000");

  auto listen_any = parse_endpoint("0.0.0.0:0", EndpointUse::kListen, "--listen");
  REQUIRE(listen_any.ok());
  CHECK(listen_any->port == 0);
  auto star = parse_endpoint("*:7000", EndpointUse::kListen, "--listen");
  REQUIRE(star.ok());
  CHECK(star->host == "0.0.0.0");
  CHECK(parse_endpoint("[::]:7000", EndpointUse::kListen, "--listen").ok());
}

TEST_CASE("endpoints: every malformed address is refused with a reason") {
  CHECK(refusal("127.0.0.1", EndpointUse::kDial).find("no port") != std::string::npos);
  CHECK(refusal("127.0.0.1:abc", EndpointUse::kDial).find("'abc'") != std::string::npos);
  CHECK(refusal("127.0.0.1:99999", EndpointUse::kDial).find("above 65535") != std::string::npos);
  CHECK(refusal("127.0.0.1:70000", EndpointUse::kListen).find("above 65535") != std::string::npos);
  CHECK(refusal("127.0.0.1:123456", EndpointUse::kDial).find("[1, 65535]") != std::string::npos);
  CHECK(refusal("not:an:addr", EndpointUse::kDial).find("more than one ':'") != std::string::npos);
  CHECK(refusal("::1:7000", EndpointUse::kDial).find("brackets") != std::string::npos);
  CHECK(refusal("[::1:7000", EndpointUse::kDial).find("never closed") != std::string::npos);
  CHECK(refusal("[::1]", EndpointUse::kDial).find("no port") != std::string::npos);
  CHECK(refusal("[nothex]:7000", EndpointUse::kDial).find("not an IPv6") != std::string::npos);
  CHECK(refusal("300.1.1.1:7000", EndpointUse::kDial).find("not an IPv4") != std::string::npos);
  CHECK(refusal("host_name:7000", EndpointUse::kDial).find("neither an IP address nor a host name") != std::string::npos);
  CHECK(refusal(":7000", EndpointUse::kDial).find("no host") != std::string::npos);
  CHECK(refusal("", EndpointUse::kDial).find("''") != std::string::npos);
  CHECK(refusal("127.0.0.1:", EndpointUse::kDial).find("no port") != std::string::npos);
  CHECK(refusal("127.0.0.1:-5", EndpointUse::kDial).find("'-5'") != std::string::npos);
  // What only makes sense for listening is refused for dialling.
  CHECK(refusal("127.0.0.1:0", EndpointUse::kDial).find("port 0") != std::string::npos);
  CHECK(refusal("0.0.0.0:7000", EndpointUse::kDial).find("wildcard") != std::string::npos);
  CHECK(refusal("[::]:7000", EndpointUse::kDial).find("wildcard") != std::string::npos);
  CHECK(refusal("*:7000", EndpointUse::kDial).find("'*'") != std::string::npos);
}

TEST_CASE("endpoints: wildcard and loopback tests, and a host put into an announced address") {
  CHECK(is_wildcard_address("tcp://0.0.0.0:7000"));
  CHECK(is_wildcard_address("[::]:7000"));
  CHECK(is_wildcard_address("*:7000"));
  CHECK_FALSE(is_wildcard_address("tcp://192.0.2.7:7000"));
  CHECK(host_of("tcp://192.0.2.7:7000") == "192.0.2.7");
  CHECK(host_of("[2001:db8::1]:7") == "2001:db8::1");
  CHECK(with_host("tcp://0.0.0.0:7000", "198.51.100.4") == "tcp://198.51.100.4:7000");
  CHECK(with_host("0.0.0.0:7001", "2001:db8::9") == "[2001:db8::9]:7001");
  CHECK(is_loopback_ip("127.0.0.1"));
  CHECK(is_loopback_ip("127.4.5.6"));
  CHECK(is_loopback_ip("::1"));
  CHECK(is_loopback_ip("::ffff:127.0.0.1"));
  CHECK_FALSE(is_loopback_ip("192.0.2.1"));
  CHECK_FALSE(is_loopback_ip("::ffff:192.0.2.1"));
}

}  // namespace gossamer::transport
