#include "transport/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <array>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <asio.hpp>
#include <spdlog/spdlog.h>

#include "transport/protocol.h"

namespace gossamer::transport {

namespace {

using asio::ip::tcp;
using SteadyTime = std::chrono::steady_clock::time_point;

// Deadlines of the TCP transport are on the real (steady) clock.
SteadyTime steady(Deadline d) {
  if (d.is_never()) return SteadyTime::max();
  return SteadyTime(std::chrono::duration_cast<std::chrono::steady_clock::duration>(d.time()));
}

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

// Asio's default completion condition moves at most 64 KiB per system call; large messages go much
// faster in bigger steps (measured: see docs/benchmarks.md).
struct TransferAllInLargeSteps {
  std::size_t operator()(const asio::error_code& ec, std::size_t) const { return ec ? 0 : std::size_t{8} << 20; }
};

// Waits on a shared completion flag until it is set or the deadline passes.
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  asio::error_code ec;
  Status status;

  void finish(asio::error_code e, Status st = Status()) {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    ec = e;
    status = std::move(st);
    cv.notify_all();
  }
  bool wait_until(SteadyTime t) {
    std::unique_lock<std::mutex> lock(mu);
    if (t == SteadyTime::max()) {
      cv.wait(lock, [&] { return done; });
      return true;
    }
    return cv.wait_until(lock, t, [&] { return done; });
  }
  void wait() { (void)wait_until(SteadyTime::max()); }
};

class TcpLink final : public Link, public std::enable_shared_from_this<TcpLink> {
 public:
  TcpLink(std::shared_ptr<asio::io_context> io, tcp::socket socket, PeerId peer, const TcpOptions& o)
      : io_(std::move(io)), socket_(std::move(socket)), peer_(peer), max_message_(o.max_message_bytes), max_buffered_(o.max_buffered_bytes) {
    asio::error_code ec;
    const auto ep = socket_.remote_endpoint(ec);
    remote_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  void start() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->read_header(); });
  }

  PeerId peer() const override { return peer_; }
  std::string remote_address() const override { return remote_; }

  Status send(Tag tag, ByteView payload, Deadline deadline) override {
    return send_frame(FrameHeader{FrameType::kData, 0, tag, payload.size()}, payload, deadline);
  }

  Result<Bytes> recv(Tag tag, Deadline deadline) override {
    const SteadyTime until = steady(deadline);
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto it = inbox_.find(tag);
      if (it != inbox_.end() && !it->second.empty()) {
        Bytes m = std::move(it->second.front());
        it->second.pop_front();
        buffered_ -= m.size();
        if (paused_ && buffered_ <= max_buffered_) {
          paused_ = false;
          asio::post(socket_.get_executor(), [self = shared_from_this()] { self->read_header(); });
        }
        return m;
      }
      if (!failed_.ok()) return failed_;
      if (until == SteadyTime::max()) {
        cv_.wait(lock);
      } else if (cv_.wait_until(lock, until) == std::cv_status::timeout) {
        auto again = inbox_.find(tag);
        if (again != inbox_.end() && !again->second.empty()) continue;
        if (!failed_.ok()) return failed_;
        return error(ErrorCode::kTimeout, "no message with tag " + std::to_string(tag) + " from peer " + peer_.to_string() +
                                              " before the deadline");
      }
    }
  }

  void close() override {
    bool was_up;
    {
      std::lock_guard<std::mutex> lock(mu_);
      was_up = failed_.ok();
    }
    if (was_up) {
      // Best effort goodbye, so the peer sees a clean close rather than a reset.
      (void)send_frame(FrameHeader{FrameType::kClose, 0, 0, 0}, {}, Deadline::after(real_clock(), std::chrono::milliseconds(200)));
    }
    fail(error(ErrorCode::kPeerLost, "link to peer " + peer_.to_string() + " was closed locally"));
  }

  LinkStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  // Marks the link down with `st` (the first failure wins), wakes every waiter and closes the socket.
  void fail(Status st) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.ok()) return;
      failed_ = std::move(st);
      cv_.notify_all();
    }
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      asio::error_code ec;
      self->socket_.shutdown(tcp::socket::shutdown_both, ec);
      self->socket_.close(ec);
    });
  }

 private:
  Status send_frame(const FrameHeader& h, ByteView payload, Deadline deadline) {
    std::lock_guard<std::mutex> serial(send_mu_);  // frames go out whole, in call order
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.ok()) return failed_;
    }
    std::array<std::uint8_t, kFrameHeaderBytes> header{};
    encode_frame_header(h, header.data());
    auto done = std::make_shared<Completion>();
    // The buffers are the caller's: this function returns only after the write handler has run.
    asio::post(socket_.get_executor(), [self = shared_from_this(), &header, payload, done] {
      const std::array<asio::const_buffer, 2> buffers = {asio::buffer(header), asio::buffer(payload.data(), payload.size())};
      asio::async_write(self->socket_, buffers, TransferAllInLargeSteps{}, [done](asio::error_code ec, std::size_t) { done->finish(ec); });
    });
    if (!done->wait_until(steady(deadline))) {
      fail(error(ErrorCode::kPeerLost, "link to peer " + peer_.to_string() + " closed: a send timed out mid-frame"));
      done->wait();  // closing the socket aborts the write; its handler must run before the buffers go away
      return error(ErrorCode::kTimeout, "sending " + std::to_string(payload.size()) + " bytes to peer " + peer_.to_string() +
                                            " did not finish before the deadline");
    }
    if (done->ec) {
      Status lost = error(ErrorCode::kPeerLost, "peer " + peer_.to_string() + " lost while sending: " + done->ec.message());
      fail(lost);
      std::lock_guard<std::mutex> lock(mu_);
      return failed_;
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_sent += kFrameHeaderBytes + payload.size();
    stats_.messages_sent += h.type == FrameType::kData ? 1 : 0;
    return Status();
  }

  void read_header() {
    asio::async_read(socket_, asio::buffer(rheader_), [self = shared_from_this()](asio::error_code ec, std::size_t) {
      if (ec) return self->fail_read(ec);
      auto h = decode_frame_header(ByteView(reinterpret_cast<const std::byte*>(self->rheader_.data()), kFrameHeaderBytes),
                                   self->max_message_);
      if (!h.ok()) {
        spdlog::warn("dropping link to peer {} ({}): {}", self->peer_.to_string(), self->remote_, h.status().message());
        return self->fail(h.status().with_context("peer " + self->peer_.to_string() + " broke the protocol"));
      }
      if (h->type == FrameType::kClose) {
        return self->fail(error(ErrorCode::kPeerLost, "peer " + self->peer_.to_string() + " closed the link"));
      }
      self->read_payload(*h);
    });
  }

  void read_payload(const FrameHeader& h) {
    auto buf = std::make_shared<Bytes>(h.length);  // length checked against the cap in decode_frame_header
    asio::async_read(socket_, asio::buffer(buf->data(), buf->size()), TransferAllInLargeSteps{}, [self = shared_from_this(), buf, tag = h.tag](asio::error_code ec, std::size_t) {
      if (ec) return self->fail_read(ec);
      bool pause;
      {
        std::lock_guard<std::mutex> lock(self->mu_);
        self->buffered_ += buf->size();
        self->stats_.bytes_received += kFrameHeaderBytes + buf->size();
        self->stats_.messages_received += 1;
        self->inbox_[tag].push_back(std::move(*buf));
        self->cv_.notify_all();
        pause = self->buffered_ > self->max_buffered_;
        self->paused_ = pause;
      }
      if (!pause) self->read_header();
    });
  }

  void fail_read(asio::error_code ec) {
    if (ec == asio::error::operation_aborted) return fail(error(ErrorCode::kPeerLost, "link to peer " + peer_.to_string() + " was closed"));
    fail(error(ErrorCode::kPeerLost, "peer " + peer_.to_string() + " (" + remote_ + ") lost: " +
                                         (ec == asio::error::eof ? std::string("connection closed mid-stream") : ec.message())));
  }

  std::shared_ptr<asio::io_context> io_;  // outlives socket_, even when the Transport is gone
  tcp::socket socket_;
  PeerId peer_;
  std::string remote_;
  std::uint64_t max_message_, max_buffered_;
  std::array<std::uint8_t, kFrameHeaderBytes> rheader_{};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<Tag, std::deque<Bytes>> inbox_;
  std::uint64_t buffered_ = 0;
  bool paused_ = false;
  Status failed_;
  LinkStats stats_;
  std::mutex send_mu_;
};

