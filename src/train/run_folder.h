// RunFolder: the folder a command writes its results into (--out), for train, sim, compare and peer.
//
// What it promises: a command writes only into a folder that it created (missing, empty, or holding
// only the start of a run of its own kind that wrote no result yet), or that holds a run of its own
// kind being resumed. A folder holding anything else, or another command's run, is refused with a
// message that says what to do. Results (summary.json, metrics.jsonl, checkpoint.bin, report.html)
// are then only replaced atomically or extended by the run that owns them.
//
// The kind is recorded in run.json ({"kind": "train", "format": 1}); folders written before it existed
// are recognised by their checkpoint when resumed.
// Thread-compatible value type; the checks and files use the real file system. Errors are Status
// values: kInvalidArgument for what the user must change (another --out, --resume), kIoError for the
// file system refusing.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/status.h"

namespace gossamer::train {

enum class RunKind : std::uint8_t { kTrain = 0, kPeer = 1, kSim = 2, kCompare = 3 };
std::string_view to_string(RunKind kind);

class RunFolder {
 public:
  // Checks, without touching the disk, that a new run of `kind` may be written into `path`.
  [[nodiscard]] static Status check_new(const std::filesystem::path& path, RunKind kind);
  // check_new, then creates the folder (and its parents) and records the kind.
  [[nodiscard]] static Result<RunFolder> create(const std::filesystem::path& path, RunKind kind);
  // A folder holding a run of `kind` with a checkpoint, to resume it.
  [[nodiscard]] static Result<RunFolder> open_to_resume(const std::filesystem::path& path, RunKind kind);

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path file(std::string_view name) const { return path_ / name; }
  RunKind kind() const { return kind_; }
  // Replaces `name` atomically (write_file_atomic).
  [[nodiscard]] Status write_text(std::string_view name, std::string_view text) const;

 private:
  RunFolder(std::filesystem::path path, RunKind kind) : path_(std::move(path)), kind_(kind) {}
  std::filesystem::path path_;
  RunKind kind_;
};

inline constexpr const char* kRunMarkerFile = "run.json";

}  // namespace gossamer::train
