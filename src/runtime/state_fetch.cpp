// StateFetch (state_sync.h): a newcomer's side of a state transfer, its snapshot and the updates
// since, fetched from every donor at once and verified.
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

struct StateFetch::Source {
  std::shared_ptr<transport::Link> link;
  std::string name;
  bool alive = true;
  bool served = false;
};

StateFetch::StateFetch(Clock& clock) : clock_(clock) {}

StateFetch::~StateFetch() {
  closing_ = true;
  if (keepalive_) keepalive_->join();
  for (auto& s : sources_) s->link->close();
}

void StateFetch::keep_alive(std::function<void()> ping, Nanos every) {
  if (keepalive_) return;
  keepalive_ = clock_.start_thread([this, ping = std::move(ping), every] {
    Nanos next = clock_.now() + every;
    while (!closing_) {
      if (clock_.now() >= next) {
        ping();
        next = clock_.now() + every;
      }
      clock_.sleep_for(std::min<Nanos>(every, 100ms));
    }
  });
}

int StateFetch::donors_used() const {
  int n = 0;
  for (const auto& s : sources_) n += s->served ? 1 : 0;
  return n;
}

int StateFetch::donors_left() const {
  int n = 0;
  for (const auto& s : sources_) n += s->alive ? 1 : 0;
  return n;
}

void StateFetch::drop(std::size_t source, const std::string& why) {
  Source& s = *sources_[source];
  if (!s.alive) return;
  s.alive = false;
  ++failed_;
  spdlog::warn("state: donor {} dropped: {}", s.name, why);
  s.link->close();
}

Result<std::unique_ptr<StateFetch>> StateFetch::open(transport::Transport& transport, const std::vector<Donor>& donors, std::int64_t round,
                                                      Deadline deadline, Clock& clock, const LinkWrap& wrap) {
  std::unique_ptr<StateFetch> f(new StateFetch(clock));
  // Every donor asked at once: a slow or dead one costs no more than its own deadline.
  struct Asked {
    Result<std::shared_ptr<transport::Link>> link = error(ErrorCode::kUnavailable, "not asked");
    Result<StateManifest> manifest = error(ErrorCode::kUnavailable, "not asked");
  };
  std::vector<Asked> asked(donors.size());
  {
    std::vector<std::unique_ptr<ClockThread>> threads;
    for (std::size_t i = 0; i < donors.size(); ++i) {
      threads.push_back(clock.start_thread([&, i] {
        Asked& a = asked[i];
        a.link = open_state_link(transport, donors[i].address, deadline);
        if (!a.link.ok()) return;
        if (wrap) a.link = wrap(*a.link);
        auto body = ask(**a.link, kAskManifest, round, 0, deadline);
        a.manifest = body.ok() ? StateManifest::decode(*body) : Result<StateManifest>(body.status());
        if (a.manifest.ok() && a.manifest->round != round) a.manifest = error(ErrorCode::kMalformed, "it sent the manifest of round " + std::to_string(a.manifest->round));
      }));
    }
    for (auto& t : threads) t->join();
  }
  std::vector<StateManifest> manifests;
  for (std::size_t i = 0; i < donors.size(); ++i) {
    const Donor& d = donors[i];
    Asked& a = asked[i];
    if (!a.link.ok()) {
      spdlog::warn("state: donor {} unreachable: {}", d.name, a.link.status().to_string());
      ++f->failed_;
      continue;
    }
    if (!a.manifest.ok()) {
      spdlog::warn("state: donor {} has no manifest of round {}: {}", d.name, round, a.manifest.status().to_string());
      (*a.link)->close();
      ++f->failed_;
      continue;
    }
    auto src = std::make_unique<Source>();
    src->link = *a.link;
    src->name = d.name;
    f->sources_.push_back(std::move(src));
    manifests.push_back(std::move(*a.manifest));
  }
  if (f->sources_.empty()) return error(ErrorCode::kUnavailable, "no donor could serve the state of round " + std::to_string(round));
  // The manifest the most donors agree on (the first of equals); the others are not used.
  std::size_t best = 0, best_count = 0;
  for (std::size_t i = 0; i < manifests.size(); ++i) {
    std::size_t n = 0;
    for (const auto& m : manifests) n += m.encode() == manifests[i].encode() ? 1 : 0;
    if (n > best_count) best = i, best_count = n;
  }
  f->manifest_ = manifests[best];
  const Bytes agreed = f->manifest_.encode();
  for (std::size_t i = 0; i < manifests.size(); ++i) {
    if (manifests[i].encode() != agreed) f->drop(i, "it offers other state of round " + std::to_string(round) + " than the most donors");
  }
  return f;
}

