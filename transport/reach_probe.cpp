#include "transport/reach_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/wire.h"
#include "transport/endpoint.h"

namespace gossamer::transport {

namespace {

constexpr char kMagic[4] = {'G', 'S', 'R', 'P'};
constexpr char kProbeMagic[4] = {'G', 'S', 'P', 'B'};
constexpr std::size_t kMaxAddress = 300, kMaxDetail = 300, kMaxIp = 64;

void write_header(Writer& w, ReachType type, std::uint64_t nonce) {
  w.raw(as_bytes(std::string_view(kMagic, 4)));
  w.u8(kReachVersion);
  w.u8(static_cast<std::uint8_t>(type));
  w.u64(nonce);
}

// Reads the header; the nonce on success.
Result<std::uint64_t> read_header(Reader& r, ReachType want) {
  ByteView magic = r.raw(4);
  const std::uint8_t version = r.u8(), type = r.u8();
  const std::uint64_t nonce = r.u64();
  if (!r.ok()) return r.status();
  if (std::memcmp(magic.data(), kMagic, 4) != 0) return error(ErrorCode::kMalformed, "not a dial-back message");
  if (version != kReachVersion) {
    return error(ErrorCode::kVersionMismatch, "dial-back message version " + std::to_string(version) + " (we speak " + std::to_string(kReachVersion) + ")");
  }
  if (type != static_cast<std::uint8_t>(want)) return error(ErrorCode::kMalformed, "dial-back message of type " + std::to_string(type));
  return nonce;
}

Result<std::uint8_t> read_count(Reader& r) {
  const std::uint8_t n = r.u8();
  if (!r.ok()) return r.status();
  if (n == 0 || n > kMaxReachAddresses) return error(ErrorCode::kMalformed, "dial-back message with " + std::to_string(n) + " addresses");
  return n;
}

}  // namespace

ReachType reach_type(ByteView bytes) {
  if (bytes.size() < 6 || std::memcmp(bytes.data(), kMagic, 4) != 0) return ReachType::kNone;
  const auto type = static_cast<std::uint8_t>(bytes[5]);
  if (type == static_cast<std::uint8_t>(ReachType::kRequest)) return ReachType::kRequest;
  if (type == static_cast<std::uint8_t>(ReachType::kAnswer)) return ReachType::kAnswer;
  return ReachType::kNone;
}

Bytes encode_reach_request(const ReachRequest& request) {
  Writer w;
  write_header(w, ReachType::kRequest, request.nonce);
  w.u64(request.requester.value);
  w.u8(static_cast<std::uint8_t>(request.addresses.size()));
  for (const auto& a : request.addresses) w.str(a);
  return std::move(w).take();
}

Result<ReachRequest> decode_reach_request(ByteView bytes) {
  Reader r(bytes, "dial-back request");
  auto nonce = read_header(r, ReachType::kRequest);
  if (!nonce.ok()) return nonce.status();
  ReachRequest out;
  out.nonce = *nonce;
  out.requester = PeerId{r.u64()};
  auto n = read_count(r);
  if (!n.ok()) return n.status();
  for (std::uint8_t i = 0; i < *n; ++i) out.addresses.push_back(r.str(kMaxAddress));
  r.expect_end();
  if (!r.ok()) return r.status();
  if (out.requester.value == 0) return error(ErrorCode::kMalformed, "dial-back request from peer id 0");
  return out;
}

Bytes encode_reach_answer(const ReachAnswer& answer) {
  Writer w;
  write_header(w, ReachType::kAnswer, answer.nonce);
  w.str(answer.observed_ip);
  w.u8(static_cast<std::uint8_t>(answer.results.size()));
  for (const auto& res : answer.results) {
    w.u8(static_cast<std::uint8_t>(res.outcome));
    w.str(res.detail);
  }
  return std::move(w).take();
}

Result<ReachAnswer> decode_reach_answer(ByteView bytes) {
  Reader r(bytes, "dial-back answer");
  auto nonce = read_header(r, ReachType::kAnswer);
  if (!nonce.ok()) return nonce.status();
  ReachAnswer out;
  out.nonce = *nonce;
  out.observed_ip = r.str(kMaxIp);
  auto n = read_count(r);
  if (!n.ok()) return n.status();
  for (std::uint8_t i = 0; i < *n; ++i) {
    ReachResult res;
    const std::uint8_t outcome = r.u8();
    res.detail = r.str(kMaxDetail);
    if (r.ok() && outcome > static_cast<std::uint8_t>(ReachOutcome::kUnchecked)) {
      return error(ErrorCode::kMalformed, "dial-back answer with outcome " + std::to_string(outcome));
    }
    res.outcome = static_cast<ReachOutcome>(outcome);
    out.results.push_back(std::move(res));
  }
  r.expect_end();
  if (!r.ok()) return r.status();
  return out;
}

bool is_reach_probe_magic(ByteView first4) { return first4.size() >= 4 && std::memcmp(first4.data(), kProbeMagic, 4) == 0; }

Result<std::string> reach_target(const std::string& requested, const std::string& observed_ip) {
  auto ep = parse_endpoint(requested, EndpointUse::kListen, "dial-back address");
  if (!ep.ok()) return ep.status();
  if (ep->port == 0) return error(ErrorCode::kInvalidArgument, "dial-back address " + requested + " has no port");
  if (observed_ip.empty()) return error(ErrorCode::kInvalidArgument, "the request's source address is unknown");
  Endpoint at;
  at.host = observed_ip;
  at.ipv6 = observed_ip.find(':') != std::string::npos;
  at.port = ep->port;
  if (is_wildcard_address(requested) || ep->host == observed_ip) return at.to_string();
  // A name (or another IP): dialled only when it is the address the request came from.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  bool same = false;
  if (::getaddrinfo(ep->host.c_str(), nullptr, &hints, &found) == 0) {
    for (addrinfo* a = found; a != nullptr && !same; a = a->ai_next) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = a->ai_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
                                                : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
      same = ::inet_ntop(a->ai_family, raw, text, sizeof(text)) != nullptr && observed_ip == text;
    }
    ::freeaddrinfo(found);
  }
  if (!same) return error(ErrorCode::kNotFound, ep->host + " is not the address the request came from (" + observed_ip + "): not dialled");
  return at.to_string();
}

