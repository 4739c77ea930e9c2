#include "transport/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cerrno>
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
#include "transport/protocol.h"

namespace gossamer::transport {

namespace {

using asio::ip::tcp;
using SteadyTime = std::chrono::steady_clock::time_point;

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

// Secure state of a link after the handshake.
struct SecureSession {
  explicit SecureSession(const SessionKeys& k) : sealer(k.tx) {}
  StreamSealer sealer;
  StreamOpener opener;
};

class TcpLink final : public Link, public std::enable_shared_from_this<TcpLink> {
 public:
  TcpLink(std::shared_ptr<asio::io_context> io, tcp::socket socket, PeerId peer, const TcpOptions& o,
          std::unique_ptr<SecureSession> secure)
      : io_(std::move(io)),
        socket_(std::move(socket)),
        peer_(peer),
        max_message_(o.max_message_bytes),
        max_buffered_(o.max_buffered_bytes),
        secure_(std::move(secure)) {
    fd_ = socket_.native_handle();
    asio::error_code ec;
    const auto ep = socket_.remote_endpoint(ec);
    remote_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  void start() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->read_next(); });
  }

  PeerId peer() const override { return peer_; }
  std::string remote_address() const override { return remote_; }

  Status send(Tag tag, ByteView payload, Deadline deadline) override {
    return send_frame(FrameHeader{FrameType::kData, 0, tag, payload.size()}, payload, deadline);
  }

  Status send_parts(Tag tag, std::span<const ByteView> parts, Deadline deadline) override {
    if (secure_) return Link::send_parts(tag, parts, deadline);  // records are sealed from one buffer
    std::size_t total = 0;
    for (ByteView p : parts) total += p.size();
    std::lock_guard<std::mutex> serial(send_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.ok()) return failed_;
    }
    std::array<std::uint8_t, kFrameHeaderBytes> header{};
    encode_frame_header(FrameHeader{FrameType::kData, 0, tag, total}, header.data());
    std::vector<asio::const_buffer> buffers = {asio::buffer(header)};
    for (ByteView p : parts) {
      if (!p.empty()) buffers.push_back(asio::buffer(p.data(), p.size()));
    }
    if (Status st = write(std::move(buffers), deadline); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_sent += kFrameHeaderBytes + total;
    stats_.messages_sent += 1;
    return Status();
  }

  void recycle(Bytes buffer) override {
    if (secure_ || buffer.empty()) return;
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t pooled = 0;
    for (const auto& b : pool_) pooled += b.capacity();
    if (pool_.size() >= kPoolBuffers || pooled + buffer.capacity() > max_buffered_) return;
    pool_.push_back(std::move(buffer));
  }

  Result<Bytes> recv(Tag tag, Deadline deadline) override {
    const SteadyTime until = deadline.steady_time();
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto it = inbox_.find(tag);
      if (it != inbox_.end() && !it->second.empty()) {
        Bytes m = std::move(it->second.front());
        it->second.pop_front();
        buffered_ -= m.size();
        if (paused_ && buffered_ <= max_buffered_) {
          paused_ = false;
          asio::post(socket_.get_executor(), [self = shared_from_this()] { self->read_next(); });
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
      std::lock_guard<std::mutex> fd_lock(self->fd_mu_);  // no direct write is using the descriptor
      asio::error_code ec;
      self->socket_.shutdown(tcp::socket::shutdown_both, ec);
      self->socket_.close(ec);
      self->fd_ = -1;
    });
  }