void StateFetch::add_pieces(std::vector<Piece>& pieces, std::uint8_t kind, std::int64_t at, const StateManifest& manifest, Bytes& out) {
  for (std::uint32_t i = 0; i < manifest.chunks.size(); ++i) {
    const auto [from, n] = chunk_range(manifest.total, manifest.chunk_bytes, i);
    pieces.push_back(Piece{kind, at, i, &out, nullptr, from, n, manifest.chunks[i]});
  }
}

Result<Bytes> StateFetch::read_answer_or_stop(transport::Link& link, Deadline deadline) {
  if (!stop_) return read_answer(link, deadline);
  for (;;) {
    if (stopped()) return error(ErrorCode::kAborted, "stop requested");
    const bool last = deadline.remaining(clock_) <= Nanos(200ms);
    auto body = read_answer(link, last ? deadline : Deadline::after(clock_, 200ms));
    if (last || body.ok() || body.status().code() != ErrorCode::kTimeout) return body;
  }
}

Result<Bytes> StateFetch::ask_or_stop(transport::Link& link, std::uint8_t kind, std::int64_t at, std::uint32_t chunk, Deadline deadline) {
  if (Status st = link.send(kStateRequestTag, request(kind, at, chunk), deadline); !st.ok()) return st;
  return read_answer_or_stop(link, deadline);
}

// Pieces are handed out one at a time to whichever donor has room in its window; those of a failed
// donor go back.
struct StateFetch::PieceQueue {
  PieceQueue(Clock& clock, std::size_t count, int sources) : bad_copies(count, 0), copies(sources), changed(clock.make_signal()) {
    for (std::size_t i = 0; i < count; ++i) todo.push_back(i);
  }
  // A donor's pieces in flight go back to the front (under mu).
  void give_back(std::deque<std::size_t>& inflight) {
    for (const std::size_t p : inflight) todo.push_front(p);
    busy -= inflight.size();
    inflight.clear();
    changed->notify_all();
  }

  std::mutex mu;
  std::deque<std::size_t> todo;
  std::vector<int> bad_copies;  // per piece: donors whose copy failed its hash
  const int copies;             // donors at the start
  std::size_t busy = 0, done = 0;
  std::uint64_t got = 0;
  Status io_failure;
  std::unique_ptr<Signal> changed;
};

