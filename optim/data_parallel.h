// The ddp baseline, whatever engine moves its bytes: before each inner step every gradient is
// flattened into one fp32 buffer, the engine replaces it by the group's mean, and the mean is written
// back. The counters (steps averaged, steps skipped, bytes, time) and save/load are the same for every
// engine; an engine only implements average() and regroup(). Threading: one training thread.
#pragma once

#include <cstdint>
#include <memory>

#include "optim/outer_optimizer.h"

namespace gossamer::optim {

class DataParallel : public OuterOptimizer, public GradientSync {
 public:
  std::string_view name() const override { return "ddp"; }
  Result<bool> step(std::int64_t, Deadline) override { return false; }
  void skip_round() override { ++skipped_; }
  std::int64_t rounds() const override { return rounds_; }
  std::int64_t skipped_rounds() const override { return skipped_; }
  CommStats comm() const override { return comm_; }
  Bytes save() const override;
  [[nodiscard]] Status load(ByteView state) override;
  [[nodiscard]] Status sync_gradients(const std::vector<at::Tensor>& params, std::int64_t step, Deadline deadline) final;
  // Catch-up: each step's averaged gradients (flat), keyed by the step. The Worker replays them
  // (train/worker.h: the inner optimizer is the shared state); replay() only counts the step.
  void record_updates(UpdateSink sink) override { sink_ = std::move(sink); }
  [[nodiscard]] Status replay(std::int64_t, const at::Tensor&) override {
    ++rounds_;
    return Status();
  }
  void take_shared_weights() override {}

 protected:
  // Replaces `flat` (contiguous CPU fp32) by the group's mean; adds what it cost to `stats`.
  [[nodiscard]] virtual Status average(at::Tensor& flat, std::int64_t step, Deadline deadline, CommStats& stats) = 0;

 private:
  std::int64_t rounds_ = 0, skipped_ = 0;
  CommStats comm_;
  at::Tensor flat_;  // the gradients, flattened; kept from step to step
  UpdateSink sink_;
};

// ddp over the group's Links with our all-reduce (any codec).
std::unique_ptr<DataParallel> make_links_data_parallel(Group group, quant::EncodeOptions codec, Aggregation aggregation = {});

}  // namespace gossamer::optim
