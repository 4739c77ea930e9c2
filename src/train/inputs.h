// The files a run reads, pinned when it starts and checked when it is resumed: its corpus
// (data.path: a text file, a folder of text files, token files) and a TorchScript model
// (model.path), each by size and content digest (core/file.h, digest_file) in OUT/inputs.json.
//
// A resume whose files changed since (edited, replaced, added to a folder or taken from it) is
// refused before anything is loaded, with what changed: it would otherwise carry on under the same
// config with other data or another model, silently or with a failure deep inside LibTorch. A run
// folder without inputs.json (written before it existed) is pinned when it is resumed.
// Pure functions but for the files they read; thread-safe. Errors are Status values: kInvalidArgument
// for a change, kIoError or kNotFound for a file that cannot be read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/config.h"
#include "train/run_folder.h"

namespace gossamer::train {

struct PinnedInput {
  std::string key;      // the config key naming it: data.path or model.path
  std::string path;     // as the run reads it
  std::uint64_t size = 0;
  std::string digest;   // BLAKE2b-256, hex
  bool sampled = false; // digested by samples (a file over 1 GiB; core/file.h)
  friend bool operator==(const PinnedInput&, const PinnedInput&) = default;
};

// The run's input files as they are now (none for the built-in synthetic corpus and GPT).
[[nodiscard]] Result<std::vector<PinnedInput>> pin_inputs(const RunConfig& config);
// inputs.json's text, and back.
std::string inputs_json(const std::vector<PinnedInput>& inputs);
[[nodiscard]] Result<std::vector<PinnedInput>> parse_inputs_json(const std::string& text);
// The differences between the files pinned and the files now: one line each, in the order pinned
// (then the files that are new), naming the key, the file and what changed. Empty when none.
std::vector<std::string> input_changes(const std::vector<PinnedInput>& pinned, const std::vector<PinnedInput>& now);

// On resume: the files of `config` against `folder`'s inputs.json; kInvalidArgument naming what
// changed and what to do. Returns the record to keep (inputs.json's text as it is to be written):
// the same files, or the files pinned now where the folder has no record yet.
[[nodiscard]] Result<std::string> check_inputs(const std::filesystem::path& folder, const RunConfig& config);
// For a trained model's users (sample, export): only model.path, a TorchScript module read again to
// hold the run's weights, against `folder`'s inputs.json (fine where it has none).
[[nodiscard]] Status check_model_input(const std::filesystem::path& folder, const RunConfig& config);

}  // namespace gossamer::train
