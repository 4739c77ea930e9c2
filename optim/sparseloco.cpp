#include "optim/sparseloco.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "optim/flat_params.h"
#include "transport/tags.h"

namespace gossamer::optim {

namespace {

constexpr transport::Tag kSparseLoCoTag = transport::tags::kSparseLoCo;  // + round (round_tag)

std::span<float> span_of(at::Tensor& t) { return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())}; }

// Which payloads a robust rule keeps: those that decode, and whose norm is within outlier_factor
// times the median norm. Empty payloads (an abstaining rank) are left out.
std::vector<char> usable_payloads(const std::vector<Bytes>& payloads, std::int64_t n, const Aggregation& agg) {
  const std::size_t m = payloads.size();
  std::vector<char> usable(m, 0);
  std::vector<double> norm(m, 0.0), in;
  for (std::size_t j = 0; j < m; ++j) {
    if (payloads[j].empty()) continue;
    auto n2 = quant::sparse_norm2(payloads[j], n);
    if (!n2.ok() || !std::isfinite(*n2)) continue;
    usable[j] = 1;
    norm[j] = std::sqrt(*n2);
    in.push_back(norm[j]);
  }
  if (agg.rule != Aggregation::Rule::kFiltered || in.empty()) return usable;
  std::sort(in.begin(), in.end());
  const std::size_t h = in.size() / 2;
  const double median = in.size() % 2 == 1 ? in[h] : (in[h - 1] + in[h]) / 2;
  for (std::size_t j = 0; j < m; ++j) {
    if (usable[j] && norm[j] > agg.outlier_factor * median) usable[j] = 0;
  }
  return usable;
}

}  // namespace

