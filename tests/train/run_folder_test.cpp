#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "train/run_folder.h"

using namespace gossamer;
using namespace gossamer::train;
namespace fs = std::filesystem;

namespace {
fs::path scratch(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("gossamer_folder_" + name + "_" + std::to_string(std::random_device{}()));
  fs::remove_all(p);
  return p;
}
void touch(const fs::path& p, const std::string& text = "x") { std::ofstream(p) << text; }
}  // namespace

TEST_CASE("run folders: a new run takes a missing or empty folder, never one with results or another kind's") {
  const fs::path dir = scratch("new");
  CHECK(RunFolder::check_new(dir, RunKind::kSim).ok());
  {
    auto f = RunFolder::create(dir, RunKind::kSim);
    REQUIRE(f.ok());
    CHECK(fs::exists(dir / kRunMarkerFile));
    // While it is held, no other command may write there, not even one of its kind.
    auto again = RunFolder::create(dir, RunKind::kSim);
    REQUIRE_FALSE(again.ok());
    CHECK(again.status().message().find("in use") != std::string::npos);
    CHECK(RunFolder::check_new(dir, RunKind::kSim).message().find("in use") != std::string::npos);
  }
  // Let go, holding only its start: the same kind may start there again, another kind may not.
  CHECK(RunFolder::check_new(dir, RunKind::kSim).ok());
  // A newcomer's state on its way is part of the start: the same command resumes the transfer there.
  touch(dir / kJoinStateFile);
  touch(dir / kJoinManifestFile);
  CHECK(RunFolder::check_new(dir, RunKind::kSim).ok());
  auto other = RunFolder::check_new(dir, RunKind::kTrain);
  CHECK(other.code() == ErrorCode::kInvalidArgument);
  CHECK(other.message().find("`gossamer sim` run") != std::string::npos);
  touch(dir / "summary.json");
  CHECK(RunFolder::check_new(dir, RunKind::kSim).message().find("already holds a run") != std::string::npos);

  const fs::path foreign = scratch("foreign");
  fs::create_directories(foreign);
  touch(foreign / "notes.txt");
  CHECK(RunFolder::check_new(foreign, RunKind::kTrain).message().find("other files") != std::string::npos);
  touch(foreign / "afile");
  CHECK(RunFolder::check_new(foreign / "afile", RunKind::kTrain).message().find("is a file") != std::string::npos);
  CHECK(RunFolder::check_new("", RunKind::kTrain).message().find("--out is empty") != std::string::npos);
  fs::remove_all(dir);
  fs::remove_all(foreign);
}

TEST_CASE("run folders: a resume checks without writing, recognises older folders, and holds the folder") {
  const fs::path dir = scratch("resume");
  fs::create_directories(dir);
  CHECK(RunFolder::open_to_resume(dir, RunKind::kTrain).status().message().find("nothing to resume") != std::string::npos);
  // A train folder from before run.json: its checkpoint makes it a run; checking writes nothing.
  touch(dir / "checkpoint.bin");
  REQUIRE(RunFolder::open_to_resume(dir, RunKind::kTrain, /*claim=*/false).ok());
  CHECK_FALSE(fs::exists(dir / kRunMarkerFile));
  // A peer's folder (it holds an address file) is not a train run, marker or not.
  touch(dir / "address");
  CHECK(RunFolder::open_to_resume(dir, RunKind::kTrain, false).status().message().find("`gossamer peer` run") != std::string::npos);
  fs::remove(dir / "address");
  {
    auto held = RunFolder::open_to_resume(dir, RunKind::kTrain);
    REQUIRE(held.ok());
    CHECK(fs::exists(dir / kRunMarkerFile));
    CHECK(RunFolder::open_to_resume(dir, RunKind::kTrain).status().message().find("in use") != std::string::npos);
    CHECK(RunFolder::open_to_resume(dir, RunKind::kTrain, false).status().message().find("in use") != std::string::npos);
    // Moving the folder object keeps the hold.
    RunFolder moved = std::move(*held);
    CHECK(RunFolder::open_to_resume(dir, RunKind::kTrain).status().message().find("in use") != std::string::npos);
  }
  CHECK(RunFolder::open_to_resume(dir, RunKind::kTrain).ok());
  CHECK(RunFolder::open_to_resume(dir, RunKind::kPeer).status().message().find("`gossamer train` run") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("run folders: a run that ended before its first checkpoint is not offered a resume it would be refused") {
  const fs::path dir = scratch("no-checkpoint");
  fs::remove_all(dir);
  {
    auto folder = RunFolder::create(dir, RunKind::kPeer);
    REQUIRE(folder.ok());
  }
  touch(dir / "metrics.jsonl");  // it trained a little, then died before its first checkpoint
  const Status again = RunFolder::check_new(dir, RunKind::kPeer);
  CHECK(again.code() == ErrorCode::kInvalidArgument);
  CHECK(again.message().find("ended before its first checkpoint") != std::string::npos);
  CHECK(again.message().find("pass --resume") == std::string::npos);
  const auto resumed = RunFolder::open_to_resume(dir, RunKind::kPeer, /*claim=*/false);
  REQUIRE_FALSE(resumed.ok());
  CHECK(resumed.status().message().find("nothing to resume") != std::string::npos);
  // With a checkpoint, --resume is the way on.
  touch(dir / "checkpoint.bin");
  CHECK(RunFolder::check_new(dir, RunKind::kPeer).message().find("pass --resume") != std::string::npos);
  fs::remove_all(dir);
}
