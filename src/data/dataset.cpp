#include "data/dataset.h"

#include <torch/torch.h>

#include <algorithm>
#include <random>

#include "core/check.h"
#include "core/file.h"

namespace gossamer::data {

namespace fs = std::filesystem;

Result<std::vector<fs::path>> corpus_files(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return error(ErrorCode::kNotFound, "corpus " + path.string() + " does not exist: pass a text file or a folder of text files");
  }
  if (fs::is_regular_file(path, ec)) return std::vector<fs::path>{path};
  if (!fs::is_directory(path, ec)) return error(ErrorCode::kInvalidArgument, "corpus " + path.string() + " is neither a file nor a folder");
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) files.push_back(it->path());
  }
  if (ec) return error(ErrorCode::kIoError, "cannot list " + path.string() + ": " + ec.message());
  if (files.empty()) return error(ErrorCode::kNotFound, "corpus folder " + path.string() + " holds no files");
  std::sort(files.begin(), files.end());
  return files;
}

Result<std::string> load_corpus(const fs::path& path, std::size_t max_bytes) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return read_text_file(path, max_bytes);
  auto files = corpus_files(path);
  if (!files.ok()) return files.status();
  std::string out;
  for (const auto& f : *files) {
    auto text = read_text_file(f, max_bytes - out.size());
    if (!text.ok()) return text.status().with_context("reading corpus");
    out += *text;
  }
  return out;
}

double control_byte_share(std::string_view text) {
  if (text.empty()) return 0.0;
  std::size_t control = 0;
  for (const char ch : text) {
    const auto b = static_cast<unsigned char>(ch);
    control += (b < 0x20 && (b < 0x09 || b > 0x0D)) || b == 0x7F ? 1 : 0;
  }
  return static_cast<double>(control) / static_cast<double>(text.size());
}

Result<Dataset> Dataset::from_text(std::string text, double val_fraction, std::int64_t context) {
  return from_tokens(Tokens::of_text(std::move(text)), val_fraction, context);
}

Result<Dataset> Dataset::from_tokens(const Tokens& all, double val_fraction, std::int64_t context) {
  if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
    return error(ErrorCode::kInvalidArgument, "validation fraction must be in (0, 1), got " + std::to_string(val_fraction));
  }
  const auto n = all.size();
  const auto n_val = static_cast<std::int64_t>(static_cast<double>(n) * val_fraction);
  const std::int64_t need = context + 1;
  if (n_val < need || n - n_val < need) {
    return error(ErrorCode::kInvalidArgument, "corpus of " + std::to_string(n) + " tokens is too small: both splits need at least " +
                                                  std::to_string(need) + " tokens (context + 1); use a larger corpus or a shorter context");
  }
  return from_splits(all.slice(0, n - n_val), all.slice(n - n_val, n), context);
}

Result<Dataset> Dataset::from_splits(Tokens train, Tokens val, std::int64_t context) {
  const std::int64_t need = context + 1;
  if (train.size() < need || val.size() < need) {
    return error(ErrorCode::kInvalidArgument, "the training split (" + std::to_string(train.size()) + " tokens) and the validation split (" +
                                                  std::to_string(val.size()) + " tokens) each need at least " + std::to_string(need) +
                                                  " tokens (context + 1); use more data or a shorter context");
  }
  Dataset d;
  d.train_ = std::move(train);
  d.val_ = std::move(val);
  return d;
}

ShardSampler::ShardSampler(const Tokens& train, int rank, int world, std::int64_t batch, std::int64_t context, std::uint64_t seed,
                           std::int64_t block)
    : text_(train), rank_(rank), batch_(batch), context_(context), seed_(seed) {
  GOSSAMER_CHECK(world >= 1 && rank >= 0 && rank < world, "ShardSampler: rank must be in [0, world)");
  GOSSAMER_CHECK(batch >= 1 && context >= 1, "ShardSampler: batch and context must be positive");
  GOSSAMER_CHECK(block == 0 || block > context, "ShardSampler: a block must hold a window (block > context)");
  const auto n = train.size();
  if (block == 0) {
    pieces_.emplace_back(n * rank / world, n * (rank + 1) / world);
  } else {
    for (std::int64_t b = rank * block; b < n; b += world * block) pieces_.emplace_back(b, std::min(n, b + block));
  }
  if (pieces_.empty()) pieces_.emplace_back(n, n);  // a text too short to give this rank a block
  for (const auto& [b, e] : pieces_) {
    starts_before_.push_back(starts_);
    starts_ += std::max<std::int64_t>(0, e - b - context);
  }
  GOSSAMER_CHECK(starts_ >= 1, "ShardSampler: shard of " + std::to_string(shard_end() - shard_begin()) +
                                   " tokens holds no window of context + 1; use fewer workers or more data");
}

namespace {
std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

std::vector<std::int64_t> ShardSampler::offsets(std::int64_t index) const {
  GOSSAMER_CHECK(index >= 0, "batch index must be >= 0");
  std::mt19937_64 rng(splitmix64(seed_ ^ splitmix64(static_cast<std::uint64_t>(rank_) ^ splitmix64(static_cast<std::uint64_t>(index)))));
  std::uniform_int_distribution<std::int64_t> pick(0, starts_ - 1);
  std::vector<std::int64_t> out(static_cast<std::size_t>(batch_));
  for (auto& o : out) {
    const std::int64_t k = pick(rng);
    // The piece holding the k-th window start (pieces too short for a window hold none).
    const auto i = static_cast<std::size_t>(std::upper_bound(starts_before_.begin(), starts_before_.end(), k) - starts_before_.begin()) - 1;
    o = pieces_[i].first + (k - starts_before_[i]);
  }
  return out;
}

Batch ShardSampler::batch(std::int64_t index) const { return make_batch(text_, offsets(index), context_); }

Batch make_batch(const Tokens& text, const std::vector<std::int64_t>& offsets, std::int64_t context) {
  const auto B = static_cast<std::int64_t>(offsets.size());
  auto window = torch::empty({B, context + 1}, torch::kLong);
  auto* out = window.data_ptr<std::int64_t>();
  for (std::int64_t b = 0; b < B; ++b) {
    const auto off = offsets[static_cast<std::size_t>(b)];
    GOSSAMER_CHECK(off >= 0 && off + context + 1 <= text.size(), "window out of range");
    text.copy(off, context + 1, out + b * (context + 1));
  }
  using torch::indexing::Slice;
  return Batch{window.index({Slice(), Slice(0, context)}).contiguous(), window.index({Slice(), Slice(1, context + 1)}).contiguous()};
}

std::vector<Batch> validation_batches(const Tokens& val, std::int64_t batch, std::int64_t context, std::int64_t max_batches) {
  const auto n = val.size();
  const std::int64_t windows_available = n / (context + 1);
  const std::int64_t windows = std::min(windows_available, batch * max_batches);
  GOSSAMER_CHECK(windows >= 1, "validation text shorter than one window");
  // Spread the windows evenly over the whole split.
  const std::int64_t stride = n / windows;
  std::vector<Batch> out;
  std::vector<std::int64_t> offsets;
  for (std::int64_t w = 0; w < windows; ++w) {
    offsets.push_back(std::min(w * stride, n - context - 1));
    if (static_cast<std::int64_t>(offsets.size()) == batch || w == windows - 1) {
      out.push_back(make_batch(val, offsets, context));
      offsets.clear();
    }
  }
  return out;
}

}  // namespace gossamer::data
