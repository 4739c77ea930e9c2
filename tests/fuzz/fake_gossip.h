// A gossip node for fuzz targets: the target delivers messages to the subscribers itself, at once
// and on its own thread; broadcasts and direct messages are counted, and the last few kept (to
// make seeds from).
// Thread-safe, so a component with a thread of its own (SpecAnnouncer) may broadcast while the
// target delivers.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "transport/gossip.h"

namespace gossamer::fuzz {

class FakeGossip final : public transport::Gossip {
 public:
  explicit FakeGossip(transport::PeerId self, std::vector<transport::Member> members = {}) : self_(self), members_(std::move(members)) {}
  transport::PeerId self() const override { return self_; }
  std::string address() const override { return "tcp://192.0.2.1:7000"; }
  std::vector<transport::Member> members() const override { return members_; }
  std::vector<transport::Member> sample(std::size_t) override { return {}; }
  Status broadcast(const std::string& topic, ByteView payload) override {
    ++broadcasts_;
    std::lock_guard lock(mu_);
    sent_.emplace_back(topic, Bytes(payload.begin(), payload.end()));
    if (sent_.size() > kKept) sent_.pop_front();
    return Status();
  }
  Status send(transport::PeerId to, const std::string& topic, ByteView payload) override {
    ++directs_;
    std::lock_guard lock(mu_);
    direct_.emplace_back(to, topic, Bytes(payload.begin(), payload.end()));
    if (direct_.size() > kKept) direct_.pop_front();
    return Status();
  }
  void subscribe(const std::string& topic, Handler handler) override {
    std::lock_guard lock(mu_);
    handlers_[topic].push_back(std::move(handler));
  }
  void leave() override {}
  std::uint64_t dropped_messages() const override { return 0; }
  std::pair<std::uint64_t, std::uint64_t> bytes() const override { return {0, 0}; }

  void deliver(transport::PeerId origin, const std::string& topic, ByteView payload) {
    std::vector<Handler> handlers;
    {
      std::lock_guard lock(mu_);
      handlers = handlers_[topic];
    }
    const Bytes message(payload.begin(), payload.end());
    for (auto& h : handlers) h(origin, message);
  }
  std::uint64_t broadcasts() const { return broadcasts_.load(); }
  std::uint64_t directs() const { return directs_.load(); }
  std::deque<std::tuple<transport::PeerId, std::string, Bytes>> direct() const {
    std::lock_guard lock(mu_);
    return direct_;
  }
  std::deque<std::pair<std::string, Bytes>> sent() const {
    std::lock_guard lock(mu_);
    return sent_;
  }

 private:
  const transport::PeerId self_;
  const std::vector<transport::Member> members_;
  static constexpr std::size_t kKept = 16;
  mutable std::mutex mu_;
  std::map<std::string, std::vector<Handler>> handlers_;
  std::deque<std::pair<std::string, Bytes>> sent_;
  std::deque<std::tuple<transport::PeerId, std::string, Bytes>> direct_;
  std::atomic<std::uint64_t> broadcasts_{0}, directs_{0};
};

}  // namespace gossamer::fuzz
