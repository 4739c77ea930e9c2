#include "train/checkpoint.h"

#include <cstring>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <vector>

#include "core/file.h"
#include "core/hash.h"
#include "core/wire.h"

namespace gossamer::train {

namespace {
constexpr std::size_t kMaxCheckpointBytes = std::size_t{1} << 40;  // 1 TiB
constexpr std::size_t kMaxConfigBytes = 16 << 20;
}  // namespace

namespace {

// A checkpoint as parts in file order: the header (with the payload's digest), the small fields,
// and views of the outer state and the tensors, which are the bulk and are never copied here.
struct EncodedParts {
  Bytes header, front, middle;
  std::vector<ByteView> parts;
};

EncodedParts encode_parts(const CheckpointState& s) {
  EncodedParts e;
  Writer front(s.rng_state.size() + s.config_toml.size() + 64);
  front.str(s.config_toml);
  front.i64(s.step);
  front.i64(s.next_batch);
  front.i64(s.tokens_seen);
  front.blob(s.rng_state);
  front.u64(s.outer_state.size());
  e.front = std::move(front).take();
  Writer middle(16);
  middle.i32(s.shard);
  middle.i32(s.shards);
  middle.u64(s.tensors.size());  // may exceed 4 GiB: 64-bit length
  e.middle = std::move(middle).take();
  const ByteView payload[] = {e.front, s.outer_state, e.middle, s.tensors};
  Hasher hasher;
  std::uint64_t length = 0;
  for (const ByteView part : payload) {
    hasher.update(part);
    length += part.size();
  }
  const Digest digest = hasher.finish();
  Writer header(kCheckpointHeaderBytes);
  header.raw(as_bytes(std::string_view(kCheckpointMagic, sizeof(kCheckpointMagic))));
  header.u32(kCheckpointVersion);
  header.u64(length);
  header.raw(ByteView(reinterpret_cast<const std::byte*>(digest.bytes.data()), digest.bytes.size()));
  e.header = std::move(header).take();
  e.parts = {e.header, e.front, s.outer_state, e.middle, s.tensors};
  return e;
}

}  // namespace

Bytes encode_checkpoint(const CheckpointState& s) {
  const EncodedParts e = encode_parts(s);
  std::size_t total = 0;
  for (const ByteView part : e.parts) total += part.size();
  Writer file(total);
  for (const ByteView part : e.parts) file.raw(part);
  return std::move(file).take();
}

Result<CheckpointState> decode_checkpoint(ByteView file, const std::string& name) {
  Reader header(file, "checkpoint " + name);
  ByteView magic = header.raw(sizeof(kCheckpointMagic));
  if (header.ok() && std::memcmp(magic.data(), kCheckpointMagic, sizeof(kCheckpointMagic)) != 0) {
    return error(ErrorCode::kMalformed, "checkpoint " + name + " is not a Gossamer checkpoint (bad magic)");
  }
  const std::uint32_t version = header.u32();
  if (header.ok() && (version < 1 || version > kCheckpointVersion)) {
    return error(ErrorCode::kVersionMismatch, "checkpoint " + name + " has format version " + std::to_string(version) +
                                                  "; this build reads version " + std::to_string(kCheckpointVersion) +
                                                  (version > kCheckpointVersion ? ": upgrade Gossamer" : ""));
  }
  const std::uint64_t length = header.u64();
  ByteView digest_bytes = header.raw(32);
  if (!header.ok()) return error(ErrorCode::kDataLoss, "checkpoint " + name + " is truncated inside its header");
  if (length != header.remaining()) {
    return error(ErrorCode::kDataLoss, "checkpoint " + name + " is truncated or padded: header says " + std::to_string(length) +
                                           " payload bytes, file holds " + std::to_string(header.remaining()));
  }
  ByteView payload = file.subspan(header.position());
  Digest expected;
  std::memcpy(expected.bytes.data(), digest_bytes.data(), 32);
  if (digest_of(payload) != expected) {
    return error(ErrorCode::kDataLoss, "checkpoint " + name + " is corrupted (checksum mismatch)");
  }

  Reader r(payload, "checkpoint " + name);
  CheckpointState s;
  s.config_toml = r.str(kMaxConfigBytes);
  s.step = r.i64();
  s.next_batch = r.i64();
  s.tokens_seen = r.i64();
  ByteView rng = r.blob(1 << 20);
  ByteView outer;
  if (version >= 2) {
    const std::uint64_t outer_len = r.u64();
    if (r.ok() && outer_len > r.remaining()) {
      r.fail(ErrorCode::kMalformed, "outer state length " + std::to_string(outer_len) + " exceeds the " + std::to_string(r.remaining()) +
                                        " bytes left");
    }
    outer = r.raw(r.ok() ? static_cast<std::size_t>(outer_len) : 0);
  }
  if (version >= 3) {
    s.shard = r.i32();
    s.shards = r.i32();
    if (r.ok() && (s.shards < 0 || s.shard < -1 || (s.shard >= 0 && s.shard >= s.shards))) {
      r.fail(ErrorCode::kMalformed, "shard " + std::to_string(s.shard) + " of " + std::to_string(s.shards));
    }
  }
  const std::uint64_t tensor_len = r.u64();
  if (r.ok() && tensor_len != r.remaining()) {
    r.fail(ErrorCode::kMalformed, "tensor section length " + std::to_string(tensor_len) + " does not match the " +
                                      std::to_string(r.remaining()) + " bytes left");
  }
  ByteView tensors = r.raw(static_cast<std::size_t>(tensor_len));
  r.expect_end();
  if (!r.ok()) return r.status();
  if (s.step < 0 || s.next_batch < 0 || s.tokens_seen < 0) {
    return error(ErrorCode::kMalformed, "checkpoint " + name + " holds a negative step or position");
  }
  s.rng_state.assign(rng.begin(), rng.end());
  s.outer_state.assign(outer.begin(), outer.end());
  s.tensors.assign(tensors.begin(), tensors.end());
  return s;
}

void release_free_heap() {
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

Status write_checkpoint(const std::filesystem::path& path, const CheckpointState& state) {
  // Streamed part by part: a model's checkpoint is never held twice in memory.
  const EncodedParts e = encode_parts(state);
  return write_file_atomic(path, e.parts).with_context("writing checkpoint");
}

Result<CheckpointState> read_checkpoint(const std::filesystem::path& path) {
  auto bytes = read_file(path, kMaxCheckpointBytes);
  if (!bytes.ok()) return bytes.status();
  return decode_checkpoint(*bytes, path.string());
}

}  // namespace gossamer::train
