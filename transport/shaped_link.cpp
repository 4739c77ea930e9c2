#include "transport/shaped_link.h"

#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "transport/link_model.h"
#include "transport/protocol.h"

namespace gossamer::transport {

namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

SteadyTime steady_now() { return std::chrono::steady_clock::now(); }

class ShapedLink final : public Link {
 public:
  ShapedLink(std::shared_ptr<Link> inner, const LinkProfile& p, std::uint64_t seed)
      : inner_(std::move(inner)), profile_(p), model_(p, seed) {
    thread_ = std::thread([this] { delay_line(); });
  }

  ~ShapedLink() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      drain_until_ = steady_now() + kDrainLimit;
      cv_.notify_all();
    }
    thread_.join();
    if (!queue_.empty()) spdlog::warn("shaped link to peer {}: {} message(s) still in flight were dropped", inner_->peer().to_string(), queue_.size());
  }

  PeerId peer() const override { return inner_->peer(); }
  std::string remote_address() const override { return inner_->remote_address(); }

  Status send(Tag tag, ByteView payload, Deadline deadline) override {
    std::unique_lock<std::mutex> serial(send_mu_);  // one message on the wire at a time, in call order
    SteadyTime due, returns;
    Bytes copy(payload.begin(), payload.end());  // before the lock: the delay line need not wait on it
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.ok()) return failed_;
      const SteadyTime now = steady_now();
      const std::size_t bytes = payload.size() + kFrameHeaderBytes;
      // The call returns once no more than the send buffer's worth of bytes is left to go out.
      returns = std::max(now, at(model_.would_send(since_epoch(now), bytes) - model_.wire_time(static_cast<double>(kShaperSendBufferBytes))));
      if (returns > deadline.steady_time()) {
        return error(ErrorCode::kTimeout, "shaped send of " + std::to_string(payload.size()) + " bytes to peer " + peer().to_string() +
                                              " needs longer than its deadline at " + std::to_string(profile_.bandwidth_bytes_per_s * 8 / 1e6) +
                                              " Mbit/s");
      }
      due = at(model_.carry(since_epoch(now), bytes).due);
      queue_.push_back(Pending{due, tag, std::move(copy)});
      cv_.notify_all();
      stats_.bytes_sent += payload.size() + kFrameHeaderBytes;
      stats_.messages_sent += 1;
    }
    std::this_thread::sleep_until(returns);  // a full send buffer blocks the writer
    return Status();
  }

  Result<Bytes> recv(Tag tag, Deadline deadline) override {
    auto r = inner_->recv(tag, deadline);
    if (r.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.bytes_received += r->size() + kFrameHeaderBytes;
      stats_.messages_received += 1;
    }
    return r;
  }

  void close() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_.ok()) failed_ = error(ErrorCode::kPeerLost, "shaped link to peer " + peer().to_string() + " was closed locally");
      cv_.notify_all();
    }
    inner_->close();
  }

  LinkStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  struct Pending {
    SteadyTime due;
    Tag tag;
    Bytes payload;
  };

  static Nanos since_epoch(SteadyTime t) { return std::chrono::duration_cast<Nanos>(t.time_since_epoch()); }
  static SteadyTime at(Nanos since_epoch) { return SteadyTime(std::chrono::duration_cast<std::chrono::steady_clock::duration>(since_epoch)); }

  void delay_line() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      // Going away, a link delivers what it accepted, as a closed TCP socket still sends its buffer,
      // unless it failed or was closed, or the drain takes longer than kDrainLimit.
      if (stopping_ && (queue_.empty() || !failed_.ok() || steady_now() >= drain_until_)) return;
      if (queue_.empty()) {
        cv_.wait(lock);
        continue;
      }
      const SteadyTime due = queue_.front().due;
      if (steady_now() < due) {
        cv_.wait_until(lock, stopping_ ? std::min(due, drain_until_) : due);
        continue;
      }
      Pending p = std::move(queue_.front());
      queue_.pop_front();
      // While draining, an inner link that does not take the message in time (its peer stopped
      // reading) must not hold the destructor.
      const Deadline give_up = stopping_ ? Deadline::after(real_clock(), std::chrono::duration_cast<Nanos>(drain_until_ - steady_now()))
                                         : Deadline::never();
      lock.unlock();
      Status st = inner_->send(p.tag, p.payload, give_up);
      lock.lock();
      if (!st.ok() && failed_.ok()) failed_ = st;
    }
  }

  std::shared_ptr<Link> inner_;
  LinkProfile profile_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  LinkModel model_;  // under mu_
  static constexpr std::chrono::seconds kDrainLimit{10};
  SteadyTime drain_until_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  Status failed_;
  LinkStats stats_;
  std::mutex send_mu_;
  std::thread thread_;
};

}  // namespace

Result<std::shared_ptr<Link>> make_shaped_link(std::shared_ptr<Link> inner, const LinkProfile& profile, std::uint64_t seed) {
  if (Status st = profile.validate(); !st.ok()) return st;
  return std::shared_ptr<Link>(std::make_shared<ShapedLink>(std::move(inner), profile, seed));
}

}  // namespace gossamer::transport
