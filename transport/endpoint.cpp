#include "transport/endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <optional>

namespace gossamer::transport {

namespace {

bool all_of(std::string_view s, int (*pred)(int)) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [pred](char c) { return pred(static_cast<unsigned char>(c)) != 0; });
}

bool is_dns_name(std::string_view host) {
  if (host.size() > 253) return false;
  std::size_t start = 0;
  while (start <= host.size()) {
    const std::size_t dot = std::min(host.find('.', start), host.size());
    const std::string_view label = host.substr(start, dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    for (char c : label) {
      if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '-') return false;
    }
    start = dot + 1;
  }
  return true;
}

}  // namespace

std::string Endpoint::to_string() const {
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<Endpoint> parse_endpoint(std::string_view text, EndpointUse use, std::string_view what) {
  const std::string shown(text);
  const std::string example = use == EndpointUse::kListen ? "0.0.0.0:7000" : "192.0.2.10:7000";
  auto bad = [&](const std::string& why) {
    return error(ErrorCode::kInvalidArgument, std::string(what) + " " + (shown.empty() ? "''" : shown) + ": " + why + " (expected HOST:PORT, e.g. " +
                                                  example + ", or [IPv6]:PORT)");
  };
  if (text.rfind("tcp://", 0) == 0) text.remove_prefix(6);
  Endpoint ep;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) return bad("an IPv6 address opened with '[' is never closed");
    ep.host = std::string(text.substr(1, close - 1));
    ep.ipv6 = true;
    if (close + 1 >= text.size() || text[close + 1] != ':') return bad("no port after the IPv6 address");
    port_text = text.substr(close + 2);
    in6_addr a6{};
    if (inet_pton(AF_INET6, ep.host.c_str(), &a6) != 1) return bad("'" + ep.host + "' is not an IPv6 address");
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    if (text.find(':') != colon) return bad("more than one ':'; write an IPv6 address in brackets, as [::1]:7000");
    ep.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
    if (ep.host.empty()) return bad("no host");
    if (ep.host == "*") {
      if (use != EndpointUse::kListen) return bad("'*' listens on every address; give the address of a peer to join");
      ep.host = "0.0.0.0";
    }
    in_addr a4{};
    const bool numeric = all_of(ep.host, [](int c) { return (std::isdigit(c) != 0 || c == '.') ? 1 : 0; });
    if (numeric) {
      if (inet_pton(AF_INET, ep.host.c_str(), &a4) != 1) return bad("'" + ep.host + "' is not an IPv4 address");
    } else if (!is_dns_name(ep.host)) {
      return bad("'" + ep.host + "' is neither an IP address nor a host name");
    }
  }
  if (!all_of(port_text, [](int c) { return std::isdigit(c); }) || port_text.size() > 5) {
    return bad(port_text.empty() ? std::string("no port") : "port '" + std::string(port_text) + "' is not a number in [1, 65535]");
  }
  const long port = std::stol(std::string(port_text));
  if (port > 65535) return bad("port " + std::string(port_text) + " is above 65535");
  if (port == 0 && use == EndpointUse::kDial) return bad("port 0 cannot be dialled; give the port the peer listens on");
  const bool wildcard = ep.host == "0.0.0.0" || (ep.ipv6 && ep.host == "::");
  if (wildcard && use == EndpointUse::kDial) return bad("a wildcard address cannot be dialled; give the peer's own address");
  ep.port = static_cast<std::uint16_t>(port);
  return ep;
}

namespace {
std::string_view without_scheme(std::string_view address) {
  if (address.rfind("tcp://", 0) == 0) address.remove_prefix(6);
  return address;
}
}  // namespace

std::string host_of(std::string_view address) {
  address = without_scheme(address);
  if (!address.empty() && address.front() == '[') {
    const auto close = address.find(']');
    return close == std::string_view::npos ? std::string() : std::string(address.substr(1, close - 1));
  }
  const auto colon = address.rfind(':');
  return std::string(address.substr(0, colon == std::string_view::npos ? address.size() : colon));
}

bool is_loopback_ip(std::string_view ip) {
  if (ip.rfind("::ffff:", 0) == 0) ip.remove_prefix(7);
  return ip.rfind("127.", 0) == 0 || ip == "::1";
}

bool is_wildcard_address(std::string_view address) {
  const std::string host = host_of(address);
  return host == "0.0.0.0" || host == "*" || host == "::" || host.empty();
}