void StateFetch::fetch_from(std::size_t index, const std::vector<Piece>& pieces, Deadline deadline, PieceQueue& q) {
  constexpr std::size_t kWindow = 4;
  Source& src = *sources_[index];
  std::deque<std::size_t> inflight;
  for (;;) {
    // Fill the window, but take the answers that are in before waiting for the pace.
    while (inflight.size() < kWindow && (inflight.empty() || !pacer_.would_wait(clock_))) {
      std::size_t p;
      {
        std::lock_guard lock(q.mu);
        if (q.todo.empty()) break;
        p = q.todo.front();
        q.todo.pop_front();
        ++q.busy;
      }
      inflight.push_back(p);
      if (!pacer_.wait_turn(clock_, pieces[p].size, stop_)) {
        std::lock_guard lock(q.mu);
        q.give_back(inflight);
        return;
      }
      if (Status st = src.link->send(kStateRequestTag, request(pieces[p].kind, pieces[p].at, pieces[p].chunk), deadline); !st.ok()) {
        std::lock_guard lock(q.mu);
        drop(index, st.to_string());
        q.give_back(inflight);
        return;
      }
    }
    if (inflight.empty()) {
      std::unique_lock lock(q.mu);
      q.changed->wait(lock, Deadline::never(), [&] { return !q.todo.empty() || q.busy == 0 || !q.io_failure.ok(); });
      if (q.todo.empty()) return;
      continue;
    }
    const std::size_t p = inflight.front();
    inflight.pop_front();
    const Piece& piece = pieces[p];
    auto body = read_answer_or_stop(*src.link, deadline);
    if (!body.ok() && body.status().code() == ErrorCode::kAborted) {
      std::lock_guard lock(q.mu);
      inflight.push_front(p);
      q.give_back(inflight);
      return;
    }
    const bool good = body.ok() && body->size() == piece.size && digest_of(*body) == piece.digest;
    Status stored;
    if (good && piece.store) stored = piece.store->write(piece.offset, *body);
    std::lock_guard lock(q.mu);
    --q.busy;
    if (!stored.ok()) {  // the disk refused: nobody can go on
      if (q.io_failure.ok()) q.io_failure = stored;
      q.give_back(inflight);
      q.todo.clear();
      return;
    }
    if (good) {
      if (piece.out && piece.size > 0) std::memcpy(piece.out->data() + piece.offset, body->data(), piece.size);
      q.got += piece.size;
      ++q.done;
      src.served = true;
      q.changed->notify_all();
      continue;
    }
    // This donor failed the piece: it goes back for the others (unless every donor failed it), with
    // the rest of this donor's window, and this donor stops.
    if (body.ok()) ++q.bad_copies[p];
    drop(index, "chunk " + std::to_string(piece.chunk) + (piece.kind == kAskChunk ? "" : " of the update of step " + std::to_string(piece.at)) + ": " +
                    (body.ok() ? "its hash does not match the manifest" : body.status().to_string()));
    if (q.bad_copies[p] < q.copies) q.todo.push_back(p);
    q.give_back(inflight);
    return;
  }
}

Status StateFetch::fetch_pieces(const std::vector<Piece>& pieces, const std::vector<std::size_t>& sources, Deadline deadline) {
  PieceQueue q(clock_, pieces.size(), static_cast<int>(sources.size()));
  std::vector<std::unique_ptr<ClockThread>> threads;
  for (const std::size_t index : sources) {
    threads.push_back(clock_.start_thread([&, index] { fetch_from(index, pieces, deadline, q); }));
  }
  for (auto& t : threads) t->join();
  received_ += q.got;
  if (!q.io_failure.ok()) return q.io_failure;
  if (stopped()) return error(ErrorCode::kAborted, "stop requested during the transfer");
  if (q.done != pieces.size()) {
    for (const std::size_t p : q.todo) {
      if (q.bad_copies[p] >= q.copies) return error(ErrorCode::kDataLoss, "every donor's copy of chunk " + std::to_string(pieces[p].chunk) + " failed its hash");
    }
    return error(ErrorCode::kUnavailable, "the transfer did not complete: every donor failed");
  }
  return Status();
}

Status StateFetch::snapshot(SnapshotStore& store, Deadline deadline) {
  std::vector<std::size_t> alive;
  for (std::size_t i = 0; i < sources_.size(); ++i) {
    if (sources_[i]->alive) alive.push_back(i);
  }
  const std::string what = "the state of round " + std::to_string(manifest_.round);
  auto held = store.prepare(manifest_);
  if (!held.ok()) return held.status().with_context(what);
  std::vector<Piece> pieces;
  resumed_ = 0;
  for (std::size_t i = 0; i < manifest_.chunks.size(); ++i) {
    const auto [from, n] = manifest_.range(i);
    if ((*held)[i]) {
      resumed_ += n;
      continue;
    }
    pieces.push_back(Piece{kAskChunk, manifest_.round, static_cast<std::uint32_t>(i), nullptr, &store, from, n, manifest_.chunks[i]});
  }
  if (resumed_ > 0) {
    spdlog::info("state: {:.2f} of {:.2f} MB of the state of round {} kept from an earlier transfer", resumed_ / 1e6, manifest_.total / 1e6,
                 manifest_.round);
  }
  Status st = fetch_pieces(pieces, alive, deadline);
  if (st.ok()) {
    auto whole = store.contents();
    if (!whole.ok()) st = whole.status();
    else if (digest_of(*whole) != manifest_.whole) st = error(ErrorCode::kDataLoss, "what arrived does not match its hash");
  }
  if (!st.ok()) return st.with_context(what);
  return Status();
}

