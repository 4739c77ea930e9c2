// gossamer: the command-line entry point.
//   gossamer train   train one worker on one machine
//   gossamer peer    train as one peer of a run across machines
//   gossamer sim     simulate one method with many workers over an emulated network
//   gossamer compare compare methods in simulation and write a report
//   gossamer plan    bandwidth each method needs for a target compute utilization
//   gossamer pipeline train the GPT as a SkipPipe pipeline, in this process or one node per process
//   gossamer schedule SkipPipe: stages per node and micro-batch paths, the modes side by side
//   gossamer config  print the effective configuration, or every key with its meaning
//   gossamer keygen  write a run key that secures every link of a run
//   gossamer sample  generate text from a trained run's model
//   gossamer export  write a trained run's weights for PyTorch (safetensors, TorchScript)
//   gossamer bench   measure Gossamer against references (LibTorch, memcpy, plain sockets)
// Exit codes: 0 done, 1 failed at run time, 2 bad input (usage, configuration, addresses, a
// configuration that cannot fit in memory), 130 interrupted (Ctrl-C or SIGTERM, after a checkpoint).
#include <malloc.h>

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "app/commands.h"
#include "app/stop.h"
#include "core/log.h"
#include "core/text.h"
#include "optim/gloo_sync.h"

namespace {

// The first word that is neither an option nor an option's value: what the user meant as the command.
std::optional<std::string> first_word(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--log-level") {
      ++i;
      continue;
    }
    if (!a.empty() && a[0] != '-') return a;
  }
  return std::nullopt;
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// glibc's heaps tuned for buffers that come and go every round.
void tune_malloc() {
#ifdef __GLIBC__
  // Large buffers (encoded fragments, received messages, tensors) come and go every round. glibc's
  // default hands each one fresh mmapped pages, zero-filled by the kernel on first touch and unmapped
  // on free; keeping them in heaps that are not trimmed lets the next round reuse the same pages. A
  // profile of the all-reduce put a third of its time in those page faults (docs/benchmarks.md has
  // the figures, together with the collective's own changes). Limit: a heap of a thread other than
  // the main one holds at most 64 MiB, so larger blocks allocated there are still mmapped.
  mallopt(M_ARENA_MAX, 2);
  // 32 MiB, not more: a model's own weights and activations then stay out of the heaps, which keep
  // what they hold. MALLOC_MMAP_THRESHOLD_ in the environment (glibc's own knob) takes precedence.
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

// Every command's options, and the command that ran.
struct Commands {
  gossamer::app::TrainArgs train;
  gossamer::app::ConfigArgs config;
  gossamer::app::KeygenArgs keygen;
  gossamer::app::PeerArgs peer;
  gossamer::app::SimArgs sim;
  gossamer::app::CompareArgs compare;
  gossamer::app::PlanArgs plan;
  gossamer::app::PipelineArgs pipeline;
  gossamer::app::ScheduleArgs schedule;
  gossamer::app::BenchArgs bench;
  gossamer::app::SampleArgs sample;
  gossamer::app::ExportArgs exporter;

  void add(CLI::App& app) {
    gossamer::app::add_train_command(app, train);
    gossamer::app::add_config_command(app, config);
    gossamer::app::add_keygen_command(app, keygen);
    gossamer::app::add_peer_command(app, peer);
    gossamer::app::add_sim_command(app, sim);
    gossamer::app::add_compare_command(app, compare);
    gossamer::app::add_plan_command(app, plan);
    gossamer::app::add_pipeline_command(app, pipeline);
    gossamer::app::add_schedule_command(app, schedule);
    gossamer::app::add_bench_command(app, bench);
    gossamer::app::add_sample_command(app, sample);
    gossamer::app::add_export_command(app, exporter);
  }

  int run(const CLI::App& app) {
    if (app.got_subcommand("train")) return gossamer::app::run_train_command(train);
    if (app.got_subcommand("peer")) return gossamer::app::run_peer_command(peer);
    if (app.got_subcommand("sim")) return gossamer::app::run_sim_command(sim);
    if (app.got_subcommand("compare")) return gossamer::app::run_compare_command(compare);
    if (app.got_subcommand("plan")) return gossamer::app::run_plan_command(plan);
    if (app.got_subcommand("schedule")) return gossamer::app::run_schedule_command(schedule);
    if (app.got_subcommand("pipeline")) return gossamer::app::run_pipeline_command(pipeline);
    if (app.got_subcommand("config")) return gossamer::app::run_config_command(config);
    if (app.got_subcommand("bench")) return gossamer::app::run_bench_command(bench);
    if (app.got_subcommand("keygen")) return gossamer::app::run_keygen_command(keygen);
    if (app.got_subcommand("sample")) return gossamer::app::run_sample_command(sample);
    if (app.got_subcommand("export")) return gossamer::app::run_export_command(exporter);
    return 2;
  }
};

// Parses the command line; an exit code when the parse ends the program (help, version, an error).
std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (app.get_subcommands().empty()) {
      if (auto typed = first_word(argc, argv)) {
        std::vector<std::string> names;
        for (const auto* sub : app.get_subcommands({})) names.push_back(sub->get_name());
        std::cerr << "gossamer: unknown command '" << *typed << "'";
        if (auto best = gossamer::closest_match(*typed, names)) std::cerr << "; did you mean '" << *best << "'?";
        std::cerr << " (`gossamer --help` lists the commands)\n";
        return 2;
      }
    }
    std::cerr << "gossamer: " << e.what() << "\n(run `gossamer --help` or `gossamer <command> --help`)\n";
    return 2;
  }
  return std::nullopt;
}

