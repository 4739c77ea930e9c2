// `gossamer pipeline`: trains the GPT as a SkipPipe pipeline with every node in this process
// (train/pipeline_trainer.h): the schedule of pipeline.mode, an iteration at a time, the validation
// loss every train.eval_every iterations, and at the end the loss with stages left out (--omit).
// With --node, this process hosts one node and the others run in processes of their own
// (runtime/pipeline_process.h).
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "app/args.h"
#include "app/commands.h"
#include "app/stop.h"
#include "runtime/pipeline_process.h"
#include "train/memory.h"
#include "train/metrics.h"
#include "train/pipeline_trainer.h"
#include "train/run.h"
#include "train/run_folder.h"
#include "train/trained_model.h"
#include "transport/secure_channel.h"
#include "transport/tcp_transport.h"

namespace gossamer::app {

void add_pipeline_command(CLI::App& app, PipelineArgs& a) {
  auto* cmd = app.add_subcommand("pipeline",
                                 "Train the GPT as a SkipPipe pipeline (pipeline.* keys; docs/skippipe.md): its stages on pipeline.nodes nodes, all in "
                                 "this process, or with --node one node per process; train.steps iterations of every origin's micro-batches. Writes "
                                 "metrics.jsonl and summary.json");
  add_config_source(*cmd, a.source);
  a.out_option = cmd->add_option("--out", a.out, "output folder, new or empty (default: runs/pipeline-<time>)");
  auto* omit = cmd->add_option("--omit", a.omit, "stages (not 0) to leave out in the omission evaluation at the end, e.g. --omit 2,4,5 (default: the "
                                     "second half, stages S/2 .. S-1: with 6 stages, 3, 4 and 5)")
      ->delimiter(',')
      ->check(integer_in(1, 4095));
  auto* node = cmd->add_option("--node", a.node,
                               "host only this pipeline node, the others in processes of their own (on this machine or others), linked over "
                               "TCP: start one process per node, each with the same config and --addresses")
                   ->check(integer_in(0, 4095))
                   ->excludes(omit);
  cmd->add_option("--addresses", a.addresses, "with --node: every node's host:port, in node order, comma-separated (node k listens at the k-th)")
      ->delimiter(',')
      ->check(host_port(transport::EndpointUse::kDial))
      ->needs(node);
  node->needs("--addresses");
  cmd->add_option("--listen", a.listen, "with --node: host:port this node listens on, when not its entry in --addresses (e.g. 0.0.0.0:PORT)")
      ->check(host_port(transport::EndpointUse::kListen))
      ->needs(node);
  cmd->add_option("--key", a.key, "with --node: run key file (`gossamer keygen`): links are then authenticated and encrypted")->needs(node);
  cmd->add_option("--shape", a.shape, "with --node: shape what this node sends, as a preset or MBIT,MS (processes on one machine then behave as if far apart)")
      ->needs(node);
  cmd->add_option("--rejoin-timeout", a.rejoin_timeout_s,
                  "with --node: after a failed iteration, seconds to link again with the nodes that answer before going on without the others")
      ->capture_default_str()
      ->check(positive_number())
      ->needs(node);
}

namespace {

// One node of a pipeline across processes (runtime/pipeline_process.h).
int run_pipeline_node(const PipelineArgs& a, const train::RunConfig& c, const std::string& out) {
  runtime::PipelineProcessRequest req;
  req.config = c;
  req.clock = &real_clock();
  req.node = a.node;
  req.addresses = a.addresses;
  req.stop = &install_graceful_stop();
  req.rejoin_timeout = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(a.rejoin_timeout_s));
  if (!a.shape.empty()) {
    auto profile = parse_shape(a.shape);
    if (!profile.ok()) return report_failure(profile.status());
    req.shape = *profile;
  }
  if (static_cast<std::int64_t>(a.addresses.size()) != c.pipeline.nodes) {
    return report_failure(error(ErrorCode::kInvalidArgument, "--addresses names " + std::to_string(a.addresses.size()) + " nodes but pipeline.nodes is " +
                                                                 std::to_string(c.pipeline.nodes) + ": give every node's host:port, in node order"));
  }
  if (a.node >= c.pipeline.nodes) {
    return report_failure(error(ErrorCode::kInvalidArgument, "--node " + std::to_string(a.node) + ": pipeline.nodes is " + std::to_string(c.pipeline.nodes) +
                                                                 ", so use 0 .. " + std::to_string(c.pipeline.nodes - 1)));
  }
  for (std::size_t i = 0; i < a.addresses.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (a.addresses[i] == a.addresses[j]) {
        return report_failure(error(ErrorCode::kInvalidArgument, "--addresses names " + a.addresses[i] + " for nodes " + std::to_string(j) + " and " +
                                                                     std::to_string(i) + ": every node needs an address of its own"));
      }
    }
  }
  if (c.pipeline.crash_node >= 0) {
    return report_failure(error(ErrorCode::kInvalidArgument, "pipeline.crash_node is a drill of the simulator (gossamer sim --pipeline); across "
                                                             "processes, stop a node's process to rehearse a loss"));
  }
  // One node here builds the whole model (it keeps only its stage's part training).
  if (Status st = train::check_resources(c, /*workers=*/1); !st.ok()) return report_failure(st);
  if (Status st = train::RunFolder::check_new(out, train::RunKind::kPipeline); !st.ok()) return report_failure(st);
  transport::TcpOptions to;
  to.listen = a.listen.empty() ? a.addresses[static_cast<std::size_t>(a.node)] : a.listen;
  to.self = transport::PeerId{static_cast<std::uint64_t>(a.node) + 1};
  to.run = runtime::pipeline_run_id(c);
  if (!a.key.empty()) {
    auto key = transport::read_run_key(a.key);
    if (!key.ok()) return report_failure(error(ErrorCode::kInvalidArgument, "--key " + a.key + ": " + key.status().message()));
    to.key = *key;
  } else {
    spdlog::warn("no --key: links are neither authenticated nor encrypted (fine on a trusted network only)");
  }
  auto transport = transport::make_tcp_transport(to);
  if (!transport.ok()) {
    const bool unresolved = transport.status().message().find("resolve") != std::string::npos;
    return report_failure(error(ErrorCode::kInvalidArgument, "cannot listen on " + to.listen + " (" + transport.status().message() + "): " +
                                                                 (unresolved ? "give an address of this machine (or 0.0.0.0) with --listen, or fix its name"
                                                                             : "free that port, or give this node another address in --addresses on every node")));
  }
  // Checked, listening: the folder now.
  auto folder = train::RunFolder::create(out, train::RunKind::kPipeline);
  if (!folder.ok()) return report_failure(folder.status());
  if (Status st = folder->write_text(train::kConfigFile, train::to_toml(c)); !st.ok()) return report_failure(st);
  auto corpus = train::load_corpus(c);
  if (!corpus.ok()) return report_failure(corpus.status());
  auto metrics = train::MetricsWriter::open(folder->file(train::kMetricsFile), std::nullopt);
  if (!metrics.ok()) return report_failure(metrics.status());
  Status write_failed;
  req.on_iteration = [&](const train::PipelineRecord& r, std::optional<double> val) {
    const nlohmann::json j = runtime::pipeline_record_json(a.node, r, val);
    if (Status st = metrics->write(j); !st.ok() && write_failed.ok()) write_failed = st;
    std::fprintf(stderr, "node %d, iteration %lld/%lld: %.2f s%s\n", a.node, static_cast<long long>(r.iteration), static_cast<long long>(c.train.steps),
                 r.seconds, val ? (", val loss " + std::to_string(*val)).c_str() : "");
  };
  spdlog::info("pipeline node {} of {}: listening on {}, linking to the others", a.node, c.pipeline.nodes, (*transport)->address());
  auto outcome = runtime::run_pipeline_process(req, **transport, corpus->dataset);
  if (!outcome.ok()) return report_failure(outcome.status());
  if (!write_failed.ok()) return report_failure(write_failed);
  const nlohmann::json summary = runtime::pipeline_summary_json(a.node, *outcome);
  if (Status st = folder->write_text(train::kSummaryFile, summary.dump(2)); !st.ok()) return report_failure(st);
  if (outcome->stopped) {
    spdlog::warn("interrupted after iteration {}: metrics.jsonl holds what was done", outcome->iterations);
    return 130;
  }
  if (outcome->model) {  // the evaluating node's: the whole model, for gossamer sample and export
    if (Status st = train::save_trained_model(folder->path(), c, *outcome->model, outcome->iterations); !st.ok()) return report_failure(st);
    spdlog::info("the trained model: {}", folder->file(train::kCheckpointFile).string());
  }
  std::printf("pipeline node %d (stage %d): %lld iterations%s\n", a.node, outcome->stage, static_cast<long long>(outcome->iterations),
              outcome->final_val_loss ? (", val loss " + std::to_string(*outcome->final_val_loss)).c_str() : "");
  return 0;
}