std::string with_host(std::string_view address, std::string_view host) {
  const bool scheme = address.rfind("tcp://", 0) == 0;
  const std::string_view rest = without_scheme(address);
  const auto colon = rest.rfind(':');
  const std::string port = colon == std::string_view::npos ? std::string() : std::string(rest.substr(colon));
  const bool v6 = host.find(':') != std::string_view::npos;
  std::string out;
  out.reserve(host.size() + port.size() + 8);
  if (scheme) out.append("tcp://");
  if (v6) out.push_back('[');
  out.append(host);
  if (v6) out.push_back(']');
  out.append(port);
  return out;
}

Status check_can_listen(const Endpoint& endpoint, std::string_view what) {
  if (endpoint.port == 0) return Status();
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (endpoint.ipv6) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(endpoint.port);
    if (inet_pton(AF_INET6, endpoint.host.c_str(), &a6->sin6_addr) != 1) return Status();
    len = sizeof(sockaddr_in6);
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
    a4->sin_family = AF_INET;
    a4->sin_port = htons(endpoint.port);
    if (inet_pton(AF_INET, endpoint.host.c_str(), &a4->sin_addr) != 1) return Status();  // a host name
    len = sizeof(sockaddr_in);
  }
  const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status();
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as the links' acceptor does
  const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
  const int e = errno;
  ::close(fd);
  if (rc == 0) return Status();
  if (e == EADDRINUSE) {
    return error(ErrorCode::kInvalidArgument, std::string(what) + " " + endpoint.to_string() + ": the port is in use by another program; choose another");
  }
  return error(ErrorCode::kInvalidArgument, std::string(what) + " " + endpoint.to_string() + ": cannot listen there (" + std::strerror(e) +
                                                "); give an address of this machine (or 0.0.0.0)");
}

Status check_resolves(const Endpoint& endpoint, std::string_view what) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_family = endpoint.ipv6 ? AF_INET6 : AF_UNSPEC;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(endpoint.host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) freeaddrinfo(found);
  if (rc != 0) {
    return error(ErrorCode::kInvalidArgument, std::string(what) + " " + endpoint.to_string() + ": host '" + endpoint.host + "' cannot be resolved (" +
                                                  gai_strerror(rc) + "); check the name, or give the peer's IP address");
  }
  return Status();
}

namespace {

// "A.B.C.D:PORT" as read_address would write it back, or nothing.
std::optional<std::pair<std::array<std::uint8_t, 4>, std::uint16_t>> compact_ip4(std::string_view a) {
  std::array<std::uint32_t, 5> parts{};  // four octets, then the port
  std::size_t part = 0, digits = 0;
  for (const char c : a) {
    const char sep = part < 3 ? '.' : ':';
    if (c >= '0' && c <= '9') {
      if (digits > 0 && parts[part] == 0) return std::nullopt;  // a leading zero would not come back
      parts[part] = parts[part] * 10 + static_cast<std::uint32_t>(c - '0');
      if (++digits > 5 || parts[part] > (part < 4 ? 255U : 65535U)) return std::nullopt;
    } else if (c == sep && part < 4 && digits > 0) {
      ++part;
      digits = 0;
    } else {
      return std::nullopt;
    }
  }
  if (part != 4 || digits == 0) return std::nullopt;
  return std::make_pair(std::array<std::uint8_t, 4>{static_cast<std::uint8_t>(parts[0]), static_cast<std::uint8_t>(parts[1]),
                                                    static_cast<std::uint8_t>(parts[2]), static_cast<std::uint8_t>(parts[3])},
                        static_cast<std::uint16_t>(parts[4]));
}

constexpr std::string_view kTcp = "tcp://";

}  // namespace

void write_address(Writer& w, const std::string& address) {
  const bool tcp = std::string_view(address).starts_with(kTcp);
  if (auto ip4 = compact_ip4(std::string_view(address).substr(tcp ? kTcp.size() : 0))) {
    w.u8(tcp ? kAddressTcp4 : kAddressIp4);
    for (std::uint8_t b : ip4->first) w.u8(b);
    w.u16(ip4->second);
    return;
  }
  w.u8(kAddressText);
  w.vstr(address);
}

std::string read_address(Reader& r) {
  const std::uint8_t form = r.u8();
  if (!r.ok()) return {};
  if (form == kAddressTcp4 || form == kAddressIp4) {
    std::string out = form == kAddressTcp4 ? std::string(kTcp) : std::string();
    for (int i = 0; i < 4; ++i) out += std::to_string(r.u8()) + (i < 3 ? "." : ":");
    out += std::to_string(r.u16());
    return r.ok() ? out : std::string();
  }
  if (form != kAddressText) {
    r.fail(ErrorCode::kMalformed, "unknown address form " + std::to_string(form));
    return {};
  }
  return r.vstr(kMaxWireAddress);
}

}  // namespace gossamer::transport
