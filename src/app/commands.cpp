#include "app/args.h"
#include "app/stop.h"
#include "app/commands.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/clock.h"
#include "train/run.h"
#include "transport/secure_channel.h"

namespace gossamer::app {

void add_config_source(CLI::App& cmd, ConfigSource& source) {
  cmd.add_option("--config", source.config_file, "TOML run configuration (`gossamer config` prints one with every key)")->check(not_empty());
  cmd.add_option("--set", source.overrides, "override one key, e.g. --set model.layers=4 (repeatable)")->take_all();
}

Result<train::RunConfig> build_config(const ConfigSource& source, const train::RunConfig& base) {
  train::RunConfig config = base;
  if (!source.config_file.empty()) {
    if (Status st = train::apply_toml_file(config, source.config_file); !st.ok()) return st;
  }
  for (const auto& o : source.overrides) {
    if (Status st = train::apply_override(config, o); !st.ok()) return st;
  }
  if (Status st = train::validate(config); !st.ok()) return st;
  return config;
}

double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

int report_failure(const Status& status) {
  spdlog::error("{}", status.message());
  return status.code() == ErrorCode::kInvalidArgument ? 2 : 1;
}

void add_train_command(CLI::App& app, TrainArgs& args) {
  auto* cmd = app.add_subcommand("train", "Train one worker on this machine (inner loop, evaluation, checkpoints)");
  add_config_source(*cmd, args.source);
  cmd->add_option("--out", args.out, "run folder: config.toml, metrics.jsonl, checkpoint.bin, summary.json")->capture_default_str();
  cmd->add_flag("--resume", args.resume, "continue the run in --out from its checkpoint (its stored config, plus any --set)");
  cmd->add_option("--stop-at", args.stop_at, "stop with a checkpoint once this many steps are done (resume later)")->check(integer_in(1, std::int64_t{1} << 40));
}

int run_train_command(const TrainArgs& args) {
  train::TrainRequest req;
  if (args.resume) {
    if (!args.source.config_file.empty()) {
      return report_failure(error(ErrorCode::kInvalidArgument,
                                  "--resume takes the config stored in the checkpoint; drop --config (use --set to change a key)"));
    }
    auto config = train::config_from_checkpoint(args.out);
    if (!config.ok()) return report_failure(config.status());
    req.config = *config;
    for (const auto& o : args.source.overrides) {
      if (Status st = train::apply_override(req.config, o); !st.ok()) return report_failure(st);
    }
  } else {
    auto config = build_config(args.source);
    if (!config.ok()) return report_failure(config.status());
    req.config = *config;
  }
  req.out_dir = args.out;
  req.resume = args.resume;
  if (args.stop_at >= req.config.train.steps) {
    return report_failure(error(ErrorCode::kInvalidArgument, "--stop-at " + std::to_string(args.stop_at) + " is not before the run's end (train.steps = " +
                                                                 std::to_string(req.config.train.steps) + "): the run would end there anyway; drop "
                                                                 "--stop-at, or give a step below train.steps"));
  }
  if (args.stop_at > 0) req.stop_at = args.stop_at;
  req.terminal = ::isatty(STDERR_FILENO) != 0;
  req.stop = &install_graceful_stop();

  auto outcome = train::run_training(req, real_clock());
  if (!outcome.ok()) return report_failure(outcome.status());
  if (outcome->nothing_to_do) {
    spdlog::info("the run in {} is already at step {} of train.steps = {}: nothing to do, nothing changed "
                 "(to train further: gossamer train --out {} --resume --set train.steps=N)",
                 args.out, outcome->steps, req.config.train.steps, args.out);
    return 0;
  }
  if (!outcome->finished) {
    spdlog::info("stopped at step {}; continue with: gossamer train --out {} --resume", outcome->steps, args.out);
    return stop_requested() ? 130 : 0;
  }
  std::string line = fmt::format("done: {} steps, {} tokens, {:.0f} tok/s", outcome->steps, outcome->tokens, outcome->tok_per_s);
  if (outcome->final_val_loss) {
    line += fmt::format(", val loss {:.4f} nats/{}", *outcome->final_val_loss, req.config.data.format == train::DataFormat::kTokens ? "token" : "byte");
  }
  if (outcome->entropy_floor) {
    line += fmt::format(" (entropy floor {:.4f}, gap {:.4f})", *outcome->entropy_floor,
                        outcome->final_val_loss.value_or(0.0) - *outcome->entropy_floor);
  }
  spdlog::info("{}", line);
  spdlog::info("results in {}/ (metrics.jsonl, summary.json, checkpoint.bin)", args.out);
  return 0;
}

void add_config_command(CLI::App& app, ConfigArgs& args) {
  auto* cmd = app.add_subcommand("config", "Print the effective run configuration as TOML (defaults, --config, --set)");
  add_config_source(*cmd, args.source);
  cmd->add_flag("--keys", args.keys, "list every key with its type, allowed values and meaning")
      ->excludes(cmd->get_option("--config"))
      ->excludes(cmd->get_option("--set"));
}

int run_config_command(const ConfigArgs& args) {
  if (args.keys) {
    for (const auto& k : train::config_keys()) std::cout << fmt::format("{:<26} {}; {}\n", k.name, k.allowed, k.help);
    return 0;
  }
  auto config = build_config(args.source);
  if (!config.ok()) return report_failure(config.status());
  std::cout << train::to_toml(*config);
  return 0;
}

}  // namespace gossamer::app

namespace gossamer::app {

void add_keygen_command(CLI::App& app, KeygenArgs& args) {
  auto* cmd = app.add_subcommand("keygen", "Write a new run key: every peer of a secured run is given the same file (--key)");
  cmd->add_option("--out", args.out, "where to write the key (created with mode 0600)")->required();
  cmd->add_flag("--force", args.force, "replace an existing file");
}

int run_keygen_command(const KeygenArgs& args) {
  // The rules of every file a command writes (app/args.h): a name, an existing folder, not a run's
  // own file nor a device, another file only with --force (peers holding the old key are then refused).
  if (Status st = check_output_file(args.out, args.force); !st.ok()) return report_failure(st);
  if (Status st = transport::write_run_key(args.out, transport::generate_run_key()); !st.ok()) return report_failure(st);
  spdlog::info("wrote a new run key to {}; copy it to every peer of the run over a trusted channel", args.out);
  return 0;
}

}  // namespace gossamer::app
