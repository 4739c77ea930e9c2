// Run output: metrics as JSON lines and human progress on the terminal.
//
// MetricsWriter appends one JSON object per line to <run>/metrics.jsonl and flushes each line, so a
// crash loses at most the line being written. ProgressReporter draws a one-line progress bar when
// stderr is a terminal and prints plain log lines otherwise. Neither is thread-safe: the training
// thread owns them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace gossamer::train {

class MetricsWriter {
 public:
  // On resume, records with "step" > keep_up_to_step are removed (they were written after the
  // checkpoint being resumed from) when the first record is written, so a resume that makes no
  // progress leaves the file as it was. Pass nullopt to start a fresh file.
  static Result<MetricsWriter> open(const std::filesystem::path& path, std::optional<std::int64_t> keep_up_to_step);
  [[nodiscard]] Status write(const nlohmann::json& record);

 private:
  [[nodiscard]] Status open_for_resume();

  std::filesystem::path path_;
  std::optional<std::int64_t> keep_up_to_step_;  // set until the resumed file is opened
  std::ofstream out_;
};

class ProgressReporter {
 public:
  ProgressReporter(std::int64_t total_steps, bool terminal);
  void update(std::int64_t step, double train_loss, std::optional<double> val_loss, double tok_per_s);
  void finish();

 private:
  std::int64_t total_;
  bool terminal_;
  std::optional<double> last_val_;
  std::int64_t last_logged_ = -1;
  double start_s_;
};

}  // namespace gossamer::train
