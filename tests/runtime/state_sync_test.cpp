// State transfers between in-process peers over TCP on loopback: several donors at once, a donor
// serving corrupt chunks, a donor unreachable, a donor leaving mid-transfer, and malformed manifests;
// the store a newcomer keeps a snapshot in, and a transfer resumed from it.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <random>
#include <thread>

#include "core/hash.h"
#include "core/wire.h"
#include "runtime/peer_links.h"
#include "runtime/state_store.h"
#include "runtime/state_sync.h"
#include "runtime/update_log.h"
#include "train/run_folder.h"
#include "transport/tcp_transport.h"

using namespace gossamer;
using namespace gossamer::runtime;
using namespace std::chrono_literals;

namespace {

Deadline in(Nanos d) { return Deadline::after(real_clock(), d); }

std::unique_ptr<transport::Transport> tcp() {
  auto t = transport::make_tcp_transport(transport::TcpOptions{});
  REQUIRE(t.ok());
  return std::move(*t);
}

Bytes random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::byte>(gen() & 0xFF);
  return b;
}

// A member serving state: its transport, the links' acceptor handing state links to its server.
struct DonorPeer {
  std::unique_ptr<transport::Transport> transport = tcp();
  std::shared_ptr<UpdateLog> log = std::make_shared<UpdateLog>(100, 1u << 30);
  std::unique_ptr<StateServer> server = std::make_unique<StateServer>(real_clock(), log);
  std::unique_ptr<PeerLinks> links = std::make_unique<PeerLinks>(*transport, real_clock(), [this](std::shared_ptr<transport::Link> l) { server->serve(std::move(l)); });
  Donor donor() const { return Donor{transport->address(), transport->self().to_string()}; }
  void leave() {  // the acceptor first (it hands links to the server), then the server
    links.reset();
    server.reset();
  }
};

// n members that all offer `snapshot`, and the donor list a newcomer would hear of.
struct Donors {
  std::vector<std::unique_ptr<DonorPeer>> peers;
  std::vector<Donor> list;
};
Donors serving(int n, const std::shared_ptr<const Snapshot>& snapshot) {
  Donors d;
  for (int i = 0; i < n; ++i) {
    d.peers.push_back(std::make_unique<DonorPeer>());
    d.peers.back()->server->offer(snapshot);
    d.list.push_back(d.peers.back()->donor());
  }
  return d;
}

}  // namespace

TEST_CASE("a newcomer fetches the state from several donors at once, chunk hashes and whole hash checked") {
  const Bytes state = random_bytes(3'000'000, 1);
  auto [donors, list] = serving(3, Snapshot::make(7, 70, 4, state, 64 * 1024));
  auto newcomer = tcp();
  // Chunks go to whichever donor asks next: 46 chunks spread over the three donors, unless a stall of
  // the machine lets one donor take them all, so the spread needs to show in one of three fetches.
  std::uint64_t fetched = 0;
  std::size_t most_donors = 0;
  for (int attempt = 0; attempt < 3 && most_donors < 2; ++attempt) {
    auto got = fetch_state(*newcomer, list, 7, in(30s), real_clock());
    REQUIRE(got.ok());
    CHECK(digest_of(got->bytes) == digest_of(state));
    CHECK(got->manifest.round == 7);
    CHECK(got->manifest.step == 70);
    CHECK(got->manifest.shards == 4);
    CHECK(got->bytes_received == state.size());
    fetched += state.size();
    most_donors = std::max(most_donors, static_cast<std::size_t>(got->donors_used));
  }
  CHECK(most_donors >= 2);
  std::uint64_t served = 0;
  for (auto& d : donors) served += d->server->bytes_served();
  CHECK(served == fetched);
  // A round nobody holds: refused, and said so.
  auto none = fetch_state(*newcomer, list, 8, in(10s), real_clock());
  CHECK(none.status().code() == ErrorCode::kUnavailable);
}

