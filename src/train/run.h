// A single-worker training run into a run folder: what `gossamer train` does.
//
// The run folder (train/run_folder.h) holds config.toml (the effective config), metrics.jsonl, checkpoint.bin (latest,
// written atomically) and summary.json. A run that is resumed continues bit-identically from its last
// checkpoint. A resume checks before writing anything: the folder holds a train run whose checkpoint
// agrees with its config.toml and with the request on the model and the data, and the request does
// not go back behind the checkpoint's step; a resume of a finished run changes nothing. A resumed
// run rewrites config.toml and trims metrics.jsonl (lines after the checkpoint) only once it has made
// a step. Errors are Status values: kInvalidArgument for what the user must change (bad config, an
// existing run folder without --resume, a mismatching resume), others for I/O and corrupt files.
// Blocking: run_training blocks until the run ends or `stop` becomes true (checked between steps).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "core/clock.h"
#include "core/status.h"
#include "data/dataset.h"
#include "train/config.h"
#include "train/run_folder.h"

namespace gossamer::train {

struct Corpus {
  data::Dataset dataset;
  std::string description;              // "synthetic language (64 words, ...)" or the path
  std::optional<double> entropy_floor;  // nats per byte, when known exactly
};

// Builds the corpus a config asks for: the synthetic language or a text file / folder.
[[nodiscard]] Result<Corpus> load_corpus(const RunConfig& config);

struct TrainRequest {
  RunConfig config;
  std::filesystem::path out_dir;
  bool resume = false;                  // continue from out_dir/checkpoint.bin
  std::optional<std::int64_t> stop_at;  // stop (with a checkpoint) once this many steps are done
  bool terminal = false;                // draw a progress bar instead of log lines
  const std::atomic<bool>* stop = nullptr;  // set from a signal handler for a graceful stop
};

struct TrainOutcome {
  std::int64_t steps = 0;
  std::int64_t tokens = 0;
  double final_train_loss = 0.0;
  std::optional<double> final_val_loss;
  std::optional<double> entropy_floor;
  double tok_per_s = 0.0;
  bool finished = false;  // false when stopped early (stop_at or a stop request)
  bool nothing_to_do = false;  // a resume of a run already at train.steps: nothing was read or written
};

// The config stored in a run folder's checkpoint, with `overrides` (key=value) applied on top.
[[nodiscard]] Result<RunConfig> config_from_checkpoint(const std::filesystem::path& out_dir);

[[nodiscard]] Result<TrainOutcome> run_training(const TrainRequest& request, Clock& clock);


}  // namespace gossamer::train