// What a finished single-process pipeline run leaves: its summary, the assembled model, and the
// closing lines (the loss with stages left out, with and without depth scaling).
struct Totals {
  double last_val = 0;
  std::uint64_t activation_bytes = 0, sync_bytes = 0;
};

int finish_pipeline_run(const train::RunConfig& c, train::PipelineTrainer& t, train::RunFolder& folder, const std::vector<int>& omit, const Totals& totals,
                        const std::string& out) {
  const double last_val = totals.last_val;
  const std::uint64_t activation_bytes = totals.activation_bytes, sync_bytes = totals.sync_bytes;
  const auto& sim = t.plan().simulation;
  // The same weights without depth scaling, beside: what the scaling changes is in the summary.
  const auto weights = t.stage_weights();
  const train::EndEvaluations end = train::EndEvaluation(t, omit).measure(t, weights, last_val);
  const double omitted = end.omitted_val_loss, as_trained = end.val_loss_as_trained, omitted_as_trained = end.omitted_val_loss_as_trained;
  nlohmann::json summary = {{"mode", train::name_of(c.pipeline.mode)},
                            {"nodes", c.pipeline.nodes},
                            {"stages", c.pipeline.stages},
                            {"path_length", c.pipeline.path_length},
                            {"iterations", t.iterations_done()},
                            {"samples", t.iterations_done() * t.samples_per_iteration()},
                            {"final_val_loss", last_val},
                            {"omitted_stages", omit},
                            {"omitted_val_loss", omitted},
                            {"omission_increase", omitted / last_val - 1},
                            {"depth_scaling", c.pipeline.depth_scaling},
                            {"stage_shares", end.stage_shares},
                            {"val_loss_as_trained", as_trained},
                            {"omitted_val_loss_as_trained", omitted_as_trained},
                            {"stage_sync", train::name_of(c.pipeline.stage_sync)},
                            {"activation_bytes", activation_bytes},
                            {"stage_sync_bytes", sync_bytes},
                            {"iteration_makespan_s", sim.makespan_s},
                            {"predicted_makespan_s", t.plan().predicted_makespan_s},
                            {"schedule_hash", t.plan().schedule.hash().hex()}};
  if (Status st = folder.write_text(train::kSummaryFile, summary.dump(2)); !st.ok()) return report_failure(st);
  // The assembled model (depth-scaled as evaluated), for gossamer sample and export.
  if (Status st = train::save_trained_model(folder.path(), c, t.assemble(weights, t.depth_scales()), t.iterations_done()); !st.ok()) {
    return report_failure(st);
  }
  std::printf("%s pipeline: val loss %.4f after %lld iterations; with stages", train::name_of(c.pipeline.mode).c_str(), last_val, static_cast<long long>(t.iterations_done()));
  for (int s : omit) std::printf(" %d", s);
  std::printf(" left out %.4f (%+.1f%%); an iteration %.1f s over the scheduler's network; %.1f MB of activations, %.1f MB to sync the stages (%s)\n",
              omitted, 100 * (omitted / last_val - 1), sim.makespan_s, activation_bytes / 1e6, sync_bytes / 1e6, train::name_of(c.pipeline.stage_sync).c_str());
  if (as_trained != last_val) {
    std::printf("the stages' residual branches scaled by their visit shares (pipeline.depth_scaling); as trained, unscaled: val loss %.4f, "
                "with those stages left out %.4f (%+.1f%%)\n", as_trained, omitted_as_trained, 100 * (omitted_as_trained / as_trained - 1));
  }
  std::printf("the model: %s (gossamer sample --from %s, gossamer export --from %s)\n", folder.file(train::kCheckpointFile).string().c_str(), out.c_str(), out.c_str());
  return 0;
}

}  // namespace

