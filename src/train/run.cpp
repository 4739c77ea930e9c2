#include "train/run.h"

#include <torch/torch.h>

#include <algorithm>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "core/file.h"
#include "data/synthetic.h"
#include "data/token_files.h"
#include "train/inputs.h"
#include "train/memory.h"
#include "train/metrics.h"
#include "train/run_folder.h"
#include "train/worker.h"

namespace gossamer::train {

namespace fs = std::filesystem;

namespace {

// A path that does not exist is the user's to fix: a config error.
Status data_path_error(const Status& st) {
  const ErrorCode code = st.code() == ErrorCode::kNotFound ? ErrorCode::kInvalidArgument : st.code();
  return error(code, "data.path: " + st.message());
}

Result<Corpus> load_token_corpus(const RunConfig& config) {
  auto loaded = data::load_token_corpus(config.data.path);
  if (!loaded.ok()) return data_path_error(loaded.status());
  // Every id must fit the model's vocabulary: an embedding lookup out of range would fail mid-run.
  const std::int64_t vocab = vocab_size(config);
  const std::int64_t max_id = loaded->max_token;
  if (max_id >= vocab) {
    return error(ErrorCode::kInvalidArgument,
                 fmt::format("data.vocab_size is {} but {} holds token id {}: set data.vocab_size to the tokenizer's vocabulary size "
                             "(at least {}; 50257 for GPT-2's)",
                             vocab, config.data.path, max_id, max_id + 1));
  }
  auto dataset = loaded->val ? data::Dataset::from_splits(loaded->train, *loaded->val, config.model.context)
                             : data::Dataset::from_tokens(loaded->train, config.data.val_fraction, config.model.context);
  if (!dataset.ok()) return error(dataset.status().code(), "data.path " + config.data.path + ": " + dataset.status().message());
  std::string how = loaded->val ? "validation from its val files" : fmt::format("last {} held out for validation", config.data.val_fraction);
  return Corpus{std::move(*dataset), fmt::format("{}; vocabulary {}, {}", loaded->description, vocab, how), std::nullopt};
}

}  // namespace

Result<Corpus> load_corpus(const RunConfig& config) {
  if (config.data.format == DataFormat::kTokens) return load_token_corpus(config);
  std::string text, description;
  std::optional<double> floor;
  if (config.data.path.empty()) {
    const auto& syn = config.data.synthetic;
    data::SyntheticOptions o;
    o.words = syn.words;
    o.classes = syn.classes;
    o.zipf_exponent = syn.zipf;
    o.seed = static_cast<std::uint64_t>(syn.seed);
    data::SyntheticLanguage lang(o);
    text = lang.generate(syn.bytes, /*stream_seed=*/0);
    floor = lang.entropy_rate_nats_per_byte();
    description = fmt::format("synthetic language ({} words, {} classes, zipf {}, {} bytes; entropy floor {:.4f} nats/byte)",
                              syn.words, syn.classes, syn.zipf, syn.bytes, *floor);
  } else {
    auto loaded = data::load_corpus(config.data.path, static_cast<std::size_t>(config.data.max_bytes));
    if (!loaded.ok()) return data_path_error(loaded.status());
    text = std::move(*loaded);
    description = fmt::format("{} ({} bytes)", config.data.path, text.size());
    if (const double share = data::control_byte_share(text); share > data::kNotTextShare) {
      spdlog::warn("data.path {} does not look like text: {:.1f}% of its bytes are NUL or control characters (text has next to none, random "
                   "bytes about 11%); it is trained on as bytes all the same. A token file wants data.format = \"tokens\"",
                   config.data.path, 100 * share);
    }
  }
  auto dataset = data::Dataset::from_text(std::move(text), config.data.val_fraction, config.model.context);
  if (!dataset.ok()) return dataset.status();
  return Corpus{std::move(*dataset), description, floor};
}

Result<RunConfig> config_from_checkpoint(const fs::path& out_dir) {
  const fs::path path = out_dir / kCheckpointFile;
  auto state = read_checkpoint(path);
  if (!state.ok()) {
    if (state.status().code() == ErrorCode::kNotFound) {
      return error(ErrorCode::kInvalidArgument, "nothing to resume: " + path.string() + " does not exist (drop --resume to start a new run)");
    }
    return state.status();
  }
  RunConfig config;
  Status st = apply_toml(config, state->config_toml, path.string() + " (stored config)");
  if (!st.ok()) return st;
  return config;
}

namespace {

// The keys a resumed run may not change: they define the model and the data it was trained on.
const std::vector<std::string> kIdentityPrefixes = {"model.", "data."};

std::vector<std::string> identity_differences(const RunConfig& a, const RunConfig& b) {
  std::vector<std::string> diffs = config_differences(a, b, kIdentityPrefixes);
  // The inner optimizer's state is of its kind: another one cannot take it over.
  if (a.train.optimizer != b.train.optimizer) diffs.push_back("train.optimizer: " + name_of(a.train.optimizer) + " -> " + name_of(b.train.optimizer));
  // The size cap on corpora changes neither the model nor the data a run was given.
  diffs.erase(std::remove_if(diffs.begin(), diffs.end(), [](const std::string& d) { return d.rfind("data.max_bytes:", 0) == 0; }), diffs.end());
  return diffs;
}

std::string joined(const std::vector<std::string>& items) { return fmt::format("{}", fmt::join(items, ", ")); }

// The checks before a resume writes anything: the folder is a train run, its checkpoint reads, the
// checkpoint belongs to the folder's config and to this request's model and data.
Result<CheckpointState> checked_resume(const TrainRequest& req) {
  auto folder = RunFolder::open_to_resume(req.out_dir, RunKind::kTrain, /*claim=*/false);
  if (!folder.ok()) return folder.status();
  auto state = read_checkpoint(folder->file(kCheckpointFile));
  if (!state.ok()) return state.status().with_context("resuming");
  RunConfig stored;
  if (Status st = apply_toml(stored, state->config_toml, "the checkpoint's stored config"); !st.ok()) return st;
  if (auto text = read_text_file(folder->file(kConfigFile), 16 << 20); text.ok()) {
    RunConfig recorded;
    if (apply_toml(recorded, *text, kConfigFile).ok()) {
      if (auto diffs = identity_differences(recorded, stored); !diffs.empty()) {
        return error(ErrorCode::kInvalidArgument, folder->file(kCheckpointFile).string() + " belongs to another run than the folder's config.toml (" +
                                                      joined(diffs) + "): resume the folder that checkpoint came from, or start a new run");
      }
    }
  }
  if (auto diffs = identity_differences(stored, req.config); !diffs.empty()) {
    return error(ErrorCode::kInvalidArgument, "the checkpoint in " + req.out_dir.string() + " holds another model config or data (" + joined(diffs) +
                                                  "): a resumed run keeps its model and data; start a new run in another --out to change them");
  }
  if (state->step > req.config.train.steps) {
    return error(ErrorCode::kInvalidArgument, "the run in " + req.out_dir.string() + " is at step " + std::to_string(state->step) +
                                                  ", beyond train.steps = " + std::to_string(req.config.train.steps) +
                                                  ": a resume cannot go backwards (raise train.steps, or leave it as it was)");
  }
  return state;
}

}  // namespace

namespace {

// How a run starts: new (its folder checked), resumed from its checkpoint, or already done.
struct Start {
  std::optional<CheckpointState> resumed;
  std::optional<TrainOutcome> done;  // a finished run with its summary: nothing to do
};

Result<Start> start_or_resume(const TrainRequest& req) {
  Start start;
  if (!req.resume) {
    if (Status st = RunFolder::check_new(req.out_dir, RunKind::kTrain); !st.ok()) return st;
    return start;
  }
  auto state = checked_resume(req);
  if (!state.ok()) return state.status();
  // A finished run with its summary: nothing to do. (Without one, as after a crash between the last
  // checkpoint and the summary, the run goes on and writes it.)
  std::error_code ec;
  if (state->step == req.config.train.steps && fs::exists(req.out_dir / kSummaryFile, ec)) {
    TrainOutcome done;
    done.steps = state->step;
    done.tokens = state->tokens_seen;
    done.finished = true;
    done.nothing_to_do = true;
    start.done = done;
    return start;
  }
  start.resumed = std::move(*state);
  return start;
}

Status write_summary(const RunFolder& folder, const TrainOutcome& outcome, bool stepped, std::int64_t parameters, const std::string& data) {
  nlohmann::json summary = {{"steps", outcome.steps}, {"tokens", outcome.tokens}, {"parameters", parameters}, {"tok_per_s", outcome.tok_per_s}, {"data", data}};
  if (stepped) summary["final_train_loss"] = outcome.final_train_loss;
  if (outcome.final_val_loss) summary["final_val_loss"] = *outcome.final_val_loss;
  if (outcome.entropy_floor) summary["entropy_floor"] = *outcome.entropy_floor;
  return folder.write_text(kSummaryFile, summary.dump(2) + "\n");
}

Status record_step(MetricsWriter& metrics, const StepResult& r, std::int64_t tokens, double tok_per_s, std::optional<double> val, double time_s) {
  nlohmann::json rec = {{"step", r.step}, {"tokens", tokens}, {"train_loss", r.loss}, {"lr", r.lr}, {"tok_per_s", tok_per_s}, {"grad_norm", r.grad_norm},
                        {"time_s", time_s}};
  if (val) rec["val_loss"] = *val;
  return metrics.write(rec);
}

// Says what the model is and, resuming, restores the worker from its checkpoint (then let go).
Status announce_and_restore(Worker& worker, const RunConfig& config, std::optional<CheckpointState>& resumed, const fs::path& ckpt_path) {
  spdlog::info("model: {} layers, width {}, {} heads, context {}: {} parameters", config.model.layers, config.model.width, config.model.heads,
               config.model.context, worker.model().num_parameters());
  if (!resumed) return Status();
  if (Status st = worker.restore(*resumed); !st.ok()) return st.with_context("resuming");
  spdlog::info("resumed from {} at step {}", ckpt_path.string(), worker.steps_done());
  resumed.reset();
  return Status();
}

}  // namespace

Result<TrainOutcome> run_training(const TrainRequest& req, Clock& clock) {
  const RunConfig& config = req.config;
  if (Status st = validate(config); !st.ok()) return st;
  // A resume on files other than the run's is refused before any of them is loaded.
  Result<std::string> inputs = req.resume ? check_inputs(req.out_dir, config) : Result<std::string>(std::string());
  if (!inputs.ok()) return inputs.status();
  if (Status st = check_resources(config, /*workers=*/1); !st.ok()) return st;
  const fs::path ckpt_path = req.out_dir / kCheckpointFile;
  auto start = start_or_resume(req);
  if (!start.ok()) return start.status();
  if (start->done) return *start->done;
  std::optional<CheckpointState> resumed = std::move(start->resumed);
  auto corpus = load_corpus(config);
  if (!corpus.ok()) return corpus.status();
  spdlog::info("data: {}", corpus->description);
  if (!req.resume) {  // pinned as loaded
    auto pinned = pin_inputs(config);
    if (!pinned.ok()) return pinned.status();
    *inputs = inputs_json(*pinned);
  }
  auto folder = req.resume ? RunFolder::open_to_resume(req.out_dir, RunKind::kTrain) : RunFolder::create(req.out_dir, RunKind::kTrain);
  if (!folder.ok()) return folder.status();
  if (config.train.threads > 0) torch::set_num_threads(static_cast<int>(config.train.threads));

  // A new run records its config at once; a resumed one only once it has made progress, so that a
  // resume that fails at once leaves the folder as it was.
  const std::string config_toml = to_toml(config);
  bool config_written = false;
  auto write_config = [&]() -> Status {
    if (config_written) return Status();
    config_written = true;
    if (Status st = folder->write_text(kInputsFile, *inputs); !st.ok()) return st;
    return folder->write_text(kConfigFile, config_toml);
  };
  if (!req.resume) {
    if (Status st = write_config(); !st.ok()) return st;
  }

  Worker worker(config, corpus->dataset, /*rank=*/0, /*world=*/1, clock);
  if (Status st = announce_and_restore(worker, config, resumed, ckpt_path); !st.ok()) return st;

  auto metrics = MetricsWriter::open(req.out_dir / kMetricsFile,
                                     req.resume ? std::optional<std::int64_t>(worker.steps_done()) : std::nullopt);
  if (!metrics.ok()) return metrics.status();

  TrainOutcome outcome;
  outcome.entropy_floor = corpus->entropy_floor;
  const std::int64_t total = config.train.steps;
  const std::int64_t stop_at = std::min(total, req.stop_at.value_or(total));
  ProgressReporter progress(total, req.terminal);
  Stopwatch run_watch(clock);
  double compute_s = 0.0;
  std::int64_t tokens_this_run = 0;

  const std::int64_t steps_before = worker.steps_done();
  while (worker.steps_done() < stop_at) {
    if (req.stop != nullptr && req.stop->load()) {
      spdlog::warn("stop requested: checkpointing at step {}", worker.steps_done());
      break;
    }
    const StepResult r = worker.step();
    if (Status st = write_config(); !st.ok()) return st;
    compute_s += r.seconds;
    tokens_this_run += r.tokens;
    outcome.final_train_loss = r.loss;
    const double tok_per_s = r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0.0;

    std::optional<double> val;
    if (r.step % config.train.eval_every == 0 || r.step == total) {
      val = worker.evaluate();
      outcome.final_val_loss = val;
    }
    if (r.step % config.train.log_every == 0 || val || r.step == total) {
      if (Status st = record_step(*metrics, r, worker.tokens_seen(), tok_per_s, val, run_watch.elapsed_seconds()); !st.ok()) return st;
    }
    progress.update(r.step, r.loss, val, tok_per_s);
    if (config.train.checkpoint_every > 0 && r.step % config.train.checkpoint_every == 0 && r.step < stop_at) {
      if (Status st = write_checkpoint(ckpt_path, worker.checkpoint_state(config_toml)); !st.ok()) return st;
    }
  }
  progress.finish();
  const bool stepped = worker.steps_done() > steps_before;
  // A resume that made no step leaves its checkpoint as it was.
  if (stepped || !req.resume) {
    if (Status st = write_checkpoint(ckpt_path, worker.checkpoint_state(config_toml)); !st.ok()) return st;
  }

  outcome.steps = worker.steps_done();
  outcome.tokens = worker.tokens_seen();
  outcome.tok_per_s = compute_s > 0 ? static_cast<double>(tokens_this_run) / compute_s : 0.0;
  outcome.finished = worker.steps_done() >= total;

  if (outcome.finished) {
    if (!stepped) outcome.final_val_loss = worker.evaluate();  // a finished run whose summary was never written
    if (Status st = write_summary(*folder, outcome, stepped, worker.model().num_parameters(), corpus->description); !st.ok()) return st;
  }
  return outcome;
}

}  // namespace gossamer::train
