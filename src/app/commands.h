// The `gossamer` subcommands: each adds its options to the CLI and runs from the parsed arguments,
// returning the process exit code (0 ok, 1 runtime failure, 2 bad usage or configuration).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "app/args.h"
#include "core/status.h"
#include "train/config.h"

namespace gossamer::app {

// Options shared by commands that take a run configuration.
struct ConfigSource {
  std::string config_file;
  std::vector<std::string> overrides;
};
void add_config_source(CLI::App& cmd, ConfigSource& source);
// Defaults (`base`), then the file, then the overrides, then validation.
[[nodiscard]] Result<train::RunConfig> build_config(const ConfigSource& source, const train::RunConfig& base = {});
// The median of benchmark samples (the upper one for an even count).
double median(std::vector<double> samples);
// Prints a Status for the user and returns the exit code it maps to.
int report_failure(const Status& status);

struct TrainArgs {
  ConfigSource source;
  std::string out = "runs/train";
  bool resume = false;
  std::int64_t stop_at = 0;
};
void add_train_command(CLI::App& app, TrainArgs& args);
int run_train_command(const TrainArgs& args);

struct ConfigArgs {
  ConfigSource source;
  bool keys = false;
};
void add_config_command(CLI::App& app, ConfigArgs& args);
int run_config_command(const ConfigArgs& args);

struct KeygenArgs {
  std::string out;
  bool force = false;
};
void add_keygen_command(CLI::App& app, KeygenArgs& args);
int run_keygen_command(const KeygenArgs& args);

struct PeerArgs {
  std::string listen = "127.0.0.1:0";
  std::vector<std::string> join;
  std::string advertise;
  std::int64_t link_port = -1;  // -1: the gossip port + 1
  bool outbound_only = false;
  ConfigSource source;
  std::string key;
  std::string out = "runs/peer";
  std::int64_t wait_for = 1;
  std::string device;  // empty: the run's train.device
  double join_timeout_s = 60;
  std::string shape;
  double dead_after_s = 1.0;
  bool resume = false;
  std::int64_t crash_at_step = 0;  // 0: never
  std::int64_t crash_mid_round = 0;  // 0: never
  double throttle = 1.0;           // > 1: every inner step takes this many times as long (a slower machine)
  OptionScopes scopes{{{"first", "peer without --join"}, {"joiner", "peer --join"}}};
};
void add_peer_command(CLI::App& app, PeerArgs& args);
int run_peer_command(const PeerArgs& args);

// A fresh folder name for commands whose --out is optional: "runs/<command>-YYYYmmdd-HHMMSS".
std::string dated_out(const std::string& command);

struct SimArgs {
  ConfigSource source;
  std::string out;  // given, or dated_out("sim")
  const CLI::Option* out_option = nullptr;
  double target_loss = 0;  // 0: the default target
  bool pipeline = false;   // simulate the [pipeline] config instead of outer.method
};
void add_sim_command(CLI::App& app, SimArgs& args);
int run_sim_command(const SimArgs& args);

struct CompareArgs {
  ConfigSource source;
  std::string out;  // given, or dated_out("compare")
  const CLI::Option* out_option = nullptr;
  std::vector<std::string> methods = optim::default_compare_methods();  // the method table's rows marked for it
  double target_loss = 0;
};
// The built-in comparison: 2 workers behind 100 Mbit/s, 80 ms links, a small GPT on the synthetic
// language, each method's period chosen so the whole run takes a few minutes on two cores.
train::RunConfig compare_defaults();
void add_compare_command(CLI::App& app, CompareArgs& args);
int run_compare_command(const CompareArgs& args);

struct PlanArgs {
  double params = 1e9;
  int layers = 24;
  double step_time = 0.1;
  int workers = 2;
  int inner_steps = 100;
  int fragment_layers = 3;
  int overlap = 1;
  std::string codec = "bf16";
  std::string streaming_codec = "fp4_e3m0";
  double utilization = 0.95;
  double backward_overlap = 0.0;
  double latency_ms = 0.0;
  bool table4 = false;
  bool memory = false;  // memory per worker of the config's model for each method, instead of bandwidth
  ConfigSource source;
  OptionScopes scopes{{{"bandwidth", "plan"}, {"memory", "plan --memory"}, {"table4", "plan --table4"}}};
};
void add_plan_command(CLI::App& app, PlanArgs& args);
int run_plan_command(const PlanArgs& args);

struct PipelineArgs {
  ConfigSource source;
  std::string out;  // given, or dated_out("pipeline")
  const CLI::Option* out_option = nullptr;
  std::vector<int> omit;  // stages left out in the omission evaluation at the end
  int node = -1;          // >= 0: host this node only, the others in other processes
  std::vector<std::string> addresses;  // every node's host:port, with --node
  std::string listen;     // where this node listens, when not its address in --addresses
  std::string key;
  std::string shape;
  double rejoin_timeout_s = 10;
};
void add_pipeline_command(CLI::App& app, PipelineArgs& args);
int run_pipeline_command(const PipelineArgs& args);

struct ScheduleArgs {
  int nodes = 20;
  int stages = 6;
  int path_length = 4;
  int memory = 3;
  int mbs_per_origin = 6;
  int mbs_per_agent = 2;
  std::string network = "geo";
  bool fix_nl_ldn = false;
  double latency_ms = 50;
  double bandwidth_mbit = 1000;
  double forward_s = 1.76;
  double activation_mib = 32;
  double hop_overhead_s = 0.35;
  std::uint64_t seed = 5;
  int gcma_trials = 8000;
  std::string out;
  const CLI::Option* out_option = nullptr;
  bool force = false;
  OptionScopes scopes{{{"geo", "--network geo"}, {"uniform", "--network uniform"}}};
};
void add_schedule_command(CLI::App& app, ScheduleArgs& args);
int run_schedule_command(const ScheduleArgs& args);

struct BenchArgs {
  std::string what = "train";
  ConfigSource source;
  std::int64_t steps = 20;
  std::int64_t rounds = 11;
  // bench quant
  std::int64_t elements = 1 << 22;
  std::int64_t block = 128;
  double min_time = 0.3;
  bool naive = true;
  bool bf16 = true;  // bench model: also time bf16 (slow on CPUs without bf16 instructions)
  bool bf16_only = false;    // bench model: only the bf16 GPT (a GPU check's inner loop)
  std::string device = "cpu";  // bench quant: where the values live
  // bench transport
  std::int64_t message_mib = 64;
  std::int64_t gossip_peers = 32;
  bool encrypted = true;  // also measure encrypted links
  bool relay = false;      // transport: direct against relayed links
  // bench allreduce
  std::int64_t ranks = 4;
  std::int64_t elements_allreduce = 16 << 20;
  // bench grid
  std::vector<std::int64_t> sim_ranks{64, 256};
  std::int64_t grid_values = 34688;  // examples/configs/sim_256_churn.toml's model
  std::string network = "wan-100m-80ms";
  std::string codec = "fp32";
  OptionScopes scopes{{{"train", "bench train"}, {"model", "bench model"}, {"memory", "bench memory"}, {"quant", "bench quant"},
                       {"transport", "bench transport"}, {"transport-relay", "bench transport --relay"}, {"allreduce", "bench allreduce"}, {"grid", "bench grid"}}};
};
void add_bench_command(CLI::App& app, BenchArgs& args);
int run_bench_command(const BenchArgs& args);
int bench_quant(const BenchArgs& args);
int bench_model(const BenchArgs& args);
int bench_memory(const BenchArgs& args);
int bench_transport(const BenchArgs& args);
int bench_allreduce(const BenchArgs& args);
int bench_grid(const BenchArgs& args);


struct SampleArgs {
  std::string from;
  std::string prompt;
  std::string prompt_tokens;
  std::int64_t tokens = 200;
  double temperature = 0.8;
  std::int64_t top_k = 0;
  std::uint64_t seed = 1;
};
void add_sample_command(CLI::App& app, SampleArgs& args);
int run_sample_command(const SampleArgs& args);

struct ExportArgs {
  std::string from;
  std::string format = "safetensors";
  std::string out;
  bool force = false;
};
void add_export_command(CLI::App& app, ExportArgs& args);
int run_export_command(const ExportArgs& args);

}  // namespace gossamer::app
