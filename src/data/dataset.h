// Text datasets: loading a corpus, the deterministic train/validation split, per-worker shards and
// (B, T) batches of byte tokens.
//
// Determinism: a batch is a pure function of (corpus, seed, rank, world, batch index), so the data
// position of a run is just the index of its next batch, which checkpoints store. Workers' shards are
// disjoint byte ranges of the training split, so N workers see disjoint, reproducible streams.
// Threading: const objects are safe to share. Errors: files are Status values; misuse throws.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/status.h"

namespace gossamer::data {

// Reads one text file, or every regular file in a folder (recursively, in sorted path order,
// concatenated). Refuses more than max_bytes in total.
[[nodiscard]] Result<std::string> load_corpus(const std::filesystem::path& path, std::size_t max_bytes);

struct Batch {
  at::Tensor tokens;   // int64 (B, T)
  at::Tensor targets;  // int64 (B, T): tokens shifted by one
};

// The last `val_fraction` of the text is validation, the rest training.
class Dataset {
 public:
  static Result<Dataset> from_text(std::string text, double val_fraction, std::int64_t context);

  const std::string& train() const { return train_; }
  const std::string& val() const { return val_; }

 private:
  std::string train_, val_;
};

// Batches for worker `rank` of `world`: windows of T+1 bytes drawn uniformly (with a counter-based
// seeded RNG) from the rank's disjoint slice of the training text.
class ShardSampler {
 public:
  ShardSampler(const std::string& train, int rank, int world, std::int64_t batch, std::int64_t context, std::uint64_t seed);

  Batch batch(std::int64_t index) const;
  std::int64_t shard_begin() const { return begin_; }
  std::int64_t shard_end() const { return end_; }
  // Offset of every window of batch `index` (exposed for tests).
  std::vector<std::int64_t> offsets(std::int64_t index) const;

 private:
  const std::string* text_;
  int rank_;
  std::int64_t batch_, context_;
  std::uint64_t seed_;
  std::int64_t begin_, end_;
};

// A fixed evaluation set: up to max_batches batches of non-overlapping windows spread evenly over the
// validation text.
std::vector<Batch> validation_batches(const std::string& val, std::int64_t batch, std::int64_t context, std::int64_t max_batches);

// Builds a batch from explicit window offsets into text.
Batch make_batch(const std::string& text, const std::vector<std::int64_t>& offsets, std::int64_t context);

}  // namespace gossamer::data