int run_pipeline_command(const PipelineArgs& a) {
  auto config = build_config(a.source);
  if (!config.ok()) return report_failure(config.status());
  const auto& c = *config;
  for (int s : a.omit) {
    if (s <= 0 || s >= c.pipeline.stages) return report_failure(error(ErrorCode::kInvalidArgument, "--omit: stage " + std::to_string(s) + " is not one of 1 .. pipeline.stages - 1"));
  }
  if (Status st = train::check_pipeline_shape(c); !st.ok()) return report_failure(st);
  const std::vector<int> omit = a.omit.empty() ? train::default_omitted_stages(c.pipeline.stages) : a.omit;
  const std::string out = a.out_option != nullptr && a.out_option->count() > 0 ? a.out : dated_out("pipeline");
  if (a.node >= 0) return run_pipeline_node(a, c, out);
  if (Status st = train::check_network_in_one_process(c); !st.ok()) return report_failure(st);
  if (c.pipeline.crash_node >= 0) {
    return report_failure(error(ErrorCode::kInvalidArgument, "pipeline.crash_node is a drill of the simulator (gossamer sim --pipeline); gossamer pipeline "
                                                             "runs every node to the end (across processes, stop a node's process to rehearse a loss)"));
  }
  // Every node builds the whole model (it keeps only its stage's part training), all in this process.
  if (Status st = train::check_resources(c, c.pipeline.nodes, "pipeline.nodes"); !st.ok()) return report_failure(st);
  auto folder = train::RunFolder::create(out, train::RunKind::kPipeline);
  if (!folder.ok()) return report_failure(folder.status());
  if (Status st = folder->write_text(train::kConfigFile, train::to_toml(c)); !st.ok()) return report_failure(st);
  auto corpus = train::load_corpus(c);
  if (!corpus.ok()) return report_failure(corpus.status());
  spdlog::info("planning a {} pipeline: {} nodes, {} stages, paths of {}", train::name_of(c.pipeline.mode), c.pipeline.nodes, c.pipeline.stages, c.pipeline.path_length);
  auto trainer = train::PipelineTrainer::make(c, corpus->dataset);
  if (!trainer.ok()) return report_failure(trainer.status());
  auto& t = **trainer;
  const auto& sim = t.plan().simulation;
  spdlog::info("schedule: {} agents, an iteration {:.1f} s over the scheduler's network (closed form {:.1f} s); {} samples per iteration",
               t.plan().schedule.agents.size(), sim.makespan_s, t.plan().predicted_makespan_s, t.samples_per_iteration());
  auto metrics = train::MetricsWriter::open(folder->file(train::kMetricsFile), std::nullopt);
  if (!metrics.ok()) return report_failure(metrics.status());
  install_graceful_stop();  // Ctrl-C: the iteration under way ends, the model so far is kept
  double last_val = 0;
  std::uint64_t activation_bytes = 0, sync_bytes = 0;
  for (std::int64_t i = 0; i < c.train.steps; ++i) {
    if (stop_requested()) {
      if (Status st = train::save_trained_model(folder->path(), c, t.assemble(t.stage_weights(), t.depth_scales()), t.iterations_done()); !st.ok()) {
        return report_failure(st);
      }
      spdlog::warn("interrupted at iteration {}: metrics.jsonl holds what was done, checkpoint.bin the model so far", i);
      return 130;
    }
    auto rec = t.step();
    if (!rec.ok()) return report_failure(rec.status());
    activation_bytes += rec->activation_bytes;
    sync_bytes += rec->sync_bytes;
    nlohmann::json j = {{"step", rec->iteration}, {"samples", rec->samples}, {"train_loss", rec->train_loss}, {"lr", rec->lr},
                        {"grad_norm", rec->grad_norm}, {"activation_bytes", rec->activation_bytes}, {"sync_bytes", rec->sync_bytes},
                        {"sync_rounds", rec->sync_rounds}, {"seconds", rec->seconds},
                        {"sim_time_s", sim.makespan_s * static_cast<double>(rec->iteration)}};
    const bool eval = rec->iteration % c.train.eval_every == 0 || rec->iteration == c.train.steps;
    if (eval) {
      last_val = t.evaluate();
      j["val_loss"] = last_val;
    }
    if (Status st = metrics->write(j); !st.ok()) return report_failure(st);
    if (eval || rec->iteration % std::max<std::int64_t>(1, c.train.log_every) == 0) {
      std::fprintf(stderr, "iteration %lld/%lld: train loss %.4f%s, %.2f s\n", static_cast<long long>(rec->iteration), static_cast<long long>(c.train.steps),
                   rec->train_loss, eval ? (", val loss " + std::to_string(last_val)).c_str() : "", rec->seconds);
    }
  }
  return finish_pipeline_run(c, t, *folder, omit, Totals{last_val, activation_bytes, sync_bytes}, out);
}

}  // namespace gossamer::app