Result<std::vector<UpdateInfo>> StateFetch::updates_after(std::int64_t step, Deadline deadline) {
  // step -> (hash, size, chunk size) -> the donors that list it so
  std::map<std::int64_t, std::map<std::tuple<Digest, std::uint64_t, std::uint32_t>, std::vector<std::size_t>>> listed;
  bool covered = false;
  std::string why;
  donors_step_ = -1;
  for (std::size_t i = 0; i < sources_.size(); ++i) {
    Source& src = *sources_[i];
    if (!src.alive) continue;
    auto body = ask_or_stop(*src.link, kAskIndex, step, kMaxIndexEntries, deadline);
    if (!body.ok()) {
      if (body.status().code() == ErrorCode::kUnavailable) {  // it keeps no updates (any more)
        why = body.status().message();
        continue;
      }
      drop(i, body.status().to_string());
      continue;
    }
    Reader r(*body, "update index from donor " + src.name);
    const std::int64_t complete_after = r.i64();
    const std::uint32_t count = r.u32();
    if (r.ok() && count > kMaxIndexEntries) r.fail(ErrorCode::kMalformed, "too many entries");
    std::vector<UpdateInfo> index;
    for (std::uint32_t k = 0; r.ok() && k < count; ++k) {
      UpdateInfo u;
      u.step = r.i64();
      u.total = r.u64();
      u.chunk_bytes = r.u32();
      u.whole = get_digest(r);
      if (r.ok() && u.total > update_limit_) {
        r.fail(ErrorCode::kMalformed, "it lists an update of " + std::to_string(u.total) + " bytes at step " + std::to_string(u.step) +
                                          ", more than this model's updates can hold (" + std::to_string(update_limit_) + ")");
      }
      if (r.ok() && (u.step <= step || u.total > kMaxUpdate || u.chunk_bytes == 0 || u.chunk_bytes > kMaxChunk ||
                     (u.total + u.chunk_bytes - 1) / u.chunk_bytes > kMaxChunks || (!index.empty() && u.step <= index.back().step))) {
        r.fail(ErrorCode::kMalformed, "entries out of order or out of bounds");
      }
      index.push_back(u);
    }
    const std::int64_t donor_step = r.i64();
    r.expect_end();
    if (r.ok() && (donor_step < -1 || donor_step > (std::int64_t{1} << 40))) r.fail(ErrorCode::kMalformed, "a step out of range");
    if (!r.ok()) {
      drop(i, r.status().to_string());
      continue;
    }
    donors_step_ = std::max(donors_step_, donor_step);
    if (complete_after > step) {  // it no longer holds every update after `step`
      why = "donor " + src.name + " keeps updates after step " + std::to_string(complete_after) + " only";
      continue;
    }
    covered = true;
    for (const auto& u : index) listed[u.step][std::make_tuple(u.whole, u.total, u.chunk_bytes)].push_back(i);
  }
  if (!covered) return error(ErrorCode::kOutOfRange, "no donor keeps the updates after step " + std::to_string(step) + (why.empty() ? "" : ": " + why));
  std::vector<UpdateInfo> out;
  holders_.clear();
  for (const auto& [s, by_digest] : listed) {
    auto best = by_digest.begin();
    for (auto it = by_digest.begin(); it != by_digest.end(); ++it) {
      if (it->second.size() > best->second.size()) best = it;
    }
    for (const auto& [d, holders] : by_digest) {
      if (d == best->first) continue;
      for (const std::size_t h : holders) drop(h, "it lists another update of step " + std::to_string(s) + " than the most donors");
    }
    const auto& [whole, total, chunk_bytes] = best->first;
    out.push_back(UpdateInfo{s, total, chunk_bytes, whole});
    holders_[s] = best->second;
  }
  return out;
}

