#include "run/state_sync.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>

#include <spdlog/spdlog.h>

#include "core/wire.h"
#include "transport/tags.h"

namespace gossamer::run {

namespace {

using namespace std::chrono_literals;
constexpr std::uint8_t kVersion = 1;
constexpr std::uint8_t kAskManifest = 1, kAskChunk = 2;
constexpr std::uint64_t kMaxTotal = std::uint64_t{8} << 30;
constexpr std::uint32_t kMaxChunk = 16u << 20;
constexpr std::uint32_t kMaxChunks = 1u << 18;  // the manifest stays under 16 MiB

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

// Sends a request and returns the body of an ok response.
Result<Bytes> ask(transport::Link& link, std::uint8_t kind, std::int64_t round, std::uint32_t chunk, Deadline deadline) {
  if (Status st = link.send(kStateRequestTag, request(kind, round, chunk), deadline); !st.ok()) return st;
  auto resp = link.recv(kStateResponseTag, deadline);
  if (!resp.ok()) return resp.status();
  Reader r(*resp, "state response from peer " + link.peer().to_string());
  const std::uint8_t version = r.u8(), ok = r.u8();
  if (r.ok() && version != kVersion) return error(ErrorCode::kVersionMismatch, "peer " + link.peer().to_string() + " serves state version " + std::to_string(version));
  if (r.ok() && ok == 0) return error(ErrorCode::kUnavailable, "peer " + link.peer().to_string() + " cannot serve: " + r.str(1024));
  if (r.ok() && ok != 1) return error(ErrorCode::kMalformed, "peer " + link.peer().to_string() + " answered with status " + std::to_string(ok));
  const ByteView body = r.blob(kMaxChunk + 64);
  r.expect_end();
  if (!r.ok()) return r.status();
  return Bytes(body.begin(), body.end());
}

}  // namespace

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

std::shared_ptr<const Snapshot> StateServer::find(std::int64_t round) const {
  std::lock_guard lock(mu_);
  if (current_ && current_->manifest.round == round) return current_;
  if (previous_ && previous_->manifest.round == round) return previous_;
  return nullptr;
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
      Reader r(*req, "state request from peer " + link->peer().to_string());
      const std::uint8_t version = r.u8(), kind = r.u8();
      const std::int64_t round = r.i64();
      const std::uint32_t chunk = r.u32();
      r.expect_end();
      Bytes reply;
      if (!r.ok() || version != kVersion || (kind != kAskManifest && kind != kAskChunk)) {
        spdlog::warn("state: a malformed request from peer {}: closing its link", link->peer().to_string());
        link->close();
        return;
      }
      auto snap = find(round);
      if (!snap) {
        reply = refusal("no state of round " + std::to_string(round) + " here any more");
      } else if (kind == kAskManifest) {
        reply = answer(snap->manifest.encode());
      } else if (chunk >= snap->manifest.chunks.size()) {
        reply = refusal("no chunk " + std::to_string(chunk));
      } else {
        const auto [at, n] = chunk_range(snap->bytes.size(), snap->manifest.chunk_bytes, chunk);
        reply = answer(ByteView(snap->bytes.data() + at, n));
        served_ += n;
      }
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

Result<FetchResult> fetch_state(transport::Transport& transport, const std::vector<Donor>& donors, std::int64_t round, Deadline deadline,
                                Clock& clock) {
  struct Source {
    std::shared_ptr<transport::Link> link;
    std::string name;
  };
  std::vector<Source> sources;
  std::optional<StateManifest> manifest;
  FetchResult out;
  for (const auto& d : donors) {
    auto link = open_state_link(transport, d.address, deadline);
    if (!link.ok()) {
      spdlog::warn("state: donor {} unreachable: {}", d.name, link.status().to_string());
      ++out.donors_failed;
      continue;
    }
    auto body = ask(**link, kAskManifest, round, 0, deadline);
    auto m = body.ok() ? StateManifest::decode(*body) : Result<StateManifest>(body.status());
    if (m.ok() && m->round != round) m = error(ErrorCode::kMalformed, "it sent the manifest of round " + std::to_string(m->round));
    if (!m.ok()) {
      spdlog::warn("state: donor {} has no manifest of round {}: {}", d.name, round, m.status().to_string());
      (*link)->close();
      ++out.donors_failed;
      continue;
    }
    if (!manifest) manifest = *m;
    if (m->whole != manifest->whole || m->total != manifest->total || m->chunk_bytes != manifest->chunk_bytes) {
      spdlog::warn("state: donor {} offers other state of round {} than the first donor: not used", d.name, round);
      (*link)->close();
      ++out.donors_failed;
      continue;
    }
    sources.push_back(Source{*link, d.name});
  }
  if (!manifest || sources.empty()) return error(ErrorCode::kUnavailable, "no donor could serve the state of round " + std::to_string(round));

  // Chunks are handed out one at a time to whichever donor asks next; a failed one goes back.
  std::mutex mu;
  std::deque<std::uint32_t> todo;
  for (std::uint32_t i = 0; i < manifest->chunks.size(); ++i) todo.push_back(i);
  std::vector<int> bad_copies(manifest->chunks.size(), 0);
  std::size_t busy = 0;
  auto changed = clock.make_signal();
  out.bytes.resize(manifest->total);
  std::vector<std::unique_ptr<ClockThread>> threads;
  int used = 0;
  for (auto& src : sources) {
    threads.push_back(clock.start_thread([&, src] {
      bool fetched_any = false;
      for (;;) {
        std::uint32_t chunk;
        {
          std::unique_lock lock(mu);
          changed->wait(lock, Deadline::never(), [&] { return !todo.empty() || busy == 0; });
          if (todo.empty()) break;
          chunk = todo.front();
          todo.pop_front();
          ++busy;
        }
        auto body = ask(*src.link, kAskChunk, round, chunk, deadline);
        const auto [at, n] = chunk_range(manifest->total, manifest->chunk_bytes, chunk);
        bool good = body.ok() && body->size() == n && digest_of(*body) == manifest->chunks[chunk];
        std::unique_lock lock(mu);
        --busy;
        if (good) {
          std::memcpy(out.bytes.data() + at, body->data(), n);
          out.bytes_received += n;
          fetched_any = true;
          changed->notify_all();
          continue;
        }
        // This donor failed the chunk: it goes back for the others, and this donor stops.
        if (body.ok()) ++bad_copies[chunk];
        spdlog::warn("state: donor {} failed chunk {}: {}", src.name, chunk, body.ok() ? "its hash does not match the manifest" : body.status().to_string());
        if (bad_copies[chunk] < static_cast<int>(sources.size())) todo.push_back(chunk);
        ++out.donors_failed;
        changed->notify_all();
        break;
      }
      std::lock_guard lock(mu);
      if (fetched_any) ++used;
    }));
  }
  for (auto& t : threads) t->join();
  for (auto& s : sources) s.link->close();
  out.donors_used = used;
  out.manifest = *manifest;
  if (!todo.empty() || out.bytes_received != manifest->total) {
    return error(ErrorCode::kUnavailable, "the state transfer of round " + std::to_string(round) + " did not complete: every donor failed");
  }
  if (digest_of(out.bytes) != manifest->whole) return error(ErrorCode::kDataLoss, "the state of round " + std::to_string(round) + " does not match its hash");
  return out;
}

}  // namespace gossamer::run
