#include "transport/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <asio.hpp>
#include <spdlog/spdlog.h>

#include "core/log.h"
#include "transport/pending_handshakes.h"
#include "transport/protocol.h"
#include "transport/reach_probe.h"
#include "transport/relay_hub.h"
#include "transport/tcp_link.h"

namespace gossamer::transport {

namespace {

using asio::ip::tcp;
using tcp_detail::Completion;
using tcp_detail::SecureSession;
using tcp_detail::SteadyTime;
using tcp_detail::TcpLink;

Result<tcp::endpoint> parse_endpoint(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return error(ErrorCode::kInvalidArgument, "address '" + address + "' is not host:port");
  std::string host = address.substr(0, colon);
  const std::string port_text = address.substr(colon + 1);
  if (!host.empty() && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned long port = 0;
  try {
    std::size_t used = 0;
    port = std::stoul(port_text, &used);
    if (used != port_text.size() || port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    return error(ErrorCode::kInvalidArgument, "address '" + address + "' has no valid port");
  }
  asio::error_code ec;
  auto ip = asio::ip::make_address(host.empty() ? "0.0.0.0" : host, ec);
  if (!ec) return tcp::endpoint(ip, static_cast<unsigned short>(port));
  // A host name: resolve it (blocking, on the caller's thread, with a private io_context).
  asio::io_context io;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(host, port_text, ec);
  if (ec || results.empty()) return error(ErrorCode::kNotFound, "cannot resolve '" + host + "': " + ec.message());
  return results.begin()->endpoint();
}

// Where a connection comes from, for the per-source bound: the IPv4 address, or an IPv6 address's
// /64 (one host usually holds a whole /64).
std::string address_bucket(const std::string& ip) {
  if (ip.find(':') == std::string::npos) return ip;
  asio::error_code ec;
  const auto a = asio::ip::make_address_v6(ip, ec);
  if (ec) return ip;
  if (a.is_v4_mapped()) return asio::ip::make_address_v4(asio::ip::v4_mapped, a).to_string();
  auto bytes = a.to_bytes();
  std::fill(bytes.begin() + 8, bytes.end(), 0);
  return asio::ip::address_v6(bytes).to_string() + "/64";
}

void tune_socket(tcp::socket& s, const TcpOptions& o) {
  asio::error_code ec;
  s.set_option(tcp::no_delay(true), ec);
  if (o.keepalive) {
    s.set_option(asio::socket_base::keep_alive(true), ec);
    const int idle = 10, interval = 5, count = 3;
    ::setsockopt(s.native_handle(), IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    ::setsockopt(s.native_handle(), IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    ::setsockopt(s.native_handle(), IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  }
  if (!o.congestion_control.empty()) {
    if (::setsockopt(s.native_handle(), IPPROTO_TCP, TCP_CONGESTION, o.congestion_control.data(),
                     static_cast<socklen_t>(o.congestion_control.size())) != 0) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        spdlog::warn("congestion control '{}' is not available on this kernel; using the default (see "
                     "/proc/sys/net/ipv4/tcp_available_congestion_control)",
                     o.congestion_control);
      });
    }
  }
}

// The handshake on a fresh socket, on the I/O thread, under one timeout: HELLOs, the checks of
// check_hello and of the encryption capability, then (with a run key) AUTH and the stream headers.
// `done` runs once, when no operation is pending on the socket, so the socket can be handed on.
struct Handshake : std::enable_shared_from_this<Handshake> {
  using Done = std::function<void(Status, Hello, std::unique_ptr<SecureSession>)>;

  // `prefix`: the first bytes of the peer's HELLO, already read (the accept path reads 4 to tell a
  // HELLO from a relay request).
  Handshake(tcp::socket s, const Hello& ours, std::optional<RunKey> key, bool initiator, ByteView prefix = {})
      : socket(std::move(s)), timer(socket.get_executor()), ours_(ours), key_(std::move(key)), initiator_(initiator) {
    if (key_) ours_.capabilities |= kCapEncrypted;
    hello_out_ = encode_hello(ours_);
    have_ = std::min(prefix.size(), kHelloBytes);
    std::memcpy(hello_in_.data(), prefix.data(), have_);
  }

  void run(Nanos timeout, Done on_done) {
    done_ = std::move(on_done);
    auto self = shared_from_this();
    timer.expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(timeout));
    timer.async_wait([self](asio::error_code ec) {
      if (!ec) {
        self->timed_out_ = true;
        asio::error_code ignored;
        self->socket.close(ignored);
      }
    });
    exchange(hello_out_.data(), hello_out_.size(), hello_in_.data() + have_, hello_in_.size() - have_, [self] { self->after_hello(); });
  }

  tcp::socket socket;
  asio::steady_timer timer;

 private:
  // Writes `out` and reads exactly `in_size` bytes; `next` runs once both completed without error.
  void exchange(const void* out, std::size_t out_size, void* in, std::size_t in_size, std::function<void()> next) {
    auto self = shared_from_this();
    auto pending = std::make_shared<int>(2);
    auto step = [self, pending, next](asio::error_code ec) {
      if (ec && !self->failed_) {
        self->failed_ = true;
        self->first_error_ = ec;
        asio::error_code ignored;
        self->socket.close(ignored);  // unblocks the other operation
      }
      if (--*pending > 0) return;
      if (self->failed_) return self->finish(self->io_error());
      next();
    };
    asio::async_write(socket, asio::buffer(out, out_size), [step](asio::error_code ec, std::size_t) { step(ec); });
    asio::async_read(socket, asio::buffer(in, in_size), [step](asio::error_code ec, std::size_t) { step(ec); });
  }

  Status io_error() const {
    if (timed_out_) return error(ErrorCode::kTimeout, "the handshake did not finish before its deadline");
    return error(ErrorCode::kPeerLost, "connection lost during the handshake: " + first_error_.message() +
                                           " (the peer may have refused us: see its log)");
  }

  void after_hello() {
    auto hello = decode_hello(ByteView(reinterpret_cast<const std::byte*>(hello_in_.data()), kHelloBytes));
    if (!hello.ok()) return finish(hello.status());
    theirs_ = *hello;
    if (Status st = check_hello(ours_, theirs_); !st.ok()) return finish(st);
    const bool we_encrypt = key_.has_value(), they_encrypt = (theirs_.capabilities & kCapEncrypted) != 0;
    if (we_encrypt != they_encrypt) {
      return finish(error(ErrorCode::kUnauthenticated,
                          "peer " + theirs_.peer.to_string() + (they_encrypt ? " requires an encrypted link but this node has no run key (pass --key)"
                                                                             : " runs without encryption (--insecure) but this node requires it")));
    }
    if (!we_encrypt) return finish(Status());
    const Bytes theirs_bytes(reinterpret_cast<const std::byte*>(hello_in_.data()), reinterpret_cast<const std::byte*>(hello_in_.data()) + kHelloBytes);
    kx_ = std::make_unique<KeyExchange>(*key_, initiator_, initiator_ ? ByteView(hello_out_) : ByteView(theirs_bytes),
                                        initiator_ ? ByteView(theirs_bytes) : ByteView(hello_out_));
    auto self = shared_from_this();
    exchange(kx_->auth_message().data(), kAuthBytes, auth_in_.data(), kAuthBytes, [self] { self->after_auth(); });
  }

  void after_auth() {
    auto keys = kx_->finish(ByteView(reinterpret_cast<const std::byte*>(auth_in_.data()), kAuthBytes), theirs_.peer);
    if (!keys.ok()) return finish(keys.status());
    session_ = std::make_unique<SecureSession>(*keys);
    rx_key_ = keys->rx;
    sodium_memzero(&*keys, sizeof(SessionKeys));
    auto self = shared_from_this();
    exchange(session_->sealer.header().data(), kStreamHeaderBytes, stream_header_in_.data(), kStreamHeaderBytes, [self] {
      Status st = self->session_->opener.init(self->rx_key_, ByteView(reinterpret_cast<const std::byte*>(self->stream_header_in_.data()), kStreamHeaderBytes));
      sodium_memzero(self->rx_key_.data(), self->rx_key_.size());
      self->finish(st);
    });
  }

  void finish(Status st) {
    timer.cancel();
    Done finish_cb = std::move(done_);  // the callback may hold this Handshake: drop it after one call
    done_ = nullptr;
    if (!finish_cb) return;
    if (!st.ok()) {
      asio::error_code ignored;
      socket.close(ignored);
      return finish_cb(std::move(st), theirs_, nullptr);
    }
    finish_cb(Status(), theirs_, std::move(session_));
  }

  Hello ours_, theirs_;
  std::optional<RunKey> key_;
  bool initiator_;
  std::size_t have_ = 0;  // bytes of the peer's HELLO read before the handshake began
  Bytes hello_out_;
  std::array<std::uint8_t, kHelloBytes> hello_in_{};
  std::array<std::uint8_t, kAuthBytes> auth_in_{};
  std::array<std::uint8_t, kStreamHeaderBytes> stream_header_in_{};
  std::array<std::uint8_t, 32> rx_key_{};
  std::unique_ptr<KeyExchange> kx_;
  std::unique_ptr<SecureSession> session_;
  Done done_;
  bool timed_out_ = false, failed_ = false;
  asio::error_code first_error_;
};

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TcpOptions& o)
      : options_(o), io_(std::make_shared<asio::io_context>()), work_(asio::make_work_guard(*io_)), acceptor_(*io_) {
    if (options_.self.value == 0) options_.self = random_peer_id();
    hello_.peer = options_.self;
    hello_.run = options_.run;
    relayed_ = std::make_shared<RelayedTotals>();
    // Relaying only in a run with a key: a request must then carry the key's tag, and the ends'
    // handshake through the relay is encrypted (without one, anyone could use the peer as a proxy).
    if (options_.relay_max_pairs > 0 && options_.key) {
      RelayOptions ro;
      ro.wait = options_.relay_wait;
      ro.max_pairs = options_.relay_max_pairs;
      ro.idle = options_.relay_idle;
      hub_ = std::make_shared<RelayHub>(*io_, options_.self, options_.run, options_.key, ro);
    }
  }

