// `gossamer schedule`: SkipPipe's scheduler on its own (docs/skippipe.md): assigns nodes to stages
// (GCMA), plans the paths of each mode (full pipeline, cost-blind skip, CBS without and with TC2),
// simulates an iteration of each and prints them side by side; --out writes the SkipPipe schedule
// (its wire form, whose hash peers agree on).
#include <chrono>
#include <cstdio>

#include "app/args.h"
#include "app/commands.h"
#include "core/file.h"
#include "skippipe/planner.h"

namespace gossamer::app {

void add_schedule_command(CLI::App& app, ScheduleArgs& a) {
  auto* cmd = app.add_subcommand("schedule",
                                 "SkipPipe: assign nodes to pipeline stages and plan micro-batch paths that skip and reorder stages; compares the "
                                 "full pipeline, cost-blind skipping, and CBS without and with collision awareness on one simulated iteration");
  cmd->add_option("--nodes", a.nodes, "nodes of the pipeline")->capture_default_str()->check(integer_in(2, skippipe::kMaxNodes));
  cmd->add_option("--stages", a.stages, "stages the model is cut into")->capture_default_str()->check(integer_in(2, skippipe::kMaxStages));
  cmd->add_option("--path-length", a.path_length, "stages each micro-batch visits, stage 0 included")->capture_default_str()->check(integer_in(2, skippipe::kMaxStages));
  cmd->add_option("--memory", a.memory, "micro-batches in flight per node")->capture_default_str()->check(integer_in(1, 1024));
  cmd->add_option("--mbs-per-origin", a.mbs_per_origin, "micro-batches each stage-0 node starts per iteration")->capture_default_str()->check(integer_in(1, 1 << 16));
  cmd->add_option("--mbs-per-agent", a.mbs_per_agent, "micro-batches one planned path carries")->capture_default_str()->check(integer_in(1, 1 << 16));
  cmd->add_option("--network", a.network, "geo (the reference's 12 locations, node i at location i mod 12) or uniform")
      ->capture_default_str()
      ->check(CLI::IsMember({"geo", "uniform"}));
  a.scopes.add(cmd->add_flag("--fix-nl-ldn", a.fix_nl_ldn, "geo: replace the table's NL-LDN bandwidth (0.000237 GiB/s, likely a typo) by BE-LDN's"), {"geo"});
  a.scopes.add(cmd->add_option("--latency-ms", a.latency_ms, "uniform: one-way latency")->capture_default_str()->check(number_in(0.0, 1e5)), {"uniform"});
  a.scopes.add(cmd->add_option("--bandwidth-mbit", a.bandwidth_mbit, "uniform: bandwidth of every pair")->capture_default_str()->check(number_in(1e-3, 1e7)),
               {"uniform"});
  cmd->add_option("--forward-s", a.forward_s, "seconds of one stage's forward of one micro-batch")->capture_default_str()->check(number_in(0.0, 3600.0, true));
  cmd->add_option("--activation-mib", a.activation_mib, "MiB one hop carries")->capture_default_str()->check(number_in(0.0, 1e5));
  cmd->add_option("--hop-overhead-s", a.hop_overhead_s, "seconds added to every hop (the reference's 0.35)")->capture_default_str()->check(number_in(0.0, 3600.0));
  cmd->add_option("--seed", a.seed, "seed of the assignment and the cost-blind draws")->capture_default_str()->check(integer_in(0, std::numeric_limits<std::int64_t>::max()));
  cmd->add_option("--gcma-trials", a.gcma_trials, "children the genetic assignment tries")->capture_default_str()->check(integer_in(0, 1 << 24));
  auto* out = cmd->add_option("--out", a.out, "write the SkipPipe schedule's bytes here");
  a.out_option = out;
  cmd->add_flag("--force", a.force, "replace an existing --out file")->needs(out);
}

int run_schedule_command(const ScheduleArgs& a) {
  using namespace skippipe;
  if (Status st = a.scopes.check(a.network); !st.ok()) return report_failure(st);
  const bool write = a.out_option != nullptr && a.out_option->count() > 0;
  if (write) {  // before the work: a refusal should not come after minutes of planning
    if (Status st = check_output_file(a.out, a.force); !st.ok()) return report_failure(st);
  }
  // The options' own names where the planner's checks would name pipeline.* keys.
  if (a.path_length > a.stages) {
    return report_failure(error(ErrorCode::kInvalidArgument, "--path-length (" + std::to_string(a.path_length) + ") must be at most --stages (" +
                                                                 std::to_string(a.stages) + "): a micro-batch visits each stage once at most"));
  }
  if (a.mbs_per_origin % a.mbs_per_agent != 0) {
    return report_failure(error(ErrorCode::kInvalidArgument, "--mbs-per-origin (" + std::to_string(a.mbs_per_origin) + ") must be a multiple of --mbs-per-agent (" +
                                                                 std::to_string(a.mbs_per_agent) + ")"));
  }
  Options o;
  o.stages = a.stages;
  o.path_length = a.path_length;
  o.memory = a.memory;
  o.mbs_per_origin = a.mbs_per_origin;
  o.mbs_per_agent = a.mbs_per_agent;
  o.seed = a.seed;
  if (Status st = o.check(); !st.ok()) return report_failure(st);
  if (a.nodes < a.stages) return report_failure(error(ErrorCode::kInvalidArgument, "--nodes must be at least --stages: every stage needs a node"));
  const Network net = a.network == "geo" ? geo_network(a.nodes, a.fix_nl_ldn) : uniform_network(a.nodes, a.latency_ms / 1e3, a.bandwidth_mbit * 1e6 / 8);
  Costs costs;
  costs.forward_s = a.forward_s;
  costs.activation_bytes = a.activation_mib * 1024 * 1024;
  costs.hop_overhead_s = a.hop_overhead_s;
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  GcmaOptions g;
  g.trials = a.gcma_trials;
  g.seed = a.seed;
  std::fprintf(stderr, "assigning %d nodes to %d stages (GCMA, %d trials)...\n", a.nodes, a.stages, a.gcma_trials);
  auto assigned = assign_gcma(net, costs, o, g);
  if (!assigned.ok()) return report_failure(assigned.status());
  const double gcma_s = seconds();
  std::printf("%d nodes (%s network), %d stages, path length %d, memory %d, %d micro-batches per origin; GCMA in %.2f s\n", a.nodes, a.network.c_str(), a.stages,
              a.path_length, a.memory, a.mbs_per_origin, gcma_s);
  std::printf("stage of each node:");
  for (int s : *assigned) std::printf(" %d", s);
  std::printf("\n%-16s %12s %12s %9s %11s %10s %13s %11s\n", "mode", "predicted s", "simulated s", "vs full", "collisions", "busy", "hop GiB", "planned in");
  double full = 0;
  Result<Plan> chosen = error(ErrorCode::kInternal, "not planned");
  for (const Mode m : {Mode::kFull, Mode::kCostBlind, Mode::kNoCollision, Mode::kSkipPipe}) {
    std::fprintf(stderr, "planning %s...\n", std::string(mode_name(m)).c_str());
    const double before = seconds();
    auto p = plan(net, costs, *assigned, o, m);
    if (!p.ok()) return report_failure(p.status().with_context(std::string(mode_name(m))));
    const double took = seconds() - before;
    if (m == Mode::kFull) full = p->simulation.makespan_s;
    double busy = 0;
    for (const auto& n : p->simulation.nodes) busy += n.busy_s;
    busy /= p->simulation.makespan_s * a.nodes;
    std::printf("%-16s %12.2f %12.2f %9.3f %11zu %9.1f%% %13.2f %9.2f s\n", std::string(mode_name(m)).c_str(), p->predicted_makespan_s, p->simulation.makespan_s,
                p->simulation.makespan_s / full, p->simulation.collisions.size(), 100 * busy, p->simulation.hop_bytes / (1024.0 * 1024 * 1024), took);
    if (m == Mode::kSkipPipe) chosen = std::move(p);
  }
  std::printf("skippipe schedule: %zu bytes, hash %s; scheduler total %.2f s\n", chosen->schedule.encode().size(), chosen->schedule.hash().hex().substr(0, 16).c_str(),
              seconds());
  if (write) {
    if (Status st = write_file_atomic(a.out, chosen->schedule.encode()); !st.ok()) return report_failure(st);
    std::printf("wrote %s\n", a.out.c_str());
  }
  return 0;
}

}  // namespace gossamer::app
