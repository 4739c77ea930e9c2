// RunFolder: the folder a command writes its results into (--out), for train, sim, compare and peer.
//
// What it promises: a command writes only into a folder that it created (missing, empty, or holding
// only the start of a run of its own kind that wrote no result yet), or that holds a run of its own
// kind being resumed. A folder holding anything else, or another command's run, is refused with a
// message that says what to do. Results (summary.json, metrics.jsonl, checkpoint.bin, report.html)
// are then only replaced atomically or extended by the run that owns them.
//
// The kind is recorded in run.json ({"kind": "train", "format": 1}); folders written before it existed
// are recognised by their files when resumed (a checkpoint; an address file for a peer's). While a
// command writes into a folder it holds an advisory lock on it (flock), so two commands given the
// same --out at the same time cannot both write there: the second is refused.
// Thread-compatible value type; the checks and files use the real file system. Errors are Status
// values: kInvalidArgument for what the user must change (another --out, --resume), kIoError for the
// file system refusing.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/status.h"

namespace gossamer::train {

enum class RunKind : std::uint8_t { kTrain = 0, kPeer = 1, kSim = 2, kCompare = 3, kPipeline = 4 };
std::string_view to_string(RunKind kind);

class RunFolder {
 public:
  // Checks, without writing anything, that a new run of `kind` may be written into `path`.
  [[nodiscard]] static Status check_new(const std::filesystem::path& path, RunKind kind);
  // Creates the folder (and its parents), takes it for this process (refused while another process
  // holds it), checks it as check_new does and records the kind.
  [[nodiscard]] static Result<RunFolder> create(const std::filesystem::path& path, RunKind kind);
  // A folder holding a run of `kind` with a checkpoint, to resume it. With claim = false nothing is
  // written (the checks a resume makes before deciding anything); with claim = true the folder is
  // taken for this process and its kind recorded when it was not (a folder from before run.json).
  [[nodiscard]] static Result<RunFolder> open_to_resume(const std::filesystem::path& path, RunKind kind, bool claim = true);

  RunFolder(RunFolder&& other) noexcept;
  RunFolder& operator=(RunFolder&& other) noexcept;
  RunFolder(const RunFolder&) = delete;
  RunFolder& operator=(const RunFolder&) = delete;
  ~RunFolder();  // lets the folder go

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path file(std::string_view name) const { return path_ / name; }
  RunKind kind() const { return kind_; }
  // Replaces `name` atomically (write_file_atomic).
  [[nodiscard]] Status write_text(std::string_view name, std::string_view text) const;

 private:
  RunFolder(std::filesystem::path path, RunKind kind, int lock_fd) : path_(std::move(path)), kind_(kind), lock_fd_(lock_fd) {}
  std::filesystem::path path_;
  RunKind kind_;
  int lock_fd_ = -1;  // the folder, opened and flock()ed while this process writes into it; -1: not held
};

// The files of a run folder: the one place their names are written.
inline constexpr const char* kRunMarkerFile = "run.json";        // the kind of run (above)
inline constexpr const char* kConfigFile = "config.toml";        // the run's config (a peer's: the run spec it took part in)
inline constexpr const char* kInputsFile = "inputs.json";        // the files it reads, pinned (train/inputs.h)
inline constexpr const char* kAddressFile = "address";           // a peer's: where its gossip (and then its links) listen
inline constexpr const char* kMetricsFile = "metrics.jsonl";     // one record per line
inline constexpr const char* kSummaryFile = "summary.json";
inline constexpr const char* kCheckpointFile = "checkpoint.bin";
inline constexpr const char* kReportFile = "report.html";        // sim and compare
// A newcomer's state as it arrives, and its manifest (runtime/state_store.h): no result yet, so the same
// command may start again in that folder and resume the transfer.
inline constexpr const char* kJoinStateFile = "join-state.bin";
inline constexpr const char* kJoinManifestFile = "join-state.manifest";
// The files a run folder's owner writes, which no other command's --out replaces.
inline constexpr std::array<std::string_view, 8> kRunFiles = {kRunMarkerFile, kSummaryFile, kMetricsFile, kCheckpointFile,
                                                              kReportFile,    kConfigFile,  kInputsFile,  kAddressFile};

}  // namespace gossamer::train
