#include <doctest/doctest.h>

#include <set>

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "data/dataset.h"

using namespace gossamer;
using namespace gossamer::data;
namespace fs = std::filesystem;

namespace {
std::string text_of(std::size_t n) {
  std::string s(n, 'a');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + i / 13) % 26);
  return s;
}
Tokens tok(const std::string& s) { return Tokens::of_text(s); }
std::string text_of(const Tokens& t) {
  std::string s;
  for (std::int64_t i = 0; i < t.size(); ++i) s.push_back(static_cast<char>(t.at(i)));
  return s;
}
}  // namespace

TEST_CASE("split is deterministic: the validation text is the end of the corpus") {
  const std::string t = text_of(10000);
  auto d = Dataset::from_text(t, 0.1, 32);
  REQUIRE(d.ok());
  CHECK(d->val().size() == 1000);
  CHECK(text_of(d->train()) + text_of(d->val()) == t);
  CHECK(Dataset::from_text(text_of(50), 0.1, 32).status().code() == ErrorCode::kInvalidArgument);
  CHECK(Dataset::from_text(t, 0.0, 32).status().code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("shards are disjoint, cover the training text and give reproducible batches") {
  const std::string t = text_of(100000);
  const int world = 4;
  const std::int64_t T = 32;
  std::int64_t expected_begin = 0;
  for (int rank = 0; rank < world; ++rank) {
    ShardSampler s(tok(t), rank, world, 8, T, 11);
    CHECK(s.shard_begin() == expected_begin);
    expected_begin = s.shard_end();
    for (std::int64_t i = 0; i < 50; ++i) {
      for (auto off : s.offsets(i)) {
        CHECK(off >= s.shard_begin());
        CHECK(off + T + 1 <= s.shard_end());  // the whole window, targets included, stays in the shard
      }
    }
    ShardSampler again(tok(t), rank, world, 8, T, 11);
    CHECK(s.offsets(17) == again.offsets(17));
    CHECK(s.offsets(17) != s.offsets(18));
    ShardSampler other_seed(tok(t), rank, world, 8, T, 12);
    CHECK(s.offsets(17) != other_seed.offsets(17));
  }
  CHECK(expected_begin == static_cast<std::int64_t>(t.size()));
}

TEST_CASE("interleaved shards deal the text's blocks in turns, windows stay inside one of the rank's blocks") {
  const std::string t = text_of(100000);
  const int world = 4;
  const std::int64_t T = 32, block = 1000;
  for (int rank = 0; rank < world; ++rank) {
    ShardSampler s(tok(t), rank, world, 8, T, 11, block);
    CHECK(s.shard_begin() == rank * block);
    std::set<std::int64_t> blocks;
    for (std::int64_t i = 0; i < 200; ++i) {
      for (auto off : s.offsets(i)) {
        const std::int64_t b = off / block;
        CHECK(b % world == rank);                   // one of this rank's blocks...
        CHECK((off + T) / block == b);              // ...and the whole window inside it
        CHECK(off + T + 1 <= static_cast<std::int64_t>(t.size()));
        blocks.insert(b);
      }
    }
    // The shard spans the text: windows come from its first and its last quarter alike.
    CHECK(*blocks.begin() < 100000 / block / 4);
    CHECK(*blocks.rbegin() >= 3 * 100000 / block / 4);
    ShardSampler again(tok(t), rank, world, 8, T, 11, block);
    CHECK(s.offsets(17) == again.offsets(17));
  }
  // Contiguous shards (block 0) are what they always were: rank r's slice of the text.
  ShardSampler slice(tok(t), 1, world, 8, T, 11, 0);
  CHECK(slice.shard_begin() == 25000);
  CHECK(slice.shard_end() == 50000);
  CHECK_THROWS(ShardSampler(tok(t), 0, world, 8, T, 11, T));  // a block must hold a window
  CHECK_THROWS(ShardSampler(tok(text_of(100)), 3, world, 8, T, 11, 64));  // rank 3 gets no block
}

TEST_CASE("batches hold bytes as tokens and targets shifted by one") {
  const std::string t = "hello world, this is gossamer";
  Batch b = make_batch(tok(t), {0, 6}, 5);
  CHECK(b.tokens.sizes() == torch::IntArrayRef({2, 5}));
  CHECK(b.tokens[0][0].item<std::int64_t>() == 'h');
  CHECK(b.targets[0][0].item<std::int64_t>() == 'e');
  CHECK(b.tokens[1][0].item<std::int64_t>() == 'w');
  CHECK(b.targets[1][4].item<std::int64_t>() == ',');
  using torch::indexing::Slice;
  CHECK(torch::equal(b.tokens.index({Slice(), Slice(1, 5)}), b.targets.index({Slice(), Slice(0, 4)})));
}

TEST_CASE("validation batches are fixed, non-overlapping and bounded") {
  const std::string v = text_of(5000);
  auto a = validation_batches(tok(v), 4, 32, 3);
  auto b = validation_batches(tok(v), 4, 32, 3);
  REQUIRE(a.size() == 3);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i].tokens, b[i].tokens));
  // Few windows available: fewer batches, never out of range.
  auto small = validation_batches(tok(text_of(100)), 4, 32, 10);
  REQUIRE(small.size() == 1);
  CHECK(small[0].tokens.size(0) == 3);
}

TEST_CASE("load_corpus reads a file or a sorted folder and reports what is wrong") {
  const fs::path dir = fs::temp_directory_path() / ("gossamer_corpus_" + std::to_string(std::random_device{}()));
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "b.txt") << "second";
  std::ofstream(dir / "a.txt") << "first ";
  std::ofstream(dir / "sub" / "c.txt") << " third";
  auto folder = data::load_corpus(dir, 1 << 20);
  REQUIRE(folder.ok());
  CHECK(*folder == "first second third");
  auto file = data::load_corpus(dir / "a.txt", 1 << 20);
  REQUIRE(file.ok());
  CHECK(*file == "first ");
  CHECK(data::load_corpus(dir / "missing", 1 << 20).status().code() == ErrorCode::kNotFound);
  CHECK_FALSE(data::load_corpus(dir, 10).ok());
  fs::remove_all(dir);
}

TEST_CASE("control bytes tell text from data that is not text") {
  CHECK(data::control_byte_share("") == 0.0);
  CHECK(data::control_byte_share("First Citizen:\nBefore we proceed any further, hear me speak.\r\n\tAll: Speak, speak.\f") == 0.0);
  CHECK(data::control_byte_share("na\xc3\xafve caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e") == 0.0);  // UTF-8 text
  CHECK(data::control_byte_share(std::string(1000, '\0')) == 1.0);
  std::string random;
  std::uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 100000; ++i) {  // xorshift bytes
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    random.push_back(static_cast<char>(x & 0xFF));
  }
  const double share = data::control_byte_share(random);
  CHECK(share == doctest::Approx(28.0 / 256).epsilon(0.05));  // 27 control bytes and DEL of 256
  CHECK(share > data::kNotTextShare);
}