Status probe_tcp(const std::string& address, Nanos timeout) {
  auto ep = parse_endpoint(address, EndpointUse::kDial, "dial-back address");
  if (!ep.ok()) return ep.status();
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(ep->port);
  if (int rc = ::getaddrinfo(ep->host.c_str(), port.c_str(), &hints, &found); rc != 0 || found == nullptr) {
    return error(ErrorCode::kNotFound, "cannot resolve " + ep->host + ": " + ::gai_strerror(rc));
  }
  const int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, found->ai_protocol);
  if (fd < 0) {
    ::freeaddrinfo(found);
    return error(ErrorCode::kIoError, std::string("socket: ") + std::strerror(errno));
  }
  int rc = ::connect(fd, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  int err = rc == 0 ? 0 : errno;
  if (rc != 0 && err == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    const int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
    rc = ::poll(&p, 1, std::max(ms, 1));
    if (rc == 0) {
      ::close(fd);
      return error(ErrorCode::kTimeout, "no answer within " + std::to_string(ms) + " ms (a firewall or a NAT without a port forward drops it)");
    }
    socklen_t len = sizeof(err);
    if (rc < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  }
  if (err == 0) (void)!::send(fd, kProbeMagic, sizeof(kProbeMagic), MSG_NOSIGNAL);
  ::close(fd);
  if (err != 0) return error(ErrorCode::kPeerLost, std::string(std::strerror(err)));
  return Status();
}

}  // namespace gossamer::transport
