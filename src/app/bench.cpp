// `gossamer bench train`: the framework's inner loop (Worker::step: sampler, schedule, clipping,
// AdamW param groups, accounting) against a bare LibTorch loop of the same model, interleaved in one
// process so machine noise hits both alike. Prints tokens/s of each, their ratio and GFLOP/s
// (6 x parameters x tokens / s).
#include <torch/torch.h>

#include <algorithm>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "app/args.h"
#include "app/commands.h"
#include "core/clock.h"
#include "train/memory.h"
#include "train/run.h"
#include "train/worker.h"
#include "transport/link_profile.h"

namespace gossamer::app {

void add_bench_command(CLI::App& app, BenchArgs& args) {
  auto* cmd = app.add_subcommand("bench", "Measure Gossamer against a reference (what: train, model, memory, quant, transport, allreduce, grid)");
  cmd->add_option("what", args.what,
                  "train: inner loop vs bare LibTorch; model: the GPT in fp32, bf16 and as TorchScript; memory: one worker's peak memory "
                  "vs the prediction; quant: codec throughput vs memcpy and naive LibTorch ops; "
                  "transport: link goodput vs plain sockets, small-frame rate; allreduce: our collective vs Gloo; grid: one all-reduce "
                  "across many simulated peers, full mesh against grid")
      ->check(CLI::IsMember({"train", "model", "memory", "quant", "transport", "allreduce", "grid"}))
      ->capture_default_str();
  add_config_source(*cmd, args.source);
  auto& sc = args.scopes;
  sc.add(cmd->get_option("--config"), {"train", "model", "memory"});
  sc.add(cmd->get_option("--set"), {"train", "model", "memory"});
  sc.add(cmd->add_option("--steps", args.steps, "train, model, memory: steps per timed block (memory: steps trained)")->check(integer_in(1, 1000000))->capture_default_str(),
         {"train", "model", "memory"});
  sc.add(cmd->add_option("--rounds", args.rounds, "train, model, transport, allreduce: interleaved rounds (the median is reported)")
             ->check(integer_in(1, 10000))
             ->capture_default_str(),
         {"train", "model", "transport", "transport-relay", "allreduce"});
  sc.add(cmd->add_option("--elements", args.elements, "quant: fp32 values per buffer")->check(integer_in(1, std::int64_t{1} << 31))->capture_default_str(), {"quant"});
  sc.add(cmd->add_option("--block", args.block, "quant: elements per scale block")->check(integer_in(1, 1 << 20))->capture_default_str(), {"quant"});
  sc.add(cmd->add_option("--min-time", args.min_time, "quant: seconds per measurement")->check(number_in(0.0, 3600.0, true))->capture_default_str(), {"quant"});
  sc.add(cmd->add_flag("!--no-naive", args.naive, "quant: skip the naive LibTorch-ops rows"), {"quant"});
  sc.add(cmd->add_flag("!--no-bf16", args.bf16, "model: skip the bf16 rows (slow on CPUs without bf16 instructions)"), {"model"});
  sc.add(cmd->add_flag("--bf16-only", args.bf16_only, "model: time the GPT in bf16 alone (no fp32 or TorchScript rows: a GPU's inner loop)"), {"model"});
  sc.add(cmd->add_option("--device", args.device,
                         "quant: where the values live (cpu, cuda, cuda:N); on a GPU the codecs run after a copy to the host, each row beside that copy alone, "
                         "and the naive rows run LibTorch's ops on the GPU")
             ->capture_default_str(),
         {"quant"});
  sc.add(cmd->add_option("--message-mib", args.message_mib, "transport: message size in MiB")->check(integer_in(1, 1024))->capture_default_str(), {"transport", "transport-relay"});
  sc.add(cmd->add_option("--ranks", args.ranks, "allreduce: in-process ranks")->check(integer_in(2, 16))->capture_default_str(), {"allreduce"});
  sc.add(cmd->add_option("--values", args.elements_allreduce, "allreduce: fp32 values in the tensor")->check(integer_in(1, std::int64_t{1} << 31))->capture_default_str(),
         {"allreduce"});
  sc.add(cmd->add_option("--sim-ranks", args.sim_ranks, "grid: simulated peer counts")->check(integer_in(2, 4096))->delimiter(',')->capture_default_str(), {"grid"});
  sc.add(cmd->add_option("--grid-values", args.grid_values, "grid: fp32 values all-reduced")->check(integer_in(1, std::int64_t{1} << 26))->capture_default_str(), {"grid"});
  sc.add(cmd->add_option("--network", args.network,
                         "grid: the simulated links, a link profile (" + fmt::format("{}", fmt::join(transport::link_profile_names(), ", ")) +
                             "; loopback costs no time and is refused)")
             ->capture_default_str(),
         {"grid"});
  sc.add(cmd->add_option("--codec", args.codec, "grid: the codec on the wire")->capture_default_str(), {"grid"});
  sc.add(cmd->add_flag("!--insecure", args.encrypted, "transport: measure plain links only (no encrypted rows)"), {"transport"});
  sc.add(cmd->add_flag("--relay", args.relay, "transport: two peers linked directly and through a relay (goodput ratio, added round trip)"), {"transport", "transport-relay"});
  sc.add(cmd->add_option("--gossip-peers", args.gossip_peers, "transport: gossip nodes for the convergence time")->check(integer_in(2, 512))->capture_default_str(),
         {"transport"});
}

namespace {

int bench_train(const BenchArgs& args) {
  auto config = build_config(args.source);
  if (!config.ok()) return report_failure(config.status());
  train::RunConfig cfg = *config;
  if (cfg.model.kind != train::ModelKind::kGpt) {
    return report_failure(error(ErrorCode::kInvalidArgument, "bench train sets the inner loop beside a bare LibTorch loop of the built-in GPT of model.*; "
                                                             "model.kind = " + train::name_of(cfg.model.kind) + " would time two different models: drop it (`gossamer bench "
                                                             "memory` measures a TorchScript model's memory)"));
  }
  if (train::muon_inner(cfg)) {
    return report_failure(error(ErrorCode::kInvalidArgument, "bench train sets the inner loop beside a bare LibTorch loop with AdamW; " +
                                                             std::string(cfg.train.optimizer == train::InnerOptimizer::kMuon ? "train.optimizer = muon" : "outer.method = muloco (Muon's inner steps)") +
                                                             " would time two different optimizers: drop it"));
  }
  if (Status st = train::check_resources(cfg, /*workers=*/2, ""); !st.ok()) return report_failure(st);  // the framework's model and the bare one
  cfg.train.steps = 1LL << 40;  // keep the schedule in its plateau-free cosine regime; we only time steps
  cfg.train.warmup_steps = 0;
  if (cfg.train.threads > 0) torch::set_num_threads(static_cast<int>(cfg.train.threads));
  auto corpus = train::load_corpus(cfg);
  if (!corpus.ok()) return report_failure(corpus.status());

  Clock& clock = real_clock();
  train::Worker worker(cfg, corpus->dataset, 0, 1, clock);

  // The bare loop: same model class and size, AdamW with one group, batches prepared up front.
  model::Gpt bare(train::gpt_config(cfg, 0));
  torch::optim::AdamW bare_opt(bare.parameters(), torch::optim::AdamWOptions(cfg.train.lr)
                                                      .betas({cfg.train.beta1, cfg.train.beta2})
                                                      .weight_decay(cfg.train.weight_decay));
  data::ShardSampler sampler(corpus->dataset.train(), 0, 1, cfg.train.batch_size, cfg.model.context, 7);
  std::vector<data::Batch> batches;
  for (std::int64_t i = 0; i < args.steps; ++i) batches.push_back(sampler.batch(i));
  auto bare_params = bare.parameters();
  auto bare_step = [&](const data::Batch& b) {
    bare_opt.zero_grad();
    auto loss = bare.loss(b.tokens, b.targets);
    loss.backward();
    torch::nn::utils::clip_grad_norm_(bare_params, cfg.train.grad_clip);
    bare_opt.step();
    return loss.item<double>();
  };

  const double tokens_per_block = static_cast<double>(args.steps * cfg.train.batch_size * cfg.model.context);
  const double params = static_cast<double>(worker.model().num_parameters());
  fmt::print("bench train: {} parameters, batch {} x {} tokens, {} steps per block, {} rounds, {} threads\n",
             static_cast<std::int64_t>(params), cfg.train.batch_size, cfg.model.context, args.steps, args.rounds,
             torch::get_num_threads());
  // Warm-up: one block of each.
  for (std::int64_t i = 0; i < std::min<std::int64_t>(3, args.steps); ++i) {
    (void)worker.step();
    (void)bare_step(batches[static_cast<std::size_t>(i)]);
  }
  std::vector<double> fw, bw;
  for (std::int64_t round = 0; round < args.rounds; ++round) {
    auto time_framework = [&] {
      Stopwatch w(clock);
      for (std::int64_t i = 0; i < args.steps; ++i) (void)worker.step();
      fw.push_back(tokens_per_block / w.elapsed_seconds());
    };
    auto time_bare = [&] {
      Stopwatch w(clock);
      for (const auto& b : batches) (void)bare_step(b);
      bw.push_back(tokens_per_block / w.elapsed_seconds());
    };
    if (round % 2 == 0) {
      time_framework();
      time_bare();
    } else {
      time_bare();
      time_framework();
    }
    fmt::print("  round {}: gossamer {:.0f} tok/s, bare libtorch {:.0f} tok/s, ratio {:.3f}\n", round + 1, fw.back(), bw.back(),
               fw.back() / bw.back());
  }
  // Each round's ratio compares two blocks run back to back; the median of those ratios is the figure
  // least disturbed by other load on the machine.
  std::vector<double> ratios;
  for (std::size_t i = 0; i < fw.size(); ++i) ratios.push_back(fw[i] / bw[i]);
  const double f = median(fw), b = median(bw);
  fmt::print("median: gossamer {:.0f} tok/s ({:.2f} GFLOP/s), bare libtorch {:.0f} tok/s ({:.2f} GFLOP/s)\n", f,
             6.0 * params * f / 1e9, b, 6.0 * params * b / 1e9);
  fmt::print("ratio gossamer / bare: median {:.3f} (per round: min {:.3f}, max {:.3f})\n", median(ratios),
             *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()));
  return 0;
}

}  // namespace

int run_bench_command(const BenchArgs& args) {
  if (Status st = args.scopes.check(args.what == "transport" && args.relay ? "transport-relay" : args.what); !st.ok()) return report_failure(st);
  if (args.what == "train") return bench_train(args);
  if (args.what == "model") return bench_model(args);
  if (args.what == "memory") return bench_memory(args);
  if (args.what == "quant") return bench_quant(args);
  if (args.what == "transport") return bench_transport(args);
  if (args.what == "allreduce") return bench_allreduce(args);
  if (args.what == "grid") return bench_grid(args);
  return report_failure(error(ErrorCode::kInvalidArgument, "unknown benchmark '" + args.what + "'"));
}

}  // namespace gossamer::app
