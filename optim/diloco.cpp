#include "optim/diloco.h"

#include <torch/torch.h>

#include "core/check.h"
#include "optim/flat_params.h"
#include "core/wire.h"
#include "optim/state_io.h"
#include "quant/codec.h"

namespace gossamer::optim {

namespace {
constexpr transport::Tag kDiLoCoTag = 0x0D100001u;  // the tag of DiLoCo rounds on every link
}  // namespace

DiLoCo::DiLoCo(std::vector<at::Tensor> params, Group group, DiLoCoOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(options) {
  GOSSAMER_CHECK(options_.inner_steps >= 1, "DiLoCo: inner_steps must be >= 1");
  GOSSAMER_CHECK(options_.outer_lr > 0 && options_.outer_momentum >= 0 && options_.outer_momentum < 1,
                 "DiLoCo: outer_lr must be > 0 and outer_momentum in [0, 1)");
  outer_ = flatten(params_);
  momentum_ = torch::zeros_like(outer_);
}

Result<bool> DiLoCo::step(std::int64_t inner_steps_done, Deadline deadline) {
  if (inner_steps_done <= 0 || inner_steps_done % options_.inner_steps != 0) return false;
  at::Tensor delta = outer_ - flatten(params_);  // pseudo-gradient: outer - local
  CommStats stats;
  if (Status st = allreduce_mean(group_, delta, options_.codec, kDiLoCoTag, deadline, &stats); !st.ok()) {
    comm_ += stats;
    return st.with_context("DiLoCo round " + std::to_string(rounds_ + 1));
  }
  comm_ += stats;
  const double mu = options_.outer_momentum, lr = options_.outer_lr;
  momentum_.mul_(mu).add_(delta);  // v <- mu v + Delta
  if (options_.nesterov) {
    outer_.sub_((delta + mu * momentum_) * lr);  // Nesterov look-ahead
  } else {
    outer_.sub_(momentum_ * lr);
  }
  write_flat(params_, outer_);
  ++rounds_;
  return true;
}

Bytes DiLoCo::save() const { return save_state("diloco", {rounds_, skipped_rounds_}, {outer_, momentum_}); }

Status DiLoCo::load(ByteView bytes) {
  std::vector<std::int64_t> counters(2);
  std::vector<at::Tensor> tensors = {outer_, momentum_};
  if (Status st = load_state(bytes, "diloco", counters, tensors); !st.ok()) return st;
  rounds_ = counters[0];
  skipped_rounds_ = counters[1];
  outer_ = tensors[0];
  momentum_ = tensors[1];
  return Status();
}

}  // namespace gossamer::optim
