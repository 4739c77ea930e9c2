// RunStore: where a Peer (peer_runtime.h) keeps what it leaves behind: the run's spec, its records,
// its checkpoint, its summary, the addresses it listens at, and a newcomer's state as it arrives.
// `gossamer peer` keeps them in its run folder (make_folder_store: the files train/run_folder.h
// names); the simulator and tests in memory (MemoryRunStore, or one of their own).
//
// Threading: record() is called from the peer's training thread, the rest from the thread that runs
// the Peer; a store is used by one Peer at a time. Errors: kIoError when the file system refuses.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "runtime/state_store.h"
#include "train/checkpoint.h"

namespace gossamer::runtime {

class RunStore {
 public:
  virtual ~RunStore() = default;
  // Where this peer listens (gossip's HOST:PORT, then the links' too), for whoever starts peers.
  [[nodiscard]] virtual Status keep_addresses(const std::vector<std::string>& addresses) = 0;
  // The run's spec, once it is known (the TOML of its config).
  [[nodiscard]] virtual Status keep_spec(const std::string& spec) = 0;
  // Records from here on: a resumed run's records after `resumed_at` (its checkpoint's step) go.
  [[nodiscard]] virtual Status open_records(std::optional<std::int64_t> resumed_at) = 0;
  // One record (after open_records()).
  [[nodiscard]] virtual Status record(const nlohmann::json& rec) = 0;
  // False: it keeps no checkpoints (save_checkpoint() is not called).
  virtual bool keeps_checkpoints() const = 0;
  [[nodiscard]] virtual Status save_checkpoint(const train::CheckpointState& state) = 0;
  [[nodiscard]] virtual Status write_summary(const nlohmann::json& summary) = 0;
  // Where a newcomer keeps the run's state as it arrives (state_store.h).
  virtual std::shared_ptr<SnapshotStore> snapshots() = 0;
};

// The run folder `dir` (held by the caller: train::RunFolder): train::kAddressFile, kConfigFile,
// kMetricsFile, kCheckpointFile (its write timed and logged), kSummaryFile and the join state's files.
std::unique_ptr<RunStore> make_folder_store(std::filesystem::path dir);

// In memory, for the caller to read back: every record, the last checkpoint (when it keeps them), the
// summary. Its snapshots are `snapshots` (one that outlives this store: a simulated worker's across
// its crash), or memory of its own.
class MemoryRunStore : public RunStore {
 public:
  explicit MemoryRunStore(bool keep_checkpoints = false, std::shared_ptr<SnapshotStore> snapshots = nullptr);

  Status keep_addresses(const std::vector<std::string>& addresses) override;
  Status keep_spec(const std::string& spec) override;
  Status open_records(std::optional<std::int64_t> resumed_at) override;
  Status record(const nlohmann::json& rec) override;
  bool keeps_checkpoints() const override { return keep_checkpoints_; }
  Status save_checkpoint(const train::CheckpointState& state) override;
  Status write_summary(const nlohmann::json& summary) override;
  std::shared_ptr<SnapshotStore> snapshots() override { return snapshots_; }

  std::vector<std::string> addresses;
  std::optional<std::string> spec;
  std::vector<nlohmann::json> records;
  std::optional<train::CheckpointState> checkpoint;
  std::optional<nlohmann::json> summary;

 private:
  bool keep_checkpoints_;
  std::shared_ptr<SnapshotStore> snapshots_;
};

}  // namespace gossamer::runtime
