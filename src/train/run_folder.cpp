#include "train/run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file.h"

namespace gossamer::train {

namespace fs = std::filesystem;

namespace {

constexpr std::array<std::string_view, 5> kKindNames = {"train", "peer", "sim", "compare", "pipeline"};

// Files a run writes before it has any result: a start that failed leaves only these, and the same
// command may start again in that folder.
constexpr std::array<std::string_view, 6> kStartFiles = {kRunMarkerFile, kConfigFile, kInputsFile, kAddressFile, kJoinStateFile, kJoinManifestFile};

std::string resume_hint(RunKind kind, const fs::path& path) {
  switch (kind) {
    case RunKind::kTrain: return "continue it with `gossamer train --out " + path.string() + " --resume`";
    case RunKind::kPeer: return "restart that peer with `gossamer peer --out " + path.string() + " --resume --join ...`";
    case RunKind::kSim:
    case RunKind::kCompare:
    case RunKind::kPipeline: return "its results stay there";
  }
  return "";
}

bool exists_quietly(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

// The kind recorded in run.json: nullopt when there is no marker; an error when it cannot be read.
Result<std::optional<RunKind>> recorded_kind(const fs::path& folder) {
  const fs::path marker = folder / kRunMarkerFile;
  if (!exists_quietly(marker)) return std::optional<RunKind>();
  auto text = read_text_file(marker, 1 << 16);
  if (!text.ok()) return text.status();
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("kind") && j["kind"].is_string()) {
    const std::string name = j["kind"].get<std::string>();
    for (std::size_t i = 0; i < kKindNames.size(); ++i) {
      if (name == kKindNames[i]) return std::optional<RunKind>(static_cast<RunKind>(i));
    }
  }
  return error(ErrorCode::kInvalidArgument, marker.string() + " is not a Gossamer run marker: choose another --out");
}

Status write_marker(const fs::path& folder, RunKind kind) {
  const nlohmann::json j = {{"kind", std::string(to_string(kind))}, {"format", 1}};
  return write_file_atomic(folder / kRunMarkerFile, as_bytes(j.dump() + "\n"));
}

// Opens `folder` and takes its advisory lock: the fd, or an error naming what to do when another
// process holds it.
Result<int> lock_folder(const fs::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return error(ErrorCode::kIoError, "cannot open run folder " + folder.string() + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::close(fd);
    if (e == EWOULDBLOCK) {
      return error(ErrorCode::kInvalidArgument, "run folder " + folder.string() + " is in use by another running gossamer command: choose another --out");
    }
    return error(ErrorCode::kIoError, "cannot lock run folder " + folder.string() + ": " + std::strerror(e));
  }
  return fd;
}

// Whether another process holds the folder now (check only).
bool held_elsewhere(const fs::path& folder) {
  auto fd = lock_folder(folder);
  if (!fd.ok()) return fd.status().code() == ErrorCode::kInvalidArgument;
  ::close(*fd);
  return false;
}

// The checks of check_new on an existing folder.
Status check_contents(const fs::path& path, RunKind kind) {
  auto recorded = recorded_kind(path);
  if (!recorded.ok()) return recorded.status();
  std::error_code ec;
  std::vector<std::string> all, results;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    const std::string name = entry.path().filename().string();
    all.push_back(name);
    if (std::find(kStartFiles.begin(), kStartFiles.end(), name) == kStartFiles.end()) results.push_back(name);
  }
  if (ec) return error(ErrorCode::kInvalidArgument, "--out " + path.string() + ": cannot be listed (" + ec.message() + ")");
  if (recorded->has_value() && **recorded != kind) {
    return error(ErrorCode::kInvalidArgument, "--out " + path.string() + " holds a `gossamer " + std::string(to_string(**recorded)) +
                                                  "` run: choose another --out (a " + std::string(to_string(kind)) + " run never writes into it)");
  }
  if (all.empty() || (results.empty() && recorded->has_value())) return Status();
  if (!recorded->has_value()) {
    if (exists_quietly(path / kCheckpointFile)) {
      return error(ErrorCode::kInvalidArgument, "run folder " + path.string() + " already holds a run: pass --resume to continue it, or choose another --out");
    }
    std::sort(all.begin(), all.end());
    return error(ErrorCode::kInvalidArgument, "--out " + path.string() + " is a folder with other files in it (" + all.front() +
                                                  (all.size() > 1 ? ", ..." : "") + "): choose a new or empty folder, so that nothing in it is overwritten");
  }
  const bool resumable = kind == RunKind::kTrain || kind == RunKind::kPeer;
  if (resumable && !exists_quietly(path / kCheckpointFile)) {
    // (--resume would be refused too: there is no checkpoint to continue from.)
    return error(ErrorCode::kInvalidArgument, "run folder " + path.string() + " holds a run that ended before its first checkpoint, so there is "
                                                  "nothing to resume: choose another --out, or delete the folder to start over in it");
  }
  return error(ErrorCode::kInvalidArgument, "run folder " + path.string() + " already holds a run" +
                                                (resumable ? ": pass --resume to continue it, or choose another --out"
                                                                                                    : ": choose another --out (" + resume_hint(kind, path) + ")"));
}

}  // namespace

