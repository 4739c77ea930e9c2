// Swarm: many GossipCores (the membership alone, no model) on emulated links in virtual time, for
// deterministic tests at a thousand members. Each link delivers after the latency, a seeded normal
// jitter and a seeded loss draw; a node's own uplink may add a delay of its own (a long transfer
// holding it: its messages wait behind that transfer's bytes). One event queue, one thread.
#pragma once

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "core/clock.h"
#include "transport/gossip_core.h"

namespace gossamer::testing {

class VirtualClock final : public Clock {
 public:
  Nanos now() const override { return now_; }
  void sleep_until(Nanos t) override { now_ = std::max(now_, t); }
  void set(Nanos t) { now_ = t; }

 private:
  Nanos now_{0};
};

struct SwarmOptions {
  int n = 64;
  Nanos latency = std::chrono::milliseconds(40);  // one way
  Nanos jitter = Nanos{0};                         // standard deviation of a normal draw, folded positive
  double loss = 0;                                 // chance a message is lost
  std::uint64_t seed = 1;
  transport::GossipOptions gossip;  // period, timeouts, fanout; bind, seeds and self are set per node
};

class Swarm {
 public:
  explicit Swarm(SwarmOptions o) : o_(std::move(o)), rng_(o_.seed) {
    for (int i = 0; i < o_.n; ++i) {
      transport::GossipOptions g = o_.gossip;
      g.bind = address(i);
      g.self = transport::PeerId{static_cast<std::uint64_t>(i + 1)};
      if (i > 0) g.seeds = {address(0)};
      cores_.push_back(std::make_unique<transport::GossipCore>(g, g.bind, clock_, o_.seed * 7919 + static_cast<std::uint64_t>(i)));
      by_address_[g.bind] = i;
      up_.push_back(true);
      egress_.push_back(Nanos{0});
      // Nodes start within the first period, each on its own phase.
      const Nanos phase = std::chrono::duration_cast<Nanos>(o_.gossip.period * std::uniform_real_distribution<double>(0, 1)(rng_));
      push(Event{phase, 0, i, -1, {}});
    }
  }

  static std::string address(int i) { return "tcp://198.18." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1) + ":7000"; }

  int size() const { return o_.n; }
  Nanos now() const { return clock_.now(); }
  transport::GossipCore& core(int i) { return *cores_[static_cast<std::size_t>(i)]; }
  bool up(int i) const { return up_[static_cast<std::size_t>(i)]; }
  // Goes silent at once: no farewell, nothing sent or received.
  void crash(int i) { up_[static_cast<std::size_t>(i)] = false; }
  // Every message node i sends waits this long more before it leaves (its uplink is busy).
  void set_egress_delay(int i, Nanos d) { egress_[static_cast<std::size_t>(i)] = d; }

  // Runs the events up to `t`; `every` (if given) runs after each period boundary crossed.
  void run_until(Nanos t, const std::function<void()>& every = {}) {
    Nanos next_check = clock_.now() + o_.gossip.period;
    while (!events_.empty() && events_.top().at <= t) {
      Event e = events_.top();
      events_.pop();
      while (every && e.at >= next_check) {
        clock_.set(next_check);
        every();
        next_check += o_.gossip.period;
      }
      clock_.set(e.at);
      if (!up(e.node)) continue;
      auto& c = core(e.node);
      if (e.from < 0) {
        send(e.node, c.tick());
        push(Event{e.at + o_.gossip.period, 0, e.node, -1, {}});
      } else {
        send(e.node, c.handle(e.message, "198.18.0.1"));
      }
    }
    clock_.set(t);
  }

  // Live members node i holds alive (or suspect), itself excluded.
  std::size_t known_live(int i) {
    std::size_t k = 0;
    for (const auto& m : core(i).members()) k += m.state == transport::MemberState::kAlive || m.state == transport::MemberState::kSuspect ? 1 : 0;
    return k;
  }
  std::uint64_t bytes_sent(int i) { return core(i).bytes().first; }

 private:
  struct Event {
    Nanos at;
    std::uint64_t order;
    int node;
    int from;  // -1: a tick
    Bytes message;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const { return a.at != b.at ? a.at > b.at : a.order > b.order; }
  };

  void push(Event e) {
    e.order = ++order_;
    events_.push(std::move(e));
  }

  void send(int from, std::vector<transport::GossipSend> sends) {
    for (auto& s : sends) {
      auto it = by_address_.find(s.to);
      if (it == by_address_.end()) continue;
      if (o_.loss > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < o_.loss) continue;
      Nanos delay = o_.latency + egress_[static_cast<std::size_t>(from)];
      if (o_.jitter > Nanos{0}) {
        delay += std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(
            std::abs(std::normal_distribution<double>(0.0, std::chrono::duration<double>(o_.jitter).count())(rng_))));
      }
      push(Event{clock_.now() + delay, 0, it->second, from, std::move(s.message)});
    }
  }

  SwarmOptions o_;
  VirtualClock clock_;
  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<transport::GossipCore>> cores_;
  std::map<std::string, int> by_address_;
  std::vector<bool> up_;
  std::vector<Nanos> egress_;
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  std::uint64_t order_ = 0;
};

}  // namespace gossamer::testing
