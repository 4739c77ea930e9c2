#include "transport/tcp_link.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

namespace gossamer::transport::tcp_detail {

namespace {

// Asio's default completion condition moves at most 64 KiB per system call; large messages go much
// faster in bigger steps (measured: see docs/benchmarks.md).
struct TransferAllInLargeSteps {
  std::size_t operator()(const asio::error_code& ec, std::size_t) const { return ec ? 0 : std::size_t{8} << 20; }
};

}  // namespace

TcpLink::TcpLink(std::shared_ptr<asio::io_context> io, tcp::socket socket, PeerId peer, const TcpOptions& o,
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

TcpLink::~TcpLink() {
  if (on_retire_) on_retire_(stats_);
}

void TcpLink::start() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] { self->read_next(); });
}

Status TcpLink::send(Tag tag, ByteView payload, Deadline deadline) {
  return send_frame(FrameHeader{FrameType::kData, 0, tag, payload.size()}, payload, deadline);
}

Status TcpLink::send_parts(Tag tag, std::span<const ByteView> parts, Deadline deadline) {
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

void TcpLink::recycle(Bytes buffer) {
  if (secure_ || buffer.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t pooled = 0;
  for (const auto& b : pool_) pooled += b.capacity();
  if (pool_.size() >= kPoolBuffers || pooled + buffer.capacity() > max_buffered_) return;
  pool_.push_back(std::move(buffer));
}

Result<Bytes> TcpLink::recv(Tag tag, Deadline deadline) {
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

void TcpLink::close() {
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

LinkStats TcpLink::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void TcpLink::fail(Status st) {
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

Status TcpLink::write(std::vector<asio::const_buffer> buffers, Deadline deadline) {
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

std::shared_ptr<Completion> TcpLink::start_write(std::vector<asio::const_buffer> buffers) {
  auto done = std::make_shared<Completion>();
  asio::post(socket_.get_executor(), [self = shared_from_this(), buffers = std::move(buffers), done] {
    asio::async_write(self->socket_, buffers, TransferAllInLargeSteps{}, [done](asio::error_code ec, std::size_t) { done->finish(ec); });
  });
  return done;
}

Status TcpLink::finish_write(const std::shared_ptr<Completion>& done, Deadline deadline) {
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

Status TcpLink::send_frame(const FrameHeader& h, ByteView payload, Deadline deadline) {
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

void TcpLink::read_next() {
  if (secure_) {
    read_record();
  } else {
    read_header();
  }
}

void TcpLink::read_header() {
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

Bytes TcpLink::take_buffer(std::size_t n) {
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

void TcpLink::read_payload(const FrameHeader& h) {
  auto buf = std::make_shared<Bytes>(take_buffer(h.length));  // length checked against the cap in decode_frame_header
  read_exact(buf->data(), buf->size(), [self = shared_from_this(), buf, tag = h.tag](asio::error_code ec) {
    if (ec) return self->fail_read(ec);
    if (!self->deliver(tag, std::move(*buf))) self->read_next();
  });
}

template <typename Done>
void TcpLink::read_exact(void* data, std::size_t size, Done done) {
  if (size < kReadLowWater || !low_water_ok_) {
    asio::async_read(socket_, asio::buffer(data, size), TransferAllInLargeSteps{},
                     [done = std::move(done)](asio::error_code ec, std::size_t) mutable { done(ec); });
    return;
  }
  read_rest(static_cast<std::byte*>(data), size, std::make_shared<std::function<void(asio::error_code)>>(std::move(done)));
}

void TcpLink::read_rest(std::byte* data, std::size_t left, std::shared_ptr<std::function<void(asio::error_code)>> done) {
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

bool TcpLink::set_low_water(std::size_t bytes) {
  if (bytes == low_water_) return true;
  const int v = static_cast<int>(bytes);
  if (::setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) != 0) {
    low_water_ok_ = false;
    return false;
  }
  low_water_ = bytes;
  return true;
}

void TcpLink::read_record() {
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

bool TcpLink::consume(const std::uint8_t* p, std::size_t n, bool& paused) {
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

bool TcpLink::accept_header(const Result<FrameHeader>& h) {
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

bool TcpLink::deliver(Tag tag, Bytes message) {
  std::lock_guard<std::mutex> lock(mu_);
  buffered_ += message.size();
  stats_.bytes_received += kFrameHeaderBytes + message.size();
  stats_.messages_received += 1;
  inbox_[tag].push_back(std::move(message));
  cv_.notify_all();
  paused_ = buffered_ > max_buffered_;
  return paused_;
}

void TcpLink::fail_read(asio::error_code ec) {
  if (ec == asio::error::operation_aborted) return fail(error(ErrorCode::kPeerLost, "link to peer " + peer_.to_string() + " was closed"));
  fail(error(ErrorCode::kPeerLost, "peer " + peer_.to_string() + " (" + remote_ + ") lost: " +
                                       (ec == asio::error::eof ? std::string("connection closed mid-stream") : ec.message())));
}

}  // namespace gossamer::transport::tcp_detail