// Exchanges HELLOs on a fresh socket (on the I/O thread), with a timeout. `done` runs once, after both
// the write and the read have completed (or failed), so the socket is idle when it is handed on.
struct Handshake : std::enable_shared_from_this<Handshake> {
  using Done = std::function<void(Status, Hello)>;

  Handshake(tcp::socket s, Bytes ours) : socket(std::move(s)), hello_out(std::move(ours)), timer(socket.get_executor()) {}

  void run(Nanos timeout, Done on_done) {
    done = std::move(on_done);
    auto self = shared_from_this();
    timer.expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(timeout));
    timer.async_wait([self](asio::error_code ec) {
      if (!ec) {
        self->timed_out = true;
        asio::error_code ignored;
        self->socket.close(ignored);
      }
    });
    asio::async_write(socket, asio::buffer(hello_out), [self](asio::error_code ec, std::size_t) {
      self->write_ec = ec;
      self->write_done = true;
      self->maybe_finish();
    });
    asio::async_read(socket, asio::buffer(hello_in), [self](asio::error_code ec, std::size_t) {
      self->read_ec = ec;
      self->read_done = true;
      if (ec) {  // unblock a write that may wait on a dead peer
        asio::error_code ignored;
        self->socket.close(ignored);
      }
      self->maybe_finish();
    });
  }

  void maybe_finish() {
    if (!write_done || !read_done) return;
    timer.cancel();
    Done finish = std::move(done);  // the callback may hold this Handshake: drop it after one call
    done = nullptr;
    const asio::error_code ec = read_ec ? read_ec : write_ec;
    if (ec) {
      finish(error(timed_out ? ErrorCode::kTimeout : ErrorCode::kPeerLost,
                 timed_out ? std::string("no HELLO before the handshake deadline") : "connection lost during the handshake: " + ec.message()),
           Hello{});
      return;
    }
    auto hello = decode_hello(ByteView(reinterpret_cast<const std::byte*>(hello_in.data()), kHelloBytes));
    if (!hello.ok()) return finish(hello.status(), Hello{});
    finish(Status(), *hello);
  }

  tcp::socket socket;
  Bytes hello_out;
  std::array<std::uint8_t, kHelloBytes> hello_in{};
  asio::steady_timer timer;
  Done done;
  bool timed_out = false, write_done = false, read_done = false;
  asio::error_code write_ec, read_ec;
};

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TcpOptions& o)
      : options_(o), io_(std::make_shared<asio::io_context>()), work_(asio::make_work_guard(*io_)), acceptor_(*io_) {
    if (options_.self.value == 0) options_.self = random_peer_id();
    hello_.peer = options_.self;
    hello_.run = options_.run;
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
    auto ep = parse_endpoint(address);
    if (!ep.ok()) return ep.status();
    auto socket = std::make_shared<tcp::socket>(*io_);
    auto connected = std::make_shared<Completion>();
    asio::post(*io_, [socket, ep = *ep, connected] {
      socket->async_connect(ep, [connected](asio::error_code ec) { connected->finish(ec); });
    });
    if (!connected->wait_until(steady(deadline))) {
      asio::post(*io_, [socket] {
        asio::error_code ec;
        socket->close(ec);
      });
      connected->wait();
      return error(ErrorCode::kTimeout, "connecting to " + address + " timed out");
    }
    if (connected->ec) return error(ErrorCode::kPeerLost, "cannot connect to " + address + ": " + connected->ec.message());
    tune_socket(*socket, options_);

    const Nanos left = deadline.remaining(real_clock());
    auto hs = std::make_shared<Handshake>(std::move(*socket), encode_hello(hello_));
    auto done = std::make_shared<Completion>();
    auto theirs = std::make_shared<Hello>();
    asio::post(*io_, [hs, done, theirs, timeout = std::min(left, options_.handshake_timeout)] {
      hs->run(timeout, [done, theirs](Status st, Hello h) {
        *theirs = h;
        done->finish({}, std::move(st));
      });
    });
    done->wait();  // bounded by the handshake timer
    if (!done->status.ok()) return done->status.with_context("handshake with " + address);
    if (Status st = check_hello(hello_, *theirs); !st.ok()) {
      spdlog::warn("refusing {}: {}", address, st.message());
      close_on_io(hs);
      return st;
    }
    return std::shared_ptr<Link>(register_link(std::move(hs->socket), theirs->peer));
  }

  Result<std::shared_ptr<Link>> accept(Deadline deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    const SteadyTime until = steady(deadline);
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
  void close_on_io(const std::shared_ptr<Handshake>& hs) {
    asio::post(*io_, [hs] {
      asio::error_code ec;
      hs->socket.close(ec);
    });
  }

  std::shared_ptr<TcpLink> register_link(tcp::socket socket, PeerId peer) {
    auto link = std::make_shared<TcpLink>(io_, std::move(socket), peer, options_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      links_.push_back(link);
    }
    link->start();
    return link;
  }

  void do_accept() {
    acceptor_.async_accept([this](asio::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec) {
        tune_socket(socket, options_);
        asio::error_code rec;
        const auto remote = socket.remote_endpoint(rec);
        const std::string who = rec ? std::string("?") : remote.address().to_string() + ":" + std::to_string(remote.port());
        auto hs = std::make_shared<Handshake>(std::move(socket), encode_hello(hello_));
        hs->run(options_.handshake_timeout, [this, hs, who](Status st, Hello theirs) {
          if (st.ok()) st = check_hello(hello_, theirs);
          if (!st.ok()) {
            spdlog::warn("refusing connection from {}: {}", who, st.message());
            asio::error_code ignored;
            hs->socket.close(ignored);
            return;
          }
          auto link = register_link(std::move(hs->socket), theirs.peer);
          std::lock_guard<std::mutex> lock(mu_);
          accepted_.push_back(link);
          cv_.notify_all();
        });
      }
      do_accept();
    });
  }

  TcpOptions options_;
  Hello hello_;
  std::shared_ptr<asio::io_context> io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  tcp::acceptor acceptor_;
  std::thread thread_;
  std::string address_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Link>> accepted_;
  std::vector<std::weak_ptr<TcpLink>> links_;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_tcp_transport(const TcpOptions& options) {
  auto t = std::make_unique<TcpTransport>(options);
  if (Status st = t->start(); !st.ok()) return st;
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace gossamer::transport
