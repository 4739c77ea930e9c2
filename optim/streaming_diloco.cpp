#include "optim/streaming_diloco.h"

#include <torch/torch.h>

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "optim/flat_params.h"
#include "optim/state_io.h"
#include "transport/tags.h"

namespace gossamer::optim {

namespace {
constexpr transport::Tag kStreamingTagBase = transport::tags::kStreaming;  // | fragment << 16, + window (round_tag)
}  // namespace

StreamingDiLoCo::StreamingDiLoCo(std::vector<Fragment> fragments, AsyncCollectives& comm, StreamingDiLoCoOptions options)
    : fragments_(std::move(fragments)), comm_thread_(&comm), options_(options) {
  const auto p = static_cast<std::int64_t>(fragments_.size());
  GOSSAMER_CHECK(p >= 1 && p <= 256, "StreamingDiLoCo: 1 to 256 fragments");
  GOSSAMER_CHECK(options_.inner_steps >= 1 && options_.inner_steps % p == 0, "StreamingDiLoCo: H must be a multiple of the fragment count");
  GOSSAMER_CHECK(options_.overlap >= 0 && options_.overlap < options_.inner_steps / p, "StreamingDiLoCo: tau must be in [0, H/P)");
  GOSSAMER_CHECK(options_.mixing >= 0 && options_.mixing <= 1, "StreamingDiLoCo: alpha must be in [0, 1]");
  for (std::size_t f = 0; f < fragments_.size(); ++f) {
    const at::Tensor flat = flatten(fragments_[f].tensors, options_.state_device);
    State st;
    st.outer = flat;
    st.momentum = torch::zeros_like(flat);
    state_.push_back(std::move(st));
  }
}

Result<int> StreamingDiLoCo::step(std::int64_t s, Deadline deadline) {
  if (s <= 0) return 0;
  const std::int64_t h = options_.inner_steps, p = static_cast<std::int64_t>(fragments_.size()), tau = options_.overlap;
  if (options_.token_weighted && s == kCalibrationStep && h > kCalibrationStep) {  // calibrate (token_weights.h)
    auto w = comm_thread_->calibrate(state_[0].meter.latest(), kMaxWeightedWindows * h, deadline);
    if (Status st = w->wait(deadline); st.ok()) {
      fastest_step_s_ = w->weights().fastest_step_seconds();
    } else {
      spdlog::warn("the members' first step times were not exchanged ({}): the first window runs in lockstep", st.to_string());
    }
    comm_ += w->stats();
  }
  int done = 0;
  for (std::int64_t f = 0; f < p; ++f) {
    const std::int64_t t_f = (f + 1) * h / p;  // completion offset within each window of H steps
    State& st = state_[static_cast<std::size_t>(f)];
    // LAUNCH tau steps before completion.
    if ((s - (t_f - tau)) % h == 0 && s >= t_f - tau && !st.pending) {
      const std::int64_t window = (s + tau) / h;
      at::Tensor delta = st.outer - flatten(fragments_[static_cast<std::size_t>(f)].tensors, options_.state_device);
      const transport::Tag tag = round_tag(kStreamingTagBase | (static_cast<transport::Tag>(f & 0xFF) << 16), window);
      st.pending = options_.token_weighted
                       ? comm_thread_->weighted_allreduce_mean(std::move(delta), st.meter.contribution(), kMaxWeightedWindows * h, options_.codec,
                                                               tag, deadline, options_.aggregation)
                       : comm_thread_->allreduce_mean(std::move(delta), options_.codec, tag, deadline, options_.aggregation);
      st.meter.merged();
      st.pending_window = window;
    }
    // COMPLETE at t_f.
    if ((s - t_f) % h != 0 || s < t_f) continue;
    if (!st.pending) {
      missed(st, s / h);  // failed, dropped or never launched
      continue;
    }
    if (Status w = st.pending->wait(deadline); !w.ok()) {
      if (st.pending->done()) {  // failed for good (its bytes count): the next window launches afresh
        comm_ += st.pending->stats();
        st.pending.reset();
        missed(st, s / h);
      }
      return w.with_context("Streaming DiLoCo fragment " + std::to_string(f) + " at step " + std::to_string(s));
    }
    comm_ += st.pending->stats();
    const at::Tensor delta = st.pending->tensor();
    if (!st.pending->weights().members().empty()) {
      fastest_step_s_ = st.pending->weights().fastest_step_seconds();
      round_steps_ = steps_by_rank(st.pending->weights());
    }
    st.pending.reset();
    if (sink_) sink_(s, delta);
    const double mu = options_.outer_momentum, lr = options_.outer_lr, alpha = options_.mixing;
    st.momentum.mul_(mu).add_(delta);
    st.outer.sub_(delta, lr).sub_(st.momentum, mu * lr);  // lr (Delta + mu v), in place as DiLoCo's
    auto& tensors = fragments_[static_cast<std::size_t>(f)].tensors;
    write_flat(tensors, alpha == 0.0 ? st.outer : flatten(tensors, options_.state_device) * alpha + st.outer * (1.0 - alpha));
    ++completed_;
    ++done;
  }
  return done;
}

Status StreamingDiLoCo::replay(std::int64_t s, const at::Tensor& delta) {
  const std::int64_t h = options_.inner_steps, p = static_cast<std::int64_t>(fragments_.size());
  for (std::int64_t f = 0; f < p; ++f) {
    const std::int64_t t_f = (f + 1) * h / p;
    if (s < t_f || (s - t_f) % h != 0) continue;
    State& st = state_[static_cast<std::size_t>(f)];
    if (Status c = check_update(delta, st.outer.numel(), "Streaming DiLoCo fragment " + std::to_string(f), s); !c.ok()) return c;
    const at::Tensor d = delta.to(options_.state_device);
    const double mu = options_.outer_momentum, lr = options_.outer_lr;
    st.momentum.mul_(mu).add_(d);
    st.outer.sub_(d, lr).sub_(st.momentum, mu * lr);
    st.pending.reset();
    write_flat(fragments_[static_cast<std::size_t>(f)].tensors, st.outer);
    ++completed_;
    return Status();
  }
  return error(ErrorCode::kMalformed, "Streaming DiLoCo completes no fragment at step " + std::to_string(s));
}

void StreamingDiLoCo::take_shared_weights() {
  for (std::size_t f = 0; f < fragments_.size(); ++f) write_flat(fragments_[f].tensors, state_[f].outer);
}

void StreamingDiLoCo::missed(State& st, std::int64_t window) {
  if (window <= st.last_missed) return;
  st.last_missed = window;
  ++skipped_;
}

Status StreamingDiLoCo::regroup(Group group) {
  comm_thread_->set_group(std::move(group));
  for (auto& st : state_) {
    if (st.pending) missed(st, st.pending_window);
    st.pending.reset();
  }
  return Status();
}

Bytes StreamingDiLoCo::save() const { return save_counting(skipped_); }

Bytes StreamingDiLoCo::save_shared() const { return save_counting(0); }

Bytes StreamingDiLoCo::save_counting(std::int64_t skipped) const {
  std::vector<at::Tensor> tensors;
  for (const auto& st : state_) {
    tensors.push_back(st.outer);
    tensors.push_back(st.momentum);
  }
  return save_state("streaming_diloco", {completed_, skipped}, tensors);
}

Status StreamingDiLoCo::load(ByteView bytes) {
  std::vector<std::int64_t> counters(2);
  std::vector<at::Tensor> tensors;
  for (const auto& st : state_) {
    tensors.push_back(st.outer);
    tensors.push_back(st.momentum);
  }
  if (Status s = load_state(bytes, "streaming_diloco", counters, tensors); !s.ok()) return s;
  completed_ = counters[0];
  skipped_ = counters[1];
  for (std::size_t f = 0; f < state_.size(); ++f) {
    state_[f].outer = tensors[2 * f];
    state_[f].momentum = tensors[2 * f + 1];
    state_[f].pending.reset();
  }
  return Status();
}

}  // namespace gossamer::optim

