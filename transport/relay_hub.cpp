#include "transport/relay_hub.h"

#include <cstring>

#include <spdlog/spdlog.h>

namespace gossamer::transport {

using asio::ip::tcp;

// A request being read, then waiting for its other end.
struct RelayHub::Waiting {
  explicit Waiting(tcp::socket s) : socket(std::make_shared<tcp::socket>(std::move(s))), timer(socket->get_executor()) {}
  std::shared_ptr<tcp::socket> socket;
  asio::steady_timer timer;
  std::array<std::uint8_t, kRelayRequestBytes> bytes{};
  std::uint8_t probe = 0;  // a read that notices the requester going away while it waits
  RelayRequest request;
  bool read = false;  // the request is in
  bool done = false;  // paired, refused or timed out
};

// Two spliced connections.
struct RelayHub::Pair {
  explicit Pair(asio::any_io_executor ex) : idle_timer(ex) {}
  std::shared_ptr<tcp::socket> socket[2];
  std::vector<std::uint8_t> buffer[2];  // buffer[i]: bytes read from socket[i]
  int running = 2;
  std::uint64_t session = 0;
  bool moved = false;  // bytes went through since the idle timer was last armed
  asio::steady_timer idle_timer;
  void close() {
    asio::error_code ignored;
    for (auto& s : socket) s->close(ignored);
  }
};

RelayHub::RelayHub(asio::io_context& io, PeerId self, RunId run, std::optional<RunKey> key, RelayOptions options)
    : io_(io), self_(self), run_(run), key_(std::move(key)), options_(options) {}

std::function<void()> RelayHub::take(tcp::socket socket, ByteView first4, Nanos read_timeout, std::shared_ptr<void> hold) {
  if (waiting_.size() >= options_.max_waiting) {
    refused_.fetch_add(1);
    answer_and_close(std::make_shared<tcp::socket>(std::move(socket)), RelayStatus::kBusy);
    return [] {};
  }
  auto w = std::make_shared<Waiting>(std::move(socket));
  std::memcpy(w->bytes.data(), first4.data(), 4);
  auto self = shared_from_this();
  w->timer.expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(read_timeout));
  w->timer.async_wait([w](asio::error_code ec) {
    if (ec || w->read) return;  // (the read may have completed just before)
    asio::error_code ignored;
    w->socket->close(ignored);  // the rest of the request did not come in time
  });
  asio::async_read(*w->socket, asio::buffer(w->bytes.data() + 4, kRelayRequestBytes - 4), [self, w, hold](asio::error_code ec, std::size_t) {
    (void)hold;  // held until here
    w->read = true;
    w->timer.cancel();
    if (ec) {
      self->refused_.fetch_add(1);
      asio::error_code ignored;
      w->socket->close(ignored);
      return;
    }
    self->on_request(w);
  });
  return [weak = std::weak_ptr<Waiting>(w)] {
    if (auto alive = weak.lock(); alive && !alive->read) {
      asio::error_code ignored;
      alive->socket->close(ignored);
    }
  };
}

void RelayHub::answer_and_close(std::shared_ptr<tcp::socket> socket, RelayStatus status) {
  auto answer = std::make_shared<Bytes>(encode_relay_answer(status));
  asio::async_write(*socket, asio::buffer(answer->data(), answer->size()), [socket, answer](asio::error_code, std::size_t) {
    asio::error_code ignored;
    socket->shutdown(tcp::socket::shutdown_both, ignored);
    socket->close(ignored);
  });
}

void RelayHub::on_request(std::shared_ptr<Waiting> w) {
  auto request = decode_relay_request(ByteView(reinterpret_cast<const std::byte*>(w->bytes.data()), w->bytes.size()), key_);
  if (request.ok() && request->run != run_) request = error(ErrorCode::kUnauthenticated, "relay request of another run");
  if (request.ok() && (request->from == self_ || request->to == self_)) request = error(ErrorCode::kMalformed, "relay request naming the relay itself");
  if (!request.ok()) {
    refused_.fetch_add(1);
    spdlog::debug("relay: refused a request: {}", request.status().to_string());
    return answer_and_close(w->socket, RelayStatus::kRefused);
  }
  if (request->relay != self_) {
    refused_.fetch_add(1);
    spdlog::debug("relay: refused a request meant for relay {}", request->relay.to_string());
    return answer_and_close(w->socket, RelayStatus::kRefused);
  }
  if (!fresh(*request)) {
    refused_.fetch_add(1);
    return answer_and_close(w->socket, RelayStatus::kStale);
  }
  w->request = *request;
  const Key mine{request->session, request->from.value, request->to.value};
  const Key theirs{request->session, request->to.value, request->from.value};
  if (auto it = waiting_.find(theirs); it != waiting_.end()) {
    auto other = it->second;
    waiting_.erase(it);
    other->done = true;
    other->timer.cancel();
    if (active_ >= options_.max_pairs) {
      refused_.fetch_add(2);
      answer_and_close(other->socket, RelayStatus::kBusy);
      return answer_and_close(w->socket, RelayStatus::kBusy);
    }
    return splice(other, w);
  }
  if (auto it = waiting_.find(mine); it != waiting_.end()) {  // asked again: the newer connection wins
    it->second->done = true;
    it->second->timer.cancel();
    asio::error_code ignored;
    it->second->socket->close(ignored);
    waiting_.erase(it);
  }
  waiting_[mine] = w;
  auto self = shared_from_this();
  w->timer.expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(options_.wait));
  w->timer.async_wait([self, w, mine](asio::error_code ec) {
    if (ec || w->done) return;
    w->done = true;
    auto it = self->waiting_.find(mine);
    if (it != self->waiting_.end() && it->second == w) self->waiting_.erase(it);
    self->answer_and_close(w->socket, RelayStatus::kNoMatch);
  });
  // A requester sends nothing until it is answered: a read that completes means it went away (or
  // broke the protocol), and its place is given up.
  w->socket->async_read_some(asio::buffer(&w->probe, 1), [self, w, mine](asio::error_code, std::size_t) {
    if (w->done) return;  // paired (its read cancelled), refused or timed out
    w->done = true;
    w->timer.cancel();
    auto it = self->waiting_.find(mine);
    if (it != self->waiting_.end() && it->second == w) self->waiting_.erase(it);
    asio::error_code ignored;
    w->socket->close(ignored);
  });
}

