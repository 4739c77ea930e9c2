#include "train/run_folder.h"

#include <algorithm>
#include <array>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file.h"

namespace gossamer::train {

namespace fs = std::filesystem;

namespace {

constexpr std::array<std::string_view, 4> kKindNames = {"train", "peer", "sim", "compare"};

// Files a run writes before it has any result: a start that failed leaves only these, and the same
// command may start again in that folder.
constexpr std::array<std::string_view, 3> kStartFiles = {kRunMarkerFile, "config.toml", "address"};

std::string resume_hint(RunKind kind, const fs::path& path) {
  switch (kind) {
    case RunKind::kTrain: return "continue it with `gossamer train --out " + path.string() + " --resume`";
    case RunKind::kPeer: return "restart that peer with `gossamer peer --out " + path.string() + " --resume --join ...`";
    case RunKind::kSim:
    case RunKind::kCompare: return "its results stay there";
  }
  return "";
}

// The kind recorded in run.json: nullopt when there is no marker; an error when it cannot be read.
Result<std::optional<RunKind>> recorded_kind(const fs::path& folder) {
  const fs::path marker = folder / kRunMarkerFile;
  std::error_code ec;
  if (!fs::exists(marker, ec)) return std::optional<RunKind>();
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

}  // namespace

std::string_view to_string(RunKind kind) { return kKindNames.at(static_cast<std::size_t>(kind)); }

Status RunFolder::check_new(const fs::path& path, RunKind kind) {
  if (path.empty()) return error(ErrorCode::kInvalidArgument, "--out is empty: name the folder for the results, e.g. --out runs/first");
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return error(ErrorCode::kInvalidArgument, "--out " + path.string() + ": cannot be read (" + ec.message() + ")");
  }
  if (!fs::exists(st)) return Status();
  if (!fs::is_directory(st)) return error(ErrorCode::kInvalidArgument, "--out " + path.string() + " is a file, not a folder: choose another --out");
  auto recorded = recorded_kind(path);
  if (!recorded.ok()) return recorded.status();
  std::vector<std::string> all, results;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    const std::string name = entry.path().filename().string();
    all.push_back(name);
    if (std::find(kStartFiles.begin(), kStartFiles.end(), name) == kStartFiles.end()) results.push_back(name);
  }
  if (ec) return error(ErrorCode::kInvalidArgument, "--out " + path.string() + ": cannot be listed (" + ec.message() + ")");
  const bool has_checkpoint = fs::exists(path / "checkpoint.bin");
  if (recorded->has_value() && **recorded != kind) {
    return error(ErrorCode::kInvalidArgument, "--out " + path.string() + " holds a `gossamer " + std::string(to_string(**recorded)) +
                                                  "` run: choose another --out (a " + std::string(to_string(kind)) + " run never writes into it)");
  }
  if (all.empty() || (results.empty() && recorded->has_value())) return Status();
  if (!recorded->has_value()) {
    if (has_checkpoint) {
      return error(ErrorCode::kInvalidArgument, "run folder " + path.string() + " already holds a run: pass --resume to continue it, or choose another --out");
    }
    std::sort(all.begin(), all.end());
    return error(ErrorCode::kInvalidArgument, "--out " + path.string() + " is a folder with other files in it (" + all.front() +
                                                  (all.size() > 1 ? ", ..." : "") + "): choose a new or empty folder, so that nothing in it is overwritten");
  }
  return error(ErrorCode::kInvalidArgument, "run folder " + path.string() + " already holds a run" +
                                                (kind == RunKind::kTrain || kind == RunKind::kPeer ? ": pass --resume to continue it, or choose another --out"
                                                                                                    : ": choose another --out (" + resume_hint(kind, path) + ")"));
}

Result<RunFolder> RunFolder::create(const fs::path& path, RunKind kind) {
  if (Status st = check_new(path, kind); !st.ok()) return st;
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return error(ErrorCode::kIoError, "cannot create run folder " + path.string() + ": " + ec.message());
  if (Status st = write_marker(path, kind); !st.ok()) return st;
  return RunFolder(path, kind);
}

Result<RunFolder> RunFolder::open_to_resume(const fs::path& path, RunKind kind) {
  if (path.empty()) return error(ErrorCode::kInvalidArgument, "--out is empty: name the run folder to resume");
  const fs::path ckpt = path / "checkpoint.bin";
  std::error_code ec;
  if (!fs::exists(ckpt, ec)) {
    return error(ErrorCode::kInvalidArgument, "nothing to resume: " + ckpt.string() + " does not exist (drop --resume to start a new run)");
  }
  auto recorded = recorded_kind(path);
  if (!recorded.ok()) return recorded.status();
  if (recorded->has_value() && **recorded != kind) {
    return error(ErrorCode::kInvalidArgument, "run folder " + path.string() + " holds a `gossamer " + std::string(to_string(**recorded)) + "` run, not a " +
                                                  std::string(to_string(kind)) + " run: " + resume_hint(**recorded, path));
  }
  if (!recorded->has_value()) {
    // A folder from before run.json: its checkpoint makes it a run; record the kind now.
    if (Status st = write_marker(path, kind); !st.ok()) return st;
  }
  return RunFolder(path, kind);
}

Status RunFolder::write_text(std::string_view name, std::string_view text) const {
  return write_file_atomic(path_ / name, as_bytes(text));
}

}  // namespace gossamer::train