 private:
  // Writes a frame's buffers (the caller's; under send_mu_): as much as the kernel takes at once
  // straight from this thread, the rest through the I/O thread. Writing directly spares a hand-off
  // per message and spreads the socket copies over the sending and the I/O threads.
  Status write(std::vector<asio::const_buffer> buffers, Deadline deadline) {
    std::size_t first = 0;  // buffers[first..] are still (partly) to write
    {
      std::lock_guard<std::mutex> fd_lock(fd_mu_);
      while (fd_ >= 0 && first < buffers.size()) {
        std::array<iovec, 16> iov{};
        std::size_t count = 0;
        for (std::size_t i = first; i < buffers.size() && count < iov.size(); ++i, ++count) {
          iov[count].iov_base = const_cast<void*>(buffers[i].data());
          iov[count].iov_len = buffers[i].size();
        }
        msghdr msg{};
        msg.msg_iov = iov.data();
        msg.msg_iovlen = count;
        const ssize_t n = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;  // the kernel's buffer is full: the I/O thread waits for room
          const int err = errno;
          fail(error(ErrorCode::kPeerLost, "peer " + peer_.to_string() + " lost while sending: " + std::strerror(err)));
          std::lock_guard<std::mutex> lock(mu_);
          return failed_;
        }
        auto left = static_cast<std::size_t>(n);
        while (first < buffers.size() && left >= buffers[first].size()) left -= buffers[first++].size();
        if (left > 0) buffers[first] += left;
      }
    }
    if (first == buffers.size()) return Status();
    buffers.erase(buffers.begin(), buffers.begin() + static_cast<std::ptrdiff_t>(first));
    return finish_write(start_write(std::move(buffers)), deadline);
  }

  // Hands two buffers to the I/O thread to write; finish_write() waits for it. The buffers are the
  // caller's and must stay valid until finish_write() returns.
  std::shared_ptr<Completion> start_write(asio::const_buffer a, asio::const_buffer b) { return start_write(std::vector<asio::const_buffer>{a, b}); }
  std::shared_ptr<Completion> start_write(std::vector<asio::const_buffer> buffers) {
    auto done = std::make_shared<Completion>();
    asio::post(socket_.get_executor(), [self = shared_from_this(), buffers = std::move(buffers), done] {
      asio::async_write(self->socket_, buffers, TransferAllInLargeSteps{}, [done](asio::error_code ec, std::size_t) { done->finish(ec); });
    });
    return done;
  }

  Status finish_write(const std::shared_ptr<Completion>& done, Deadline deadline) {
    if (!done->wait_until(deadline.steady_time())) {
      fail(error(ErrorCode::kPeerLost, "link to peer " + peer_.to_string() + " closed: a send timed out mid-frame"));
      done->wait();  // closing the socket aborts the write; its handler must run before the buffers go away
      return error(ErrorCode::kTimeout, "sending to peer " + peer_.to_string() + " did not finish before the deadline");
    }
    if (done->ec) {
      fail(error(ErrorCode::kPeerLost, "peer " + peer_.to_string() + " lost while sending: " + done->ec.message()));
      std::lock_guard<std::mutex> lock(mu_);
      return failed_;
    }
    return Status();
  }

  Status send_frame(const FrameHeader& h, ByteView payload, Deadline deadline) {
    std::lock_guard<std::mutex> serial(send_mu_);  // frames go out whole, in call order
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.ok()) return failed_;
    }
    std::array<std::uint8_t, kFrameHeaderBytes> header{};
    encode_frame_header(h, header.data());
    Status st;
    if (!secure_) {
      st = write({asio::buffer(header), asio::buffer(payload.data(), payload.size())}, deadline);
    } else {
      // The frame (header then payload) as a stream of sealed records of up to kRecordPlaintext bytes;
      // only the first record, which carries the header, is staged. Two record buffers: this thread
      // seals the next record while the I/O thread writes the previous one.
      for (auto& b : record_out_) {
        if (b.empty()) b.resize(4 + kRecordPlaintext + kRecordOverhead);
      }
      std::shared_ptr<Completion> in_flight;
      std::size_t offset = 0;
      bool first = true;
      for (int i = 0; st.ok() && (first || offset < payload.size()); ++i) {
        auto& out = record_out_[static_cast<std::size_t>(i % 2)];
        std::size_t n;
        if (first) {
          const std::size_t take = std::min(payload.size(), kRecordPlaintext - kFrameHeaderBytes);
          Bytes staged(kFrameHeaderBytes + take);
          std::memcpy(staged.data(), header.data(), kFrameHeaderBytes);
          if (take > 0) std::memcpy(staged.data() + kFrameHeaderBytes, payload.data(), take);
          n = secure_->sealer.seal(staged, out.data());
          offset = take;
          first = false;
        } else {
          const std::size_t take = std::min(payload.size() - offset, kRecordPlaintext);
          n = secure_->sealer.seal(payload.subspan(offset, take), out.data());
          offset += take;
        }
        if (in_flight) st = finish_write(in_flight, deadline);
        in_flight = st.ok() ? start_write(asio::buffer(out.data(), n), asio::const_buffer()) : nullptr;
      }
      if (in_flight) st = finish_write(in_flight, deadline);
    }
    if (!st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_sent += kFrameHeaderBytes + payload.size();
    stats_.messages_sent += h.type == FrameType::kData ? 1 : 0;
    return Status();
  }

  void read_next() {
    if (secure_) {
      read_record();
    } else {
      read_header();
    }
  }

  // Plaintext links: a frame header, then its payload read straight into the message.
  void read_header() {
    asio::async_read(socket_, asio::buffer(rheader_), [self = shared_from_this()](asio::error_code ec, std::size_t) {
      if (ec) return self->fail_read(ec);
      auto h = decode_frame_header(ByteView(reinterpret_cast<const std::byte*>(self->rheader_.data()), kFrameHeaderBytes),
                                   self->max_message_);
      if (!self->accept_header(h)) return;
      if (h->length == 0) {
        if (!self->deliver(h->tag, Bytes())) self->read_next();
        return;
      }
      self->read_payload(*h);
    });
  }

  // A buffer for a payload of n bytes: the recycled one of the smallest capacity that holds it (only
  // the part beyond its current size is cleared; messages of one size reuse it without clearing),
  // else a new one.
  Bytes take_buffer(std::size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    auto best = pool_.end();
    for (auto it = pool_.begin(); it != pool_.end(); ++it) {
      if (it->capacity() >= n && (best == pool_.end() || it->capacity() < best->capacity())) best = it;
    }
    if (best == pool_.end()) return Bytes(n);
    Bytes b = std::move(*best);
    pool_.erase(best);
    b.resize(n);
    return b;
  }

  void read_payload(const FrameHeader& h) {
    auto buf = std::make_shared<Bytes>(take_buffer(h.length));  // length checked against the cap in decode_frame_header
    read_exact(buf->data(), buf->size(), [self = shared_from_this(), buf, tag = h.tag](asio::error_code ec) {
      if (ec) return self->fail_read(ec);
      if (!self->deliver(tag, std::move(*buf))) self->read_next();
    });
  }

  // Reads exactly `size` bytes into `data`, then calls done(ec). A large read asks the kernel not to
  // wake this thread before kReadLowWater bytes, or the rest of the read if less, have arrived
  // (SO_RCVLOWAT): one wakeup per half MiB instead of one per loopback segment (64 KiB), which cuts
  // the CPU a bulk transfer costs by about a tenth on a busy host. The mark never exceeds what the
  // current read still expects, so it cannot hold back bytes that complete a frame; a closed or
  // failed socket wakes the reader whatever the mark.
  template <typename Done>
  void read_exact(void* data, std::size_t size, Done done) {
    if (size < kReadLowWater || !low_water_ok_) {
      asio::async_read(socket_, asio::buffer(data, size), TransferAllInLargeSteps{},
                       [done = std::move(done)](asio::error_code ec, std::size_t) mutable { done(ec); });
      return;
    }
    read_rest(static_cast<std::byte*>(data), size, std::make_shared<std::function<void(asio::error_code)>>(std::move(done)));
  }

  void read_rest(std::byte* data, std::size_t left, std::shared_ptr<std::function<void(asio::error_code)>> done) {
    set_low_water(std::min(left, kReadLowWater));
    socket_.async_read_some(asio::buffer(data, left), [self = shared_from_this(), data, left, done](asio::error_code ec, std::size_t n) {
      if (!ec && n < left) return self->read_rest(data + n, left - n, done);
      // Back to waking on any byte, for the next frame's header; a mark that cannot be lowered
      // again would stall that read, so the link fails instead.
      if (!ec && !self->set_low_water(1)) {
        const std::string why = std::strerror(errno);
        return self->fail(error(ErrorCode::kInternal, "link to peer " + self->peer_.to_string() +
                                                          " closed: the socket's receive low-water mark could not be reset (" + why + ")"));
      }
      (*done)(ec);
    });
  }

  // Sets the socket's receive low-water mark (I/O thread only); false when the kernel refused it,
  // after which reads no longer use it.
  bool set_low_water(std::size_t bytes) {
    if (bytes == low_water_) return true;
    const int v = static_cast<int>(bytes);
    if (::setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) != 0) {
      low_water_ok_ = false;
      return false;
    }
    low_water_ = bytes;
    return true;
  }

  // Encrypted links: records, opened into a plaintext stream that is parsed into frames.
  void read_record() {
    asio::async_read(socket_, asio::buffer(rlen_), [self = shared_from_this()](asio::error_code ec, std::size_t) {
      if (ec) return self->fail_read(ec);
      std::uint32_t len = 0;
      for (int i = 0; i < 4; ++i) len |= static_cast<std::uint32_t>(self->rlen_[static_cast<std::size_t>(i)]) << (8 * i);
      if (len < kRecordOverhead || len > kRecordPlaintext + kRecordOverhead) {
        spdlog::warn("dropping link to peer {} ({}): encrypted record of {} bytes", self->peer_.to_string(), self->remote_, len);
        return self->fail(error(ErrorCode::kMalformed, "peer " + self->peer_.to_string() + " sent an encrypted record of impossible size"));
      }
      self->rcipher_.resize(len);
      self->read_exact(self->rcipher_.data(), self->rcipher_.size(), [self](asio::error_code ec2) {
        if (ec2) return self->fail_read(ec2);
        self->rplain_.resize(kRecordPlaintext);
        auto n = self->secure_->opener.open(ByteView(reinterpret_cast<const std::byte*>(self->rcipher_.data()), self->rcipher_.size()),
                                            self->rplain_.data());
        if (!n.ok()) {
          spdlog::warn("dropping link to peer {} ({}): {}", self->peer_.to_string(), self->remote_, n.status().message());
          return self->fail(n.status().with_context("peer " + self->peer_.to_string()));
        }
        bool paused = false;
        if (!self->consume(self->rplain_.data(), *n, paused)) return;
        if (!paused) self->read_next();
      });
    });
  }

  // Parses decrypted bytes into frames. False when the link failed.
  bool consume(const std::uint8_t* p, std::size_t n, bool& paused) {
    while (n > 0) {
      if (!in_payload_) {
        const std::size_t take = std::min(kFrameHeaderBytes - header_fill_, n);
        std::memcpy(rheader_.data() + header_fill_, p, take);
        header_fill_ += take;
        p += take;
        n -= take;
        if (header_fill_ < kFrameHeaderBytes) break;
        header_fill_ = 0;
        auto h = decode_frame_header(ByteView(reinterpret_cast<const std::byte*>(rheader_.data()), kFrameHeaderBytes), max_message_);
        if (!accept_header(h)) return false;
        message_ = Bytes(h->length);
        message_tag_ = h->tag;
        message_fill_ = 0;
        in_payload_ = h->length > 0;
        if (!in_payload_) paused = deliver(message_tag_, std::move(message_)) || paused;
      } else {
        const std::size_t take = std::min(message_.size() - message_fill_, n);
        std::memcpy(message_.data() + message_fill_, p, take);
        message_fill_ += take;
        p += take;
        n -= take;
        if (message_fill_ == message_.size()) {
          in_payload_ = false;
          paused = deliver(message_tag_, std::move(message_)) || paused;
        }
      }
    }
    return true;
  }

  // Checks a decoded header; a protocol error or a goodbye fails the link. True to go on.
  bool accept_header(const Result<FrameHeader>& h) {
    if (!h.ok()) {
      spdlog::warn("dropping link to peer {} ({}): {}", peer_.to_string(), remote_, h.status().message());
      fail(h.status().with_context("peer " + peer_.to_string() + " broke the protocol"));
      return false;
    }
    if (h->type == FrameType::kClose) {
      fail(error(ErrorCode::kPeerLost, "peer " + peer_.to_string() + " closed the link"));
      return false;
    }
    return true;
  }

  // Queues a received message; true when reading must pause (too much unreceived data).
  bool deliver(Tag tag, Bytes message) {
    std::lock_guard<std::mutex> lock(mu_);
    buffered_ += message.size();
    stats_.bytes_received += kFrameHeaderBytes + message.size();
    stats_.messages_received += 1;
    inbox_[tag].push_back(std::move(message));
    cv_.notify_all();
    paused_ = buffered_ > max_buffered_;
    return paused_;
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
  std::unique_ptr<SecureSession> secure_;  // null: plaintext link

  // Read side (I/O thread only).
  static constexpr std::size_t kReadLowWater = std::size_t{512} << 10;
  std::size_t low_water_ = 1;  // the socket's SO_RCVLOWAT (the kernel's default is 1)
  bool low_water_ok_ = true;
  std::array<std::uint8_t, kFrameHeaderBytes> rheader_{};
  std::array<std::uint8_t, 4> rlen_{};
  std::vector<std::uint8_t> rcipher_, rplain_;
  std::size_t header_fill_ = 0, message_fill_ = 0;
  bool in_payload_ = false;
  Bytes message_;
  Tag message_tag_ = 0;

  // Send side (under send_mu_).
  std::mutex send_mu_;
  std::mutex fd_mu_;  // the descriptor, for direct writes against the close on the I/O thread
  int fd_ = -1;
  std::array<std::vector<std::uint8_t>, 2> record_out_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<Tag, std::deque<Bytes>> inbox_;
  static constexpr std::size_t kPoolBuffers = 64;
  std::vector<Bytes> pool_;  // recycled receive buffers (plaintext links)
  std::uint64_t buffered_ = 0;
  bool paused_ = false;
  Status failed_;
  LinkStats stats_;
};

