// `gossamer plan`: the bandwidth each method needs for a target compute utilization (sim/plan.h),
// and the reproduction of Streaming DiLoCo's Table 4.
#include <cmath>
#include <cstdio>
#include <optional>

#include <fmt/format.h>

#include "app/args.h"
#include "app/commands.h"
#include "optim/method.h"
#include "quant/format.h"
#include "sim/plan.h"
#include "train/memory.h"
#include "train/worker.h"

namespace gossamer::app {

namespace {

Result<double> bits_of(const std::string& name, const char* option) {
  auto id = quant::codec_from_name(name);
  if (!id.ok()) return error(ErrorCode::kInvalidArgument, std::string(option) + ": " + id.status().message());
  return static_cast<double>(quant::traits(*id).bits);
}

std::string gbit(double bits_per_s) { return std::isfinite(bits_per_s) ? fmt::format("{:.3g}", bits_per_s / 1e9) : "latency-bound"; }

int table4() {
  // Streaming DiLoCo, Table 4 (ALGORITHMS.md section 2.7): Gbit/s for 95% compute utilization, H = 100,
  // fragments of 3 layers, two replicas; columns DP, DiLoCo, Streaming, + overlap, + overlap + FP4.
  struct Row {
    const char* name;
    double params;
    int layers;
    double step;
    double paper[5];
  };
  const Row rows[] = {{"1B", 1e9, 24, 0.1, {222.3, 23.3, 16.0, 9.1, 2.0}},
                      {"10B", 1e10, 48, 0.8, {268.3, 33.9, 13.3, 6.2, 1.4}},
                      {"100B", 1e11, 108, 4.9, {390.7, 49.4, 11.0, 5.2, 1.1}}};
  std::printf("Streaming DiLoCo Table 4: Gbit/s for 95%% compute utilization; ours (paper, difference)\n");
  std::printf("assumptions: 2 replicas, bf16 on the wire (fp4 in the last column), gradients of the last step sent during\n"
              "its backward pass (2/3 of the step), no latency, H = 100, fragments of 3 layers, overlap tau = 1 step\n");
  std::printf("%-6s %22s %22s %22s %22s %22s\n", "model", "DP", "DiLoCo", "Streaming", "+ overlap", "+ overlap + FP4");
  double worst = 0;
  for (const auto& r : rows) {
    sim::PlanInput in;
    in.parameters = r.params;
    in.layers = r.layers;
    in.step_time_s = r.step;
    in.workers = 2;
    in.inner_steps = 100;
    in.fragment_layers = 3;
    in.bits_per_value = 16;
    in.backward_overlap = 2.0 / 3.0;
    in.overlap = 0;
    const auto plain = sim::plan(in);
    in.overlap = 1;
    const auto overlapped = sim::plan(in);
    const auto fp4 = sim::plan(in, 4);
    const double ours[5] = {plain[0].required_bits_per_s, plain[1].required_bits_per_s, plain[2].required_bits_per_s,
                            overlapped[2].required_bits_per_s, fp4[2].required_bits_per_s};
    std::printf("%-6s", r.name);
    for (int i = 0; i < 5; ++i) {
      const double diff = ours[i] / 1e9 / r.paper[i] - 1;
      worst = std::max(worst, std::abs(diff));
      std::printf(" %22s", fmt::format("{:.1f} ({:.1f}, {:+.0f}%)", ours[i] / 1e9, r.paper[i], 100 * diff).c_str());
    }
    std::printf("\n");
  }
  std::printf("largest difference: %.0f%%\n", 100 * worst);
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app, PlanArgs& a) {
  auto* cmd = app.add_subcommand("plan",
                                 "Bandwidth each method needs to keep workers computing a target share of the time (analytic; the model is in "
                                 "sim/plan.h, checked against the simulator)");
  auto& sc = a.scopes;
  const std::vector<std::string> bandwidth{"bandwidth"};
  sc.add(cmd->add_option("--params", a.params, "model parameters")->capture_default_str()->check(number_in(1.0, 1e15)), bandwidth);
  sc.add(cmd->add_option("--layers", a.layers, "transformer blocks")->capture_default_str()->check(integer_in(1, 100000)), bandwidth);
  sc.add(cmd->add_option("--step-time", a.step_time, "seconds per inner step")->capture_default_str()->check(positive_number()), bandwidth);
  sc.add(cmd->add_option("--workers", a.workers, "replicas")->capture_default_str()->check(integer_in(2, 1 << 20)), bandwidth);
  sc.add(cmd->add_option("--inner-steps", a.inner_steps, "H: inner steps between synchronizations")->capture_default_str()->check(integer_in(1, 1 << 30)), bandwidth);
  sc.add(cmd->add_option("--fragment-layers", a.fragment_layers, "streaming_diloco: blocks per fragment")->capture_default_str()->check(integer_in(1, 100000)),
         bandwidth);
  sc.add(cmd->add_option("--overlap", a.overlap, "streaming_diloco: tau, steps a fragment's all-reduce may overlap")->capture_default_str()->check(integer_in(0, 1 << 30)),
         bandwidth);
  sc.add(cmd->add_option("--codec", a.codec, "codec of ddp, diloco, noloco and co2")->capture_default_str(), bandwidth);
  sc.add(cmd->add_option("--streaming-codec", a.streaming_codec, "codec of streaming_diloco")->capture_default_str(), bandwidth);
  sc.add(cmd->add_option("--utilization", a.utilization, "target compute utilization")->capture_default_str()->check(number_in(0.01, 0.9999)), bandwidth);
  sc.add(cmd->add_option("--backward-overlap", a.backward_overlap,
                         "share of a step during which the last step's gradients may already be sent (2/3 for layer-by-layer sends "
                         "during backward; 0 for Gossamer today)")
             ->capture_default_str()
             ->check(number_in(0.0, 1.0)),
         bandwidth);
  sc.add(cmd->add_option("--latency-ms", a.latency_ms, "one-way latency per hop")->capture_default_str()->check(number_in(0.0, 1e6)), bandwidth);
  auto* memory = cmd->add_flag("--memory", a.memory,
                               "memory one worker needs for each method with the model and batch of --config/--set (e.g. --set model.preset=gpt2-124m), "
                               "against what this machine has");
  add_config_source(*cmd, a.source);
  sc.add(cmd->get_option("--config"), {"memory"});
  sc.add(cmd->get_option("--set"), {"memory"});
  cmd->add_flag("--table4", a.table4, "reproduce Table 4 of Streaming DiLoCo (its 1B, 10B and 100B models), beside the paper's figures")->excludes(memory);
}

namespace {

int memory_table(const PlanArgs& a) {
  auto config = build_config(a.source);
  if (!config.ok()) return report_failure(config.status());
  const auto avail = train::available_memory_bytes();
  const auto& c = *config;
  // A user's TorchScript module: its parameters counted in it, its activations unknown beyond the
  // logits (train/memory.h).
  std::optional<double> parameters;
  if (c.model.kind != train::ModelKind::kGpt) {
    auto model = train::make_model(c, 0);
    if (!model.ok()) return report_failure(model.status());
    parameters = static_cast<double>((*model)->num_parameters());
    std::printf("memory per worker: the TorchScript module %s, %.4g parameters, context %lld, batch %lld, vocabulary %lld, fp32 weights and AdamW; "
                "activations counted for its logits only (its layers are not known)\n",
                c.model.path.c_str(), *parameters, static_cast<long long>(c.model.context), static_cast<long long>(c.train.batch_size),
                static_cast<long long>(train::vocab_size(c)));
  } else {
    std::printf("memory per worker: %lld layers, width %lld, context %lld, batch %lld, vocabulary %lld, fp32 weights and AdamW\n",
                static_cast<long long>(c.model.layers), static_cast<long long>(c.model.width), static_cast<long long>(c.model.context),
                static_cast<long long>(c.train.batch_size), static_cast<long long>(train::vocab_size(c)));
  }
  const bool gpu = train::estimate_memory(c, 1, parameters).on_gpu;
  if (gpu) {
    std::printf("on a GPU (train.device = %s), outer state in %s memory; host memory is checked here, the GPU's is not\n", c.train.device.c_str(),
                c.outer.state_device == train::StateDevice::kHost ? "host" : "the GPU's");
    std::printf("%-18s %14s %14s %14s %14s %14s %14s %10s\n", "method", "state", "activations", "checkpoint", "peak", "on the GPU", "host memory", "fits here");
  } else {
    std::printf("%-18s %14s %14s %14s %14s %10s\n", "method", "state", "activations", "checkpoint", "peak", "fits here");
  }
  for (const auto& info : optim::kMethods) {
    const std::string name(info.name);
    const char* method = name.c_str();
    train::RunConfig m = c;
    m.outer.method = info.id;
    const auto e = train::estimate_memory(m, 1, parameters);
    const double peak = e.peak_bytes();
    const char* fits = avail ? (e.host_bytes <= *avail ? "yes" : "no") : "?";
    if (gpu) {
      std::printf("%-18s %14s %14s %14s %14s %14s %14s %10s\n", method, train::format_bytes(e.state_bytes).c_str(), train::format_bytes(e.activation_bytes).c_str(),
                  train::format_bytes(e.checkpoint_bytes).c_str(), train::format_bytes(peak).c_str(), train::format_bytes(e.device_bytes).c_str(), train::format_bytes(e.host_bytes).c_str(), fits);
    } else {
      std::printf("%-18s %14s %14s %14s %14s %10s\n", method, train::format_bytes(e.state_bytes).c_str(), train::format_bytes(e.activation_bytes).c_str(),
                  train::format_bytes(e.checkpoint_bytes).c_str(), train::format_bytes(peak).c_str(), fits);
    }
  }
  if (avail) {
    std::printf("available here: %s of host memory (activations include the outer step's temporaries; the checkpoint is built after they are freed, so the peak is the state and the larger of the two; docs/benchmarks.md)\n", train::format_bytes(*avail).c_str());
  }
  return 0;
}

}  // namespace

int run_plan_command(const PlanArgs& a) {
  if (Status st = a.scopes.check(a.table4 ? "table4" : a.memory ? "memory" : "bandwidth"); !st.ok()) return report_failure(st);
  if (a.table4) return table4();
  if (a.memory) return memory_table(a);
  if (a.overlap >= a.inner_steps) {
    return report_failure(error(ErrorCode::kInvalidArgument, "--overlap (" + std::to_string(a.overlap) + ") must be below --inner-steps (" +
                                                                 std::to_string(a.inner_steps) + "): a fragment's all-reduce overlaps steps within its round"));
  }
  if (a.fragment_layers > a.layers) {
    return report_failure(error(ErrorCode::kInvalidArgument, "--fragment-layers (" + std::to_string(a.fragment_layers) + ") exceeds --layers (" +
                                                                 std::to_string(a.layers) + "): a fragment is part of the model"));
  }
  auto bits = bits_of(a.codec, "--codec");
  if (!bits.ok()) return report_failure(bits.status());
  auto sbits = bits_of(a.streaming_codec, "--streaming-codec");
  if (!sbits.ok()) return report_failure(sbits.status());
  sim::PlanInput in;
  in.parameters = a.params;
  in.layers = a.layers;
  in.step_time_s = a.step_time;
  in.workers = a.workers;
  in.inner_steps = a.inner_steps;
  in.fragment_layers = a.fragment_layers;
  in.overlap = a.overlap;
  in.bits_per_value = *bits;
  in.target_utilization = a.utilization;
  in.backward_overlap = a.backward_overlap;
  in.latency_s = a.latency_ms / 1e3;
  std::printf("bandwidth per worker for %.0f%% compute utilization: %.3g parameters, %d layers, %.3g s per step, %d workers, H = %d\n",
              100 * a.utilization, a.params, a.layers, a.step_time, a.workers, a.inner_steps);
  std::printf("%-18s %16s %18s %16s\n", "method", "sync every", "bits per sync", "Gbit/s needed");
  for (const auto& r : sim::plan(in, *sbits)) {
    std::printf("%-18s %11.3g steps %18.3g %16s\n", r.method.c_str(), r.steps_between_syncs, r.bits_per_sync, gbit(r.required_bits_per_s).c_str());
  }
  return 0;
}

}  // namespace gossamer::app
