// libFuzzer target: both ends of a state transfer (src/runtime/state_sync.h) on arbitrary bytes, over
// in-process links. The first byte picks the end; the rest is a sequence of records (records.h):
//   0  the donor: a StateServer serving two snapshots (and keeping no updates) reads the records as
//      requests. Each well-formed request gets exactly the answer the layout in the header says (the
//      manifest, the chunk, or a refusal); the first malformed one closes the link unanswered.
//   1  the newcomer: fetch_state from one donor that sends the true manifest, and the records as its
//      chunk answers. What it accepts must be exactly the state.
//   2  the newcomer: the first record is the donor's manifest answer, the others its chunk answers.
//      What it accepts must be as long as that manifest says, and its chunk hashes and whole hash must
//      re-encode to that manifest. (A manifest may name up to 8 GiB, which the newcomer sets aside
//      before the first chunk arrives, by design; inputs whose manifest names more than 1 MiB are
//      skipped.)
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <spdlog/spdlog.h>

#include "core/wire.h"
#include "records.h"
#include "runtime/state_sync.h"
#include "runtime/state_sync_parts.h"

namespace {

using namespace gossamer;
using namespace std::chrono_literals;

// The encoders and decoders under test, not copies of them.
using runtime::state_sync_parts::answer;
using runtime::state_sync_parts::kVersion;
using runtime::state_sync_parts::request;
constexpr std::uint64_t kLargestFuzzedState = std::uint64_t{1} << 20;

Bytes state_of(std::size_t n, unsigned seed) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(i * 31 + seed);
  return b;
}

// What the donors serve: round 3 (current) and round 2 (previous).
std::shared_ptr<const runtime::Snapshot> current() {
  static const auto s = runtime::Snapshot::make(3, 30, 2, state_of(1000, 7), 256);
  return s;
}
std::shared_ptr<const runtime::Snapshot> previous() {
  static const auto s = runtime::Snapshot::make(2, 20, 2, state_of(700, 1), 300);
  return s;
}

ByteView chunk_of(const runtime::Snapshot& s, std::uint32_t chunk) {
  const std::uint64_t at = std::uint64_t{chunk} * s.manifest.chunk_bytes;
  return ByteView(s.bytes.data() + at, std::min<std::uint64_t>(s.manifest.chunk_bytes, s.manifest.total - at));
}

// The donor's end of a state link: the requests are given, the answers kept.
class DonorEnd final : public transport::Link {
 public:
  explicit DonorEnd(std::vector<ByteView> requests) : requests_(std::move(requests)) {}
  transport::PeerId peer() const override { return transport::PeerId{2}; }
  std::string remote_address() const override { return "192.0.2.2:7001"; }
  Status send(transport::Tag tag, ByteView payload, Deadline) override {
    std::lock_guard lock(mu_);
    if (tag != runtime::kStateResponseTag) __builtin_trap();
    if (closed_) return error(ErrorCode::kPeerLost, "closed");
    answers_.emplace_back(payload.begin(), payload.end());
    return Status();
  }
  Result<Bytes> recv(transport::Tag tag, Deadline) override {
    std::lock_guard lock(mu_);
    if (tag != runtime::kStateRequestTag) __builtin_trap();
    if (closed_ || next_ == requests_.size()) {
      done_ = true;
      cv_.notify_all();
      return error(ErrorCode::kPeerLost, "no more requests");
    }
    const ByteView r = requests_[next_++];
    return Bytes(r.begin(), r.end());
  }
  void close() override {
    std::lock_guard lock(mu_);
    closed_ = true;
    done_ = true;
    cv_.notify_all();
  }
  transport::LinkStats stats() const override { return {}; }

  // Until the server stops reading (every request read, or the link closed); false after 10 s.
  bool wait_done() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 10s, [&] { return done_; });
  }
  bool closed() const {
    std::lock_guard lock(mu_);
    return closed_;
  }
  std::vector<Bytes> answers() const {
    std::lock_guard lock(mu_);
    return answers_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  const std::vector<ByteView> requests_;
  std::size_t next_ = 0;
  std::vector<Bytes> answers_;
  bool closed_ = false, done_ = false;
};

