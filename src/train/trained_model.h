// The trained model of a run folder: its checkpoint's weights in the model its config describes,
// for `gossamer sample` and `gossamer export`.
//
// Reads checkpoint.bin (written by train, peer and pipeline; sim and compare keep no weights) without taking
// the folder: a run still going may be read, and nothing in the folder changes. Errors: a folder
// without a checkpoint, a checkpoint that fails its checks, or a model that cannot be built (a
// TorchScript file no longer where the config says) are Status values that say what to do.
// Threading: plain functions.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include "core/status.h"
#include "model/language_model.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace gossamer::train {

struct TrainedModel {
  RunConfig config;
  std::unique_ptr<model::LanguageModel> model;
  std::int64_t step = 0;
};

[[nodiscard]] Result<TrainedModel> load_trained_model(const std::filesystem::path& run_dir);

// `model` (built from `config`, trained for `step` steps) as a checkpoint with no optimizer or data
// position: what load_trained_model() reads, for a run that keeps no training state of its own to
// resume from (a pipeline's assembled model); save_trained_model() writes it as run_dir's
// checkpoint.bin, atomically as every checkpoint.
[[nodiscard]] Result<CheckpointState> trained_model_state(const RunConfig& config, const model::LanguageModel& model, std::int64_t step);
[[nodiscard]] Status save_trained_model(const std::filesystem::path& run_dir, const RunConfig& config, const model::LanguageModel& model,
                                        std::int64_t step);

}  // namespace gossamer::train
