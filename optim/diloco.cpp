#include "optim/diloco.h"

#include <torch/torch.h>

#include <cmath>
#include <string>

#include "core/check.h"
#include "optim/flat_params.h"
#include "transport/tags.h"

namespace gossamer::optim {

namespace {
constexpr transport::Tag kDiLoCoTag = transport::tags::kDiLoCo;  // + round (round_tag)
constexpr std::int64_t kMaxDelayRounds = 64;
}  // namespace

std::string_view DiLoCo::kind() const {
  if (options_.error_feedback) return options_.outer_step == OuterStep::kCGAD ? "diloco_ef_cgad" : "diloco_ef";
  return options_.outer_step == OuterStep::kCGAD ? "diloco_cgad" : "diloco_delayed";
}

DiLoCo::DiLoCo(std::vector<at::Tensor> params, Group group, DiLoCoOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(options) {
  GOSSAMER_CHECK(options_.inner_steps >= 1, "DiLoCo: inner_steps must be >= 1");
  GOSSAMER_CHECK(options_.outer_lr > 0 && options_.outer_momentum >= 0 && options_.outer_momentum < 1,
                 "DiLoCo: outer_lr must be > 0 and outer_momentum in [0, 1)");
  GOSSAMER_CHECK(options_.delay_rounds >= 0 && options_.delay_rounds <= kMaxDelayRounds, "DiLoCo: delay_rounds must be in [0, 64]");
  GOSSAMER_CHECK(options_.outer_step != OuterStep::kCGAD || (options_.cgad.lr > 0 && options_.cgad.beta2 >= 0 && options_.cgad.beta2 < 1 && options_.cgad.eps > 0),
                 "DiLoCo: CGAD needs lr > 0, beta2 in [0, 1) and eps > 0");
  state_.outer = flatten(params_, options_.state_device);
  state_.momentum = torch::zeros_like(state_.outer);
  GOSSAMER_CHECK(options_.error_decay >= 0 && options_.error_decay <= 1, "DiLoCo: error_decay must be in [0, 1]");
  if (options_.outer_step == OuterStep::kCGAD) second_ = torch::zeros_like(state_.outer);
  if (options_.error_feedback) residual_ = torch::zeros_like(state_.outer);
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
  // Error feedback: the round sends the decayed residual plus Delta, which the all-reduce encodes
  // itself (re-encoding a codec image would not give the same bytes: int2's scale is the block's RMS,
  // which quantizing changes); what the owners will not decode of it becomes the residual, once the
  // round went through (a failed round changes nothing). A non-finite Delta is left to the
  // all-reduce's rule and never enters the residual.
  at::Tensor unsent;
  if (options_.error_feedback && torch::isfinite(delta).all().item<bool>()) {
    delta = residual_ * options_.error_decay + delta;
    unsent = delta - allreduce_contribution(delta, group_.size, options_.codec).to(options_.state_device).view_as(delta);
  }
  const Status st = allreduce_mean(group_, delta, options_.codec, tag, deadline, &stats, kAllreduceSegmentValues, options_.aggregation);
  comm_ += stats;  // a failed round's bytes were sent all the same
  if (!st.ok()) return st.with_context("DiLoCo round " + std::to_string(state_.rounds + 1));
  if (unsent.defined()) residual_ = unsent;
  if (weights) {
    fastest_step_s_ = weights->fastest_step_seconds();
    round_steps_ = steps_by_rank(*weights);
  }
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
  if (options_.delay_rounds == 0) {
    outer_step(delta, 0);
  } else {
    waiting_.push_back(delta.clone());
    if (static_cast<std::int64_t>(waiting_.size()) > options_.delay_rounds) {
      const at::Tensor oldest = waiting_.front();
      waiting_.pop_front();
      outer_step(oldest, options_.delay_rounds);
    }
  }
  write_flat(params_, state_.outer);
  ++state_.rounds;
}

void DiLoCo::outer_step(const at::Tensor& delta, std::int64_t age) {
  if (options_.outer_step == OuterStep::kNesterov) {
    const double mu = options_.outer_momentum, lr = options_.outer_lr;
    // In place: no model-sized temporaries (each would be a whole model's bytes at a real size).
    state_.momentum.mul_(mu).add_(delta);  // v <- mu v + Delta
    if (options_.nesterov) {
      state_.outer.sub_(delta, lr).sub_(state_.momentum, mu * lr);  // Nesterov look-ahead: lr (Delta + mu v)
    } else {
      state_.outer.sub_(state_.momentum, lr);
    }
    return;
  }
  // CGAD: the gated Delta into Adam's moments.
  const double sigma = options_.cgad.gate.weight(static_cast<double>(age));
  if (sigma <= 0) return;  // past the cutoff: nothing of it is applied
  const double b1 = options_.outer_momentum, b2 = options_.cgad.beta2;
  const at::Tensor s = delta * sigma;
  state_.momentum.mul_(b1).add_(s, 1 - b1);
  second_.mul_(b2).addcmul_(s, s, 1 - b2);
  ++adam_steps_;
  const double c1 = 1 - std::pow(b1, static_cast<double>(adam_steps_)), c2 = 1 - std::pow(b2, static_cast<double>(adam_steps_));
  state_.outer.sub_(state_.momentum / c1 / ((second_ / c2).sqrt_() + options_.cgad.eps) * options_.cgad.lr);
}

Bytes DiLoCo::save() const { return save_with(residual_); }

Bytes DiLoCo::save_shared() const { return save_with(residual_.defined() ? torch::zeros_like(residual_) : residual_); }

Bytes DiLoCo::save_with(const at::Tensor& residual) const {
  if (plain()) return state_.save("diloco");  // the format of every earlier checkpoint
  // The waiting means, always delay_rounds of them (zeros for those not there yet; `waiting` says how many).
  std::vector<at::Tensor> tensors = {state_.outer, state_.momentum};
  if (second_.defined()) tensors.push_back(second_);
  if (residual.defined()) tensors.push_back(residual);
  for (std::int64_t i = 0; i < options_.delay_rounds; ++i) {
    tensors.push_back(i < static_cast<std::int64_t>(waiting_.size()) ? waiting_[static_cast<std::size_t>(i)] : torch::zeros_like(state_.outer));
  }
  const std::int64_t waiting = static_cast<std::int64_t>(waiting_.size());
  return save_state(kind(), {state_.rounds, state_.skipped, adam_steps_, options_.delay_rounds, waiting}, tensors);
}

Status DiLoCo::load(ByteView bytes) {
  if (plain()) return state_.load(bytes, "diloco");
  // Read into fresh tensors: nothing changes unless all of it is good.
  std::vector<std::int64_t> counters(5);
  const std::int64_t count = 2 + (second_.defined() ? 1 : 0) + (residual_.defined() ? 1 : 0) + options_.delay_rounds;
  std::vector<at::Tensor> tensors;
  for (std::int64_t i = 0; i < count; ++i) tensors.push_back(torch::zeros_like(state_.outer));
  if (Status st = load_state(bytes, kind(), counters, tensors); !st.ok()) return st;
  if (counters[3] != options_.delay_rounds || counters[4] < 0 || counters[4] > options_.delay_rounds || counters[2] < 0) {
    return error(ErrorCode::kMalformed, "a DiLoCo state saved with another delay (" + std::to_string(counters[3]) + " rounds, this run has " +
                                            std::to_string(options_.delay_rounds) + ") or bad counters");
  }
  state_.rounds = counters[0];
  state_.skipped = counters[1];
  adam_steps_ = counters[2];
  std::size_t at = 0;
  state_.outer = tensors[at++];
  state_.momentum = tensors[at++];
  if (second_.defined()) second_ = tensors[at++];
  if (residual_.defined()) residual_ = tensors[at++];
  waiting_.clear();
  for (std::int64_t i = 0; i < counters[4]; ++i) waiting_.push_back(tensors[at + static_cast<std::size_t>(i)]);
  return Status();
}

}  // namespace gossamer::optim