// The newcomer's end of a link to a donor: each request is answered at once by `answer_for` (or not,
// when it has nothing more to say: the donor is then gone).
class NewcomerEnd final : public transport::Link {
 public:
  using Answerer = std::function<std::optional<Bytes>(ByteView request)>;
  explicit NewcomerEnd(Answerer answer_for) : answer_for_(std::move(answer_for)) {}
  transport::PeerId peer() const override { return transport::PeerId{2}; }
  std::string remote_address() const override { return "192.0.2.2:7001"; }
  Status send(transport::Tag tag, ByteView payload, Deadline) override {
    std::lock_guard lock(mu_);
    if (closed_) return error(ErrorCode::kPeerLost, "closed");
    if (tag != runtime::kStateRequestTag) return Status();  // the epoch that opens a state link
    if (auto a = answer_for_(payload)) queued_.push_back(std::move(*a));
    return Status();
  }
  Result<Bytes> recv(transport::Tag tag, Deadline) override {
    std::lock_guard lock(mu_);
    if (tag != runtime::kStateResponseTag) __builtin_trap();
    if (closed_ || queued_.empty()) return error(ErrorCode::kPeerLost, "the donor is gone");
    Bytes b = std::move(queued_.front());
    queued_.pop_front();
    return b;
  }
  void close() override {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  transport::LinkStats stats() const override { return {}; }

 private:
  std::mutex mu_;
  Answerer answer_for_;
  std::deque<Bytes> queued_;
  bool closed_ = false;
};

class OneDonorTransport final : public transport::Transport {
 public:
  explicit OneDonorTransport(NewcomerEnd::Answerer answer_for) : answer_for_(std::move(answer_for)) {}
  transport::PeerId self() const override { return transport::PeerId{1}; }
  const transport::RunId& run() const override { return run_; }
  std::string address() const override { return "192.0.2.1:7001"; }
  Result<std::shared_ptr<transport::Link>> connect(const std::string&, Deadline) override {
    return std::shared_ptr<transport::Link>(std::make_shared<NewcomerEnd>(answer_for_));
  }
  Result<std::shared_ptr<transport::Link>> accept(Deadline) override { return error(ErrorCode::kUnavailable, "a newcomer only dials"); }