Result<std::vector<Bytes>> StateFetch::updates(const std::vector<UpdateInfo>& infos, Deadline deadline) {
  // The donors that hold the first ones alike (every donor of the snapshot, unless some differ or
  // are a round behind): as many of them as some donors hold in common.
  std::vector<std::size_t> holders;
  std::size_t count = 0;
  for (; count < infos.size(); ++count) {
    std::vector<std::size_t> common;
    for (const std::size_t h : holders_[infos[count].step]) {
      if (sources_[h]->alive && (count == 0 || std::find(holders.begin(), holders.end(), h) != holders.end())) common.push_back(h);
    }
    if (common.empty()) break;
    holders = std::move(common);
  }
  if (count == 0) return error(ErrorCode::kUnavailable, "no donor left holds the update of step " + std::to_string(infos.front().step));
  // A batch is held in memory: at most kMaxBatchBytes of it (but one update whatever its size), so
  // that a donor listing many large updates cannot make this peer set aside more than that.
  std::uint64_t batch_bytes = infos.front().total;
  for (std::size_t k = 1; k < count; ++k) {
    if (batch_bytes + infos[k].total > kMaxBatchBytes) {
      count = k;
      break;
    }
    batch_bytes += infos[k].total;
  }
  std::vector<Bytes> out(count);
  std::vector<Piece> pieces;
  for (std::size_t k = 0; k < count; ++k) {
    const UpdateInfo& u = infos[k];
    out[k].resize(u.total);
    if (u.total <= u.chunk_bytes) {  // one chunk: its hash is the whole's, no manifest needed
      if (u.total > 0) pieces.push_back(Piece{kAskUpdateChunk, u.step, 0, &out[k], nullptr, 0, static_cast<std::size_t>(u.total), u.whole});
      continue;
    }
    std::optional<StateManifest> manifest;
    for (const std::size_t h : holders) {
      if (!sources_[h]->alive) continue;
      auto body = ask_or_stop(*sources_[h]->link, kAskUpdateManifest, u.step, 0, deadline);
      auto m = body.ok() ? StateManifest::decode(*body) : Result<StateManifest>(body.status());
      if (m.ok() && (m->step != u.step || m->whole != u.whole || m->total != u.total)) {
        m = error(ErrorCode::kMalformed, "its manifest of the update of step " + std::to_string(u.step) + " does not match its index");
      }
      if (!m.ok()) {
        drop(h, m.status().to_string());
        continue;
      }
      manifest = std::move(*m);
      break;
    }
    if (!manifest) return error(ErrorCode::kUnavailable, "no donor could serve the update of step " + std::to_string(u.step));
    add_pieces(pieces, kAskUpdateChunk, u.step, *manifest, out[k]);
  }
  std::vector<std::size_t> alive;
  for (const std::size_t h : holders) {
    if (sources_[h]->alive) alive.push_back(h);
  }
  if (Status st = fetch_pieces(pieces, alive, deadline); !st.ok()) return st.with_context("the updates after step " + std::to_string(infos.front().step - 1));
  for (std::size_t k = 0; k < count; ++k) {
    if (digest_of(out[k]) != infos[k].whole) return error(ErrorCode::kDataLoss, "the update of step " + std::to_string(infos[k].step) + " does not match its hash");
  }
  return out;
}

Result<FetchResult> fetch_state(transport::Transport& transport, const std::vector<Donor>& donors, std::int64_t round, Deadline deadline,
                                Clock& clock) {
  auto session = StateFetch::open(transport, donors, round, deadline, clock);
  if (!session.ok()) return session.status();
  auto store = make_memory_store();
  if (Status st = (*session)->snapshot(*store, deadline); !st.ok()) return st;
  return (*session)->result(std::move(store));
}

Result<FetchResult> StateFetch::result(std::shared_ptr<SnapshotStore> store) const {
  auto whole = store->contents();
  if (!whole.ok()) return whole.status();
  FetchResult out;
  out.manifest = manifest_;
  out.store = std::move(store);
  out.bytes = *whole;
  out.bytes_received = received_;
  out.bytes_resumed = resumed_;
  out.donors_used = donors_used();
  out.donors_failed = failed_;
  return out;
}

}  // namespace gossamer::runtime