SparseLoCo::SparseLoCo(std::vector<at::Tensor> params, Group group, SparseLoCoOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(options) {
  GOSSAMER_CHECK(options_.inner_steps >= 1, "SparseLoCo: inner_steps must be >= 1");
  GOSSAMER_CHECK(options_.outer_lr > 0 && options_.error_decay >= 0 && options_.error_decay <= 1,
                 "SparseLoCo: outer_lr must be > 0 and error_decay in [0, 1]");
  GOSSAMER_CHECK(options_.sparse.chunk >= 2 && options_.sparse.chunk <= quant::kMaxSparseChunk && options_.sparse.topk >= 1 &&
                     options_.sparse.topk <= options_.sparse.chunk,
                 "SparseLoCo: chunk must be in [2, 2^20] and topk in [1, chunk]");
  GOSSAMER_CHECK(options_.aggregation.rule != Aggregation::Rule::kTrimmedMean, "SparseLoCo: trimmed_mean is not offered (use mean or filtered)");
  state_.outer = flatten(params_, options_.state_device);
  state_.momentum = torch::zeros_like(state_.outer);
}

Result<bool> SparseLoCo::step(std::int64_t inner_steps_done, Deadline deadline) {
  if (options_.token_weighted && inner_steps_done == kCalibrationStep && options_.inner_steps > kCalibrationStep) {
    CommStats stats;
    fastest_step_s_ = calibrate(group_, meter_, kMaxWeightedWindows * options_.inner_steps, deadline, &stats);
    comm_ += stats;
  }
  if (inner_steps_done <= 0 || inner_steps_done % options_.inner_steps != 0) return false;
  const std::int64_t round = inner_steps_done / options_.inner_steps;
  const std::int64_t n = state_.outer.numel();
  const bool robust = options_.aggregation.rule != Aggregation::Rule::kMean;
  CommStats stats;
  const transport::Tag tag = round_tag(kSparseLoCoTag, round);
  at::Tensor delta = state_.outer - flatten(params_, options_.state_device);
  std::optional<RoundWeights> weights;
  if (options_.token_weighted) {  // Delta_r weighed by the steps behind it before it enters the accumulator
    auto w = weigh(group_, meter_.contribution(), kMaxWeightedWindows * options_.inner_steps, tag, deadline, &stats, delta);
    if (!w.ok()) {
      comm_ += stats;
      return w.status().with_context("SparseLoCo round " + std::to_string(state_.rounds + 1));
    }
    weights = std::move(*w);
  }
  // e <- beta e + (outer - local), on the host where the payload is made; committed only on success.
  at::Tensor e = (state_.momentum * options_.error_decay + delta).to(at::kCPU).contiguous();
  // The round's mean goes to the outer weights (the accumulator is already updated).
  auto apply = [&](const at::Tensor& mean) {
    if (sink_) sink_(inner_steps_done, mean);
    state_.outer.sub_(mean.to(options_.state_device) * options_.outer_lr);
    write_flat(params_, state_.outer);
    ++state_.rounds;
    if (weights) {
      fastest_step_s_ = weights->fastest_step_seconds();
      round_steps_ = steps_by_rank(*weights);
    }
    meter_.merged();
    return true;
  };
  if (options_.last_step > 0 && inner_steps_done + options_.inner_steps > options_.last_step) {
    at::Tensor mean;
    const Status st = flush(e, mean, tag, deadline, stats);
    comm_ += stats;
    if (!st.ok()) return st.with_context("SparseLoCo's last round (the accumulators flushed)");
    return apply(mean);
  }
  at::Tensor sent = torch::empty({n}, torch::kFloat);  // c_r as every receiver decodes it
  Bytes mine;
  const bool finite = e.isfinite().all().item<bool>();
  if (finite || !robust) {
    const double scale = group_.poison ? group_.poison->scale : 1.0;
    mine = quant::encode_sparse(std::span<const float>(e.data_ptr<float>(), static_cast<std::size_t>(n)), options_.sparse, span_of(sent), scale);
  } else {
    spdlog::warn("sparseloco: this replica's pseudo-gradient holds NaN or Inf: it abstains this round, and takes the others' result");
    sent.zero_();
  }
  auto payloads = allgather(group_, std::move(mine), tag, deadline, &stats);
  comm_ += stats;
  if (!payloads.ok()) return payloads.status().with_context("SparseLoCo round " + std::to_string(state_.rounds + 1));
  // Every rank sums the same bytes in rank order, so the mean is bit-identical everywhere.
  std::vector<char> usable(payloads->size(), 1);
  if (robust) usable = usable_payloads(*payloads, n, options_.aggregation);
  at::Tensor sum = torch::zeros({n}, torch::kFloat);
  int count = 0;
  std::string left;
  for (std::size_t j = 0; j < payloads->size(); ++j) {
    if (!usable[j]) {
      left += (left.empty() ? "" : ", ") + std::to_string(j);
      continue;
    }
    if (Status st = quant::decode_sparse_add((*payloads)[j], span_of(sum)); !st.ok()) {
      return st.with_context("SparseLoCo round " + std::to_string(state_.rounds + 1) + ": the contribution of rank " + std::to_string(j));
    }
    ++count;
  }
  if (!left.empty()) {
    comm_.left_out += static_cast<std::uint64_t>(std::count(usable.begin(), usable.end(), 0));
    spdlog::warn("sparseloco round {}: rank {} left out the contribution of rank(s) {} (malformed, non-finite or an outlier)", round, group_.rank, left);
  }
  if (count == 0) return error(ErrorCode::kUnavailable, "SparseLoCo round " + std::to_string(state_.rounds + 1) + ": no usable contribution");
  sum.div_(static_cast<double>(count));
  if (!sum.isfinite().all().item<bool>()) {
    return error(ErrorCode::kOutOfRange, "SparseLoCo round " + std::to_string(state_.rounds + 1) + ": the mean of the contributions overflows float32");
  }
  // e <- e - c_r; an accumulator that went non-finite (this replica abstained) starts afresh, or it
  // would abstain in every round after.
  state_.momentum = finite ? (e - sent).to(options_.state_device) : torch::zeros_like(state_.outer);
  return apply(sum);
}

Status SparseLoCo::flush(const at::Tensor& e, at::Tensor& mean, transport::Tag tag, Deadline deadline, CommStats& stats) {
  // The all-reduce encodes e itself (non-finite: left to its rule; kFiltered: this rank abstains).
  const bool finite = e.isfinite().all().item<bool>();
  const at::Tensor sent = finite ? allreduce_contribution(e, group_.size, options_.flush_codec) : at::Tensor();
  mean = e.clone();
  if (Status st = allreduce_mean(group_, mean, options_.flush_codec, tag, deadline, &stats, kAllreduceSegmentValues, options_.aggregation); !st.ok()) {
    return st;
  }
  state_.momentum = finite ? (e - sent).to(options_.state_device) : torch::zeros_like(state_.outer);
  return Status();
}

Bytes SparseLoCo::save_shared() const {
  OuterState shared = state_;
  shared.momentum = torch::zeros_like(state_.momentum);
  return shared.save("sparseloco");
}

Status SparseLoCo::replay(std::int64_t step, const at::Tensor& mean) {
  if (Status st = check_update(mean, state_.outer.numel(), "SparseLoCo", step); !st.ok()) return st;
  if (step <= 0 || step % options_.inner_steps != 0) return error(ErrorCode::kMalformed, "SparseLoCo has no round at step " + std::to_string(step));
  state_.outer.sub_(mean.to(options_.state_device) * options_.outer_lr);
  write_flat(params_, state_.outer);
  ++state_.rounds;
  return Status();
}

}  // namespace gossamer::optim