std::string_view to_string(RunKind kind) { return kKindNames.at(static_cast<std::size_t>(kind)); }

Status RunFolder::check_new(const fs::path& path, RunKind kind) {
  if (path.empty() || path.filename().string().find_first_not_of(" \t") == std::string::npos) {
    if (!path.empty() && path.filename().empty()) {  // "runs/x/": the folder is the one before the slash
      return check_new(path.parent_path(), kind);
    }
    return error(ErrorCode::kInvalidArgument, "--out is empty: name the folder for the results, e.g. --out runs/first");
  }
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return error(ErrorCode::kInvalidArgument, "--out " + path.string() + ": cannot be read (" + ec.message() + ")");
  }
  if (!fs::exists(st)) return Status();
  if (!fs::is_directory(st)) return error(ErrorCode::kInvalidArgument, "--out " + path.string() + " is a file, not a folder: choose another --out");
  if (Status contents = check_contents(path, kind); !contents.ok()) return contents;
  if (held_elsewhere(path)) {
    return error(ErrorCode::kInvalidArgument, "run folder " + path.string() + " is in use by another running gossamer command: choose another --out");
  }
  return Status();
}

Result<RunFolder> RunFolder::create(const fs::path& path, RunKind kind) {
  if (Status st = check_new(path, kind); !st.ok()) return st;
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return error(ErrorCode::kIoError, "cannot create run folder " + path.string() + ": " + ec.message());
  auto fd = lock_folder(path);
  if (!fd.ok()) return fd.status();
  RunFolder folder(path, kind, *fd);
  // Checked again under the lock: another command may have written there since.
  if (Status st = check_contents(path, kind); !st.ok()) return st;
  if (Status st = write_marker(path, kind); !st.ok()) return st;
  return folder;
}

Result<RunFolder> RunFolder::open_to_resume(const fs::path& path, RunKind kind, bool claim) {
  if (path.empty()) return error(ErrorCode::kInvalidArgument, "--out is empty: name the run folder to resume");
  const fs::path ckpt = path / kCheckpointFile;
  if (!exists_quietly(ckpt)) {
    return error(ErrorCode::kInvalidArgument, "nothing to resume: " + ckpt.string() + " does not exist (drop --resume to start a new run)");
  }
  auto recorded = recorded_kind(path);
  if (!recorded.ok()) return recorded.status();
  // A folder from before run.json: a peer's holds its address file.
  const RunKind found = recorded->has_value() ? **recorded : (exists_quietly(path / kAddressFile) ? RunKind::kPeer : RunKind::kTrain);
  if (found != kind) {
    return error(ErrorCode::kInvalidArgument, "run folder " + path.string() + " holds a `gossamer " + std::string(to_string(found)) + "` run, not a " +
                                                  std::string(to_string(kind)) + " run: " + resume_hint(found, path));
  }
  if (!claim) {
    if (held_elsewhere(path)) {
      return error(ErrorCode::kInvalidArgument, "run folder " + path.string() + " is in use by another running gossamer command: wait for it to end");
    }
    return RunFolder(path, kind, -1);
  }
  auto fd = lock_folder(path);
  if (!fd.ok()) return fd.status();
  RunFolder folder(path, kind, *fd);
  if (!recorded->has_value()) {
    if (Status st = write_marker(path, kind); !st.ok()) return st;
  }
  return folder;
}

RunFolder::RunFolder(RunFolder&& other) noexcept : path_(std::move(other.path_)), kind_(other.kind_), lock_fd_(other.lock_fd_) { other.lock_fd_ = -1; }

RunFolder& RunFolder::operator=(RunFolder&& other) noexcept {
  if (this != &other) {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    path_ = std::move(other.path_);
    kind_ = other.kind_;
    lock_fd_ = other.lock_fd_;
    other.lock_fd_ = -1;
  }
  return *this;
}

RunFolder::~RunFolder() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing the last descriptor releases the flock
}

Status RunFolder::write_text(std::string_view name, std::string_view text) const {
  return write_file_atomic(path_ / name, as_bytes(text));
}

}  // namespace gossamer::train