// The handshake on a fresh socket, on the I/O thread, under one timeout: HELLOs, the checks of
// check_hello and of the encryption capability, then (with a run key) AUTH and the stream headers.
// `done` runs once, when no operation is pending on the socket, so the socket can be handed on.
struct Handshake : std::enable_shared_from_this<Handshake> {
  using Done = std::function<void(Status, Hello, std::unique_ptr<SecureSession>)>;

  Handshake(tcp::socket s, const Hello& ours, std::optional<RunKey> key, bool initiator)
      : socket(std::move(s)), timer(socket.get_executor()), ours_(ours), key_(std::move(key)), initiator_(initiator) {
    if (key_) ours_.capabilities |= kCapEncrypted;
    hello_out_ = encode_hello(ours_);
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
    exchange(hello_out_.data(), hello_out_.size(), hello_in_.data(), hello_in_.size(), [self] { self->after_hello(); });
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

    const Nanos left = deadline.remaining(real_clock());
    auto hs = std::make_shared<Handshake>(std::move(*socket), hello_, options_.key, /*initiator=*/true);
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
    if (!done->status.ok()) {
      spdlog::warn("refusing {}: {}", address, done->status.message());
      return done->status.with_context("handshake with " + address);
    }
    return std::shared_ptr<Link>(register_link(std::move(hs->socket), theirs->peer, std::move(*session)));
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
  std::shared_ptr<TcpLink> register_link(tcp::socket socket, PeerId peer, std::unique_ptr<SecureSession> session) {
    auto link = std::make_shared<TcpLink>(io_, std::move(socket), peer, options_, std::move(session));
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
        auto hs = std::make_shared<Handshake>(std::move(socket), hello_, options_.key, /*initiator=*/false);
        hs->run(options_.handshake_timeout, [this, hs, who](Status st, Hello theirs, std::unique_ptr<SecureSession> session) {
          if (!st.ok()) {
            refused_.fetch_add(1);
            if (refusal_log_.allow()) spdlog::warn("refusing connection from {}: {}", who, st.message());
            return;
          }
          auto link = register_link(std::move(hs->socket), theirs.peer, std::move(session));
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
  // Anyone can open connections that fail the handshake: counted, and logged at a bounded rate.
  std::atomic<std::uint64_t> refused_{0};
  LogLimiter refusal_log_{"refused connections that failed the handshake"};
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
