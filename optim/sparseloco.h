// SparseLoCo (Sarfi, Therien, Lidin, Belilovsky 2025, arXiv 2508.15706): DiLoCo whose global outer
// momentum is replaced by a per-replica error-feedback accumulator, of which only a top-k per chunk
// in 2 bits travels (quant/sparse.h). Every `inner_steps`, replica r computes
//   Delta_r = outer - local                      (DiLoCo's sign: it points uphill)
//   e_r <- beta e_r + Delta_r
//   c_r = Q(TopK(e_r));  e_r <- e_r - c_r        (what was sent leaves the accumulator)
//   outer <- outer - lr * (1/R) sum_r c_r;  local <- outer
// The c_r are all-gathered as sparse payloads (each rank sends its payload to every other), and every
// rank sums them in rank order from the same bytes, so the outer weights stay bit-identical across
// ranks while each e_r stays the replica's own. With chunk = topk (everything kept) and beta 0 it is
// FedAvg through a 2-level quantizer.
//
// The run's last round (`last_step`, the run's last inner step: the round at or before it) sends the
// whole accumulator instead of its top-k: e_r goes through allreduce_mean in `flush_codec`, the mean
// is applied with the same outer lr, and what the codec dropped stays in e_r. Without it, the
// progress still waiting in the accumulators at the end (most of it on short runs) never reaches the
// model; with it the run pays one dense low-bit all-reduce (4.25 bits a value in fp4) once.
//
// Robust aggregation (Aggregation::kFiltered): a payload that does not decode is left out, and so is
// each whose L2 norm exceeds outlier_factor times the median norm; the rest are averaged over their
// count. Every rank holds every payload, so every rank makes the same decision. kTrimmedMean is not
// offered (a coordinate-wise trim of sparse vectors is mostly of zeros).
//
// Ownership, threading and errors as DiLoCo (diloco.h): a failed round changes nothing, the
// accumulator included.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/bytes.h"
#include "core/status.h"
#include "optim/collectives.h"
#include "optim/state_io.h"
#include "optim/token_weights.h"
#include "optim/updates.h"
#include "optim/flat_params.h"
#include "quant/format.h"
#include "quant/sparse.h"

namespace gossamer::optim {

struct SparseLoCoOptions {
  std::int64_t inner_steps = 50;  // H
  double outer_lr = 1.0;          // alpha
  double error_decay = 0.95;      // beta of the error-feedback accumulator, in [0, 1]
  quant::SparseOptions sparse;    // chunk and top-k of the payload
  at::Device state_device = at::kCPU;
  Aggregation aggregation;        // kMean or kFiltered
  // Members of unequal speed (token_weights.h): each Delta_r is weighed by the inner steps behind it
  // before it enters the accumulator.
  bool token_weighted = false;
  std::int64_t last_step = 0;       // the run's last inner step; 0: no flush round
  quant::EncodeOptions flush_codec;  // of the last round's dense all-reduce
};

class SparseLoCo {
 public:
  SparseLoCo(std::vector<at::Tensor> params, Group group, SparseLoCoOptions options);

  [[nodiscard]] Result<bool> step(std::int64_t inner_steps_done, Deadline deadline);
  void skip_round() { ++state_.skipped; }
  void count_step(double seconds) { meter_.add(seconds); }  // as DiLoCo's
  double fastest_step_seconds() const { return fastest_step_s_; }
  const std::vector<std::int64_t>& round_steps() const { return round_steps_; }  // as DiLoCo's
  void keep_work(double fraction) { meter_.keep(fraction); }
  [[nodiscard]] Status regroup(Group group) {
    group_ = std::move(group);
    return Status();
  }

  const at::Tensor& outer_weights() const { return state_.outer; }
  // The error-feedback accumulator e (this replica's own).
  const at::Tensor& accumulator() const { return state_.momentum; }
  std::vector<std::pair<std::vector<at::Tensor>, at::Tensor>> evaluation_weights() const { return {{params_, state_.outer}}; }
  std::int64_t rounds() const { return state_.rounds; }
  std::int64_t skipped_rounds() const { return state_.skipped; }
  const CommStats& comm() const { return comm_; }

  // Outer weights, the accumulator (kept in the momentum slot) and counters.
  Bytes save() const { return state_.save("sparseloco"); }
  Bytes save_shared() const;  // the accumulator as zeros: it is this replica's own
  [[nodiscard]] Status load(ByteView bytes) { return state_.load(bytes, "sparseloco"); }
  // After taking another replica's state: its accumulator is not ours to send.
  void drop_replica_state() { state_.momentum.zero_(); }

  // Catch-up (updates.h): a round's update is the mean of the contributions every rank summed (the
  // outer weights' size); the accumulator is the replica's own and is not replayed.
  void record_updates(UpdateSink sink) { sink_ = std::move(sink); }
  [[nodiscard]] Status replay(std::int64_t step, const at::Tensor& mean);
  void take_shared_weights() { write_flat(params_, state_.outer); }

 private:
  // The last round's: the whole accumulator `e`, all-reduced in flush_codec into `mean`.
  [[nodiscard]] Status flush(const at::Tensor& e, at::Tensor& mean, transport::Tag tag, Deadline deadline, CommStats& stats);
  UpdateSink sink_;
  std::vector<at::Tensor> params_;
  Group group_;
  SparseLoCoOptions options_;
  OuterState state_;
  CommStats comm_;
  WorkMeter meter_;
  double fastest_step_s_ = 0.0;
  std::vector<std::int64_t> round_steps_;
};

}  // namespace gossamer::optim
