#include <doctest/doctest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include <torch/torch.h>

#include "data/dataset.h"
#include "data/token_files.h"

using namespace gossamer;
using namespace gossamer::data;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("gossamer_tokens_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void put_le(std::string& out, std::uint64_t v, int width) {
  for (int i = 0; i < width; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// As nanoGPT's prepare.py writes them: np.array(ids, dtype=np.uint16).tofile(path).
std::string raw_u16(const std::vector<std::uint32_t>& ids) {
  std::string out;
  for (auto id : ids) put_le(out, id, 2);
  return out;
}

// As llm.c's write_datafile does: 256 int32 (magic, version, count, zeros), then the ids.
std::string llmc(const std::vector<std::uint32_t>& ids, bool u32, std::int32_t count_field = -1, std::int32_t version = -1) {
  std::string out;
  put_le(out, static_cast<std::uint32_t>(u32 ? kLlmcMagicU32 : kLlmcMagicU16), 4);
  put_le(out, static_cast<std::uint32_t>(version >= 0 ? version : (u32 ? kLlmcVersionU32 : kLlmcVersionU16)), 4);
  put_le(out, static_cast<std::uint32_t>(count_field >= 0 ? count_field : static_cast<std::int32_t>(ids.size())), 4);
  out.resize(kLlmcHeaderBytes, '\0');
  for (auto id : ids) put_le(out, id, u32 ? 4 : 2);
  return out;
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::uint32_t> ids_of(std::size_t n, std::uint32_t vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> ids(n);
  for (auto& id : ids) id = rng() % vocab;
  return ids;
}

std::vector<std::int64_t> all(const Tokens& t) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(t.size()));
  t.copy(0, t.size(), out.data());
  return out;
}

// A field of /proc/self/status in KiB: VmRSS (all resident pages) or RssAnon (the process's own
// memory; mapped file pages are page cache, which the kernel takes back under pressure).
std::int64_t status_kib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

}  // namespace

TEST_CASE("Tokens: slices and concatenations read the same ids as the whole") {
  const auto a = Tokens::of_text("hello ");
  const auto b = Tokens::of_text("world");
  const auto ab = Tokens::concat(a, b);
  REQUIRE(ab.size() == 11);
  CHECK(ab.at(0) == 'h');
  CHECK(ab.at(6) == 'w');
  const auto mid = ab.slice(4, 8);  // "o wo", across the seam
  CHECK(all(mid) == std::vector<std::int64_t>{'o', ' ', 'w', 'o'});
  CHECK(mid.slice(1, 3).at(1) == 'w');
  CHECK(ab.slice(5, 5).empty());
  CHECK_THROWS(ab.at(11));
  CHECK_THROWS(ab.slice(3, 12));
  std::int64_t window[3];
  CHECK_THROWS(ab.copy(9, 3, window));
}

TEST_CASE("a nanoGPT raw uint16 file reads back every id, ids above 255 included") {
  TempDir dir;
  const auto ids = ids_of(5000, 50257, 1);
  write(dir.path / "train.bin", raw_u16(ids));
  auto f = read_token_file(dir.path / "train.bin");
  REQUIRE(f.ok());
  CHECK(f->layout == TokenFileLayout::kRawU16);
  REQUIRE(f->tokens.size() == 5000);
  CHECK(all(f->tokens) == std::vector<std::int64_t>(ids.begin(), ids.end()));
  CHECK(f->max_token == *std::max_element(ids.begin(), ids.end()));
}

TEST_CASE("llm.c files with uint16 and uint32 ids read back every id") {
  TempDir dir;
  const auto small = ids_of(3000, 50257, 2);
  const auto large = ids_of(3000, 128256, 3);
  write(dir.path / "a_train.bin", llmc(small, false));
  write(dir.path / "b_train.bin", llmc(large, true));
  auto a = read_token_file(dir.path / "a_train.bin");
  auto b = read_token_file(dir.path / "b_train.bin");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->layout == TokenFileLayout::kLlmcU16);
  CHECK(b->layout == TokenFileLayout::kLlmcU32);
  CHECK(all(a->tokens) == std::vector<std::int64_t>(small.begin(), small.end()));
  CHECK(all(b->tokens) == std::vector<std::int64_t>(large.begin(), large.end()));
  CHECK(b->max_token == *std::max_element(large.begin(), large.end()));
  CHECK(b->max_token > 65535);
}

TEST_CASE("malformed token files are refused with what is wrong") {
  TempDir dir;
  const auto ids = ids_of(100, 1000, 4);
  auto refused = [&](const std::string& bytes, const std::string& words) {
    const auto p = dir.path / "x.bin";
    write(p, bytes);
    auto f = read_token_file(p);
    REQUIRE_FALSE(f.ok());
    CHECK(f.status().code() == ErrorCode::kInvalidArgument);
    INFO(f.status().message());
    CHECK(f.status().message().find(words) != std::string::npos);
  };
  refused("", "empty");
  refused(raw_u16(ids) + "x", "not a whole number of uint16");
  refused(llmc(ids, false).substr(0, 600), "less than its 1024-byte header");
  refused(llmc(ids, false).substr(0, 1024 + 150), "truncated");
  refused(llmc(ids, false) + "zz", "trailing bytes");
  refused(llmc(ids, false, 101), "promises 101 tokens");
  refused(llmc(ids, false, -1, 2), "version 2");
  refused(llmc(ids, true, -1, 1), "version 1");
  std::string negative = llmc(ids, false);
  negative[8] = negative[9] = negative[10] = negative[11] = static_cast<char>(0xFF);
  refused(negative, "negative token count");
  CHECK(read_token_file(dir.path / "missing.bin").status().code() == ErrorCode::kNotFound);
  CHECK_FALSE(read_token_file(dir.path).ok());  // a folder is not a token file
}

