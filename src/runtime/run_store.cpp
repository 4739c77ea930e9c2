#include "runtime/run_store.h"

#include <spdlog/spdlog.h>

#include "core/clock.h"
#include "core/file.h"
#include "train/metrics.h"
#include "train/memory.h"
#include "train/run_folder.h"

namespace gossamer::runtime {

namespace fs = std::filesystem;

namespace {

class FolderStore final : public RunStore {
 public:
  explicit FolderStore(fs::path dir) : dir_(std::move(dir)), snapshots_(make_file_store(dir_)) {}

  Status keep_addresses(const std::vector<std::string>& addresses) override {
    std::string text;
    for (const auto& a : addresses) text += a + "\n";
    return write_file_atomic(dir_ / train::kAddressFile, as_bytes(text));
  }
  Status keep_spec(const std::string& spec) override { return write_file_atomic(dir_ / train::kConfigFile, as_bytes(spec)); }
  Status open_records(std::optional<std::int64_t> resumed_at) override {
    auto opened = train::MetricsWriter::open(dir_ / train::kMetricsFile, resumed_at);
    if (!opened.ok()) return opened.status();
    metrics_.emplace(std::move(*opened));
    return Status();
  }
  Status record(const nlohmann::json& rec) override {
    if (!metrics_) return error(ErrorCode::kInternal, "a record before the records were opened");
    return metrics_->write(rec);
  }
  bool keeps_checkpoints() const override { return true; }
  Status save_checkpoint(const train::CheckpointState& state) override {
    const fs::path path = dir_ / train::kCheckpointFile;
    Stopwatch watch(real_clock());
    Status st = train::write_checkpoint(path, state);
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (st.ok() && !ec) {
      spdlog::info("checkpoint at step {}: {} written in {:.2f} s", state.step, train::format_bytes(static_cast<double>(size)), watch.elapsed_seconds());
    }
    return st;
  }
  Status write_summary(const nlohmann::json& summary) override {
    return write_file_atomic(dir_ / train::kSummaryFile, as_bytes(summary.dump(2) + "\n"));
  }
  std::shared_ptr<SnapshotStore> snapshots() override { return snapshots_; }

 private:
  fs::path dir_;
  std::shared_ptr<SnapshotStore> snapshots_;
  std::optional<train::MetricsWriter> metrics_;
};

}  // namespace

std::unique_ptr<RunStore> make_folder_store(fs::path dir) { return std::make_unique<FolderStore>(std::move(dir)); }

MemoryRunStore::MemoryRunStore(bool keep_checkpoints, std::shared_ptr<SnapshotStore> snapshots)
    : keep_checkpoints_(keep_checkpoints), snapshots_(snapshots ? std::move(snapshots) : make_memory_store()) {}

Status MemoryRunStore::keep_addresses(const std::vector<std::string>& a) {
  addresses = a;
  return Status();
}

Status MemoryRunStore::keep_spec(const std::string& s) {
  spec = s;
  return Status();
}

Status MemoryRunStore::open_records(std::optional<std::int64_t> resumed_at) {
  if (!resumed_at) {
    records.clear();
    return Status();
  }
  std::erase_if(records, [&](const nlohmann::json& r) { return r.contains("step") && r["step"].get<std::int64_t>() > *resumed_at; });
  return Status();
}

Status MemoryRunStore::record(const nlohmann::json& rec) {
  records.push_back(rec);
  return Status();
}

Status MemoryRunStore::save_checkpoint(const train::CheckpointState& state) {
  if (keep_checkpoints_) checkpoint = state;
  return Status();
}

Status MemoryRunStore::write_summary(const nlohmann::json& s) {
  summary = s;
  return Status();
}

}  // namespace gossamer::runtime
