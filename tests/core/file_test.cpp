#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "core/file.h"
#include "core/hash.h"

using namespace gossamer;
namespace fs = std::filesystem;

namespace {
fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("gossamer_" + name + "_" + std::to_string(std::random_device{}()));
  fs::create_directories(p);
  return p;
}
}  // namespace

TEST_CASE("write_file_atomic replaces the file and leaves no temporary behind") {
  const fs::path dir = temp_dir("file");
  const fs::path f = dir / "x.bin";
  REQUIRE(write_file_atomic(f, as_bytes("first")).ok());
  REQUIRE(write_file_atomic(f, as_bytes("second version")).ok());
  auto text = read_text_file(f, 1 << 20);
  REQUIRE(text.ok());
  CHECK(*text == "second version");
  int entries = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(dir)) ++entries;
  CHECK(entries == 1);
  fs::remove_all(dir);
}

TEST_CASE("read_file reports missing files and refuses files over the cap") {
  const fs::path dir = temp_dir("file2");
  CHECK(read_file(dir / "nope", 10).status().code() == ErrorCode::kNotFound);
  REQUIRE(write_file_atomic(dir / "big", as_bytes("0123456789abc")).ok());
  CHECK(read_file(dir / "big", 10).status().code() == ErrorCode::kOutOfRange);
  CHECK(write_file_atomic(dir / "missing_folder" / "f", as_bytes("x")).code() == ErrorCode::kIoError);
  fs::remove_all(dir);
}

TEST_CASE("BLAKE2b-256 digest matches the reference vector and incremental hashing") {
  // BLAKE2b-256 of the empty string (RFC 7693 family reference value).
  CHECK(digest_of({}).hex() == "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8");
  Hasher h;
  h.update(as_bytes("abc"));
  h.update(as_bytes("def"));
  CHECK(h.finish() == digest_of(as_bytes("abcdef")));
  CHECK_FALSE(digest_of(as_bytes("abcdef")) == digest_of(as_bytes("abcdeg")));
}

TEST_CASE("digest_file: the content's digest, whole up to 1 GiB, by samples beyond") {
  const fs::path dir = temp_dir("digest");
  const fs::path f = dir / "data.bin";
  REQUIRE(write_file_atomic(f, as_bytes("some text to pin")).ok());
  auto a = digest_file(f);
  REQUIRE(a.ok());
  CHECK(a->size == 16);
  CHECK_FALSE(a->sampled);
  CHECK(a->digest == digest_of(as_bytes("some text to pin")));
  REQUIRE(write_file_atomic(f, as_bytes("some text to pIn")).ok());  // same size, one byte other
  auto b = digest_file(f);
  REQUIRE(b.ok());
  CHECK(b->digest != a->digest);
  CHECK(digest_file(dir / "missing.bin").status().code() == ErrorCode::kIoError);

  // A sparse file over the limit: digested by samples (quickly), its size included; a byte changed
  // in a sampled block shows, one between the samples does not (the documented limit).
  const fs::path big = dir / "big.bin";
  const std::uint64_t size = kWholeDigestBytes + (std::uint64_t{3} << 20);
  { std::ofstream create(big); }
  fs::resize_file(big, size);
  auto s1 = digest_file(big);
  REQUIRE(s1.ok());
  CHECK(s1->sampled);
  CHECK(s1->size == size);
  auto poke = [&](std::uint64_t offset) {
    std::fstream io(big, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(offset));
    io.put('x');
  };
  poke(size - 1);  // the last block is always sampled
  auto s2 = digest_file(big);
  REQUIRE(s2.ok());
  CHECK(s2->digest != s1->digest);
  poke(size / 512 + (1 << 20) + 100);  // between the first and the second sample
  auto s3 = digest_file(big);
  REQUIRE(s3.ok());
  CHECK(s3->digest == s2->digest);
  fs::resize_file(big, size + 1);
  auto s4 = digest_file(big);
  REQUIRE(s4.ok());
  CHECK(s4->digest != s2->digest);
  fs::remove_all(dir);
}
