#include "optim/co2.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "optim/flat_params.h"
#include "optim/state_io.h"
#include "transport/tags.h"

namespace gossamer::optim {

namespace {
constexpr transport::Tag kCO2Tag = transport::tags::kCO2;  // + round (round_tag)
}  // namespace

CO2::CO2(std::vector<at::Tensor> params, AsyncCollectives& comm, CO2Options options, std::shared_ptr<const StalenessPenalty> penalty,
         const std::vector<std::int64_t>& layer_sizes)
    : params_(std::move(params)), comm_(&comm), options_(options), penalty_(std::move(penalty)) {
  GOSSAMER_CHECK(options_.inner_steps >= 1, "CO2: inner_steps must be >= 1");
  GOSSAMER_CHECK(options_.outer_momentum >= 0 && options_.outer_momentum < 1, "CO2: outer_momentum must be in [0, 1)");
  GOSSAMER_CHECK(options_.gap_penalty > 0 && options_.clip_threshold > 0, "CO2: gap_penalty and clip_threshold must be > 0");
  if (!penalty_) penalty_ = std::make_shared<ConstantPenalty>(options_.gap_penalty);
  outer_ = flatten(params_, options_.state_device);
  momentum_ = torch::zeros_like(outer_);
  layer_offsets_ = {0};
  for (const std::int64_t n : layer_sizes) layer_offsets_.push_back(layer_offsets_.back() + n);
  if (layer_sizes.empty()) layer_offsets_.push_back(outer_.numel());
  GOSSAMER_CHECK(layer_offsets_.back() == outer_.numel(), "CO2: the layer sizes do not add up to the parameters");
}

void CO2::apply(const at::Tensor& average, std::int64_t round) {
  at::Tensor g = previous_outer_ - average;  // x_{t-1,0} - xbar_{t-1}
  const std::vector<double> lambda = penalty_->lambda(StalenessInputs{round, outer_, previous_outer_, g, layer_offsets_});
  const std::size_t layers = layer_offsets_.size() - 1;
  GOSSAMER_CHECK(lambda.size() == 1 || lambda.size() == layers, "CO2: a staleness penalty gives one factor or one per layer");
  for (const double l : lambda) GOSSAMER_CHECK(std::isfinite(l) && l > 0, "CO2: a staleness penalty must be finite and > 0");
  if (lambda.size() == 1) {
    g.div_(lambda[0]);
  } else {
    for (std::size_t l = 0; l < layers; ++l) g.slice(0, layer_offsets_[l], layer_offsets_[l + 1]).div_(lambda[l]);
  }
  momentum_.mul_(options_.outer_momentum).add_(g);
  if (options_.clip) momentum_.clamp_(-options_.clip_threshold, options_.clip_threshold);
  outer_ = outer_ - options_.outer_lr * momentum_;
}

Result<bool> CO2::step(std::int64_t inner_steps_done, Deadline deadline) {
  if (inner_steps_done <= 0 || inner_steps_done % options_.inner_steps != 0) return false;
  const std::int64_t round = inner_steps_done / options_.inner_steps;
  // The average launched last round, which used x_{t-1,tau}: it must be in before we go on.
  if (pending_ && pending_round_ != round - 1) {  // an older one (rounds were skipped): of no use now
    lost(pending_round_);
    pending_.reset();
  }
  if (pending_) {
    if (Status st = pending_->wait(deadline); !st.ok()) {
      if (pending_->done()) {  // failed for good: that average is lost (its bytes count), the next round launches afresh
        stats_ += pending_->stats();
        pending_.reset();
        lost(round - 1);
      }
      return st.with_context("CO2 round " + std::to_string(round));
    }
    stats_ += pending_->stats();
    record_pending();
  } else if (round > 1) {
    lost(round - 1);  // not launched (its round failed), or dropped
  }
  // Launch this round's average; it completes while the next round trains.
  auto launched = comm_->allreduce_mean(flatten(params_, options_.state_device), options_.codec, round_tag(kCO2Tag, round), Deadline::after(comm_->clock(), options_.average_timeout),
                                         options_.aggregation);
  const at::Tensor current_outer = outer_;
  if (pending_) apply(pending_->tensor(), round);
  previous_outer_ = current_outer;  // x_{t,0}: the start of the round whose average was just launched
  pending_ = std::move(launched);
  pending_round_ = round;
  write_flat(params_, outer_);
  ++rounds_;
  return true;
}

bool CO2::average_in() const { return pending_ && pending_->done() && pending_->wait(Deadline::never()).ok(); }

void CO2::lost(std::int64_t round) {
  if (round <= last_lost_) return;
  last_lost_ = round;
  ++skipped_rounds_;
}

Status CO2::regroup(Group group) {
  comm_->set_group(std::move(group));
  // An average that is in is the group's, whoever the members are now (callers settle() before the
  // members change, so every member keeps it alike); one still in flight over the old group is lost.
  if (pending_ && !average_in()) {
    lost(pending_round_);
    pending_.reset();
  }
  return Status();
}

Status CO2::settle(Deadline deadline) {
  if (!pending_) return Status();
  Status st = pending_->wait(deadline);
  if (!st.ok()) return st.with_context("CO2's average of round " + std::to_string(pending_round_));
  record_pending();
  return Status();
}

void CO2::record_pending() {
  if (!sink_ || !pending_ || pending_round_ <= recorded_) return;
  recorded_ = pending_round_;
  sink_(pending_round_ * options_.inner_steps, pending_->tensor());
}

Status CO2::replay(std::int64_t step, const at::Tensor& average) {
  if (Status st = check_update(average, outer_.numel(), "CO2", step); !st.ok()) return st;
  if (step <= 0 || step % options_.inner_steps != 0) return error(ErrorCode::kMalformed, "CO2 has no round at step " + std::to_string(step));
  const std::int64_t round = step / options_.inner_steps;
  // As step() for `round` on a settled state, with `average` as the one it launched. A gap (no update
  // of the round before, while this state holds an earlier average) is either a round the members
  // skipped (they dropped that average) or an average they lost after applying the one before (they
  // applied it): the two differ, and the updates do not tell which, so a newer snapshot is needed.
  if (pending_ && pending_round_ != round - 1) {
    return error(ErrorCode::kDataLoss, "CO2 round " + std::to_string(round) + ": no update of round " + std::to_string(round - 1) +
                                           " (its average was lost or its round skipped): the state must come from a newer snapshot");
  }
  if (!pending_ && round > 1) lost(round - 1);
  const at::Tensor current_outer = outer_;
  if (pending_) apply(pending_->tensor(), round);
  previous_outer_ = current_outer;
  pending_ = Work::completed(comm_->clock(), average.to(outer_.device()));
  pending_round_ = round;
  recorded_ = std::max(recorded_, round);
  write_flat(params_, outer_);
  ++rounds_;
  return Status();
}

Status CO2::finish(Deadline deadline) {
  if (!pending_) return Status();
  if (Status st = pending_->wait(deadline); !st.ok()) {
    if (pending_->done()) stats_ += pending_->stats();
    lost(pending_round_);
    pending_.reset();
    return st.with_context("CO2's last average (round " + std::to_string(pending_round_) + ")");
  }
  stats_ += pending_->stats();
  const at::Tensor current_outer = outer_;
  apply(pending_->tensor(), pending_round_ + 1);
  previous_outer_ = current_outer;
  last_lost_ = std::max(last_lost_, pending_round_);  // accounted for: a later round does not count it lost
  pending_.reset();
  write_flat(params_, outer_);
  return Status();
}

Bytes CO2::save() const {
  const at::Tensor prev = previous_outer_.defined() ? previous_outer_ : torch::zeros_like(outer_);
  const bool in = average_in();  // the average launched last round goes with the state when it is in
  return save_state("co2", {rounds_, skipped_rounds_, in ? pending_round_ : 0, last_lost_},
                    {outer_, prev, momentum_, in ? pending_->tensor() : torch::zeros_like(outer_)});
}

Status CO2::load(ByteView bytes) {
  std::vector<std::int64_t> counters(4);
  std::vector<at::Tensor> tensors = {outer_, outer_, momentum_, outer_};
  if (Status st = load_state(bytes, "co2", counters, tensors); !st.ok()) return st;
  rounds_ = counters[0];
  skipped_rounds_ = counters[1];
  last_lost_ = counters[3];
  outer_ = tensors[0];
  previous_outer_ = tensors[1];
  momentum_ = tensors[2];
  pending_.reset();
  if (counters[2] > 0) {
    pending_ = Work::completed(comm_->clock(), tensors[3]);
    pending_round_ = counters[2];
    recorded_ = std::max(recorded_, pending_round_);
  }
  return Status();
}

}  // namespace gossamer::optim
