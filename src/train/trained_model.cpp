#include "train/trained_model.h"

#include <torch/torch.h>

#include <sstream>

#include "train/checkpoint.h"
#include "train/run.h"
#include "train/worker.h"

namespace gossamer::train {

namespace fs = std::filesystem;

Result<TrainedModel> load_trained_model(const fs::path& run_dir) {
  const fs::path path = run_dir / kCheckpointFile;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return error(ErrorCode::kInvalidArgument, run_dir.string() + " is not a run folder");
  if (!fs::exists(path, ec)) {
    return error(ErrorCode::kInvalidArgument, run_dir.string() + " holds no checkpoint.bin: the weights come from a run of gossamer train or "
                                                                 "gossamer peer (sim and compare keep none)");
  }
  auto state = read_checkpoint(path);
  if (!state.ok()) return state.status();
  TrainedModel out;
  if (Status st = apply_toml(out.config, state->config_toml, path.string() + " (stored config)"); !st.ok()) return st;
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

}  // namespace gossamer::train