// Runs the command, turning what escapes it into a message and an exit code.
int run_guarded(Commands& commands, const CLI::App& app, bool debug) {
  try {
    return commands.run(app);
  } catch (const std::bad_alloc&) {
    spdlog::error("out of memory: an allocation failed; make the model, batch or corpus smaller, or run fewer workers on this machine");
    return 1;
  } catch (const c10::Error& e) {
    const std::string what = debug ? e.what() : e.what_without_backtrace();
    if (what.find("can't allocate memory") != std::string::npos || what.find("out of memory") != std::string::npos) {
      spdlog::error("out of memory: {}; make the model, batch or corpus smaller, or run fewer workers on this machine", first_line(what));
    } else {
      spdlog::error("internal error: {} (please report it with the command you ran{})", debug ? what : first_line(what),
                    debug ? "" : "; --debug prints the whole message");
    }
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("internal error: {} (please report it with the command you ran)", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  tune_malloc();
  CLI::App app{"Gossamer: train neural networks across machines joined by slow, unreliable links"};
  app.require_subcommand(1);
  app.fallthrough();  // global options (--log-level) may follow the subcommand
  // The version, and what this build can do that depends on the LibTorch it was built against.
  app.set_version_flag("--version", std::string("gossamer ") + GOSSAMER_VERSION + "\nLibTorch " + TORCH_VERSION + ", CUDA " +
                                        (torch::cuda::is_available() ? "available" : "absent") + "; ddp engines built: links" +
                                        (gossamer::optim::gloo_available() ? ", gloo" : "") + (gossamer::optim::nccl_available() ? ", nccl" : ""));
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")->capture_default_str();
  bool debug = false;
  app.add_flag("--debug", debug, "on an internal error, print the full message with its stack trace");
  Commands commands;
  commands.add(app);
  if (auto exit_code = parse(app, argc, argv)) return *exit_code;
  if (auto st = gossamer::init_logging(log_level); !st.ok()) {
    std::cerr << "gossamer: " << st.message() << "\n";
    return 2;
  }
  if (!app.got_subcommand("train") && !app.got_subcommand("peer")) {
    // Train and peer stop gracefully (app/stop.h); pipeline switches to it once it trains.
    gossamer::app::install_immediate_stop();
  }
  // A closed pipe (`gossamer config | head -1`) is a write error, seen below, not a signal.
  std::signal(SIGPIPE, SIG_IGN);
  const int code = run_guarded(commands, app, debug);
  // What went to standard output must have got there: a full disk or a closed pipe is a failure.
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    const int e = errno;
    if (e != EPIPE) spdlog::error("cannot write the output: {}", std::strerror(e));
    return code == 0 ? 1 : code;
  }
  return code;
}
