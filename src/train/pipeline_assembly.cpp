// PipelineTrainer: the stages' weights assembled into one model (depth-scaled by how often each stage
// was visited), and evaluated whole or with stages left out (pipeline_trainer.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "core/check.h"
#include "train/pipeline_trainer_parts.h"

namespace gossamer::train {

EndEvaluation::EndEvaluation(const PipelineTrainer& t, std::vector<int> omitted)
    : scales_(t.depth_scales()), omitted_scales_(t.depth_scales(omitted)) {
  figures_.omitted = std::move(omitted);
  figures_.stage_shares = t.stage_shares();
}

EndEvaluations EndEvaluation::measure(const PipelineTrainer& t, const std::map<int, std::vector<at::Tensor>>& stages,
                                      std::optional<double> val_loss) const {
  EndEvaluations out = figures_;
  out.val_loss = val_loss ? *val_loss : t.evaluate_with(stages, scales_);
  out.omitted_val_loss = t.evaluate_with(stages, omitted_scales_, out.omitted);
  out.val_loss_as_trained = t.evaluate_with(stages, {});
  out.omitted_val_loss_as_trained = t.evaluate_with(stages, {}, out.omitted);
  return out;
}

double PipelineTrainer::evaluate(const std::vector<int>& omitted) { return evaluate_with(stage_weights(), depth_scales(omitted), omitted); }

std::map<int, std::vector<at::Tensor>> PipelineTrainer::stage_weights() const {
  const auto& m = *impl_;
  std::map<int, std::vector<at::Tensor>> stages;
  for (int stage = 0; stage < m.config.pipeline.stages; ++stage) {
    // (With stage_sync = diloco: its live weights, the same on every replica just after a round.)
    const int rep = m.representative(stage);
    GOSSAMER_CHECK(rep >= 0, "PipelineTrainer::evaluate: stage " + std::to_string(stage) + " has no node in this process");
    stages[stage] = m.nodes[static_cast<std::size_t>(rep)]->stage_parameters();
  }
  return stages;
}

std::vector<double> PipelineTrainer::depth_scales(const std::vector<int>& omitted) const {
  if (!impl_->config.pipeline.depth_scaling) return {};
  const std::vector<double> shares = stage_shares();
  // A trained path adds `expected` stages' updates to the residual stream (L - 1 at balance); the
  // stages kept add as much, in proportion to their shares, none more than its whole update.
  double expected = 0, kept = 0;
  for (std::size_t st = 1; st < shares.size(); ++st) {
    expected += shares[st];
    if (std::find(omitted.begin(), omitted.end(), static_cast<int>(st)) == omitted.end()) kept += shares[st];
  }
  std::vector<double> scales(shares.size(), 1.0);
  for (std::size_t st = 1; st < shares.size() && kept > 0; ++st) scales[st] = std::min(1.0, shares[st] * expected / kept);
  return scales;
}

model::Gpt PipelineTrainer::assemble(const std::map<int, std::vector<at::Tensor>>& stages, const std::vector<double>& scales) const {
  const auto& m = *impl_;
  model::Gpt model(gpt_config(m.config, 0));
  // The stages' parameters, into the whole model in block order.
  std::map<int, std::size_t> taken;
  torch::NoGradGuard no_grad;
  const std::int64_t per = m.config.model.layers / m.config.pipeline.stages;
  for (const auto& block : model.blocks()) {
    int stage = 0;
    if (block.name != "embed" && block.name != "final") stage = static_cast<int>(std::stoll(block.name.substr(6)) / per);
    const auto it = stages.find(stage);
    GOSSAMER_CHECK(it != stages.end(), "PipelineTrainer::assemble: no parameters for stage " + std::to_string(stage));
    for (const auto& p : block.parameters) {
      const std::size_t k = taken[stage]++;
      GOSSAMER_CHECK(k < it->second.size() && it->second[k].sizes() == p.tensor.sizes(), "PipelineTrainer::assemble: stage " + std::to_string(stage) + "'s parameters do not fit");
      p.tensor.copy_(it->second[k]);
    }
  }
  GOSSAMER_CHECK(scales.empty() || static_cast<std::int64_t>(scales.size()) == m.config.pipeline.stages, "PipelineTrainer::assemble: a scale per stage");
  for (std::int64_t i = 0; i < m.config.model.layers && !scales.empty(); ++i) {
    const double scale = scales[static_cast<std::size_t>(i / per)];
    if (scale != 1) model.scale_residual_branches(i, scale);
  }
  model.train(false);
  return model;
}

double PipelineTrainer::evaluate_with(const std::map<int, std::vector<at::Tensor>>& stages, const std::vector<double>& scales,
                                      const std::vector<int>& omitted) const {
  const auto& m = *impl_;
  model::Gpt model = assemble(stages, scales);
  torch::NoGradGuard no_grad;
  const std::int64_t per = m.config.model.layers / m.config.pipeline.stages;
  double total = 0;
  std::int64_t count = 0;
  for (const auto& b : m.eval_set) {
    auto x = model.embed(b.tokens);
    for (std::int64_t s = 0; s < m.config.pipeline.stages; ++s) {
      if (s > 0 && std::find(omitted.begin(), omitted.end(), static_cast<int>(s)) != omitted.end()) continue;
      for (std::int64_t i = s * per; i < (s + 1) * per; ++i) x = model.block(i, x);
    }
    const auto logits = model.head(x);
    total += torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), b.targets.reshape({-1})).item<double>() * static_cast<double>(b.tokens.numel());
    count += b.tokens.numel();
  }
  return count > 0 ? total / static_cast<double>(count) : 0;
}

std::vector<double> PipelineTrainer::stage_shares() const {
  const auto& m = *impl_;
  const std::vector<double> visits = m.done > 0 ? m.stage_visits : schedule_stage_visits(m.plan.schedule);
  std::vector<double> shares(visits.size(), 1.0);
  for (std::size_t st = 1; st < visits.size(); ++st) shares[st] = visits[0] > 0 ? std::min(1.0, visits[st] / visits[0]) : 1.0;
  return shares;
}

}  // namespace gossamer::train
