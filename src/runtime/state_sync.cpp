#include "runtime/state_sync.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <tuple>

#include <spdlog/spdlog.h>

#include "core/wire.h"
#include "runtime/state_store.h"
#include "runtime/state_sync_parts.h"
#include "runtime/update_log.h"
#include "transport/tags.h"

namespace gossamer::runtime {

using namespace std::chrono_literals;
using namespace state_sync_parts;

namespace state_sync_parts {

// Where chunk i of a state of `total` bytes cut in `chunk_bytes` starts, and how long it is.
std::pair<std::uint64_t, std::size_t> chunk_range(std::uint64_t total, std::uint32_t chunk_bytes, std::uint64_t i) {
  const std::uint64_t at = i * chunk_bytes;
  return {at, static_cast<std::size_t>(std::min<std::uint64_t>(chunk_bytes, total - at))};
}

void put_digest(Writer& w, const Digest& d) { w.raw(ByteView(reinterpret_cast<const std::byte*>(d.bytes.data()), d.bytes.size())); }

Digest get_digest(Reader& r) {
  Digest d;
  const ByteView b = r.raw(d.bytes.size());
  if (b.size() == d.bytes.size()) std::memcpy(d.bytes.data(), b.data(), b.size());
  return d;
}

Bytes request(std::uint8_t kind, std::int64_t round, std::uint32_t chunk) {
  Writer w;
  w.u8(kVersion);
  w.u8(kind);
  w.i64(round);
  w.u32(chunk);
  return std::move(w).take();
}

Bytes answer(ByteView body) {
  Writer w(body.size() + 8);
  w.u8(kVersion);
  w.u8(1);
  w.blob(body);
  return std::move(w).take();
}

Bytes refusal(const std::string& why) {
  Writer w;
  w.u8(kVersion);
  w.u8(0);
  w.str(why);
  return std::move(w).take();
}

Result<Request> decode_request(ByteView bytes, const std::string& what) {
  Reader r(bytes, what);
  Request q;
  const std::uint8_t version = r.u8();
  q.kind = r.u8();
  q.round = r.i64();
  q.chunk = r.u32();
  r.expect_end();
  if (!r.ok()) return r.status();
  if (version != kVersion) return error(ErrorCode::kVersionMismatch, what + ": state version " + std::to_string(version) + ", this peer serves " + std::to_string(kVersion));
  if (q.kind < kAskManifest || q.kind > kAskIndex) return error(ErrorCode::kMalformed, what + ": unknown kind " + std::to_string(q.kind));
  return q;
}

Result<Bytes> decode_answer(ByteView bytes, const std::string& what) {
  Reader r(bytes, what);
  const std::uint8_t version = r.u8(), ok = r.u8();
  if (r.ok() && version != kVersion) return error(ErrorCode::kVersionMismatch, what + ": state version " + std::to_string(version));
  if (r.ok() && ok == 0) {
    const std::string why = r.str(1024);
    r.expect_end();
    if (!r.ok()) return r.status();
    return error(ErrorCode::kUnavailable, what + ": cannot serve: " + why);
  }
  if (r.ok() && ok != 1) return error(ErrorCode::kMalformed, what + ": status " + std::to_string(ok));
  const ByteView body = r.blob(kMaxChunk + 64);
  r.expect_end();
  if (!r.ok()) return r.status();
  return Bytes(body.begin(), body.end());
}

// The body of the next response on `link` when it is ok.
Result<Bytes> read_answer(transport::Link& link, Deadline deadline) {
  auto resp = link.recv(kStateResponseTag, deadline);
  if (!resp.ok()) return resp.status();
  return decode_answer(*resp, "peer " + link.peer().to_string() + "'s state answer");
}

// Sends a request and returns the body of an ok response.
Result<Bytes> ask(transport::Link& link, std::uint8_t kind, std::int64_t round, std::uint32_t chunk, Deadline deadline) {
  if (Status st = link.send(kStateRequestTag, request(kind, round, chunk), deadline); !st.ok()) return st;
  return read_answer(link, deadline);
}

}  // namespace state_sync_parts

std::uint32_t snapshot_chunk_bytes(std::uint64_t total) {
  const std::uint64_t round_up = 4096;
  const std::uint64_t spread = (total / 16 + round_up - 1) / round_up * round_up;
  const std::uint64_t fits = (total + kMaxChunks - 1) / kMaxChunks;  // the fewest bytes per chunk the manifest allows
  const std::uint64_t chunk = std::max(std::clamp<std::uint64_t>(spread, 64u << 10, 1u << 20), (fits + round_up - 1) / round_up * round_up);
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, kMaxChunk));
}

