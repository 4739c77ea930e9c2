// Streaming DiLoCo (Douillard et al. 2025; ALGORITHMS.md section 2), with torchft's schedule: the
// fragments take turns; fragment p (0-based) of P completes at local steps t_p = (p+1) H/P (mod H).
// tau steps before that it LAUNCHES: Delta_p = outer_p - local_p, all-reduced (mean, with the codec,
// fp32 accumulation) on the communication thread while training goes on; at t_p it COMPLETES:
//   v_p <- mu v_p + mean Delta_p;  outer_p <- outer_p - lr (mean Delta_p + mu v_p)   (Nesterov)
//   local_p <- alpha local_p + (1 - alpha) outer_p        (local_p now holds tau more local steps)
// Constraints (checked): H mod P == 0, 0 <= tau < H/P, 0 <= alpha <= 1. With P = 1, tau = 0 and
// alpha = 0 it is DiLoCo. Evaluate and export the outer weights (outer_weights()).
//
// Ownership: borrows the fragments' tensors and an AsyncCollectives; owns per-fragment outer weights,
// momentum and the pending Work. Errors: a failed or late fragment returns its Status; that
// fragment's state is unchanged (the caller may skip it).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/bytes.h"
#include "core/status.h"
#include "optim/fragments.h"
#include "optim/token_weights.h"
#include "optim/updates.h"
#include "optim/work.h"
#include "quant/format.h"

namespace gossamer::optim {

struct StreamingDiLoCoOptions {
  std::int64_t inner_steps = 100;  // H
  std::int64_t overlap = 1;        // tau
  double mixing = 0.5;             // alpha
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  quant::EncodeOptions codec;      // fp4 E3M0 in the paper
  at::Device state_device = at::kCPU;  // where the outer state lives (the parameters may be elsewhere)
  Aggregation aggregation;  // how each chunk's owner combines the contributions (collectives.h)
  // Members of unequal speed (token_weights.h): each fragment's mean weighs every member's Delta_p
  // by the inner steps it computed since that fragment last launched.
  bool token_weighted = false;
};

class StreamingDiLoCo {
 public:
  StreamingDiLoCo(std::vector<Fragment> fragments, AsyncCollectives& comm, StreamingDiLoCoOptions options);

  // Call after each inner step; launches and completes the fragments that are due. Returns the number
  // of fragments completed at this step.
  [[nodiscard]] Result<int> step(std::int64_t inner_steps_done, Deadline deadline);

  const at::Tensor& outer_weights(std::size_t fragment) const { return state_[fragment].outer; }
  // Every fragment's tensors with its outer weights (what to evaluate and export).
  std::vector<std::pair<std::vector<at::Tensor>, at::Tensor>> evaluation_weights() const {
    std::vector<std::pair<std::vector<at::Tensor>, at::Tensor>> out;
    for (std::size_t p = 0; p < fragments_.size(); ++p) out.emplace_back(fragments_[p].tensors, state_[p].outer);
    return out;
  }
  std::int64_t rounds() const { return completed_; }
  // A fragment's failed or dropped window is counted where it happens, once (see skipped_rounds()),
  // so the caller's skip adds nothing.
  void skip_round() {}
  // An inner step this member computed (token-weighted rounds), and the group's fastest member's
  // seconds per step as of the last weighted fragment (0: unknown).
  void count_step(double seconds) {
    for (auto& st : state_) st.meter.add(seconds);
  }
  double fastest_step_seconds() const { return fastest_step_s_; }
  // As DiLoCo's, of the last fragment applied.
  const std::vector<std::int64_t>& round_steps() const { return round_steps_; }
  void keep_work(double fraction) {
    for (auto& st : state_) st.meter.keep(fraction);
  }
  // Fragments in flight over the old group are dropped (and counted); they launch again in their
  // next window.
  [[nodiscard]] Status regroup(Group group);
  // Fragment windows that did not complete: failed, dropped by a regroup, or never launched.
  std::int64_t skipped_rounds() const { return skipped_; }
  CommStats comm() const { return comm_; }

  // Outer weights and momentum of every fragment; fragments in flight are not saved (they launch anew).
  Bytes save() const;
  // What every member holds alike (for newcomers, and the members' digest): the skipped windows,
  // which are this replica's own count (a member left out of a round misses windows the others
  // completed), as 0.
  Bytes save_shared() const;
  [[nodiscard]] Status load(ByteView bytes);

  // Catch-up (updates.h): an update is the averaged Delta of the fragment that completes at its step
  // (that fragment's size). A replayed fragment's model weights become its outer weights (a
  // newcomer's local weights start from the shared ones; alpha mixes only weights trained locally).
  void record_updates(UpdateSink sink) { sink_ = std::move(sink); }
  [[nodiscard]] Status replay(std::int64_t step, const at::Tensor& delta);
  void take_shared_weights();

 private:
  struct State {
    at::Tensor outer, momentum;
    std::shared_ptr<Work> pending;
    std::int64_t pending_window = 0;  // the window (completion step / H) pending is for
    std::int64_t last_missed = 0;     // the last window counted as missed
    WorkMeter meter;                  // steps since this fragment last launched
  };
  void missed(State& st, std::int64_t window);
  Bytes save_counting(std::int64_t skipped) const;  // save() with `skipped` as the skipped count  // counts a fragment's window as skipped, once

  std::vector<Fragment> fragments_;
  AsyncCollectives* comm_thread_;
  StreamingDiLoCoOptions options_;
  std::vector<State> state_;
  std::int64_t completed_ = 0, skipped_ = 0;
  double fastest_step_s_ = 0.0;
  std::vector<std::int64_t> round_steps_;
  CommStats comm_;
  UpdateSink sink_;
};

}  // namespace gossamer::optim
