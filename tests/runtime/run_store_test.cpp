// RunStore: the run folder's files under the names train/run_folder.h gives them, and the memory store
// a simulation reads back.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/file.h"
#include "runtime/run_store.h"
#include "train/run_folder.h"

using namespace gossamer;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("gossamer_store_" + name + "_" + std::to_string(std::random_device{}()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string text_of(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

train::CheckpointState state_at(std::int64_t step) {
  train::CheckpointState st;
  st.config_toml = "[train]\nsteps = 4\n";
  st.step = step;
  st.next_batch = step;
  st.tensors = Bytes(16, std::byte{7});
  return st;
}

}  // namespace

TEST_CASE("a folder store writes the run folder's files by their names, and a resume drops the records after its step") {
  const fs::path dir = scratch("folder");
  auto store = runtime::make_folder_store(dir);
  CHECK(store->keeps_checkpoints());
  CHECK_FALSE(store->record({{"step", 1}}).ok());  // records are opened first
  REQUIRE(store->keep_addresses({"192.0.2.1:7000"}).ok());
  CHECK(text_of(dir / train::kAddressFile) == "192.0.2.1:7000\n");
  REQUIRE(store->keep_addresses({"192.0.2.1:7000", "192.0.2.1:7001"}).ok());
  CHECK(text_of(dir / train::kAddressFile) == "192.0.2.1:7000\n192.0.2.1:7001\n");
  REQUIRE(store->keep_spec("[outer]\nmethod = \"diloco\"\n").ok());
  CHECK(text_of(dir / train::kConfigFile) == "[outer]\nmethod = \"diloco\"\n");
  REQUIRE(store->open_records(std::nullopt).ok());
  for (int step = 1; step <= 3; ++step) REQUIRE(store->record({{"step", step}}).ok());
  REQUIRE(store->save_checkpoint(state_at(2)).ok());
  auto back = train::read_checkpoint(dir / train::kCheckpointFile);
  REQUIRE(back.ok());
  CHECK(back->step == 2);
  CHECK((back->tensors == state_at(2).tensors));
  REQUIRE(store->write_summary({{"finished", true}}).ok());
  CHECK(nlohmann::json::parse(text_of(dir / train::kSummaryFile))["finished"] == true);
  // A resume from step 2: the record of step 3 goes once records are written again.
  auto resumed = runtime::make_folder_store(dir);
  REQUIRE(resumed->open_records(2).ok());
  REQUIRE(resumed->record({{"step", 3}, {"again", true}}).ok());
  std::istringstream lines(text_of(dir / train::kMetricsFile));
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(lines, line);) records.push_back(nlohmann::json::parse(line));
  REQUIRE(records.size() == 3);
  CHECK(records[1]["step"] == 2);
  CHECK(records[2].contains("again"));
  // Every file it wrote is one the folder's owner alone replaces.
  for (const char* name : {train::kAddressFile, train::kConfigFile, train::kMetricsFile, train::kCheckpointFile, train::kSummaryFile}) {
    CHECK(std::find(train::kRunFiles.begin(), train::kRunFiles.end(), std::string_view(name)) != train::kRunFiles.end());
  }
  fs::remove_all(dir);
}

TEST_CASE("a memory store keeps what a peer leaves behind, checkpoints only when asked to, and shares its snapshot store") {
  runtime::MemoryRunStore plain;
  CHECK_FALSE(plain.keeps_checkpoints());
  REQUIRE(plain.save_checkpoint(state_at(1)).ok());
  CHECK_FALSE(plain.checkpoint.has_value());
  REQUIRE(plain.open_records(std::nullopt).ok());
  for (int step = 1; step <= 4; ++step) REQUIRE(plain.record({{"step", step}}).ok());
  REQUIRE(plain.open_records(2).ok());  // a resume at step 2
  REQUIRE(plain.records.size() == 2);
  CHECK(plain.records.back()["step"] == 2);
  REQUIRE(plain.write_summary({{"finished", false}}).ok());
  REQUIRE(plain.summary.has_value());

  auto shared = runtime::make_memory_store();
  runtime::MemoryRunStore keeping(true, shared);
  CHECK(keeping.keeps_checkpoints());
  REQUIRE(keeping.save_checkpoint(state_at(3)).ok());
  REQUIRE(keeping.checkpoint.has_value());
  CHECK(keeping.checkpoint->step == 3);
  CHECK((keeping.snapshots() == shared));  // a simulated worker's state on its way outlives its crash
  CHECK((plain.snapshots() != nullptr));
}
