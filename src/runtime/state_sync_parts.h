// The state transfer's wire as the server and the fetch share it (state_sync.h has its layout):
// the version, the requests' kinds, the bounds, and the pieces of a request and its answer.
// Internal to src/run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "core/bytes.h"
#include "core/clock.h"
#include "core/hash.h"
#include "core/status.h"
#include "core/wire.h"
#include "transport/link.h"

namespace gossamer::runtime::state_sync_parts {

// 2: the shared state's parts have u64 lengths (rounds.h), snapshots may pass 8 GiB. 3: an index
// answer ends with the donor's inner step.
inline constexpr std::uint8_t kVersion = 3;
inline constexpr std::uint8_t kAskManifest = 1, kAskChunk = 2, kAskUpdateManifest = 3, kAskUpdateChunk = 4, kAskIndex = 5;
// A snapshot goes to a SnapshotStore (on disk for a real peer), so its bound is only a sanity check;
// an update is held in memory.
inline constexpr std::uint64_t kMaxTotal = std::uint64_t{1} << 40;
inline constexpr std::uint64_t kMaxUpdate = std::uint64_t{8} << 30;
inline constexpr std::uint64_t kMaxBatchBytes = std::uint64_t{2} << 30;  // updates fetched at once
inline constexpr std::uint32_t kMaxChunk = 16u << 20;
inline constexpr std::uint32_t kMaxChunks = 1u << 18;  // the manifest stays under 16 MiB

// Where chunk i of a state of `total` bytes cut in `chunk_bytes` starts, and how long it is.
std::pair<std::uint64_t, std::size_t> chunk_range(std::uint64_t total, std::uint32_t chunk_bytes, std::uint64_t i);

void put_digest(Writer& w, const Digest& d);

Digest get_digest(Reader& r);

Bytes request(std::uint8_t kind, std::int64_t round, std::uint32_t chunk);

Bytes answer(ByteView body);

Bytes refusal(const std::string& why);

// A request as it travels (untrusted when it arrives): a kind, the round it is about, a chunk.
struct Request {
  std::uint8_t kind = 0;
  std::int64_t round = 0;
  std::uint32_t chunk = 0;
};
[[nodiscard]] Result<Request> decode_request(ByteView bytes, const std::string& what);

// The body of an answer when it is ok; kUnavailable with the donor's reason when it refused.
[[nodiscard]] Result<Bytes> decode_answer(ByteView bytes, const std::string& what);

// The body of the next response on `link` when it is ok.
Result<Bytes> read_answer(transport::Link& link, Deadline deadline);

// Sends a request and returns the body of an ok response.
Result<Bytes> ask(transport::Link& link, std::uint8_t kind, std::int64_t round, std::uint32_t chunk, Deadline deadline);

}  // namespace gossamer::runtime::state_sync_parts
