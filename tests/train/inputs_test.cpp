#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "core/file.h"
#include "train/inputs.h"

using namespace gossamer;
using namespace gossamer::train;
namespace fs = std::filesystem;

namespace {
fs::path scratch(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("gossamer_inputs_" + name + "_" + std::to_string(std::random_device{}()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}
void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }
}  // namespace

TEST_CASE("inputs: a text folder's files and a TorchScript file are pinned; the synthetic corpus pins nothing") {
  const fs::path dir = scratch("pin");
  RunConfig c;
  auto none = pin_inputs(c);
  REQUIRE(none.ok());
  CHECK(none->empty());
  fs::create_directories(dir / "corpus" / "sub");
  write(dir / "corpus" / "b.txt", "second");
  write(dir / "corpus" / "sub" / "a.txt", "first");
  write(dir / "model.pt", "not really a module");
  c.data.path = (dir / "corpus").string();
  c.model.kind = ModelKind::kTorchScript;
  c.model.path = (dir / "model.pt").string();
  auto pinned = pin_inputs(c);
  REQUIRE(pinned.ok());
  REQUIRE(pinned->size() == 3);
  CHECK((*pinned)[0].path == (dir / "corpus" / "b.txt").string());
  CHECK((*pinned)[1].size == 5);
  CHECK((*pinned)[2].key == "model.path");
  // The record reads back as written.
  auto back = parse_inputs_json(inputs_json(*pinned));
  REQUIRE(back.ok());
  CHECK((*back == *pinned));
  CHECK_FALSE(parse_inputs_json("{\"format\": 1}").ok());
  CHECK_FALSE(parse_inputs_json("[1, 2").ok());
  // A corpus that is not there: bad input naming the key.
  c.data.path = (dir / "nothing").string();
  auto missing = pin_inputs(c);
  CHECK(missing.status().code() == ErrorCode::kInvalidArgument);
  CHECK(missing.status().message().find("data.path") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("inputs: token folders pin their train and val files only") {
  const fs::path dir = scratch("tokens");
  write(dir / "train.bin", std::string(64, '\1'));
  write(dir / "val.bin", std::string(16, '\2'));
  write(dir / "readme.md", "not read");
  RunConfig c;
  c.data.format = DataFormat::kTokens;
  c.data.path = dir.string();
  auto pinned = pin_inputs(c);
  REQUIRE(pinned.ok());
  REQUIRE(pinned->size() == 2);
  CHECK(fs::path((*pinned)[0].path).filename() == "train.bin");
  CHECK(fs::path((*pinned)[1].path).filename() == "val.bin");
  fs::remove_all(dir);
}

TEST_CASE("inputs: a resume is refused for each kind of change, naming the file, and allowed on the same files") {
  const fs::path dir = scratch("check");
  const fs::path run = dir / "run";
  fs::create_directories(run);
  fs::create_directories(dir / "corpus");
  write(dir / "corpus" / "a.txt", "the text a run was trained on");
  RunConfig c;
  c.data.path = (dir / "corpus").string();
  // No record yet (a folder from before inputs.json): the files now are what is kept.
  auto first = check_inputs(run, c);
  REQUIRE(first.ok());
  REQUIRE(write_file_atomic(run / kInputsFile, as_bytes(*first)).ok());
  auto same = check_inputs(run, c);
  REQUIRE(same.ok());
  CHECK(*same == *first);

  auto refused = [&](const std::string& words) {
    auto r = check_inputs(run, c);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::kInvalidArgument);
    INFO(r.status().message());
    CHECK(r.status().message().find(words) != std::string::npos);
    CHECK(r.status().message().find("another --out") != std::string::npos);
  };
  write(dir / "corpus" / "a.txt", "the text a run was trained oN");  // same size
  refused("the same 29 bytes but other content");
  write(dir / "corpus" / "a.txt", "the text a run was trained on, and more");
  refused("29 bytes when the run started, 39 now");
  write(dir / "corpus" / "a.txt", "the text a run was trained on");
  write(dir / "corpus" / "b.txt", "added later");
  refused("b.txt is new");
  fs::remove(dir / "corpus" / "b.txt");
  CHECK(check_inputs(run, c).ok());
  fs::rename(dir / "corpus" / "a.txt", dir / "corpus" / "c.txt");
  refused("a.txt is gone");
  fs::remove_all(dir / "corpus");
  refused("cannot be read as they were");
  // A record that is not one: said, not taken for "no change".
  write(run / kInputsFile, "{ not json");
  CHECK_FALSE(check_inputs(run, c).ok());
  fs::remove_all(dir);
}