TEST_CASE("a corpus folder takes its splits from the files' names") {
  TempDir dir;
  const auto train = ids_of(4000, 50257, 5);
  const auto val = ids_of(1000, 50257, 6);
  SUBCASE("nanoGPT: train.bin and val.bin") {
    write(dir.path / "train.bin", raw_u16(train));
    write(dir.path / "val.bin", raw_u16(val));
    write(dir.path / "meta.pkl", "not tokens");
    auto c = load_token_corpus(dir.path);
    REQUIRE(c.ok());
    REQUIRE(c->val);
    CHECK(all(c->train) == std::vector<std::int64_t>(train.begin(), train.end()));
    CHECK(all(*c->val) == std::vector<std::int64_t>(val.begin(), val.end()));
    CHECK(c->description.find("nanoGPT") != std::string::npos);
  }
  SUBCASE("llm.c: shards in sorted order") {
    write(dir.path / "fineweb_train_000002.bin", llmc(std::vector<std::uint32_t>(train.begin() + 2000, train.end()), false));
    write(dir.path / "fineweb_train_000001.bin", llmc(std::vector<std::uint32_t>(train.begin(), train.begin() + 2000), false));
    write(dir.path / "fineweb_val_000000.bin", llmc(val, false));
    auto c = load_token_corpus(dir.path);
    REQUIRE(c.ok());
    CHECK(all(c->train) == std::vector<std::int64_t>(train.begin(), train.end()));
    CHECK(c->val->size() == 1000);
    CHECK(c->max_token == std::max(*std::max_element(train.begin(), train.end()), *std::max_element(val.begin(), val.end())));
  }
  SUBCASE("one file: no validation split of its own") {
    write(dir.path / "tokens.bin", raw_u16(train));
    auto c = load_token_corpus(dir.path / "tokens.bin");
    REQUIRE(c.ok());
    CHECK_FALSE(c->val);
    auto d = Dataset::from_tokens(c->train, 0.1, 32);
    REQUIRE(d.ok());
    CHECK(d->val().size() == 400);
    CHECK(d->train().at(0) == train[0]);
    CHECK(d->val().at(0) == train[3600]);
  }
  SUBCASE("what cannot be used is refused") {
    write(dir.path / "val.bin", raw_u16(val));
    CHECK(load_token_corpus(dir.path).status().message().find("no *.bin file named for training") != std::string::npos);
    write(dir.path / "train_val.bin", raw_u16(val));
    CHECK(load_token_corpus(dir.path).status().message().find("both train and val") != std::string::npos);
    fs::remove(dir.path / "train_val.bin");
    write(dir.path / "a_train.bin", raw_u16(train));
    write(dir.path / "b_train.bin", llmc(train, false));
    CHECK(load_token_corpus(dir.path).status().message().find("one split must hold one layout") != std::string::npos);
    CHECK(load_token_corpus(dir.path / "nothing").status().code() == ErrorCode::kNotFound);
  }
}

TEST_CASE("batches of token files hold the files' ids, shifted by one for targets, from disjoint shards") {
  TempDir dir;
  const auto ids = ids_of(20000, 50257, 7);
  write(dir.path / "train.bin", raw_u16(ids));
  auto f = read_token_file(dir.path / "train.bin");
  REQUIRE(f.ok());
  const std::int64_t T = 16;
  ShardSampler r0(f->tokens, 0, 2, 4, T, 9), r1(f->tokens, 1, 2, 4, T, 9);
  CHECK(r0.shard_end() <= r1.shard_begin());
  const auto offsets = r1.offsets(3);
  const auto b = r1.batch(3);
  for (std::size_t w = 0; w < offsets.size(); ++w) {
    for (std::int64_t t = 0; t < T; ++t) {
      CHECK(b.tokens[static_cast<std::int64_t>(w)][t].item<std::int64_t>() == ids[static_cast<std::size_t>(offsets[w] + t)]);
      CHECK(b.targets[static_cast<std::int64_t>(w)][t].item<std::int64_t>() == ids[static_cast<std::size_t>(offsets[w] + t + 1)]);
    }
  }
}

TEST_CASE("a token file of 2 GiB is checked and sampled without reading it into memory") {
  TempDir dir;
  const auto path = dir.path / "big.bin";
  {
    // A sparse file: the holes read as token 0; one real id near the end.
    std::ofstream out(path, std::ios::binary);
    out.seekp((2LL << 30) - 4);
    const char tail[4] = {0x10, 0x27, 0, 0};  // ids 10000 and 0
    out.write(tail, 4);
  }
  const auto anon_before = status_kib("RssAnon"), rss_before = status_kib("VmRSS");
  auto f = read_token_file(path);
  REQUIRE(f.ok());
  CHECK(f->tokens.size() == (1LL << 30));
  CHECK(f->max_token == 10000);
  // The scan that checked every id released its pages as it went.
  CHECK(status_kib("VmRSS") - rss_before < 128 * 1024);
  ShardSampler s(f->tokens, 3, 4, 8, 64, 1);
  for (std::int64_t i = 0; i < 50; ++i) CHECK(s.batch(i).tokens.size(0) == 8);
  const auto anon = status_kib("RssAnon") - anon_before, rss = status_kib("VmRSS") - rss_before;
  INFO("own memory grew by " << anon / 1024 << " MiB, resident set by " << rss / 1024 << " MiB");
  CHECK(anon < 64 * 1024);
  CHECK(rss < 1024 * 1024);  // the windows' pages only, far from the file's 2 GiB
}