TEST_CASE("a donor serving corrupt chunks and an unreachable donor do not spoil the transfer") {
  const Bytes state = random_bytes(1'000'000, 2);
  DonorPeer good, bad;
  good.server->offer(Snapshot::make(3, 30, 2, state, 32 * 1024));
  // The bad donor announces the true manifest but serves other bytes.
  auto forged = std::make_shared<Snapshot>(*Snapshot::make(3, 30, 2, state, 32 * 1024));
  forged->bytes[100] ^= std::byte{1};
  forged->bytes[500'000] ^= std::byte{1};
  bad.server->offer(forged);
  Donor gone;
  {
    auto t = tcp();
    gone = Donor{t->address(), "gone"};
  }  // its transport is closed: nothing listens there
  auto newcomer = tcp();
  auto got = fetch_state(*newcomer, {gone, bad.donor(), good.donor()}, 3, in(30s), real_clock());
  REQUIRE(got.ok());
  CHECK(digest_of(got->bytes) == digest_of(state));
  CHECK(got->donors_failed >= 1);  // the unreachable one at least; the forger once it hits a forged chunk
}

TEST_CASE("a donor that leaves mid-transfer only hands its share to the others") {
  const Bytes state = random_bytes(16'000'000, 3);
  auto [donors, list] = serving(2, Snapshot::make(5, 50, 2, state, 16 * 1024));
  // Donor 0 leaves once it has served a few chunks.
  std::atomic<bool> left{false};
  std::thread leaver([&] {
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (donors[0]->server->bytes_served() < 64 * 1024 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    donors[0]->leave();
    left = true;
  });
  auto newcomer = tcp();
  auto got = fetch_state(*newcomer, list, 5, in(60s), real_clock());
  leaver.join();
  REQUIRE(got.ok());
  CHECK(left.load());
  CHECK(digest_of(got->bytes) == digest_of(state));
  MESSAGE("donors used " << got->donors_used << ", failed " << got->donors_failed);
}

TEST_CASE("malformed manifests are refused") {
  const auto good = Snapshot::make(1, 10, 2, random_bytes(10'000, 4), 4096);
  const Bytes bytes = good->manifest.encode();
  REQUIRE(StateManifest::decode(bytes).ok());
  // Truncated.
  CHECK(!StateManifest::decode(ByteView(bytes.data(), bytes.size() - 1)).ok());
  // A chunk count that does not match the size.
  Writer w;
  w.i64(1);
  w.i64(10);
  w.u32(2);
  w.u64(10'000);
  w.u32(4096);
  w.u32(1'000'000);
  CHECK(!StateManifest::decode(std::move(w).take()).ok());
  // A zero chunk size.
  Writer z;
  z.i64(1);
  z.i64(10);
  z.u32(2);
  z.u64(10);
  z.u32(0);
  z.u32(0);
  CHECK(!StateManifest::decode(std::move(z).take()).ok());
}

TEST_CASE("catch-up: the updates donors keep after a snapshot are listed, fetched from all of them and verified, and a donor that differs is dropped") {
  const Bytes state = random_bytes(300'000, 5);
  auto [donors, list] = serving(3, Snapshot::make(4, 40, 2, state, 64 * 1024));
  // Every donor keeps the updates after step 40: one small (one chunk), one of several chunks.
  const Bytes small = random_bytes(1000, 6), large = random_bytes(3'500'000, 7);
  for (auto& d : donors) {
    d->log->start(40);
    d->log->add(40, 4, 2, random_bytes(10, 1));  // at the snapshot's step: not kept
    d->log->add(50, 5, 2, small);
    d->log->add(60, 6, 2, large);
  }
  // The third donor diverged: another update at step 60.
  Bytes other = large;
  other[7] ^= std::byte{1};
  donors[2]->log->stop();
  donors[2]->log->start(40);
  donors[2]->log->add(50, 5, 2, small);
  donors[2]->log->add(60, 6, 2, other);
  auto newcomer = tcp();
  auto session = StateFetch::open(*newcomer, list, 4, in(30s), real_clock());
  REQUIRE(session.ok());
  auto store = make_memory_store();
  REQUIRE((*session)->snapshot(*store, in(30s)).ok());
  auto snap = store->contents();
  REQUIRE(snap.ok());
  CHECK(digest_of(*snap) == digest_of(state));
  auto index = (*session)->updates_after(40, in(30s));
  REQUIRE(index.ok());
  REQUIRE(index->size() == 2);
  CHECK((*index)[0].step == 50);
  CHECK((*index)[1].step == 60);
  CHECK((*session)->donors_left() == 2);  // the one that differs on step 60 is dropped
  auto got = (*session)->updates(*index, in(30s));
  REQUIRE(got.ok());
  CHECK(((*got)[0] == small));
  CHECK(((*got)[1] == large));
  // Nothing newer after the last; the donors say how far their training is (the furthest counts),
  // and a donor that says nothing counts as not knowing.
  CHECK((*session)->donors_step() == -1);
  donors[0]->server->set_progress([] { return std::int64_t{63}; });
  donors[1]->server->set_progress([] { return std::int64_t{65}; });
  auto none = (*session)->updates_after(60, in(30s));
  REQUIRE(none.ok());
  CHECK(none->empty());
  CHECK((*session)->donors_step() == 65);
  std::uint64_t served = 0;
  for (auto& d : donors) served += d->server->bytes_served();
  CHECK(served == (*session)->bytes_received());
}

TEST_CASE("catch-up: a newcomer older than what the donors keep is told to fetch a newer snapshot") {
  auto [donors, list] = serving(1, Snapshot::make(2, 20, 1, random_bytes(5000, 8), 4096));
  UpdateLog& log = *donors[0]->log;
  UpdateLog bounded(30, 1u << 30);  // keeps 30 steps back
  bounded.start(20);
  for (std::int64_t s = 30; s <= 100; s += 10) bounded.add(s, s / 10, 1, random_bytes(100, static_cast<unsigned>(s)));
  CHECK(bounded.complete_after() == 70);  // 30, 40, 50, 60 and 70 went; 80, 90, 100 stay
  CHECK(bounded.index(0, 10).size() == 3);
  CHECK(bounded.dropped() == 5);
  log.start(20);
  for (std::int64_t s = 30; s <= 100; s += 10) log.add(s, s / 10, 1, random_bytes(100, static_cast<unsigned>(s)));
  auto newcomer = tcp();
  auto session = StateFetch::open(*newcomer, list, 2, in(10s), real_clock());
  REQUIRE(session.ok());
  CHECK((*session)->updates_after(20, in(10s)).ok());  // this donor keeps 100 steps: all of them
  log.stop();
  log.start(90);
  log.add(100, 10, 1, random_bytes(100, 3));
  auto old = (*session)->updates_after(20, in(10s));
  CHECK(old.status().code() == ErrorCode::kOutOfRange);
  // A bound on memory drops the oldest too.
  UpdateLog small(1000, 250);
  small.start(0);
  for (std::int64_t s = 1; s <= 5; ++s) small.add(s, s, 1, random_bytes(100, 9));
  CHECK(small.bytes() <= 250);
  CHECK(small.complete_after() == 3);
  CHECK(small.peak_bytes() <= 300);
}

TEST_CASE("serving is paced to its rate") {
  const Bytes state = random_bytes(400'000, 10);
  auto [donors, list] = serving(1, Snapshot::make(1, 10, 1, state, 50'000));
  donors[0]->server->set_rate(1e6);  // 1 MB/s: 0.4 s at least
  auto newcomer = tcp();
  const auto t0 = std::chrono::steady_clock::now();
  auto got = fetch_state(*newcomer, list, 1, in(30s), real_clock());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(got.ok());
  CHECK(took >= 0.35);  // the first chunk goes at once
  CHECK(donors[0]->server->throttled_s() > 0.2);
}

namespace {

std::filesystem::path fresh_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("gossamer_store_" + name + "_" + std::to_string(std::random_device{}()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

std::size_t count_held(const std::vector<bool>& held) { return static_cast<std::size_t>(std::count(held.begin(), held.end(), true)); }

}  // namespace

TEST_CASE("a snapshot kept in a run folder survives a restart chunk by chunk, and only what verifies is kept") {
  const auto dir = fresh_dir("restart");
  const Bytes state = random_bytes(1'000'000, 11);
  const auto snap = Snapshot::make(4, 40, 2, state, 64 * 1024);
  const StateManifest& m = snap->manifest;
  REQUIRE(m.chunks.size() == 16);
  {
    auto store = make_file_store(dir);
    auto held = store->prepare(m);
    REQUIRE(held.ok());
    CHECK(count_held(*held) == 0);
    for (std::size_t i = 0; i < m.chunks.size(); i += 2) {  // every other chunk arrived, then the process died
      const auto [at, n] = m.range(i);
      REQUIRE(store->write(at, ByteView(state.data() + at, n)).ok());
    }
  }
  CHECK(std::filesystem::exists(dir / train::kJoinStateFile));
  CHECK(std::filesystem::exists(dir / train::kJoinManifestFile));
  {
    // One kept chunk torn on disk: fetched again, not trusted.
    std::FILE* f = std::fopen((dir / train::kJoinStateFile).c_str(), "r+b");
    REQUIRE(f != nullptr);
    std::fseek(f, static_cast<long>(m.range(2).first + 10), SEEK_SET);
    std::fputc(0x5A ^ static_cast<int>(state[m.range(2).first + 10]), f);
    std::fclose(f);
  }
  auto store = make_file_store(dir);
  auto held = store->prepare(m);
  REQUIRE(held.ok());
  CHECK(count_held(*held) == 7);
  CHECK((*held)[0]);
  CHECK_FALSE((*held)[1]);
  CHECK_FALSE((*held)[2]);
  for (std::size_t i = 0; i < m.chunks.size(); ++i) {
    if ((*held)[i]) continue;
    const auto [at, n] = m.range(i);
    REQUIRE(store->write(at, ByteView(state.data() + at, n)).ok());
  }
  auto whole = store->contents();
  REQUIRE(whole.ok());
  CHECK(digest_of(*whole) == m.whole);
  // Another round's snapshot of the same layout: only chunks that hash alike are kept.
  Bytes next = state;
  for (std::size_t i = 0; i < next.size(); i += 100'000) next[i] ^= std::byte{1};  // 10 of 16 chunks change
  const auto later = Snapshot::make(5, 50, 2, next, 64 * 1024);
  auto again = make_file_store(dir)->prepare(later->manifest);
  REQUIRE(again.ok());
  std::size_t same = 0;
  for (std::size_t i = 0; i < m.chunks.size(); ++i) same += m.chunks[i] == later->manifest.chunks[i] ? 1 : 0;
  CHECK(count_held(*again) == same);
  CHECK(same < m.chunks.size());
  store->clear();
  CHECK_FALSE(std::filesystem::exists(dir / train::kJoinStateFile));
  CHECK_FALSE(std::filesystem::exists(dir / train::kJoinManifestFile));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a state larger than the store can hold is refused before anything is allocated or fetched") {
  StateManifest huge;
  huge.total = std::uint64_t{1} << 50;  // a petabyte: no disk here has it free
  huge.chunk_bytes = 16u << 20;
  const auto dir = fresh_dir("huge");
  auto on_disk = make_file_store(dir)->prepare(huge);
  CHECK(on_disk.status().code() == ErrorCode::kResourceExhausted);
  CHECK(on_disk.status().message().find("free") != std::string::npos);  // says what to do
  CHECK_FALSE(std::filesystem::exists(dir / train::kJoinStateFile));
  huge.total = 2'000'000;
  CHECK(make_memory_store(1'000'000)->prepare(huge).status().code() == ErrorCode::kResourceExhausted);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a transfer cut short resumes: only the chunks not yet verified cross the network") {
  const Bytes state = random_bytes(2'000'000, 12);
  const auto snap = Snapshot::make(6, 60, 2, state, 64 * 1024);
  auto [donors, list] = serving(2, snap);
  const auto dir = fresh_dir("resume");
  const StateManifest& m = snap->manifest;
  std::uint64_t kept = 0;
  {  // the first start: a third of the chunks arrived before it was killed
    auto store = make_file_store(dir);
    REQUIRE(store->prepare(m).ok());
    for (std::size_t i = 0; i < m.chunks.size() / 3; ++i) {
      const auto [at, n] = m.range(i);
      REQUIRE(store->write(at, ByteView(state.data() + at, n)).ok());
      kept += n;
    }
  }
  auto newcomer = tcp();
  auto session = StateFetch::open(*newcomer, list, 6, in(30s), real_clock());
  REQUIRE(session.ok());
  auto store = make_file_store(dir);
  REQUIRE((*session)->snapshot(*store, in(30s)).ok());
  auto got = (*session)->result(store);
  REQUIRE(got.ok());
  CHECK(got->bytes_resumed == kept);
  CHECK(got->bytes_received == state.size() - kept);
  CHECK(digest_of(got->bytes) == digest_of(state));
  std::uint64_t served = 0;
  for (auto& d : donors) served += d->server->bytes_served();
  CHECK(served == state.size() - kept);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a snapshot whose parts pass 4 GiB in all is served in chunks the manifest can list") {
  CHECK(snapshot_chunk_bytes(1'000'000) == 64u << 10);
  CHECK(snapshot_chunk_bytes(8'000'000) == 503808);  // 16 chunks, rounded to 4 KiB
  CHECK(snapshot_chunk_bytes(std::uint64_t{8} << 30) == 1u << 20);
  const std::uint64_t tib = std::uint64_t{1} << 40;
  const std::uint32_t c = snapshot_chunk_bytes(tib);
  CHECK((tib + c - 1) / c <= (1u << 18));
  CHECK(c % 4096 == 0);
}

TEST_CASE("an update larger than this model's updates can hold is refused when listed, before anything is set aside for it") {
  const Bytes state = random_bytes(100'000, 13);
  auto [donors, list] = serving(2, Snapshot::make(4, 40, 2, state, 64 * 1024));
  for (auto& d : donors) {
    d->log->start(40);
    d->log->add(50, 5, 2, random_bytes(1000, 14));
    d->log->add(60, 6, 2, random_bytes(50'000, 15));  // more than the limit below
  }
  auto newcomer = tcp();
  auto session = StateFetch::open(*newcomer, list, 4, in(30s), real_clock());
  REQUIRE(session.ok());
  (*session)->set_update_limit(8000);
  auto index = (*session)->updates_after(40, in(30s));
  CHECK_FALSE(index.ok());
  CHECK((*session)->donors_left() == 0);  // both listed it: both dropped
}

namespace {

// A store whose disk fills up after a few chunks.
class FillingStore final : public SnapshotStore {
 public:
  Result<std::vector<bool>> prepare(const StateManifest& manifest) override { return std::vector<bool>(manifest.chunks.size(), false); }
  Status write(std::uint64_t, ByteView) override {
    if (++writes_ > 3) return error(ErrorCode::kIoError, "no space left on the device");
    return Status();
  }
  Result<ByteView> contents() override { return error(ErrorCode::kNotFound, "nothing stored"); }
  void clear() override {}

 private:
  std::atomic<int> writes_{0};
};

}  // namespace

TEST_CASE("a store that refuses a write ends the transfer at once with its error, whatever the other donors were doing") {
  const Bytes state = random_bytes(2'000'000, 16);
  auto [donors, list] = serving(3, Snapshot::make(8, 80, 2, state, 64 * 1024));
  auto newcomer = tcp();
  auto session = StateFetch::open(*newcomer, list, 8, in(30s), real_clock());
  REQUIRE(session.ok());
  FillingStore store;
  const Status st = (*session)->snapshot(store, in(30s));
  CHECK(st.code() == ErrorCode::kIoError);
  CHECK(st.message().find("no space left") != std::string::npos);
}