bool RelayHub::fresh(const RelayRequest& request) {
  const std::uint64_t now = relay_time_now();
  const auto skew = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(kRelayClockSkew).count());
  // Forgotten once older than twice the skew: a replay of one so old is refused by its time.
  while (!seen_order_.empty() && (now - std::min(now, seen_order_.front().first) > 2 * skew || seen_order_.size() >= options_.max_remembered)) {
    seen_.erase(seen_order_.front().second);
    seen_order_.pop_front();
  }
  const std::uint64_t apart = now > request.time_ms ? now - request.time_ms : request.time_ms - now;
  if (apart > skew) {
    spdlog::debug("relay: refused a request made {} s from this relay's clock", static_cast<double>(apart) / 1e3);
    return false;
  }
  if (!seen_.insert(request.nonce).second) {
    spdlog::debug("relay: refused a request taken before (a replay)");
    return false;
  }
  seen_order_.emplace_back(now, request.nonce);
  return true;
}

void RelayHub::splice(std::shared_ptr<Waiting> a, std::shared_ptr<Waiting> b) {
  ++active_;
  pairs_.fetch_add(1);
  auto pair = std::make_shared<Pair>(a->socket->get_executor());
  pair->session = a->request.session;
  pair->socket[0] = a->socket;
  pair->socket[1] = b->socket;
  std::erase_if(pairs_live_, [](const std::weak_ptr<Pair>& p) { return p.expired(); });
  pairs_live_.push_back(pair);
  asio::error_code ignored;
  a->socket->cancel(ignored);  // the waiting read of the first one
  for (auto& buf : pair->buffer) buf.resize(options_.buffer_bytes);
  // Both are told they are paired first; the copying starts once both answers are out.
  auto self = shared_from_this();
  auto answer = std::make_shared<Bytes>(encode_relay_answer(RelayStatus::kPaired));
  auto left = std::make_shared<int>(2);
  for (int i = 0; i < 2; ++i) {
    asio::async_write(*pair->socket[i], asio::buffer(answer->data(), answer->size()), [self, pair, answer, left](asio::error_code ec, std::size_t) {
      if (ec) pair->close();
      if (--*left > 0) return;
      self->pump(pair, 0);
      self->pump(pair, 1);
      self->watch_idle(pair);
    });
  }
  spdlog::debug("relay: paired peers {} and {}", a->request.from.to_string(), b->request.from.to_string());
}

// One direction of a pair: what is there is read from one socket and written whole to the other,
// again and again. A failure either way closes both; the pair is over when both directions stopped.
void RelayHub::pump(std::shared_ptr<Pair> pair, int from) {
  auto self = shared_from_this();
  auto& buf = pair->buffer[from];
  pair->socket[from]->async_read_some(asio::buffer(buf.data(), buf.size()), [self, pair, from](asio::error_code ec, std::size_t n) {
    if (ec) return self->stopped(pair);
    asio::async_write(*pair->socket[1 - from], asio::buffer(pair->buffer[from].data(), n), [self, pair, from](asio::error_code wec, std::size_t written) {
      self->forwarded_.fetch_add(written);
      pair->moved = true;
      if (wec) return self->stopped(pair);
      self->pump(pair, from);
    });
  });
}

void RelayHub::stopped(const std::shared_ptr<Pair>& pair) {
  pair->close();
  pair->idle_timer.cancel();
  if (--pair->running == 0) --active_;
}

void RelayHub::watch_idle(std::shared_ptr<Pair> pair) {
  pair->moved = false;
  pair->idle_timer.expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(options_.idle));
  auto self = shared_from_this();
  pair->idle_timer.async_wait([self, pair](asio::error_code ec) {
    if (ec || pair->running == 0) return;
    if (pair->moved) return self->watch_idle(pair);
    self->idle_closed_.fetch_add(1);
    spdlog::debug("relay: closing a pair idle for {} s", std::chrono::duration<double>(self->options_.idle).count());
    pair->close();  // both pumps then stop
  });
}

void RelayHub::retire_through(std::uint64_t session) {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (std::get<0>(it->first) > session) {
      ++it;
      continue;
    }
    auto w = it->second;
    it = waiting_.erase(it);
    w->done = true;
    w->timer.cancel();
    asio::error_code ignored;
    w->socket->close(ignored);
  }
  for (auto& weak : pairs_live_) {
    if (auto p = weak.lock(); p && p->session <= session) p->close();
  }
}

void RelayHub::shutdown() {
  for (auto& [key, w] : waiting_) {
    w->done = true;
    w->timer.cancel();
    asio::error_code ignored;
    w->socket->close(ignored);
  }
  waiting_.clear();
  for (auto& weak : pairs_live_) {
    if (auto p = weak.lock()) {
      p->idle_timer.cancel();
      p->close();
    }
  }
  pairs_live_.clear();
}

}  // namespace gossamer::transport
