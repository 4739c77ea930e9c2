#include "train/pipeline.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "core/check.h"
#include "train/pipeline_iteration.h"
#include "transport/tags.h"

namespace gossamer::train {

using pipeline_detail::routes;

std::vector<int> node_visits(const skippipe::Schedule& s) {
  std::vector<int> v(static_cast<std::size_t>(s.nodes()), 0);
  for (const auto& r : routes(s)) {
    std::vector<int> seen = r.path;
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int node : seen) {
      if (node >= 0 && node < s.nodes()) ++v[static_cast<std::size_t>(node)];
    }
  }
  return v;
}

std::pair<std::int64_t, std::int64_t> stage_blocks(std::int64_t stage, std::int64_t stages, std::int64_t layers) {
  GOSSAMER_CHECK(stages >= 1 && layers % stages == 0, "a pipeline of " + std::to_string(stages) + " stages needs model.layers divisible by it (it is " +
                                                          std::to_string(layers) + ")");
  GOSSAMER_CHECK(stage >= 0 && stage < stages, "no stage " + std::to_string(stage));
  const std::int64_t per = layers / stages;
  return {stage * per, (stage + 1) * per};
}

PipelineNode::PipelineNode(int node, skippipe::Schedule schedule, model::Gpt model, std::vector<std::shared_ptr<transport::Link>> links,
                           PipelineNodeOptions options)
    : node_(node), schedule_(std::move(schedule)), model_(std::move(model)), links_(std::move(links)), options_(options) {
  GOSSAMER_CHECK(options_.clock != nullptr, "PipelineNode: no clock");
  GOSSAMER_CHECK(node >= 0 && node < schedule_.nodes(), "PipelineNode: node outside the schedule");
  GOSSAMER_CHECK(static_cast<int>(links_.size()) == schedule_.nodes(), "PipelineNode: one link slot per node");
  stage_ = schedule_.stage_of[static_cast<std::size_t>(node)];
  blocks_ = stage_blocks(stage_, schedule_.options.stages, model_.config().layers);
  for (const auto& block : model_.blocks()) {
    bool mine = false;
    if (block.name == "embed" || block.name == "final") {
      mine = stage_ == 0;
    } else {
      const std::int64_t i = std::stoll(block.name.substr(6));  // "block.i"
      mine = i >= blocks_.first && i < blocks_.second;
    }
    if (mine) {
      optim::ParamBlock pb{block.name, {}};
      for (const auto& p : block.parameters) {
        params_.push_back(p.tensor);
        pb.tensors.push_back(p.tensor);
      }
      param_blocks_.push_back(std::move(pb));
    }
  }
  plan_work();
}

void PipelineNode::reschedule(skippipe::Schedule schedule, std::vector<std::shared_ptr<transport::Link>> links) {
  GOSSAMER_CHECK(schedule.nodes() == schedule_.nodes() && static_cast<int>(links.size()) == schedule.nodes(), "PipelineNode::reschedule: another number of nodes");
  GOSSAMER_CHECK(schedule.stage_of[static_cast<std::size_t>(node_)] == stage_, "PipelineNode::reschedule: a node keeps its stage");
  schedule_ = std::move(schedule);
  links_ = std::move(links);
  plan_work();
}

void PipelineNode::plan_work() {
  order_.clear();
  visits_ = 0;
  stage_visits_ = 0;
  if (!schedule_.timetable.empty()) {
    // This node's work from the timetable, by start time (ties, which a timetable of positive costs
    // does not have, by micro-batch).
    std::vector<std::uint32_t> first(schedule_.agents.size(), 0);  // each agent's first micro-batch
    for (std::size_t a = 1; a < schedule_.agents.size(); ++a) first[a] = first[a - 1] + static_cast<std::uint32_t>(schedule_.agents[a - 1].microbatches);
    std::vector<std::pair<double, OrderItem>> items;
    for (const auto& e : schedule_.timetable) {
      GOSSAMER_CHECK(e.agent >= 0 && static_cast<std::size_t>(e.agent) < schedule_.agents.size(), "PipelineNode: a timetable entry of no agent");
      const auto& agent = schedule_.agents[static_cast<std::size_t>(e.agent)];
      GOSSAMER_CHECK(e.hop >= 0 && e.hop <= static_cast<int>(agent.hops.size()) && e.microbatch >= 0 && e.microbatch < agent.microbatches,
                     "PipelineNode: a timetable entry off its agent's path");
      const int at = e.hop == 0 ? agent.origin : agent.hops[static_cast<std::size_t>(e.hop - 1)];
      if (at != node_) continue;
      const std::uint32_t mb = first[static_cast<std::size_t>(e.agent)] + static_cast<std::uint32_t>(e.microbatch);
      if (e.hop == 0) {
        items.push_back({e.forward_start, OrderItem{mb, Step::kLaunch, 0}});
        items.push_back({e.head_start, OrderItem{mb, Step::kHead, 0}});
      } else {
        items.push_back({e.forward_start, OrderItem{mb, Step::kForward, e.hop}});
      }
      items.push_back({e.backward_start, OrderItem{mb, Step::kBackward, e.hop}});
    }
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second.microbatch < b.second.microbatch;
    });
    for (const auto& [t, item] : items) order_.push_back(item);
  }
  for (const auto& r : routes(schedule_)) {
    const bool here = std::find(r.path.begin(), r.path.end(), node_) != r.path.end();
    bool stage_here = stage_ == 0;
    for (int v : r.path) stage_here = stage_here || schedule_.stage_of[static_cast<std::size_t>(v)] == stage_;
    visits_ += here ? 1 : 0;
    stage_visits_ += stage_here ? 1 : 0;
  }
}

Result<IterationStats> PipelineNode::run_iteration(std::uint64_t iteration, const std::vector<MicroBatchData>& data, Deadline deadline) {
  pipeline_detail::PipelineIteration it(*this, iteration, data, deadline);
  return it.run();
}

Status PipelineNode::sync_stage(const optim::Group& group, std::uint64_t iteration, Deadline deadline, optim::CommStats* stats) {
  // Each replica's sum scaled by replicas / visits, then the replicas' mean: the sum over every
  // micro-batch of the stage, over its visits.
  std::vector<at::Tensor> grads;
  for (const auto& p : params_) grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
  at::Tensor flat = torch::cat([&] {
    std::vector<at::Tensor> v;
    for (const auto& g : grads) v.push_back(g.detach().reshape({-1}).to(at::kFloat));
    return v;
  }());
  if (stage_visits_ > 0) flat.mul_(static_cast<double>(group.size) / static_cast<double>(stage_visits_));
  quant::EncodeOptions fp32;
  if (Status st = optim::allreduce_mean(group, flat, fp32, transport::tags::kPipelineSync | static_cast<transport::Tag>(iteration & 0xFFFFu), deadline, stats);
      !st.ok()) {
    return st.with_context("stage " + std::to_string(stage_) + " sync");
  }
  std::int64_t at = 0;
  for (auto& p : params_) {
    const std::int64_t n = p.numel();
    at::Tensor g = flat.slice(0, at, at + n).view(p.sizes());
    if (p.grad().defined()) {
      p.mutable_grad().copy_(g);
    } else {
      p.mutable_grad() = g.clone();
    }
    at += n;
  }
  return Status();
}

}  // namespace gossamer::train
