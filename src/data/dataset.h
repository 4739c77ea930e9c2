// Datasets: loading a text corpus, the deterministic train/validation split, per-worker shards and
// (B, T) batches of tokens. A text is a sequence of byte tokens; token files (data/token_files.h)
// give sequences of larger ids; both are Tokens and are split, sharded and batched alike.
//
// Determinism: a batch is a pure function of (corpus, seed, rank, world, batch index), so the data
// position of a run is just the index of its next batch, which checkpoints store. Workers' shards are
// disjoint token ranges of the training split, so N workers see disjoint, reproducible streams.
// Threading: const objects are safe to share. Errors: files are Status values; misuse throws.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/status.h"
#include "data/tokens.h"

namespace gossamer::data {

// Reads one text file, or every regular file in a folder (recursively, in sorted path order,
// concatenated). Refuses more than max_bytes in total.
[[nodiscard]] Result<std::string> load_corpus(const std::filesystem::path& path, std::size_t max_bytes);
// The files load_corpus reads, in its order.
[[nodiscard]] Result<std::vector<std::filesystem::path>> corpus_files(const std::filesystem::path& path);

// The share of bytes that text almost never holds: NUL and the other control characters but tab,
// line feed, vertical tab, form feed and carriage return (and DEL). Text in any language has next to
// none (UTF-8's other bytes are >= 0x80); random bytes have about 11%. 0 for an empty string.
double control_byte_share(std::string_view text);
// Above this share a corpus read as text is said not to look like text (a warning, not a refusal).
inline constexpr double kNotTextShare = 0.02;

struct Batch {
  at::Tensor tokens;   // int64 (B, T)
  at::Tensor targets;  // int64 (B, T): tokens shifted by one
};

class Dataset {
 public:
  // The last `val_fraction` of the text (or tokens) is validation, the rest training.
  static Result<Dataset> from_text(std::string text, double val_fraction, std::int64_t context);
  static Result<Dataset> from_tokens(const Tokens& all, double val_fraction, std::int64_t context);
  // Splits given apart (a token corpus's train and val files).
  static Result<Dataset> from_splits(Tokens train, Tokens val, std::int64_t context);

  const Tokens& train() const { return train_; }
  const Tokens& val() const { return val_; }

 private:
  Tokens train_, val_;
};

// Batches for worker `rank` of `world`: windows of T+1 tokens drawn uniformly (with a counter-based
// seeded RNG) from the rank's disjoint shard of the training tokens. With block = 0 the shard is one
// contiguous slice (rank r of the text's world equal parts); with block > T the text is cut into
// blocks of that many tokens dealt in turns (block i to rank i mod world), so every shard spans the
// whole text as a shard of a shuffled corpus does, and a window never crosses a block's end.
class ShardSampler {
 public:
  ShardSampler(const Tokens& train, int rank, int world, std::int64_t batch, std::int64_t context, std::uint64_t seed,
               std::int64_t block = 0);

  Batch batch(std::int64_t index) const;
  // Where the shard's first piece begins and its last piece ends (the slice itself when contiguous).
  std::int64_t shard_begin() const { return pieces_.front().first; }
  std::int64_t shard_end() const { return pieces_.back().second; }
  // Offset of every window of batch `index` (exposed for tests).
  std::vector<std::int64_t> offsets(std::int64_t index) const;

 private:
  Tokens text_;
  int rank_;
  std::int64_t batch_, context_;
  std::uint64_t seed_;
  std::vector<std::pair<std::int64_t, std::int64_t>> pieces_;  // [begin, end) of each piece of the shard
  std::vector<std::int64_t> starts_before_;  // window starts available in the pieces before piece i
  std::int64_t starts_ = 0;                   // window starts available in the whole shard
};

// A fixed evaluation set: up to max_batches batches of non-overlapping windows spread evenly over the
// validation text.
std::vector<Batch> validation_batches(const Tokens& val, std::int64_t batch, std::int64_t context, std::int64_t max_batches);

// Builds a batch from explicit window offsets into text.
Batch make_batch(const Tokens& text, const std::vector<std::int64_t>& offsets, std::int64_t context);

}  // namespace gossamer::data