std::pair<std::uint64_t, std::size_t> StateManifest::range(std::size_t i) const { return chunk_range(total, chunk_bytes, i); }

Bytes StateManifest::encode() const {
  Writer w;
  w.i64(round);
  w.i64(step);
  w.u32(shards);
  w.u64(total);
  w.u32(chunk_bytes);
  w.u32(static_cast<std::uint32_t>(chunks.size()));
  put_digest(w, whole);
  for (const auto& c : chunks) put_digest(w, c);
  return std::move(w).take();
}

Result<StateManifest> StateManifest::decode(ByteView bytes) {
  Reader r(bytes, "state manifest");
  StateManifest m;
  m.round = r.i64();
  m.step = r.i64();
  m.shards = r.u32();
  m.total = r.u64();
  m.chunk_bytes = r.u32();
  const std::uint32_t count = r.u32();
  if (r.ok() && (m.round < 0 || m.step < 0 || m.total > kMaxTotal || m.chunk_bytes == 0 || m.chunk_bytes > kMaxChunk || m.shards == 0 ||
                 count != (m.total + m.chunk_bytes - 1) / m.chunk_bytes || count > kMaxChunks)) {
    r.fail(ErrorCode::kMalformed, "sizes out of bounds or inconsistent");
  }
  m.whole = get_digest(r);
  for (std::uint32_t i = 0; r.ok() && i < count; ++i) m.chunks.push_back(get_digest(r));
  r.expect_end();
  if (!r.ok()) return r.status();
  return m;
}

std::shared_ptr<const Snapshot> Snapshot::make(std::int64_t round, std::int64_t step, std::uint32_t shards, Bytes bytes, std::uint32_t chunk_bytes) {
  auto s = std::make_shared<Snapshot>();
  s->manifest.round = round;
  s->manifest.step = step;
  s->manifest.shards = shards;
  s->manifest.total = bytes.size();
  s->manifest.chunk_bytes = chunk_bytes;
  s->manifest.whole = digest_of(bytes);
  for (std::uint64_t i = 0; i * chunk_bytes < bytes.size(); ++i) {
    const auto [at, n] = chunk_range(bytes.size(), chunk_bytes, i);
    s->manifest.chunks.push_back(digest_of(ByteView(bytes.data() + at, n)));
  }
  s->bytes = std::move(bytes);
  return s;
}

StateServer::~StateServer() {
  stopping_ = true;
  std::vector<std::unique_ptr<ClockThread>> threads;
  {
    std::lock_guard lock(mu_);
    for (auto& l : links_) l->close();
    threads.swap(threads_);
  }
  for (auto& t : threads) t->join();
}

void StateServer::offer(std::shared_ptr<const Snapshot> snapshot) {
  std::lock_guard lock(mu_);
  previous_ = std::move(current_);
  current_ = std::move(snapshot);
}

void StateServer::withdraw() {
  std::lock_guard lock(mu_);
  previous_.reset();
  current_.reset();
}

void Pacer::set_rate(double bytes_per_s) {
  std::lock_guard lock(mu_);
  rate_ = bytes_per_s > 0 ? bytes_per_s : 0;
}

double Pacer::rate() const {
  std::lock_guard lock(mu_);
  return rate_;
}

bool Pacer::wait_turn(Clock& clock, std::size_t bytes, const std::atomic<bool>* stop) {
  Nanos start{0};
  {
    std::lock_guard lock(mu_);
    if (rate_ <= 0) return true;
    const Nanos now = clock.now();
    start = std::max(now, next_free_);
    next_free_ = start + std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(static_cast<double>(bytes) / rate_));
    waited_ += start - now;
  }
  // In slices, so that a stop is heard at once (a turn far ahead over a slow link may be seconds away).
  while (clock.now() < start) {
    if (stop && stop->load()) return false;
    clock.sleep_until(std::min(start, clock.now() + Nanos(100ms)));
  }
  return true;
}

