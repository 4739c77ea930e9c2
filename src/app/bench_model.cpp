// `gossamer bench model`: one model three ways, interleaved in one process so machine noise hits
// each alike: the built-in GPT in fp32, the same GPT in bf16 (autocast), and the same GPT scripted
// to TorchScript (model/gpt_script.h) trained as a user's module (model.kind = torchscript). Prints
// tokens/s of each and the ratios bf16 / fp32 and TorchScript / built-in.
//
// `gossamer bench memory`: the peak memory one worker of the config's method takes (resident set
// growth while it trains a few steps and outer rounds, alone) against train/memory.h's prediction.
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "app/commands.h"
#include "core/clock.h"
#include "model/gpt_script.h"
#include "optim/outer_optimizer.h"
#include "train/memory.h"
#include "train/outer.h"
#include "train/run.h"
#include "train/worker.h"

namespace gossamer::app {

namespace {

double status_kib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1));
  }
  return 0;
}

// Resets the peak resident set (VmHWM) to the current one, so the next peak is this phase's.
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace

int bench_model(const BenchArgs& args) {
  auto config = build_config(args.source);
  if (!config.ok()) return report_failure(config.status());
  train::RunConfig cfg = *config;
  if (cfg.model.kind != train::ModelKind::kGpt) {
    return report_failure(error(ErrorCode::kInvalidArgument, "bench model times the built-in GPT of model.* three ways (fp32, bf16, and scripted to TorchScript); "
                                                             "model.kind = " + train::name_of(cfg.model.kind) + " would not be used: drop it (`gossamer bench memory` "
                                                             "measures a TorchScript model's memory)"));
  }
  cfg.train.steps = 1LL << 40;
  cfg.train.warmup_steps = 0;
  if (cfg.train.threads > 0) torch::set_num_threads(static_cast<int>(cfg.train.threads));
  if (Status st = train::check_resources(cfg, args.bf16 ? 3 : 2, ""); !st.ok()) return report_failure(st);
  auto corpus = train::load_corpus(cfg);
  if (!corpus.ok()) return report_failure(corpus.status());

  // The built-in GPT first; the TorchScript variant scripts its very weights, so all start alike.
  struct Variant {
    const char* name;
    std::unique_ptr<train::Worker> worker;
    std::vector<double> rates, ratios;  // tok/s per round, and per round against the first variant
  };
  Clock& clock = real_clock();
  std::vector<Variant> variants;
  if (!args.bf16_only) variants.push_back({"gpt fp32", std::make_unique<train::Worker>(cfg, corpus->dataset, 0, 1, clock), {}, {}});
  if (args.bf16 || args.bf16_only) {
    train::RunConfig bf16 = cfg;
    bf16.train.precision = train::Precision::kBf16;
    variants.push_back({"gpt bf16", std::make_unique<train::Worker>(bf16, corpus->dataset, 0, 1, clock), {}, {}});
  }
  if (!args.bf16_only) {
    const auto script = std::filesystem::temp_directory_path() / fmt::format("gossamer_bench_{}.pt", ::getpid());
    model::script_gpt(dynamic_cast<model::Gpt&>(variants.front().worker->model())).save(script.string());
    train::RunConfig ts = cfg;
    ts.model.kind = train::ModelKind::kTorchScript;
    ts.model.path = script.string();
    variants.push_back({"torchscript fp32", std::make_unique<train::Worker>(ts, corpus->dataset, 0, 1, clock), {}, {}});
    std::filesystem::remove(script);
  }

  const double params = static_cast<double>(variants.front().worker->model().num_parameters());
  const double tokens = static_cast<double>(args.steps * cfg.train.batch_size * cfg.model.context);
  fmt::print("bench model: {:.1f}M parameters ({} layers, width {}, vocabulary {}), batch {} x {} tokens, {} steps per block, {} rounds, {} threads, "
             "device {}\n",
             params / 1e6, cfg.model.layers, cfg.model.width, train::vocab_size(cfg), cfg.train.batch_size, cfg.model.context, args.steps,
             args.rounds, torch::get_num_threads(), cfg.train.device);
  for (auto& v : variants) (void)v.worker->step();  // warm-up
  const std::size_t n = variants.size();
  for (std::int64_t round = 0; round < args.rounds; ++round) {
    for (std::size_t k = 0; k < n; ++k) {
      auto& v = variants[(k + static_cast<std::size_t>(round)) % n];  // rotate the order
      Stopwatch watch(clock);
      for (std::int64_t s = 0; s < args.steps; ++s) (void)v.worker->step();
      v.rates.push_back(tokens / watch.elapsed_seconds());
    }
    std::string line = fmt::format("  round {}:", round + 1);
    for (std::size_t i = 0; i < n; ++i) {
      variants[i].ratios.push_back(variants[i].rates.back() / variants.front().rates.back());
      line += fmt::format("{} {} {:.1f} tok/s", i ? "," : "", variants[i].name, variants[i].rates.back());
    }
    fmt::print("{}\n", line);
  }
  for (const auto& v : variants) fmt::print("median {}: {:.1f} tok/s ({:.2f} GFLOP/s)\n", v.name, median(v.rates), 6.0 * params * median(v.rates) / 1e9);
  for (std::size_t i = 1; i < n; ++i) {
    const auto& r = variants[i].ratios;
    fmt::print("ratio {} / {}: median {:.3f} (per round min {:.3f}, max {:.3f})\n", variants[i].name, variants.front().name, median(r),
               *std::min_element(r.begin(), r.end()), *std::max_element(r.begin(), r.end()));
  }
  return 0;
}

