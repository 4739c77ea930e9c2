// DiLoCo (Douillard et al. 2023; ALGORITHMS.md section 1): workers take `inner_steps` local steps,
// then all-reduce the pseudo-gradient Delta = outer - local (DiLoCo's sign: it points uphill) and apply
// Nesterov SGD to the outer weights, exactly as PyTorch's SGD(nesterov=True, dampening 0) computes it:
//   v <- mu v + Delta;  outer <- outer - lr (Delta + mu v);  local <- outer
// (heavy-ball instead: outer <- outer - lr v). The inner optimizer's state is not touched.
// With lr 1 and mu 0 it is plain averaging (FedAvg); every rank's outer state stays bit-identical,
// because every rank applies the same bit-identical mean.
//
// Ownership: the optimizer borrows the parameter tensors (it writes them after each round) and owns
// the outer weights and momentum (fp32, flat). Threading: the training thread calls step() between
// inner steps. Errors: a failed round (lost or slow peer) returns its Status and changes nothing:
// the caller may retry it or skip it; skipped rounds are counted.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/bytes.h"
#include "core/status.h"
#include "optim/collectives.h"
#include "optim/flat_params.h"
#include "optim/state_io.h"
#include "optim/token_weights.h"
#include "optim/updates.h"
#include "quant/format.h"

namespace gossamer::optim {

struct DiLoCoOptions {
  std::int64_t inner_steps = 500;  // H
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  bool nesterov = true;
  quant::EncodeOptions codec;      // of the pseudo-gradient on the wire (fp32 by default)
  at::Device state_device = at::kCPU;  // where the outer state lives (the parameters may be elsewhere)
  Aggregation aggregation;  // how each chunk's owner combines the contributions (collectives.h)
  // Members of unequal speed (token_weights.h): the round's mean weighs each member's Delta by the
  // inner steps behind it (count_step()), exchanged before the all-reduce.
  bool token_weighted = false;
};

class DiLoCo {
 public:
  DiLoCo(std::vector<at::Tensor> params, Group group, DiLoCoOptions options);

  // Call after each inner step with the number of inner steps done; on every H-th it runs a round.
  // Returns true when a round was applied.
  [[nodiscard]] Result<bool> step(std::int64_t inner_steps_done, Deadline deadline);
  // Marks a round as skipped after step() failed (counted; the local weights go on training).
  void skip_round() { ++state_.skipped; }
  // An inner step this member computed, and its seconds (token-weighted rounds).
  void count_step(double seconds) { meter_.add(seconds); }
  // The group's fastest member's seconds per step, as of the last weighted round (0: unknown).
  double fastest_step_seconds() const { return fastest_step_s_; }
  [[nodiscard]] Status regroup(Group group) {
    group_ = std::move(group);
    return Status();
  }

  const at::Tensor& outer_weights() const { return state_.outer; }
  // The model's tensors with the outer weights that stand for them (what to evaluate and export).
  std::vector<std::pair<std::vector<at::Tensor>, at::Tensor>> evaluation_weights() const { return {{params_, state_.outer}}; }
  const at::Tensor& momentum() const { return state_.momentum; }
  std::int64_t rounds() const { return state_.rounds; }
  std::int64_t skipped_rounds() const { return state_.skipped; }
  const CommStats& comm() const { return comm_; }

  // Outer weights, momentum and counters; load() checks sizes (bytes from a checkpoint are untrusted).
  Bytes save() const { return state_.save("diloco"); }
  [[nodiscard]] Status load(ByteView bytes) { return state_.load(bytes, "diloco"); }

  // Catch-up (updates.h): a round's update is its averaged pseudo-gradient (the outer weights' size).
  void record_updates(UpdateSink sink) { sink_ = std::move(sink); }
  [[nodiscard]] Status replay(std::int64_t step, const at::Tensor& delta);
  void take_shared_weights() { write_flat(params_, state_.outer); }

 private:
  void apply(const at::Tensor& delta);  // the outer step with the round's mean Delta

  UpdateSink sink_;
  std::vector<at::Tensor> params_;
  Group group_;
  DiLoCoOptions options_;
  OuterState state_;
  CommStats comm_;
  WorkMeter meter_;
  double fastest_step_s_ = 0.0;
};

}  // namespace gossamer::optim
