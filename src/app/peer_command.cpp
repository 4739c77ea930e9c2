// `gossamer peer`: one real peer of a multi-process run (src/runtime/peer.h).
#include <atomic>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "app/args.h"
#include "app/stop.h"
#include "app/commands.h"
#include "train/device.h"
#include "runtime/peer.h"
#include "runtime/rounds.h"
#include "train/memory.h"
#include "train/outer.h"
#include "train/pipeline_trainer.h"
#include "transport/link_profile.h"

namespace gossamer::app {


void add_peer_command(CLI::App& app, PeerArgs& args) {
  auto* cmd = app.add_subcommand("peer", "Train as one peer of a run across machines: the first peer defines the run, others --join it");
  cmd->add_option("--listen", args.listen, "host:port this peer's gossip listens on (port 0: any free port, written to OUT/address)")
      ->check(host_port(transport::EndpointUse::kListen))
      ->capture_default_str();
  cmd->add_option("--join", args.join, "host:port of running peers, comma-separated (leave out on the first peer)")
      ->delimiter(',')
      ->check(host_port(transport::EndpointUse::kDial));
  cmd->add_option("--advertise", args.advertise,
                  "HOST[:PORT] the other peers reach this one at, when that is not the --listen address: a public address or DNS name "
                  "with ports PORT and PORT+1 forwarded here (PORT: the --listen port)");
  cmd->add_option("--link-port", args.link_port, "port of this peer's links (default: the --listen port + 1; 0: any free port)")
      ->check(integer_in(0, 65535));
  cmd->add_flag("--outbound-only", args.outbound_only,
                "this machine accepts no connections (behind NAT, no port forward): skip the dial-back check that finds it out; it "
                "dials the others, and its links to other such peers go through a peer that accepts connections");
  add_config_source(*cmd, args.source);
  cmd->add_option("--key", args.key, "run key file (`gossamer keygen`): links and gossip are then authenticated and encrypted");
  cmd->add_option("--out", args.out, "run folder: address, config.toml, metrics.jsonl, checkpoint.bin, summary.json")->capture_default_str();
  args.scopes.add(cmd->add_option("--wait-for", args.wait_for,
                                  "the first peer's: peers that must be ready before training starts (a joiner takes the run's; a pipeline "
                                  "run, pipeline.enabled, waits for pipeline.nodes unless given, and is planned over every peer ready at its start)")
                      ->check(integer_in(1, 4096))
                      ->capture_default_str(),
                  {"first"});
  cmd->add_option("--shape", args.shape,
                  "make this peer's links behave like a network path: a preset (" + fmt::format("{}", fmt::join(transport::link_profile_names(), ", ")) +
                      ") or MBIT,MS (bandwidth in Mbit/s, one-way latency in ms)");
  cmd->add_option("--dead-after", args.dead_after_s,
                  "seconds after which a peer that stops answering gossip's probes is declared dead and rounds go on without it "
                  "(suspect after half of it; longer in big runs and for peers whose answers run late, see docs/gossip.md); "
                  "raise it on lossy or long paths")
      ->check(number_in(0.5, 3600.0))
      ->capture_default_str();
  cmd->add_flag("--resume", args.resume, "restart from OUT/checkpoint.bin (its config is the run's) and catch up with the members");
  cmd->add_option("--crash-at-step", args.crash_at_step,
                  "fault drill: the process dies abruptly before this step, as if killed (no goodbye, no summary), to rehearse "
                  "recovery; restart it with --resume")
      ->check(integer_in(1, std::int64_t{1} << 40));
  cmd->add_option("--crash-mid-round", args.crash_mid_round,
                  "fault drill: the process dies abruptly inside this outer round's all-reduce, once its own share of the average "
                  "reached half the group and before the rest (some members then hold the round, others not); the members that "
                  "missed it catch up, and every survivor goes on from the same state; restart it with --resume")
      ->check(integer_in(1, std::int64_t{1} << 40));
  cmd->add_option("--throttle", args.throttle,
                  "drill for a slower machine: every inner step takes this many times as long as it does here (the peer idles the "
                  "rest after computing); with outer.round_budget = time this peer then runs only the steps that fit in the "
                  "fastest peer's round")
      ->check(number_in(1.0, 1000.0))
      ->capture_default_str();
  cmd->add_option("--device", args.device,
                  "where this machine computes (auto, cpu, cuda, cuda:N), whatever the run's train.device says: peers of one run may differ");
  args.scopes.add(cmd->add_option("--join-timeout", args.join_timeout_s, "with --join: seconds to wait for the run spec from the peers joined")
                      ->check(number_in(0.0, 86400.0, true))
                      ->capture_default_str(),
                  {"joiner"});
}

int run_peer_command(const PeerArgs& args) {
  if (Status st = args.scopes.check(args.join.empty() ? "first" : "joiner"); !st.ok()) return report_failure(st);
  runtime::PeerRequest req;
  req.listen = args.listen;
  req.join = args.join;
  req.advertise = args.advertise;
  if (args.link_port >= 0) req.link_port = static_cast<std::uint16_t>(args.link_port);
  req.outbound_only = args.outbound_only;
  if (args.outbound_only && !args.advertise.empty()) {
    return report_failure(error(ErrorCode::kInvalidArgument, "--outbound-only says nobody can connect to this machine and --advertise says where they "
                                                             "can: pass one of them (docs/peer.md, \"Behind NAT\")"));
  }
  if (args.outbound_only && args.join.empty()) {
    return report_failure(error(ErrorCode::kInvalidArgument, "the first peer of a run must accept connections (the others dial it to join): start it "
                                                             "on a machine they can reach, without --outbound-only, and --join it from this one"));
  }
  if (args.resume && (!args.source.config_file.empty() || !args.source.overrides.empty())) {
    return report_failure(error(ErrorCode::kInvalidArgument, "--resume takes the run's config from the checkpoint: drop --config and --set"));
  }
  if (!args.source.config_file.empty() || !args.source.overrides.empty()) {
    auto config = build_config(args.source);
    if (!config.ok()) return report_failure(config.status());
    // What the run would refuse later is refused before anything starts.
    if (!config->pipeline.enabled) {  // (a pipeline's stages sync as pipeline.stage_sync says)
      if (auto outer = train::outer_config(*config); !outer.ok()) return report_failure(outer.status());
    }
    for (const auto& w : train::config_warnings(*config)) spdlog::warn("{}", w);
    // A drill that can never fire would rehearse nothing, silently.
    if (args.crash_at_step > config->train.steps) {
      return report_failure(error(ErrorCode::kInvalidArgument, "--crash-at-step " + std::to_string(args.crash_at_step) + " is past the run's last step (train.steps = " +
                                                                   std::to_string(config->train.steps) + "): the drill would never fire"));
    }
    if (Status st = runtime::check_round_drill(*config, args.crash_mid_round, "--crash-mid-round"); !st.ok()) return report_failure(st);
    if (config->pipeline.enabled) {
      if (Status st = train::check_pipeline_shape(*config); !st.ok()) return report_failure(st);
    }
    train::RunConfig here = *config;
    if (!args.device.empty()) here.train.device = args.device;
    if (Status st = train::check_resources(here, /*workers=*/1); !st.ok()) return report_failure(st);
    req.config = *config;
  }
  if (!args.key.empty()) {
    auto key = transport::read_run_key(args.key);
    if (!key.ok()) return report_failure(key.status());
    req.key = *key;
  } else {
    spdlog::warn("no --key: links and gossip are neither authenticated nor encrypted (fine on a trusted network only)");
  }
  if (!args.shape.empty()) {
    auto profile = parse_shape(args.shape);
    if (!profile.ok()) return report_failure(profile.status());
    req.shape = *profile;
  }
  req.out_dir = args.out;
  req.resume = args.resume;
  req.crash_at_step = args.crash_at_step;
  req.crash_mid_round = args.crash_mid_round;
  req.throttle = args.throttle;
  req.dead_after = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(args.dead_after_s));
  req.wait_for = static_cast<std::size_t>(args.wait_for);
  req.spec_timeout = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(args.join_timeout_s));
  if (!args.device.empty()) {
    if (auto device = train::resolve_device(args.device); !device.ok()) return report_failure(device.status());
    req.device = args.device;
  }
  req.stop = &install_graceful_stop();
  auto outcome = runtime::run_peer(req);
  if (!outcome.ok()) {
    if (stop_requested() && outcome.status().code() == ErrorCode::kAborted) {
      spdlog::info("left before training: {}", outcome.status().message());
      return 130;
    }
    return report_failure(outcome.status());
  }
  if (!outcome->finished) {
    spdlog::info("left the run at step {}", outcome->steps);
    return stop_requested() ? 130 : 1;
  }
  if (stop_requested()) {
    spdlog::info("stopped while finishing: training was complete; results in {}/ (the other members' last words not awaited)", args.out);
    return 130;
  }
  std::string line = outcome->pipeline ? fmt::format("done: {} pipeline iterations ({} run again without lost nodes)", outcome->steps, outcome->retries)
                                       : fmt::format("done: {} steps, {} rounds ({} skipped, {} retried)", outcome->steps, outcome->rounds,
                                                     outcome->skipped_rounds, outcome->retries);
  if (outcome->final_val_loss) line += fmt::format(", val loss {:.4f}", *outcome->final_val_loss);
  spdlog::info("{}; parameters {}{}", line, outcome->params_digest.substr(0, 16), outcome->pipeline ? " (this node's stage)" : "");
  spdlog::info("results in {}/ (metrics.jsonl, summary.json{})", args.out, outcome->pipeline ? "" : ", checkpoint.bin");
  return 0;
}

}  // namespace gossamer::app
