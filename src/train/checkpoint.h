// Checkpoint files: the container around a training state.
//
// Layout (little-endian), version 3:
//   magic     8 bytes  "GSMRCKPT"
//   version   u32      kCheckpointVersion
//   length    u64      payload bytes
//   digest    32 bytes BLAKE2b-256 of the payload
//   payload:  str config_toml | i64 step | i64 next_batch | i64 tokens_seen |
//             blob rng_state | blob64 outer_state (the outer optimizer's save(); may be empty) |
//             i32 shard | i32 shards (the data shard the worker trained, of how many; -1 | 0: unknown) |
//             blob64 tensors (a LibTorch archive: model and inner optimizer)
// Version 1 files (no outer_state) and version 2 files (no shard) are still read.
// Files are written atomically (temporary file, fsync, rename): a crash mid-write keeps the last good
// checkpoint. Reading treats the file as untrusted: wrong magic, unknown version, truncation, a bad
// digest or inconsistent fields each return a clear Status; nothing is allocated beyond the file size.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "core/bytes.h"
#include "core/status.h"

namespace gossamer::train {

inline constexpr char kCheckpointMagic[8] = {'G', 'S', 'M', 'R', 'C', 'K', 'P', 'T'};
inline constexpr std::uint32_t kCheckpointVersion = 3;
inline constexpr std::size_t kCheckpointHeaderBytes = 8 + 4 + 8 + 32;

struct CheckpointState {
  std::string config_toml;
  std::int64_t step = 0;
  std::int64_t next_batch = 0;
  std::int64_t tokens_seen = 0;
  Bytes rng_state;
  Bytes outer_state;  // OuterOptimizer::save(), empty for a single worker
  std::int32_t shard = -1;   // the data shard trained (a peer that resumes keeps it); -1: unknown
  std::int32_t shards = 0;   // of how many
  Bytes tensors;
};

Bytes encode_checkpoint(const CheckpointState& state);
[[nodiscard]] Result<CheckpointState> decode_checkpoint(ByteView file, const std::string& name);

// Hands the heaps' free pages back to the system (glibc's malloc_trim; nothing elsewhere).
// Worker::checkpoint_state calls it before it builds a checkpoint: the last step's freed activations
// would otherwise sit beside the checkpoint's model-sized buffers, and several peers on one machine
// then run out of memory.
void release_free_heap();

[[nodiscard]] Status write_checkpoint(const std::filesystem::path& path, const CheckpointState& state);
[[nodiscard]] Result<CheckpointState> read_checkpoint(const std::filesystem::path& path);

}  // namespace gossamer::train
