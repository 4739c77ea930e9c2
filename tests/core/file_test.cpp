#include <doctest/doctest.h>

#include <filesystem>
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
