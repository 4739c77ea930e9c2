// Comparison outputs: per-method metrics.jsonl, summary.json and a self-contained report.html with
// SVG charts (validation loss against steps, bytes sent per worker and simulated wall-clock; final
// loss against bytes, the frontier) and the summary table. What `gossamer sim` and `gossamer compare` write.
//
// Threading: plain functions. Errors: I/O failures as Status.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "sim/cluster.h"

namespace gossamer::sim {

struct MethodRun {
  std::string name;
  train::RunConfig config;
  ClusterResult result;
};

// One method's summary: name, final_val_loss, tokens, bytes_sent_per_worker, sim_time_s,
// compute_utilization, time_to_target_s (null when the target was never reached), and more.
nlohmann::json method_summary(const MethodRun& run, double target_loss);
// The default target: 10% above ddp's final validation loss, else above the best method's.
double default_target_loss(const std::vector<MethodRun>& runs);

struct ReportContext {
  std::string title;
  std::string data_description;
  std::string network_description;
  std::optional<double> entropy_floor;
  double target_loss = 0;
};

// The methods on the bytes frontier, from a summary's "methods": those no other method beats on both
// final validation loss and bytes sent per worker (ties kept), in order of bytes. Methods without a
// final loss are left out, and so are those that sent nothing (no point on a log scale).
std::vector<std::string> frontier_methods(const nlohmann::json& methods);
// The report's frontier chart: each method's final loss against its bytes per worker (log scale),
// the frontier drawn through its methods, and, with ddp among them, a line 1% above ddp's loss and
// one at 1000x fewer bytes than ddp's, the field's headline target.
std::string svg_frontier(const nlohmann::json& methods);

// Writes <out>/<method>/metrics.jsonl for each run, <out>/summary.json and <out>/report.html, and
// returns the summary it wrote.
[[nodiscard]] Result<nlohmann::json> write_comparison(const std::filesystem::path& out, const std::vector<MethodRun>& runs, const ReportContext& context);
std::string report_html(const std::vector<MethodRun>& runs, const nlohmann::json& summary, const ReportContext& context);

}  // namespace gossamer::sim
