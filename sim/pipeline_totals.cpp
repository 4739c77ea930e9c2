#include "sim/pipeline_totals.h"

#include <algorithm>

#include <torch/torch.h>

#include "train/pipeline_wire.h"
#include "transport/link_profile.h"
#include "transport/protocol.h"

namespace gossamer::sim {

namespace {

nlohmann::json timeline_json(const train::PipelineRecord& rec, const skippipe::Schedule& s) {
  nlohmann::json nodes = nlohmann::json::array();
  for (std::size_t v = 0; v < rec.timeline.size(); ++v) {
    nlohmann::json spans = nlohmann::json::array();
    for (const auto& w : rec.timeline[v]) {
      const char* kind = w.kind == train::WorkKind::kForward ? "F" : w.kind == train::WorkKind::kBackward ? "B" : "H";
      spans.push_back(nlohmann::json::array({w.microbatch, kind, w.start_s, w.end_s}));
    }
    nodes.push_back({{"node", v}, {"stage", s.stage_of[v]}, {"spans", std::move(spans)}});
  }
  return nodes;
}

}  // namespace

double hop_scale(const train::RunConfig& c) {
  const at::Tensor probe = torch::zeros({c.train.batch_size, c.model.context, c.model.width});
  const Bytes message = train::encode_activation(train::ActivationHeader{}, probe, quant::EncodeOptions{});
  const double real = transport::LinkProfile{}.wire_bytes(message.size() + transport::kFrameHeaderBytes);
  const double table = train::pipeline_costs(c).activation_bytes;
  return table > 0 ? real / table : 1.0;
}

double bytes_sent_per_node(const Network& network, std::size_t nodes) {
  double sent = 0;
  for (std::size_t v = 0; v < nodes; ++v) sent += static_cast<double>(network.traffic(static_cast<int>(v)).wire_bytes_sent);
  return sent / static_cast<double>(nodes);
}

PipelineTotals::PipelineTotals(const train::RunConfig& config, const skippipe::Plan& first_plan, double hop_bytes_scale)
    : config_(config),
      plan_(first_plan),
      hop_bytes_scale_(hop_bytes_scale),
      launched_(static_cast<std::size_t>(config.pipeline.nodes), 0),
      busy_(static_cast<std::size_t>(config.pipeline.nodes), 0.0),
      peak_(static_cast<std::size_t>(config.pipeline.nodes), 0) {}

nlohmann::json PipelineTotals::add(const train::PipelineRecord& rec, const std::vector<std::int64_t>& started, double time_s, double bytes_sent_per_node,
                                   std::optional<double> val_loss) {
  const std::size_t nodes = launched_.size();
  for (std::size_t v = 0; v < nodes && v < started.size(); ++v) launched_[v] += started[v];
  pipeline_time_ += rec.makespan_s;
  sync_time_ += rec.sync_s;
  activation_bytes_ += rec.activation_bytes;
  sync_bytes_ += rec.sync_bytes;
  sync_rounds_ += rec.sync_rounds;
  for (std::size_t v = 0; v < nodes && v < rec.node_busy_s.size(); ++v) {
    busy_[v] += rec.node_busy_s[v];
    peak_[v] = std::max(peak_[v], rec.node_peak_inflight[v]);
  }
  if (++iterations_ == 1) {
    timeline_ = timeline_json(rec, plan_.schedule);
    first_makespan_ = rec.makespan_s;
  }
  nlohmann::json j = {{"worker", 0},
                      {"step", rec.iteration},
                      {"samples", rec.samples},
                      {"train_loss", rec.train_loss},
                      {"lr", rec.lr},
                      {"grad_norm", rec.grad_norm},
                      {"time_s", time_s},
                      {"makespan_s", rec.makespan_s},
                      {"sync_s", rec.sync_s},
                      {"predicted_makespan_s", rec.predicted_makespan_s},
                      {"activation_bytes", rec.activation_bytes},
                      {"sync_bytes", rec.sync_bytes},
                      {"sync_rounds", rec.sync_rounds},
                      {"lost_nodes", rec.lost_nodes},
                      {"microbatches", rec.losses},
                      {"bytes_sent", bytes_sent_per_node}};
  if (val_loss) j["val_loss"] = *val_loss;
  return j;
}

void PipelineTotals::finish(const PipelineEnd& end, const Network& network, double sim_time_s, ClusterResult& result) const {
  const auto& c = config_;
  const std::size_t nodes = launched_.size();
  const auto iterations = static_cast<double>(std::max<std::int64_t>(1, c.train.steps));
  nlohmann::json node_idle = nlohmann::json::array(), node_bytes = nlohmann::json::array();
  result.accounts.resize(nodes);
  for (std::size_t v = 0; v < nodes; ++v) {
    auto& a = result.accounts[v];
    const NodeTraffic tr = network.traffic(static_cast<int>(v));
    a.steps = c.train.steps;
    a.tokens = launched_[v] * c.train.batch_size * c.model.context;
    a.bytes_sent = tr.wire_bytes_sent;
    a.bytes_received = tr.wire_bytes_received;
    a.compute_s = busy_[v];
    a.blocked_s = std::max(0.0, sim_time_s - busy_[v]);
    a.rounds = c.pipeline.stage_sync == optim::Method::kDdp ? c.train.steps : (end.stage_replicas > 0 ? sync_rounds_ / end.stage_replicas : 0);
    node_idle.push_back(std::max(0.0, pipeline_time_ - busy_[v]));
    node_bytes.push_back(tr.wire_bytes_sent);
  }
  const skippipe::Schedule& s = plan_.schedule;
  result.pipeline = {{"mode", train::name_of(c.pipeline.mode)},
                     {"stage_sync", train::name_of(c.pipeline.stage_sync)},
                     {"nodes", c.pipeline.nodes},
                     {"stages", c.pipeline.stages},
                     {"path_length", c.pipeline.path_length},
                     {"stage_of", s.stage_of},
                     {"microbatches", s.microbatches()},
                     {"predicted_makespan_s", plan_.simulation.makespan_s},
                     {"closed_form_makespan_s", plan_.predicted_makespan_s},
                     {"makespan_s", pipeline_time_ / iterations},
                     {"first_makespan_s", first_makespan_},
                     {"sync_s", sync_time_ / iterations},
                     {"node_busy_s", busy_},
                     {"node_idle_s", node_idle},
                     {"node_peak_inflight", peak_},
                     {"node_bytes_sent", node_bytes},
                     {"activation_bytes", activation_bytes_},
                     {"sync_bytes", sync_bytes_},
                     {"lost_nodes", end.lost_nodes},
                     {"retried_iterations", end.retried_iterations},
                     {"retried_s", end.retried_s},
                     {"final_predicted_makespan_s", end.final_predicted_makespan_s},
                     {"depth_scaling", c.pipeline.depth_scaling},
                     {"stage_shares", end.evaluations.stage_shares},
                     {"omitted_stages", end.evaluations.omitted},
                     {"val_loss", end.evaluations.val_loss},
                     {"omitted_val_loss", end.evaluations.omitted_val_loss},
                     {"val_loss_as_trained", end.evaluations.val_loss_as_trained},
                     {"omitted_val_loss_as_trained", end.evaluations.omitted_val_loss_as_trained},
                     {"hop_bytes_scale", hop_bytes_scale_},
                     {"timeline", timeline_}};
  if (end.rejoin_s) result.pipeline["rejoin_s"] = *end.rejoin_s;
}

}  // namespace gossamer::sim