  ~TcpTransport() override {
    std::vector<std::shared_ptr<TcpLink>> links;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& w : links_) {
        if (auto l = w.lock()) links.push_back(l);
      }
      accepted_.clear();
    }
    // Every link fails now (so no caller blocks on a stopped thread) and queues its socket's close;
    // the stop below runs after those closes, so no socket is left open.
    for (auto& l : links) l->fail(error(ErrorCode::kPeerLost, "transport shut down"));
    asio::post(*io_, [this] {
      asio::error_code ec;
      acceptor_.close(ec);
      pending_->close_all();  // connections in their handshake: closed, not left open
      if (hub_) hub_->shutdown();
      io_->stop();
    });
    if (thread_.joinable()) thread_.join();
    // Run the handlers the closes made ready (aborted reads), so none keeps a link alive.
    io_->restart();
    io_->poll();
  }

  Status start() {
    auto ep = parse_endpoint(options_.listen);
    if (!ep.ok()) return ep.status().with_context("listen address");
    asio::error_code ec;
    acceptor_.open(ep->protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(*ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return error(ErrorCode::kIoError, "cannot listen on " + options_.listen + ": " + ec.message());
    const auto local = acceptor_.local_endpoint();
    address_ = local.address().to_string() + ":" + std::to_string(local.port());
    do_accept();
    thread_ = std::thread([this] { io_->run(); });
    return Status();
  }

  PeerId self() const override { return options_.self; }
  const RunId& run() const override { return options_.run; }
  std::string address() const override { return address_; }

  Result<std::shared_ptr<Link>> connect(const std::string& address, Deadline deadline) override {
    auto socket = open_socket(address, deadline);
    if (!socket.ok()) return socket.status();
    auto done = handshake(std::move(**socket), /*initiator=*/true, deadline);
    if (!done.ok()) {
      spdlog::warn("refusing {}: {}", address, done.status().message());
      return done.status().with_context("handshake with " + address);
    }
    return std::shared_ptr<Link>(register_link(std::move(done->socket), done->peer, std::move(done->session)));
  }

  Result<std::shared_ptr<Link>> connect_relayed(const std::string& relay, PeerId relay_id, PeerId target, std::uint64_t session, bool initiator,
                                                Deadline deadline) override {
    const std::string what = "a link to peer " + target.to_string() + " through the relay at " + relay;
    auto socket = open_socket(relay, deadline);
    if (!socket.ok()) return socket.status().with_context(what);
    RelayRequest request;
    request.run = options_.run;
    request.from = options_.self;
    request.to = target;
    request.session = session;
    request.relay = relay_id;
    request.time_ms = relay_time_now();
    randombytes_buf(request.nonce.data(), request.nonce.size());
    auto answer = relay_exchange(**socket, encode_relay_request(request, options_.key), deadline);
    if (!answer.ok()) return answer.status().with_context(what);
    if (*answer != RelayStatus::kPaired) {
      const std::string why = *answer == RelayStatus::kNoMatch ? "peer " + target.to_string() + " did not come to it in time"
                              : *answer == RelayStatus::kBusy  ? "it relays as many links as it allows"
                              : *answer == RelayStatus::kStale ? "it found the request stale: this machine's clock and the relay's differ by more than " +
                                                                     std::to_string(kRelayClockSkew.count()) + " minutes (keep the clocks set, e.g. by NTP)"
                                                               : "it refused the request (a peer of another run, or another --key?)";
      const ErrorCode code = *answer == RelayStatus::kNoMatch ? ErrorCode::kTimeout
                             : *answer == RelayStatus::kStale ? ErrorCode::kUnauthenticated
                             : *answer == RelayStatus::kBusy  ? ErrorCode::kResourceExhausted
                                                              : ErrorCode::kUnauthenticated;
      return error(code, what + ": " + why);
    }
    auto done = handshake(std::move(**socket), initiator, deadline);
    if (!done.ok()) return done.status().with_context(what);
    if (done->peer != target) {
      return error(ErrorCode::kUnauthenticated, what + " reached peer " + done->peer.to_string() + " instead");
    }
    auto link = register_link(std::move(done->socket), done->peer, std::move(done->session), "relay " + relay,
                              [totals = relayed_](const LinkStats& st) {
                                totals->sent.fetch_add(st.bytes_sent);
                                totals->received.fetch_add(st.bytes_received);
                              });
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::erase_if(relayed_links_, [](const std::weak_ptr<TcpLink>& w) { return w.expired(); });
      relayed_links_.push_back(link);
    }
    return std::shared_ptr<Link>(link);
  }

  TransportStats stats() const override {
    TransportStats out;
    if (hub_) {
      out.relay_forwarded_bytes = hub_->forwarded_bytes();
      out.relay_pairs = hub_->pairs();
      out.refused += hub_->refused();
    }
    out.refused += refused_.load();
    out.relayed_bytes_sent = relayed_->sent.load();
    out.relayed_bytes_received = relayed_->received.load();
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& w : relayed_links_) {
      if (auto l = w.lock()) {
        const LinkStats st = l->stats();
        out.relayed_bytes_sent += st.bytes_sent;
        out.relayed_bytes_received += st.bytes_received;
      }
    }
    return out;
  }

  Result<std::shared_ptr<Link>> accept(Deadline deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    const SteadyTime until = deadline.steady_time();
    for (;;) {
      if (!accepted_.empty()) {
        auto link = accepted_.front();
        accepted_.pop_front();
        return link;
      }
      if (until == SteadyTime::max()) {
        cv_.wait(lock);
      } else if (cv_.wait_until(lock, until) == std::cv_status::timeout && accepted_.empty()) {
        return error(ErrorCode::kTimeout, "no peer connected to " + address_ + " before the deadline");
      }
    }
  }

 private:
  // `remote` (what remote_address() says) and `on_retire` are set before the link starts reading.
  std::shared_ptr<TcpLink> register_link(tcp::socket socket, PeerId peer, std::unique_ptr<SecureSession> session, std::string remote = {},
                                         std::function<void(const LinkStats&)> on_retire = {}) {
    auto link = std::make_shared<TcpLink>(io_, std::move(socket), peer, options_, std::move(session));
    if (!remote.empty()) link->set_remote(std::move(remote));
    if (on_retire) link->on_retire(std::move(on_retire));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (links_.size() >= 2 * links_pruned_at_ + 64) {  // amortized: drop the links that are gone
        std::erase_if(links_, [](const std::weak_ptr<TcpLink>& w) { return w.expired(); });
        links_pruned_at_ = links_.size();
      }
      links_.push_back(link);
    }
    link->start();
    return link;
  }

  // A connected, tuned socket to `address` (blocking until the deadline).
  Result<std::unique_ptr<tcp::socket>> open_socket(const std::string& address, Deadline deadline) {
    auto ep = parse_endpoint(address);
    if (!ep.ok()) return ep.status();
    auto socket = std::make_shared<tcp::socket>(*io_);
    auto connected = std::make_shared<Completion>();
    asio::post(*io_, [socket, ep = *ep, connected] {
      socket->async_connect(ep, [connected](asio::error_code ec) { connected->finish(ec); });
    });
    if (!connected->wait_until(deadline.steady_time())) {
      asio::post(*io_, [socket] {
        asio::error_code ec;
        socket->close(ec);
      });
      connected->wait();
      return error(ErrorCode::kTimeout, "connecting to " + address + " timed out");
    }
    if (connected->ec) return error(ErrorCode::kPeerLost, "cannot connect to " + address + ": " + connected->ec.message());
    tune_socket(*socket, options_);
    return std::make_unique<tcp::socket>(std::move(*socket));
  }

  struct Handshaken {
    tcp::socket socket;
    PeerId peer;
    std::unique_ptr<SecureSession> session;
  };

  // The handshake on a connected socket, as the connecting side (`initiator`) or the other.
  Result<Handshaken> handshake(tcp::socket socket, bool initiator, Deadline deadline) {
    const Nanos left = deadline.remaining(real_clock());
    auto hs = std::make_shared<Handshake>(std::move(socket), hello_, options_.key, initiator);
    auto done = std::make_shared<Completion>();
    auto theirs = std::make_shared<Hello>();
    auto session = std::make_shared<std::unique_ptr<SecureSession>>();
    asio::post(*io_, [hs, done, theirs, session, timeout = std::min(left, options_.handshake_timeout)] {
      hs->run(timeout, [done, theirs, session](Status st, Hello h, std::unique_ptr<SecureSession> s) {
        *theirs = h;
        *session = std::move(s);
        done->finish({}, std::move(st));
      });
    });
    done->wait();  // bounded by the handshake timer
    if (!done->status.ok()) return done->status;
    return Handshaken{std::move(hs->socket), theirs->peer, std::move(*session)};
  }

  // Sends a relay request and waits for the relay's answer (until the deadline).
  Result<RelayStatus> relay_exchange(tcp::socket& socket, Bytes request, Deadline deadline) {
    auto answer = std::make_shared<std::array<std::uint8_t, kRelayAnswerBytes>>();
    auto wrote = std::make_shared<Completion>(), read = std::make_shared<Completion>();
    auto out = std::make_shared<Bytes>(std::move(request));
    asio::post(*io_, [&socket, out, answer, wrote, read] {
      asio::async_write(socket, asio::buffer(out->data(), out->size()), [wrote, out](asio::error_code ec, std::size_t) { wrote->finish(ec); });
      asio::async_read(socket, asio::buffer(answer->data(), answer->size()), [read](asio::error_code ec, std::size_t) { read->finish(ec); });
    });
    if (!read->wait_until(deadline.steady_time())) {
      asio::post(*io_, [&socket] {
        asio::error_code ec;
        socket.close(ec);
      });
      read->wait();
      wrote->wait();
      return error(ErrorCode::kTimeout, "the relay did not pair this link before the deadline");
    }
    wrote->wait();
    if (read->ec) return error(ErrorCode::kPeerLost, "the relay closed the connection: " + read->ec.message());
    return decode_relay_answer(ByteView(reinterpret_cast<const std::byte*>(answer->data()), answer->size()));
  }

  void retire_relayed(std::uint64_t session) override {
    if (!hub_) return;
    asio::post(*io_, [hub = hub_, session] { hub->retire_through(session); });
  }

  void do_accept() {
    acceptor_.async_accept([this](asio::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec) greet(std::move(socket));
      do_accept();
    });
  }

  void refuse(const std::string& who, const std::string& why) {
    refused_.fetch_add(1);
    if (refusal_log_.allow()) spdlog::warn("refusing connection from {}: {}", who, why);
  }

  // A new connection (I/O thread): its first 4 bytes say whether it is a HELLO or a relay request.
  // Everything up to the end of the handshake runs under handshake_timeout, and at most
  // max_handshakes connections are at that stage at once.
  void greet(tcp::socket socket) {
    asio::error_code rec;
    const auto remote = socket.remote_endpoint(rec);
    const std::string ip = rec ? std::string("?") : remote.address().to_string();
    const std::string who = rec ? std::string("?") : ip + ":" + std::to_string(remote.port());
    auto slot = pending_->take(address_bucket(ip), options_.max_handshakes, options_.max_handshakes_per_ip);
    if (!slot) {
      asio::error_code ignored;
      socket.close(ignored);
      return refuse(who, "too many connections in their handshake (from " + ip + ", or in all)");
    }
    tune_socket(socket, options_);
    struct Greeting {
      explicit Greeting(tcp::socket s) : socket(std::move(s)), timer(socket.get_executor()) {}
      tcp::socket socket;
      asio::steady_timer timer;
      std::array<std::uint8_t, 4> first{};
    };
    auto g = std::make_shared<Greeting>(std::move(socket));
    slot->close = [weak = std::weak_ptr<Greeting>(g)] {
      if (auto alive = weak.lock()) {
        asio::error_code ignored;
        alive->socket.close(ignored);
      }
    };
    g->timer.expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(options_.handshake_timeout));
    g->timer.async_wait([g](asio::error_code e) {
      if (e) return;
      asio::error_code ignored;
      g->socket.close(ignored);
    });
    // `slot` is held by the handlers until the handshake ends, either way.
    asio::async_read(g->socket, asio::buffer(g->first), [this, g, who, slot](asio::error_code e, std::size_t) {
      g->timer.cancel();
      const ByteView first(reinterpret_cast<const std::byte*>(g->first.data()), g->first.size());
      if (e) return refuse(who, e == asio::error::operation_aborted ? "nothing sent before the handshake deadline" : "connection closed before the handshake");
      if (is_reach_probe_magic(first)) {  // a member checking that this port can be reached (reach_probe.h)
        probes_.fetch_add(1);
        asio::error_code ignored;
        g->socket.close(ignored);
        return;
      }
      if (is_relay_magic(first)) {
        if (!hub_) {
          asio::error_code ignored;
          g->socket.close(ignored);
          return refuse(who, "a relay request, and this peer relays only in a run with a key");
        }
        slot->close = hub_->take(std::move(g->socket), first, options_.handshake_timeout, slot);
        return;
      }
      auto hs = std::make_shared<Handshake>(std::move(g->socket), hello_, options_.key, /*initiator=*/false, first);
      slot->close = [weak = std::weak_ptr<Handshake>(hs)] {
        if (auto alive = weak.lock()) {
          asio::error_code ignored;
          alive->socket.close(ignored);
        }
      };
      hs->run(options_.handshake_timeout, [this, hs, who, slot](Status st, Hello theirs, std::unique_ptr<SecureSession> session) {
        if (!st.ok()) return refuse(who, st.message());
        auto link = register_link(std::move(hs->socket), theirs.peer, std::move(session));
        std::lock_guard<std::mutex> lock(mu_);
        if (accepted_.size() >= options_.max_accepted) {
          link->close();
          refused_.fetch_add(1);
          if (refusal_log_.allow()) spdlog::warn("refusing a link from peer {}: {} links are waiting to be taken already", theirs.peer.to_string(), accepted_.size());
          return;
        }
        accepted_.push_back(link);
        cv_.notify_all();
      });
    });
  }

  TcpOptions options_;
  Hello hello_;
  // Anyone can open connections that fail the handshake: counted, and logged at a bounded rate.
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::uint64_t> probes_{0};  // dial-back checks of this port
  LogLimiter refusal_log_{"refused connections that failed the handshake"};
  std::shared_ptr<asio::io_context> io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  tcp::acceptor acceptor_;
  std::thread thread_;
  std::string address_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Link>> accepted_;
  std::vector<std::weak_ptr<TcpLink>> links_;
  std::size_t links_pruned_at_ = 0;
  std::shared_ptr<PendingHandshakes> pending_ = std::make_shared<PendingHandshakes>();
  std::shared_ptr<RelayHub> hub_;  // null: this transport does not relay
  // This peer's traffic over relayed links: the links alive, and the totals of those gone.
  struct RelayedTotals {
    std::atomic<std::uint64_t> sent{0}, received{0};
  };
  std::shared_ptr<RelayedTotals> relayed_;
  std::vector<std::weak_ptr<TcpLink>> relayed_links_;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_tcp_transport(const TcpOptions& options) {
  auto t = std::make_unique<TcpTransport>(options);
  if (Status st = t->start(); !st.ok()) return st;
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace gossamer::transport
