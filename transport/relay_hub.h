// RelayHub: the relay side of transport/relay.h, on the TCP transport's I/O thread: it reads relay
// requests, pairs the two ends of a session and copies bytes between their connections.
// Internal header: used only by tcp_transport.cpp and relay_hub.cpp (Asio stays private to the
// transport's .cpp files).
// Threading: every method is called on the I/O thread; the counters are atomics readable anywhere.
#pragma once

#include <atomic>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include <asio.hpp>

#include "core/clock.h"
#include "transport/relay.h"

namespace gossamer::transport {

struct RelayOptions {
  Nanos wait = std::chrono::seconds(30);  // how long a request waits for its other end
  std::size_t max_waiting = 64;
  std::size_t max_pairs = 256;
  std::size_t buffer_bytes = std::size_t{64} << 10;  // per direction of a pair
  // A pair that carried no byte either way for about this long (between one and two of it) is
  // closed: two ends that went away without a word do not hold a place for ever.
  Nanos idle = std::chrono::minutes(15);
  std::size_t max_remembered = std::size_t{1} << 16;  // requests remembered against replays
};

// The relay side: pairs requests and splices their sockets.
class RelayHub : public std::enable_shared_from_this<RelayHub> {
 public:
  RelayHub(asio::io_context& io, PeerId self, RunId run, std::optional<RunKey> key, RelayOptions options);
  // A connection whose first bytes were the relay magic (`first4` already read). `hold` is kept until
  // the whole request is read (the transport's place for a connection in its handshake). Returns
  // what closes the connection while its request is read (the place evicted). I/O thread.
  std::function<void()> take(asio::ip::tcp::socket socket, ByteView first4, Nanos read_timeout, std::shared_ptr<void> hold = nullptr);
  // Closes the waiting requests and the pairs of sessions up to `session` (the group links of
  // epochs this relay's own group left behind). I/O thread.
  void retire_through(std::uint64_t session);
  // Closes every waiting and paired connection. I/O thread.
  void shutdown();

  std::uint64_t forwarded_bytes() const { return forwarded_.load(); }
  std::uint64_t pairs() const { return pairs_.load(); }
  std::uint64_t refused() const { return refused_.load(); }
  std::uint64_t idle_closed() const { return idle_closed_.load(); }

 private:
  struct Waiting;
  struct Pair;
  using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>;  // (session, from, to)

  void on_request(std::shared_ptr<Waiting> w);
  void answer_and_close(std::shared_ptr<asio::ip::tcp::socket> socket, RelayStatus status);
  void splice(std::shared_ptr<Waiting> a, std::shared_ptr<Waiting> b);
  void pump(std::shared_ptr<Pair> pair, int from);
  void stopped(const std::shared_ptr<Pair>& pair);
  void watch_idle(std::shared_ptr<Pair> pair);
  // Whether a request may be taken now: its time near this relay's clock, its nonce not seen.
  bool fresh(const RelayRequest& request);

  asio::io_context& io_;
  const PeerId self_;
  const RunId run_;
  const std::optional<RunKey> key_;
  const RelayOptions options_;
  std::map<Key, std::shared_ptr<Waiting>> waiting_;
  std::vector<std::weak_ptr<Pair>> pairs_live_;
  std::size_t active_ = 0;
  std::atomic<std::uint64_t> forwarded_{0}, pairs_{0}, refused_{0}, idle_closed_{0};
  // Nonces taken, against replays: with the relay's time of taking, oldest first.
  std::set<std::array<std::uint8_t, 16>> seen_;
  std::deque<std::pair<std::uint64_t, std::array<std::uint8_t, 16>>> seen_order_;
};

}  // namespace gossamer::transport
