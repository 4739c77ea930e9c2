#include "train/trained_model.h"

#include <torch/torch.h>

#include <sstream>

#include "train/checkpoint.h"
#include "train/inputs.h"
#include "train/run.h"
#include "train/worker.h"

namespace gossamer::train {

namespace fs = std::filesystem;

Result<TrainedModel> load_trained_model(const fs::path& run_dir) {
  const fs::path path = run_dir / kCheckpointFile;
  std::error_code ec;
  if (!fs::exists(run_dir, ec)) {
    return error(ErrorCode::kInvalidArgument, run_dir.string() + " does not exist: pass the run folder (the --out) of a gossamer train, peer or pipeline run");
  }
  if (!fs::is_directory(run_dir, ec)) {
    return error(ErrorCode::kInvalidArgument, run_dir.string() + " is a file, not a run folder: pass the --out of a gossamer train, peer or pipeline run");
  }
  if (!fs::exists(path, ec)) {
    return error(ErrorCode::kInvalidArgument, run_dir.string() + " holds no checkpoint.bin: the weights come from a run of gossamer train, "
                                                                 "peer or pipeline (sim and compare keep none)");
  }
  auto state = read_checkpoint(path);
  if (!state.ok()) return state.status();
  TrainedModel out;
  if (Status st = apply_toml(out.config, state->config_toml, path.string() + " (stored config)"); !st.ok()) return st;
  // A TorchScript module is read from model.path again: the one the run trained, or refused.
  if (Status st = check_model_input(run_dir, out.config); !st.ok()) return st;
  auto model = make_model(out.config, 0);
  if (!model.ok()) return model.status().with_context("rebuilding the model of " + run_dir.string());
  try {
    std::istringstream is(std::string(reinterpret_cast<const char*>(state->tensors.data()), state->tensors.size()));
    torch::serialize::InputArchive archive, model_archive;
    archive.load_from(is, c10::Device(c10::kCPU));  // sample and export compute on the host
    archive.read("model", model_archive);
    (*model)->load(model_archive);
  } catch (const c10::Error& e) {
    return error(ErrorCode::kMalformed, "the weights in " + path.string() + " do not fit the model of its config: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return error(ErrorCode::kMalformed, "the weights in " + path.string() + " do not fit the model of its config: " + e.what());
  }
  out.model = std::move(*model);
  out.step = state->step;
  return out;
}

Result<CheckpointState> trained_model_state(const RunConfig& config, const model::LanguageModel& model, std::int64_t step) {
  CheckpointState state;
  state.config_toml = to_toml(config);
  state.step = step;
  try {
    torch::serialize::OutputArchive archive, model_archive;
    model.save(model_archive);
    archive.write("model", model_archive);
    std::ostringstream os;
    archive.save_to(os);
    const std::string bytes = os.str();
    const auto* p = reinterpret_cast<const std::byte*>(bytes.data());
    state.tensors.assign(p, p + bytes.size());
  } catch (const c10::Error& e) {
    return error(ErrorCode::kIoError, std::string("cannot serialize the model: ") + e.what_without_backtrace());
  }
  return state;
}

Status save_trained_model(const fs::path& run_dir, const RunConfig& config, const model::LanguageModel& model, std::int64_t step) {
  auto state = trained_model_state(config, model, step);
  if (!state.ok()) return state.status();
  return write_checkpoint(run_dir / kCheckpointFile, *state);
}

}  // namespace gossamer::train