int bench_memory(const BenchArgs& args) {
  auto config = build_config(args.source);
  if (!config.ok()) return report_failure(config.status());
  train::RunConfig cfg = *config;
  if (cfg.train.threads > 0) torch::set_num_threads(static_cast<int>(cfg.train.threads));
  if (Status st = train::check_resources(cfg, 1); !st.ok()) return report_failure(st);
  auto outer_config = train::outer_config(cfg);
  if (!outer_config.ok()) return report_failure(outer_config.status());
  auto corpus = train::load_corpus(cfg);
  if (!corpus.ok()) return report_failure(corpus.status());
  // Let LibTorch's thread pools and allocator settle before the baseline.
  (void)torch::matmul(torch::randn({64, 64}), torch::randn({64, 64}));
  const double before = status_kib("VmRSS");
  reset_peak();
  Clock& clock = real_clock();
  train::Worker worker(cfg, corpus->dataset, 0, 1, clock);
  optim::Group alone;
  alone.clock = &clock;
  alone.peers.resize(1);
  auto setup = optim::make_outer_optimizer(*outer_config, train::param_blocks(worker.model()), std::move(alone));
  if (!setup.ok()) return report_failure(setup.status());
  train::LoopOptions lo;
  lo.steps = args.steps;
  lo.eval_every = 0;
  lo.evaluate = false;
  lo.round_timeout = std::chrono::seconds(600);
  train::LoopHooks hooks;
  hooks.keep_going = [&](std::int64_t next) {
    spdlog::info("step {}/{}: peak resident set +{:.0f} MB", next - 1, args.steps, (status_kib("VmHWM") - before) * 1024 / 1e6);
    return true;
  };
  auto account = train::run_worker_loop(worker, *setup, clock, lo, hooks);
  if (!account.ok()) return report_failure(account.status());
  const double measured = (status_kib("VmHWM") - before) * 1024;
  // A TorchScript module's parameters are counted in it (its architecture is not known: the
  // prediction's activations are the logits' share only, train/memory.h).
  const bool scripted = cfg.model.kind != train::ModelKind::kGpt;
  const auto e = train::estimate_memory(cfg, 1, scripted ? std::optional<double>(static_cast<double>(worker.model().num_parameters())) : std::nullopt);
  const double predicted = e.state_bytes + e.activation_bytes;
  fmt::print("bench memory: {} ({:.1f}M parameters{}), batch {} x {}, {} steps\n", train::name_of(cfg.outer.method), e.parameters / 1e6,
             scripted ? ", a TorchScript module: activations predicted for its logits only" : "", cfg.train.batch_size, cfg.model.context, args.steps);
  fmt::print("predicted {} per worker (state {} + activations {}); measured peak growth {}; measured / predicted {:.3f}\n",
             train::format_bytes(predicted), train::format_bytes(e.state_bytes), train::format_bytes(e.activation_bytes),
             train::format_bytes(measured), measured / predicted);
  return 0;
}

}  // namespace gossamer::app