bool Pacer::would_wait(Clock& clock) const {
  std::lock_guard lock(mu_);
  return rate_ > 0 && next_free_ > clock.now();
}

double Pacer::waited_s() const {
  std::lock_guard lock(mu_);
  return std::chrono::duration<double>(waited_).count();
}

void StateServer::set_rate(double bytes_per_s) { pacer_.set_rate(bytes_per_s); }

void StateServer::set_progress(std::function<std::int64_t()> steps_done) { progress_ = std::move(steps_done); }

double StateServer::rate() const { return pacer_.rate(); }

std::uint64_t StateServer::offered_bytes() const {
  std::lock_guard lock(mu_);
  return current_ ? current_->manifest.total : 0;
}

double StateServer::throttled_s() const { return pacer_.waited_s(); }

std::shared_ptr<const Snapshot> StateServer::find(std::int64_t round) const {
  std::lock_guard lock(mu_);
  if (current_ && current_->manifest.round == round) return current_;
  if (previous_ && previous_->manifest.round == round) return previous_;
  return nullptr;
}

Bytes StateServer::answer_request(std::uint8_t kind, std::int64_t at, std::uint32_t chunk) {
  if (kind == kAskIndex) {
    if (!log_ || !log_->recording()) return refusal("no updates kept here");
    Writer w;
    const auto [complete_after, index] = log_->complete_index(at, std::min(chunk, kMaxIndexEntries));
    w.i64(complete_after);
    w.u32(static_cast<std::uint32_t>(index.size()));
    for (const auto& u : index) {
      w.i64(u.step);
      w.u64(u.total);
      w.u32(u.chunk_bytes);
      put_digest(w, u.whole);
    }
    w.i64(progress_ ? progress_() : -1);
    return answer(std::move(w).take());
  }
  const bool update = kind == kAskUpdateManifest || kind == kAskUpdateChunk;
  std::shared_ptr<const Snapshot> object = update ? (log_ ? log_->find(at) : nullptr) : find(at);
  if (!object) return refusal(update ? "no update of step " + std::to_string(at) + " here" : "no state of round " + std::to_string(at) + " here any more");
  if (kind == kAskManifest || kind == kAskUpdateManifest) return answer(object->manifest.encode());
  if (chunk >= object->manifest.chunks.size()) return refusal("no chunk " + std::to_string(chunk));
  const auto [from, n] = chunk_range(object->bytes.size(), object->manifest.chunk_bytes, chunk);
  if (!pacer_.wait_turn(clock_, n, &stopping_)) return refusal("this peer is stopping");
  served_ += n;
  return answer(ByteView(object->bytes.data() + from, n));
}

void StateServer::serve(std::shared_ptr<transport::Link> link) {
  std::lock_guard lock(mu_);
  if (stopping_) return link->close();
  links_.push_back(link);
  threads_.push_back(clock_.start_thread([this, link] {
    while (!stopping_) {
      auto req = link->recv(kStateRequestTag, Deadline::after(clock_, 500ms));
      if (!req.ok()) {
        if (req.status().code() == ErrorCode::kTimeout) continue;
        return;  // the newcomer is done or gone
      }
      auto q = decode_request(*req, "state request from peer " + link->peer().to_string());
      if (!q.ok()) {
        spdlog::warn("state: {}: closing its link", q.status().to_string());
        link->close();
        return;
      }
      const Bytes reply = answer_request(q->kind, q->round, q->chunk);
      ++requests_;
      if (!link->send(kStateResponseTag, reply, Deadline::after(clock_, 60s)).ok()) return;
    }
  }));
}

Result<std::shared_ptr<transport::Link>> open_state_link(transport::Transport& transport, const std::string& address, Deadline deadline) {
  auto link = transport.connect(address, deadline);
  if (!link.ok()) return link.status();
  Writer w;
  w.u64(0);  // epoch 0: a state link
  if (Status st = (*link)->send(transport::tags::kEpoch, std::move(w).take(), deadline); !st.ok()) return st;
  return *link;
}

}  // namespace gossamer::runtime
