#include "transport/memory_link.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

#include "transport/protocol.h"

namespace gossamer::transport {

namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

struct Channel {  // both directions of one pair share a lock
  std::mutex mu;
  std::condition_variable cv;
  std::map<Tag, std::deque<Bytes>> inbox[2];
  std::uint64_t buffered[2] = {0, 0};
  LinkStats stats[2];
  bool closed = false;
  std::uint64_t max_buffered;
};

class MemoryLink final : public Link {
 public:
  MemoryLink(std::shared_ptr<Channel> ch, int side, PeerId peer) : ch_(std::move(ch)), side_(side), peer_(peer) {}
  ~MemoryLink() override { close(); }

  PeerId peer() const override { return peer_; }
  std::string remote_address() const override { return "memory:" + peer_.to_string(); }

  Status send(Tag tag, ByteView payload, Deadline) override {
    std::lock_guard<std::mutex> lock(ch_->mu);
    if (ch_->closed) return error(ErrorCode::kPeerLost, "in-process link to peer " + peer_.to_string() + " is closed");
    const int other = 1 - side_;
    if (ch_->buffered[other] + payload.size() > ch_->max_buffered) {
      return error(ErrorCode::kResourceExhausted, "peer " + peer_.to_string() + " is not receiving: its queue is full");
    }
    ch_->inbox[other][tag].emplace_back(payload.begin(), payload.end());
    ch_->buffered[other] += payload.size();
    ch_->stats[side_].bytes_sent += payload.size() + kFrameHeaderBytes;
    ch_->stats[side_].messages_sent += 1;
    ch_->stats[other].bytes_received += payload.size() + kFrameHeaderBytes;
    ch_->stats[other].messages_received += 1;
    ch_->cv.notify_all();
    return Status();
  }

  Result<Bytes> recv(Tag tag, Deadline deadline) override {
    const SteadyTime until = deadline.steady_time();
    std::unique_lock<std::mutex> lock(ch_->mu);
    for (;;) {
      auto& q = ch_->inbox[side_][tag];
      if (!q.empty()) {
        Bytes m = std::move(q.front());
        q.pop_front();
        ch_->buffered[side_] -= m.size();
        return m;
      }
      if (ch_->closed) return error(ErrorCode::kPeerLost, "in-process link to peer " + peer_.to_string() + " is closed");
      if (until == SteadyTime::max()) {
        ch_->cv.wait(lock);
      } else if (ch_->cv.wait_until(lock, until) == std::cv_status::timeout && ch_->inbox[side_][tag].empty() && !ch_->closed) {
        return error(ErrorCode::kTimeout, "no message with tag " + std::to_string(tag) + " from peer " + peer_.to_string() +
                                              " before the deadline");
      }
    }
  }

  void close() override {
    std::lock_guard<std::mutex> lock(ch_->mu);
    ch_->closed = true;
    ch_->cv.notify_all();
  }

  LinkStats stats() const override {
    std::lock_guard<std::mutex> lock(ch_->mu);
    return ch_->stats[side_];
  }

 private:
  std::shared_ptr<Channel> ch_;
  int side_;
  PeerId peer_;
};

}  // namespace

std::pair<std::shared_ptr<Link>, std::shared_ptr<Link>> make_memory_link_pair(PeerId a, PeerId b, std::uint64_t max_buffered_bytes) {
  auto ch = std::make_shared<Channel>();
  ch->max_buffered = max_buffered_bytes;
  return {std::make_shared<MemoryLink>(ch, 0, b), std::make_shared<MemoryLink>(ch, 1, a)};
}

}  // namespace gossamer::transport
