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
//
// Staleness (docs/methods.md, "Stale contributions"). `delay_rounds` d > 0 applies each round's mean
// Delta d rounds later (a controlled delay, as asynchronous DiLoCo's pseudo-gradients arrive; the
// first d rounds apply nothing), and `outer_step = kCGAD` replaces Nesterov SGD with Cosine-Gated
// Adam-Decay (Shah and Sun 2026, arXiv 2605.09126): a Delta tau rounds old is scaled by the age gate
// sigma(tau) (age_gate.h) before it enters Adam's moments,
//   s = sigma(tau) Delta;  m <- b1 m + (1 - b1) s;  v <- b2 v + (1 - b2) s^2
//   outer <- outer - lr m^ / (sqrt(v^) + eps)   (m^, v^ bias-corrected by the Adam steps taken)
// which is plain Adam at tau = 0; nothing is applied from the gate's cutoff on.
//
// Error feedback (MuLoCo, Therien et al. 2025, arXiv 2505.23725: `error_feedback`): the pseudo-gradient
// goes through a low-bit codec, and what the codec drops is carried to the next round instead of lost:
//   e <- beta e + Delta;  c = Q(e) (what the chunks' owners decode: allreduce_contribution);  e <- e - c
// and the round all-reduces c. The residual e is this replica's own (save_shared() writes it as
// zeros; drop_replica_state() clears it after taking another member's state).
#pragma once

#include <deque>
#include <string_view>

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/bytes.h"
#include "core/status.h"
#include "optim/collectives.h"
#include "optim/age_gate.h"
#include "optim/flat_params.h"
#include "optim/state_io.h"
#include "optim/token_weights.h"
#include "optim/updates.h"
#include "quant/format.h"

namespace gossamer::optim {

enum class OuterStep { kNesterov, kCGAD };

struct CGADOptions {
  double lr = 0.0;        // 0: the caller's rule (train/outer.cpp: the inner peak lr times sqrt(H))
  double beta2 = 0.999;   // (beta1 is outer_momentum)
  double eps = 1e-8;
  AgeGate gate;
};

struct DiLoCoOptions {
  std::int64_t inner_steps = 500;  // H
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  bool nesterov = true;
  OuterStep outer_step = OuterStep::kNesterov;
  CGADOptions cgad;
  std::int64_t delay_rounds = 0;  // each round's mean Delta is applied this many rounds later
  quant::EncodeOptions codec;      // of the pseudo-gradient on the wire (fp32 by default)
  at::Device state_device = at::kCPU;  // where the outer state lives (the parameters may be elsewhere)
  Aggregation aggregation;  // how each chunk's owner combines the contributions (collectives.h)
  // Members of unequal speed (token_weights.h): the round's mean weighs each member's Delta by the
  // inner steps behind it (count_step()), exchanged before the all-reduce.
  bool token_weighted = false;
  bool error_feedback = false;  // carry what the codec drops into the next round
  double error_decay = 1.0;     // beta: the carried residual's decay per round, in [0, 1]
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
  // The steps behind each member's Delta in the last weighted round, by rank (empty: none yet).
  const std::vector<std::int64_t>& round_steps() const { return round_steps_; }
  // Left out and caught up: `fraction` of the work since the last merge rides on (WorkMeter::keep).
  void keep_work(double fraction) { meter_.keep(fraction); }
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

  // Outer weights, momentum and counters (and, with CGAD or a delay, the second moment and the Deltas
  // still waiting); load() checks sizes (bytes from a checkpoint are untrusted).
  Bytes save() const;
  [[nodiscard]] Status load(ByteView bytes);
  // save() with the error-feedback residual as zeros (it is this replica's own); save() otherwise.
  Bytes save_shared() const;
  // After taking another member's state: its residual is not ours to send.
  void drop_replica_state() {
    if (residual_.defined()) residual_.zero_();
  }
  // The error-feedback residual e (undefined without error feedback).
  const at::Tensor& residual() const { return residual_; }

  // Catch-up (updates.h): a round's update is its averaged pseudo-gradient (the outer weights' size).
  void record_updates(UpdateSink sink) { sink_ = std::move(sink); }
  [[nodiscard]] Status replay(std::int64_t step, const at::Tensor& delta);
  void take_shared_weights() { write_flat(params_, state_.outer); }

 private:
  void apply(const at::Tensor& delta);  // the outer step with the round's mean Delta (after its delay)
  void outer_step(const at::Tensor& delta, std::int64_t age);
  std::string_view kind() const;  // of a state that is not plain()
  bool plain() const { return options_.outer_step == OuterStep::kNesterov && options_.delay_rounds == 0 && !options_.error_feedback; }
  Bytes save_with(const at::Tensor& residual) const;

  UpdateSink sink_;
  std::vector<at::Tensor> params_;
  Group group_;
  DiLoCoOptions options_;
  OuterState state_;
  at::Tensor second_;                 // CGAD: Adam's second moment (state_.momentum is its first)
  std::int64_t adam_steps_ = 0;       // CGAD: the Adam steps taken (bias correction)
  std::deque<at::Tensor> waiting_;    // delay_rounds: the means not applied yet, oldest first
  at::Tensor residual_;               // error feedback: what the codec has not sent yet
  CommStats comm_;
  WorkMeter meter_;
  double fastest_step_s_ = 0.0;
  std::vector<std::int64_t> round_steps_;
};

}  // namespace gossamer::optim
