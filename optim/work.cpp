#include "optim/work.h"

#include "core/check.h"

namespace gossamer::optim {

Status Work::wait(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_->wait(lock, deadline, [&] { return done_; })) {
    return error(ErrorCode::kTimeout, "the collective is still running (wait again, or give up on this round)");
  }
  return status_;
}

std::shared_ptr<Work> Work::completed(Clock& clock, at::Tensor result) {
  auto w = std::make_shared<Work>(clock);
  w->tensor_ = std::move(result);
  w->done_ = true;
  return w;
}

bool Work::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

AsyncCollectives::AsyncCollectives(Group group) : group_(std::move(group)), clock_(group_.clock), cv_(clock_->make_signal()) {
  thread_ = group_.clock->start_thread([this] { loop(); });
}

AsyncCollectives::~AsyncCollectives() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_->notify_all();
  }
  thread_->join();
}

std::shared_ptr<Work> AsyncCollectives::allreduce_mean(at::Tensor tensor, const quant::EncodeOptions& codec, transport::Tag tag,
                                                       Deadline deadline, const Aggregation& aggregation) {
  return submit(std::move(tensor), std::nullopt, codec, tag, deadline, aggregation);
}

std::shared_ptr<Work> AsyncCollectives::weighted_allreduce_mean(at::Tensor tensor, Contribution mine, std::int64_t max_steps,
                                                                const quant::EncodeOptions& codec, transport::Tag tag, Deadline deadline,
                                                                const Aggregation& aggregation) {
  return submit(std::move(tensor), std::make_pair(mine, max_steps), codec, tag, deadline, aggregation);
}

std::shared_ptr<Work> AsyncCollectives::calibrate(Contribution mine, std::int64_t max_steps, Deadline deadline) {
  return submit(at::Tensor(), std::make_pair(mine, max_steps), quant::EncodeOptions{}, kCalibrationTag, deadline, Aggregation{});
}

std::shared_ptr<Work> AsyncCollectives::submit(at::Tensor tensor, std::optional<std::pair<Contribution, std::int64_t>> weighted,
                                               const quant::EncodeOptions& codec, transport::Tag tag, Deadline deadline,
                                               const Aggregation& aggregation) {
  auto work = std::make_shared<Work>(*clock_);  // group_ belongs to the communication thread
  work->tensor_ = std::move(tensor);
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back([this, work, weighted, codec, tag, deadline, aggregation] {
    CommStats stats;
    Status st;
    RoundWeights weights;
    if (weighted) {
      auto w = weigh(group_, weighted->first, weighted->second, tag, deadline, &stats, work->tensor_);
      if (w.ok()) {
        weights = std::move(*w);
      } else {
        st = w.status();
      }
    }
    if (st.ok() && work->tensor_.defined()) st = optim::allreduce_mean(group_, work->tensor_, codec, tag, deadline, &stats, kAllreduceSegmentValues, aggregation);
    std::lock_guard<std::mutex> wl(work->mu_);
    work->status_ = std::move(st);
    work->stats_ = stats;
    work->weights_ = std::move(weights);
    work->done_ = true;
    work->cv_->notify_all();
  });
  cv_->notify_all();
  return work;
}

void AsyncCollectives::set_group(Group group) {
  GOSSAMER_CHECK(group.clock == clock_, "AsyncCollectives::set_group: the group must keep its clock");
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back([this, g = std::move(group)]() mutable { group_ = std::move(g); });
  cv_->notify_all();
}

void AsyncCollectives::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_->wait(lock, Deadline::never(), [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and everything submitted has run
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

}  // namespace gossamer::optim
