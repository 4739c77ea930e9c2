// Endpoint: a host and a port as a user types them (`--listen`, `--join`), parsed and range-checked
// before anything is started, so a typo is one clear error at once instead of a long wait.
//
// Accepted: "host:port", "tcp://host:port", "[ipv6]:port". host is an IPv4 address, a bracketed IPv6
// address, a DNS name (letters, digits, '-' and '.'), or, for listening, a wildcard ("*", 0.0.0.0,
// [::]). port is decimal in [1, 65535]; 0 (any free port) only for listening.
// Pure functions; thread-safe. Errors are kInvalidArgument Status values naming what to type instead.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/wire.h"

namespace gossamer::transport {

enum class EndpointUse : std::uint8_t {
  kListen = 0,  // a local address to bind: wildcards and port 0 allowed
  kDial = 1,    // a remote address to connect to: a concrete host and port
};

struct Endpoint {
  std::string host;  // without brackets; "0.0.0.0" for the wildcard "*"
  std::uint16_t port = 0;
  bool ipv6 = false;

  // "host:port", or "[host]:port" for IPv6.
  std::string to_string() const;
};

// `what` names the option in messages ("--join").
[[nodiscard]] Result<Endpoint> parse_endpoint(std::string_view text, EndpointUse use, std::string_view what);

// True when `address` ("tcp://0.0.0.0:7000", "[::]:7000", "*:7000") names every address of a host
// rather than one: such an address can be listened on but not dialled.
bool is_wildcard_address(std::string_view address);
// `address` with its host replaced by `host` (an IPv4 or IPv6 address), keeping its "tcp://" prefix
// and its port: "tcp://0.0.0.0:7000" with "192.0.2.7" is "tcp://192.0.2.7:7000".
std::string with_host(std::string_view address, std::string_view host);

// An address on the wire (gossip's member rows, the round messages' link addresses): form u8, then
// 1: "tcp://A.B.C.D:PORT", 2: "A.B.C.D:PORT", as 4 bytes and port u16 (7 bytes in all, against about
// 24 as text); 0: length varint and the text, at most 256 bytes (any other address). Read back, it is
// the very string written.
inline constexpr std::uint8_t kAddressText = 0, kAddressTcp4 = 1, kAddressIp4 = 2;
inline constexpr std::size_t kMaxWireAddress = 256;
void write_address(Writer& w, const std::string& address);
// Reads one address; check r.ok() afterwards.
std::string read_address(Reader& r);
// True for 127.0.0.0/8, ::1 and IPv4-mapped loopback addresses.
bool is_loopback_ip(std::string_view ip);
// The host of `address` ("tcp://192.0.2.7:7000" -> "192.0.2.7", "[::1]:7" -> "::1"); empty if none.
std::string host_of(std::string_view address);

// Whether a TCP port can be listened on at `endpoint` now (a test bind, released at once): an address
// that is not this machine's or a port in use is a kInvalidArgument Status naming `what`. Port 0 and
// host names are not checked.
[[nodiscard]] Status check_can_listen(const Endpoint& endpoint, std::string_view what);

// Looks the host up (getaddrinfo; immediate for IP addresses): a name that does not resolve is a
// kInvalidArgument Status naming `what`. Blocks for as long as the system resolver takes.
[[nodiscard]] Status check_resolves(const Endpoint& endpoint, std::string_view what);

}  // namespace gossamer::transport