 private:
  NewcomerEnd::Answerer answer_for_;
  transport::RunId run_;
};

void fuzz_donor(const std::vector<fuzz::Record>& records) {
  std::vector<ByteView> requests;
  for (const auto& r : records) requests.push_back(r.payload);
  auto link = std::make_shared<DonorEnd>(requests);
  std::vector<Bytes> answers;
  bool closed = false;
  std::uint64_t served = 0;
  {
    runtime::StateServer server(real_clock());
    server.offer(previous());
    server.offer(current());
    server.serve(link);
    if (!link->wait_done()) __builtin_trap();
    closed = link->closed();
    answers = link->answers();
    served = server.bytes_served();
  }  // (joins the server's thread)
  // What the server must have said.
  std::size_t expected = 0;
  std::uint64_t expected_served = 0;
  bool malformed = false;
  for (ByteView q : requests) {
    auto decoded = runtime::state_sync_parts::decode_request(q, "fuzzed request");
    if (!decoded.ok()) {
      malformed = true;
      break;
    }
    const std::uint8_t kind = decoded->kind;
    const std::int64_t round = decoded->round;
    const std::uint32_t chunk = decoded->chunk;
    if (expected >= answers.size()) __builtin_trap();
    const Bytes& got = answers[expected++];
    const auto s = round == 3 ? current() : round == 2 ? previous() : nullptr;
    // Kinds 3 to 5 ask for updates, which this donor keeps none of: refused.
    if (kind >= 3 || s == nullptr || (kind == 2 && chunk >= s->manifest.chunks.size())) {
      Reader refusal(got);
      const std::uint8_t v = refusal.u8(), ok = refusal.u8();
      (void)refusal.str(1024);
      refusal.expect_end();
      if (!refusal.ok() || v != kVersion || ok != 0) __builtin_trap();
    } else if (kind == 1) {
      if (got != answer(s->manifest.encode())) __builtin_trap();
    } else {
      if (got != answer(chunk_of(*s, chunk))) __builtin_trap();
      expected_served += chunk_of(*s, chunk).size();
    }
  }
  if (answers.size() != expected || closed != malformed || served != expected_served) __builtin_trap();
}

void fuzz_newcomer(const std::vector<fuzz::Record>& records, bool manifest_fuzzed) {
  std::optional<Bytes> manifest_body;  // of a fuzzed manifest answer the newcomer reads as one
  if (manifest_fuzzed) {
    if (records.empty()) return;
    Reader r(records[0].payload);
    const std::uint8_t version = r.u8(), ok = r.u8();
    const ByteView body = r.blob((16u << 20) + 64);
    r.expect_end();
    if (r.ok() && version == kVersion && ok != 0) {
      auto m = runtime::StateManifest::decode(body);
      if (m.ok() && m->total > kLargestFuzzedState) return;
      if (m.ok()) manifest_body = Bytes(body.begin(), body.end());
    }
  }
  std::size_t next = manifest_fuzzed ? 1 : 0;
  OneDonorTransport transport([&](ByteView q) -> std::optional<Bytes> {
    if (q.size() >= 2 && q[1] == std::byte{1}) {
      if (!manifest_fuzzed) return answer(current()->manifest.encode());
      return Bytes(records[0].payload.begin(), records[0].payload.end());
    }
    if (next >= records.size()) return std::nullopt;
    const ByteView a = records[next++].payload;
    return Bytes(a.begin(), a.end());
  });
  auto got = runtime::fetch_state(transport, {runtime::Donor{"192.0.2.2:7001", "2"}}, 3, Deadline::after(real_clock(), 10s), real_clock());
  if (!got.ok()) {
    const ErrorCode code = got.status().code();
    if (code != ErrorCode::kUnavailable && code != ErrorCode::kDataLoss) __builtin_trap();
    return;
  }
  if (!manifest_fuzzed) {
    if (Bytes(got->bytes.begin(), got->bytes.end()) != current()->bytes || got->bytes_received != current()->manifest.total) __builtin_trap();
    if (got->manifest.encode() != current()->manifest.encode()) __builtin_trap();
    return;
  }
  const runtime::StateManifest& m = got->manifest;
  if (!manifest_body || m.encode() != *manifest_body || got->bytes.size() != m.total) __builtin_trap();
  if (runtime::Snapshot::make(m.round, m.step, m.shards, Bytes(got->bytes.begin(), got->bytes.end()), m.chunk_bytes)->manifest.encode() != *manifest_body) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // every refused answer is logged
  if (fuzz::seeds_wanted()) {
    const runtime::Snapshot& s = *current();
    fuzz::write_seed("donor", fuzz::join_records({{0, request(1, 3, 0)},
                                                  {0, request(2, 3, 0)},
                                                  {0, request(2, 3, 3)},
                                                  {0, request(1, 2, 0)},
                                                  {0, request(2, 2, 2)},
                                                  {0, request(2, 3, 9)},
                                                  {0, request(1, 5, 0)}},
                                                 Bytes{std::byte{0}}));
    std::vector<std::pair<std::uint8_t, Bytes>> chunks;
    for (std::uint32_t i = 0; i < s.manifest.chunks.size(); ++i) chunks.emplace_back(0, answer(chunk_of(s, i)));
    fuzz::write_seed("newcomer", fuzz::join_records(chunks, Bytes{std::byte{1}}));
    chunks.insert(chunks.begin(), {0, answer(s.manifest.encode())});
    fuzz::write_seed("newcomer-manifest", fuzz::join_records(chunks, Bytes{std::byte{2}}));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto records = gossamer::fuzz::split_records(data + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      fuzz_donor(records);
      break;
    case 1:
      fuzz_newcomer(records, false);
      break;
    default:
      fuzz_newcomer(records, true);
      break;
  }
  return 0;
}
