#include "optim/diloco.h"

#include <torch/torch.h>

#include "core/check.h"
#include "optim/flat_params.h"
#include "transport/tags.h"

namespace gossamer::optim {

namespace {
constexpr transport::Tag kDiLoCoTag = transport::tags::kDiLoCo;  // + round (round_tag)
}  // namespace

DiLoCo::DiLoCo(std::vector<at::Tensor> params, Group group, DiLoCoOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(options) {
  GOSSAMER_CHECK(options_.inner_steps >= 1, "DiLoCo: inner_steps must be >= 1");
  GOSSAMER_CHECK(options_.outer_lr > 0 && options_.outer_momentum >= 0 && options_.outer_momentum < 1,
                 "DiLoCo: outer_lr must be > 0 and outer_momentum in [0, 1)");
  state_.outer = flatten(params_, options_.state_device);
  state_.momentum = torch::zeros_like(state_.outer);
}

Result<bool> DiLoCo::step(std::int64_t inner_steps_done, Deadline deadline) {
  if (options_.token_weighted && inner_steps_done == kCalibrationStep && options_.inner_steps > kCalibrationStep) {
    CommStats stats;
    fastest_step_s_ = calibrate(group_, meter_, kMaxWeightedWindows * options_.inner_steps, deadline, &stats);
    comm_ += stats;
  }
  if (inner_steps_done <= 0 || inner_steps_done % options_.inner_steps != 0) return false;
  at::Tensor delta = state_.outer - flatten(params_, options_.state_device);  // pseudo-gradient: outer - local
  CommStats stats;
  const transport::Tag tag = round_tag(kDiLoCoTag, inner_steps_done / options_.inner_steps);
  std::optional<RoundWeights> weights;
  if (options_.token_weighted) {
    auto w = weigh(group_, meter_.contribution(), kMaxWeightedWindows * options_.inner_steps, tag, deadline, &stats, delta);
    if (!w.ok()) {
      comm_ += stats;
      return w.status().with_context("DiLoCo round " + std::to_string(state_.rounds + 1));
    }
    weights = std::move(*w);
  }
  const Status st = allreduce_mean(group_, delta, options_.codec, tag, deadline, &stats, kAllreduceSegmentValues, options_.aggregation);
  comm_ += stats;  // a failed round's bytes were sent all the same
  if (!st.ok()) return st.with_context("DiLoCo round " + std::to_string(state_.rounds + 1));
  if (weights) fastest_step_s_ = weights->fastest_step_seconds();
  meter_.merged();
  if (sink_) sink_(inner_steps_done, delta);
  apply(delta);
  return true;
}

Status DiLoCo::replay(std::int64_t step, const at::Tensor& delta) {
  if (Status st = check_update(delta, state_.outer.numel(), "DiLoCo", step); !st.ok()) return st;
  if (step <= 0 || step % options_.inner_steps != 0) return error(ErrorCode::kMalformed, "DiLoCo has no round at step " + std::to_string(step));
  apply(delta.to(options_.state_device));
  return Status();
}

void DiLoCo::apply(const at::Tensor& delta) {
  const double mu = options_.outer_momentum, lr = options_.outer_lr;
  state_.momentum.mul_(mu).add_(delta);  // v <- mu v + Delta
  if (options_.nesterov) {
    state_.outer.sub_((delta + mu * state_.momentum) * lr);  // Nesterov look-ahead
  } else {
    state_.outer.sub_(state_.momentum * lr);
  }
  write_flat(params_, state_.outer);
  ++state_.rounds;
}

}  // namespace gossamer::optim
