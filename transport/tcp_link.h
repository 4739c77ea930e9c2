// TcpLink: the Link of the TCP transport (one connected socket, driven by the transport's I/O thread),
// and what the transport and its links share: Completion and SecureSession.
// Internal header: used only by tcp_transport.cpp and tcp_link.cpp, not part of the public API (that
// is tcp_transport.h).
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <asio.hpp>

#include "transport/protocol.h"
#include "transport/tcp_transport.h"

namespace gossamer::transport::tcp_detail {

using asio::ip::tcp;
using SteadyTime = std::chrono::steady_clock::time_point;

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
          std::unique_ptr<SecureSession> secure);

  ~TcpLink() override;
  void start();
  // Runs with the link's final counts when it is destroyed (the transport's relayed-bytes totals).
  void on_retire(std::function<void(const LinkStats&)> f) { on_retire_ = std::move(f); }
  // What remote_address() says (a relayed link names its relay).
  void set_remote(std::string remote) { remote_ = std::move(remote); }

  PeerId peer() const override { return peer_; }
  std::string remote_address() const override { return remote_; }

  Status send(Tag tag, ByteView payload, Deadline deadline) override;
  Status send_parts(Tag tag, std::span<const ByteView> parts, Deadline deadline) override;
  void recycle(Bytes buffer) override;
  Result<Bytes> recv(Tag tag, Deadline deadline) override;
  void close() override;
  LinkStats stats() const override;

  // Marks the link down with `st` (the first failure wins), wakes every waiter and closes the socket.
  void fail(Status st);

 private:
  // Writes a frame's buffers (the caller's; under send_mu_): as much as the kernel takes at once
  // straight from this thread, the rest through the I/O thread. Writing directly spares a hand-off
  // per message and spreads the socket copies over the sending and the I/O threads.
  Status write(std::vector<asio::const_buffer> buffers, Deadline deadline);

  // Hands two buffers to the I/O thread to write; finish_write() waits for it. The buffers are the
  // caller's and must stay valid until finish_write() returns.
  std::shared_ptr<Completion> start_write(asio::const_buffer a, asio::const_buffer b) { return start_write(std::vector<asio::const_buffer>{a, b}); }
  std::shared_ptr<Completion> start_write(std::vector<asio::const_buffer> buffers);

  Status finish_write(const std::shared_ptr<Completion>& done, Deadline deadline);
  Status send_frame(const FrameHeader& h, ByteView payload, Deadline deadline);
  void read_next();

  // Plaintext links: a frame header, then its payload read straight into the message.
  void read_header();

  // A buffer for a payload of n bytes: the recycled one of the smallest capacity that holds it (only
  // the part beyond its current size is cleared; messages of one size reuse it without clearing),
  // else a new one.
  Bytes take_buffer(std::size_t n);

  void read_payload(const FrameHeader& h);

  // Reads exactly `size` bytes into `data`, then calls done(ec). A large read asks the kernel not to
  // wake this thread before kReadLowWater bytes, or the rest of the read if less, have arrived
  // (SO_RCVLOWAT): one wakeup per half MiB instead of one per loopback segment (64 KiB), which cuts
  // the CPU a bulk transfer costs by about a tenth on a busy host. The mark never exceeds what the
  // current read still expects, so it cannot hold back bytes that complete a frame; a closed or
  // failed socket wakes the reader whatever the mark.
  template <typename Done>
  void read_exact(void* data, std::size_t size, Done done);
  void read_rest(std::byte* data, std::size_t left, std::shared_ptr<std::function<void(asio::error_code)>> done);

  // Sets the socket's receive low-water mark (I/O thread only); false when the kernel refused it,
  // after which reads no longer use it.
  bool set_low_water(std::size_t bytes);

  // Encrypted links: records, opened into a plaintext stream that is parsed into frames.
  void read_record();

  // Parses decrypted bytes into frames. False when the link failed.
  bool consume(const std::uint8_t* p, std::size_t n, bool& paused);

  // Checks a decoded header; a protocol error or a goodbye fails the link. True to go on.
  bool accept_header(const Result<FrameHeader>& h);

  // Queues a received message; true when reading must pause (too much unreceived data).
  bool deliver(Tag tag, Bytes message);

  void fail_read(asio::error_code ec);

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
  std::function<void(const LinkStats&)> on_retire_;
};

}  // namespace gossamer::transport::tcp_detail
