// Asynchronous collectives: overlap communication with computation through Work handles (the shape
// of c10d's Work), with no thread hidden inside an optimizer's step().
//
// AsyncCollectives owns one communication thread, started on the group's Clock (so a simulation
// schedules it like any other), made explicitly by the caller, that runs submitted
// collectives in submission order (so every rank runs them in the same order). A Work handle reports
// when its collective finished; wait(deadline) blocks until then or the deadline: a kTimeout from
// wait() leaves the operation running (wait again later); the collective's own deadline bounds it.
// Ownership: the tensor handed to a collective belongs to it until its Work is done; read the result
// through Work::tensor(). Threading: submit and wait from any thread. Destruction waits for the jobs
// already submitted (each is bounded by its own deadline).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include <ATen/core/Tensor.h>

#include "core/clock.h"
#include "core/signal.h"
#include "core/status.h"
#include "optim/collectives.h"
#include "optim/token_weights.h"

namespace gossamer::optim {

class Work {
 public:
  explicit Work(Clock& clock) : cv_(clock.make_signal()) {}
  // A Work that is already done with `result` (a collective's outcome restored from saved state).
  static std::shared_ptr<Work> completed(Clock& clock, at::Tensor result);
  [[nodiscard]] Status wait(Deadline deadline);
  bool done() const;
  // The collective's result (valid once wait() returned ok).
  const at::Tensor& tensor() const { return tensor_; }
  const CommStats& stats() const { return stats_; }
  // A token-weighted collective's exchange (valid once wait() returned ok; empty otherwise).
  const RoundWeights& weights() const { return weights_; }

 private:
  friend class AsyncCollectives;
  mutable std::mutex mu_;
  std::unique_ptr<Signal> cv_;
  bool done_ = false;
  Status status_;
  at::Tensor tensor_;
  CommStats stats_;
  RoundWeights weights_;
};

class AsyncCollectives {
 public:
  explicit AsyncCollectives(Group group);
  ~AsyncCollectives();
  AsyncCollectives(const AsyncCollectives&) = delete;
  AsyncCollectives& operator=(const AsyncCollectives&) = delete;

  Clock& clock() const { return *clock_; }
  // Later collectives run over `group` (members left or joined); those already submitted keep theirs.
  void set_group(Group group);
  // allreduce_mean (collectives.h) on the communication thread.
  std::shared_ptr<Work> allreduce_mean(at::Tensor tensor, const quant::EncodeOptions& codec, transport::Tag tag, Deadline deadline,
                                       const Aggregation& aggregation = {});
  // calibrate() (token_weights.h) on the communication thread: Work::weights() holds what the members
  // claimed (empty when the exchange failed).
  std::shared_ptr<Work> calibrate(Contribution mine, std::int64_t max_steps, Deadline deadline);  // `mine`: WorkMeter::latest()
  // A token-weighted round (token_weights.h) on the communication thread: exchanges `mine` over the
  // group, multiplies the tensor by this rank's scale, then allreduce_mean; Work::weights() holds
  // what the members claimed.
  std::shared_ptr<Work> weighted_allreduce_mean(at::Tensor tensor, Contribution mine, std::int64_t max_steps, const quant::EncodeOptions& codec,
                                                transport::Tag tag, Deadline deadline, const Aggregation& aggregation = {});

 private:
  std::shared_ptr<Work> submit(at::Tensor tensor, std::optional<std::pair<Contribution, std::int64_t>> weighted, const quant::EncodeOptions& codec,
                               transport::Tag tag, Deadline deadline, const Aggregation& aggregation);
  void loop();

  Group group_;  // touched by the communication thread only, after construction
  Clock* clock_;
  std::mutex mu_;
  std::unique_ptr<Signal> cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::unique_ptr<ClockThread> thread_;
};

}  // namespace gossamer::optim
