#include "skippipe/simulate.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <queue>
#include <string>
#include <tuple>
#include <unordered_map>

namespace gossamer::skippipe {

namespace {

enum class Kind : std::uint8_t { kBackward = 0, kHead = 1, kForward = 2 };  // the order ties are broken in

struct Task {
  int mb = 0;
  int hop = 0;
  Kind kind = Kind::kForward;
  double ready = 0;
  double planned = 0;    // with a timetable: its planned start
  int blocker = -1;      // the agent whose computation held the node when this became ready
};

struct MicroBatch {
  int agent = 0;
  int index = 0;              // within the agent
  std::vector<int> path;      // origin, then the hops
};

struct Event {
  double time;
  std::uint64_t seq;
  int kind;  // 0: a task arrives at `node`; 1: `node` finishes; 2: origin `node` may launch
  int node;
  Task task;
  bool operator>(const Event& o) const { return std::tie(time, seq) > std::tie(o.time, o.seq); }
};

class Sim {
 public:
  Sim(const Schedule& s, const Network& net, const Costs& costs) : s_(s), net_(net), costs_(costs), nodes_(static_cast<std::size_t>(s.nodes())) {
    const int n = s.nodes();
    result_.nodes.resize(static_cast<std::size_t>(n));
    launch_.resize(static_cast<std::size_t>(n));
    for (std::size_t a = 0; a < s.agents.size(); ++a) {
      const Agent& ag = s.agents[a];
      std::vector<int> path{ag.origin};
      path.insert(path.end(), ag.hops.begin(), ag.hops.end());
      for (int k = 0; k < ag.microbatches; ++k) {
        mbs_.push_back(MicroBatch{static_cast<int>(a), k, path});
        launch_[static_cast<std::size_t>(ag.origin)].push_back(static_cast<int>(mbs_.size() - 1));
      }
    }
    // Launch order at each origin: by agent start, then agent, then micro-batch.
    for (auto& q : launch_) {
      std::stable_sort(q.begin(), q.end(), [&](int x, int y) {
        const auto& ax = s.agents[static_cast<std::size_t>(mbs_[static_cast<std::size_t>(x)].agent)];
        const auto& ay = s.agents[static_cast<std::size_t>(mbs_[static_cast<std::size_t>(y)].agent)];
        return ax.start_s < ay.start_s;
      });
    }
    for (const auto& e : s.timetable) planned_[{e.agent, e.microbatch, e.hop}] = e;
  }

  Result<Simulation> run() {
    for (int o = 0; o < s_.nodes(); ++o) {
      for (int mb : launch_[static_cast<std::size_t>(o)]) push(Event{s_.agents[static_cast<std::size_t>(mbs_[static_cast<std::size_t>(mb)].agent)].start_s, 0, 2, o, {}});
    }
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      now_ = e.time;
      if (e.kind == 0) {
        Task t = e.task;
        Node& nd = nodes_[static_cast<std::size_t>(e.node)];
        if (nd.busy && nd.running_agent != agent_of(t)) t.blocker = nd.running_agent;
        nd.ready.push_back(t);
        try_start(e.node);
      } else if (e.kind == 1) {
        finish(e.node);
      } else {
        try_launch(e.node);
      }
    }
    if (done_ != static_cast<int>(mbs_.size())) {
      std::string stuck;
      for (int n = 0; n < s_.nodes(); ++n) {
        if (!nodes_[static_cast<std::size_t>(n)].ready.empty()) stuck += (stuck.empty() ? "" : ", ") + std::to_string(n);
      }
      return error(ErrorCode::kAborted, "the schedule deadlocks: forwards wait for memory on node(s) " + stuck + " in a cycle (raise memory or change the paths)");
    }
    result_.makespan_s = now_;
    for (auto& nt : result_.nodes) nt.idle_s = std::max(0.0, result_.makespan_s - nt.busy_s);
    std::sort(result_.timetable.begin(), result_.timetable.end(),
              [](const TimetableEntry& a, const TimetableEntry& b) { return std::tie(a.agent, a.microbatch, a.hop) < std::tie(b.agent, b.microbatch, b.hop); });
    return std::move(result_);
  }

 private:
  struct Node {
    bool busy = false;
    int running_agent = -1;
    Task running;
    int inflight = 0;  // activations held (non-zero nodes) or micro-batches in flight (origins)
    std::vector<Task> ready;
  };

  int agent_of(const Task& t) const { return mbs_[static_cast<std::size_t>(t.mb)].agent; }
  int node_of(const Task& t) const {
    const auto& p = mbs_[static_cast<std::size_t>(t.mb)].path;
    return t.kind == Kind::kHead ? p[0] : p[static_cast<std::size_t>(t.hop)];
  }
  double duration(const Task& t) const {
    const double f = costs_.forward(node_of(t));
    return t.kind == Kind::kForward ? f : t.kind == Kind::kHead ? costs_.head_factor * f : costs_.backward_factor * f;
  }
  void push(Event e) {
    e.seq = ++seq_;
    events_.push(e);
  }
  // Sends task t's input from node a to node b, starting now.
  void send(int a, int b, Task t) {
    const double transfer = costs_.activation_bytes / net_.bandwidth(a, b);
    double& free = link_free_[static_cast<std::int64_t>(a) * s_.nodes() + b];
    const double start = std::max(now_, free);
    free = start + transfer;
    const double arrive = start + transfer + net_.latency(a, b) + costs_.hop_overhead_s;
    ++result_.hop_messages;
    result_.hop_bytes += costs_.activation_bytes;
    t.ready = arrive;
    t.planned = planned_start(t);
    push(Event{arrive, 0, 0, b, t});
  }
  double planned_start(const Task& t) const {
    if (planned_.empty()) return 0;
    const auto& mb = mbs_[static_cast<std::size_t>(t.mb)];
    auto it = planned_.find({mb.agent, mb.index, t.hop});
    if (it == planned_.end()) return 0;
    return t.kind == Kind::kForward ? it->second.forward_start : t.kind == Kind::kHead ? it->second.head_start : it->second.backward_start;
  }
  bool admitted(int node, const Task& t) const {
    return t.kind != Kind::kForward || t.hop == 0 || nodes_[static_cast<std::size_t>(node)].inflight < s_.options.memory;
  }
  void try_launch(int origin) {
    auto& q = launch_[static_cast<std::size_t>(origin)];
    Node& nd = nodes_[static_cast<std::size_t>(origin)];
    while (!q.empty() && nd.inflight < s_.options.memory) {
      const int mb = q.front();
      if (s_.agents[static_cast<std::size_t>(mbs_[static_cast<std::size_t>(mb)].agent)].start_s > now_) break;
      q.pop_front();
      ++nd.inflight;
      auto& nt = result_.nodes[static_cast<std::size_t>(origin)];
      nt.peak_inflight = std::max(nt.peak_inflight, nd.inflight);
      Task t{mb, 0, Kind::kForward, now_, 0, -1};
      t.planned = planned_start(t);
      if (nd.busy && nd.running_agent != agent_of(t)) t.blocker = nd.running_agent;
      nd.ready.push_back(t);
    }
    try_start(origin);
  }
  void try_start(int node) {
    Node& nd = nodes_[static_cast<std::size_t>(node)];
    if (nd.busy) return;
    auto best = nd.ready.end();
    for (auto it = nd.ready.begin(); it != nd.ready.end(); ++it) {
      if (!admitted(node, *it)) continue;
      if (best == nd.ready.end()) {
        best = it;
        continue;
      }
      const bool plan = !planned_.empty();
      const auto key = [&](const Task& t) { return std::make_tuple(plan ? t.planned : t.ready, static_cast<int>(t.kind), t.mb, t.hop); };
      if (key(*it) < key(*best)) best = it;
    }
    if (best == nd.ready.end()) return;
    Task t = *best;
    nd.ready.erase(best);
    auto& nt = result_.nodes[static_cast<std::size_t>(node)];
    const double wait = now_ - t.ready;
    nt.queue_wait_s += wait;
    if (t.blocker >= 0 && wait > 1e-12) {
      ++nt.collisions;
      result_.collisions.push_back(Collision{node, agent_of(t), t.blocker, wait, t.kind == Kind::kForward});
    }
    if (t.kind == Kind::kForward && t.hop > 0) {
      ++nd.inflight;
      nt.peak_inflight = std::max(nt.peak_inflight, nd.inflight);
    }
    const auto& mb = mbs_[static_cast<std::size_t>(t.mb)];
    auto& entry = entries_[{mb.agent, mb.index, t.hop}];
    entry.agent = mb.agent;
    entry.microbatch = mb.index;
    entry.hop = t.hop;
    (t.kind == Kind::kForward ? entry.forward_start : t.kind == Kind::kHead ? entry.head_start : entry.backward_start) = now_;
    nd.busy = true;
    nd.running = t;
    nd.running_agent = mb.agent;
    const double d = duration(t);
    nt.busy_s += d;
    push(Event{now_ + d, 0, 1, node, {}});
  }
  void finish(int node) {
    Node& nd = nodes_[static_cast<std::size_t>(node)];
    const Task t = nd.running;
    nd.busy = false;
    nd.running_agent = -1;
    const auto& mb = mbs_[static_cast<std::size_t>(t.mb)];
    const int last = static_cast<int>(mb.path.size()) - 1;
    auto at = [&](int hop) { return mb.path[static_cast<std::size_t>(hop)]; };
    if (t.kind == Kind::kForward) {
      if (t.hop < last) {
        send(node, at(t.hop + 1), Task{t.mb, t.hop + 1, Kind::kForward, 0, 0, -1});
      } else {
        send(node, at(0), Task{t.mb, 0, Kind::kHead, 0, 0, -1});
      }
    } else if (t.kind == Kind::kHead) {
      send(node, at(last), Task{t.mb, last, Kind::kBackward, 0, 0, -1});
    } else {
      if (t.hop > 0) {
        --nd.inflight;  // its activations are freed
        send(node, at(t.hop - 1), Task{t.mb, t.hop - 1, Kind::kBackward, 0, 0, -1});
      } else {
        --nd.inflight;  // the micro-batch is done at its origin
        ++done_;
        push(Event{now_, 0, 2, node, {}});
      }
    }
    if (t.kind == Kind::kBackward && t.hop == 0) {
      // Every entry of this micro-batch is complete now.
      for (int h = 0; h <= last; ++h) {
        auto e = entries_.find({mb.agent, mb.index, h});
        result_.timetable.push_back(e->second);
        entries_.erase(e);
      }
    }
    try_start(node);
  }

  const Schedule& s_;
  const Network& net_;
  const Costs& costs_;
  std::vector<Node> nodes_;
  std::vector<MicroBatch> mbs_;
  std::vector<std::deque<int>> launch_;
  std::map<std::tuple<int, int, int>, TimetableEntry> planned_, entries_;
  std::unordered_map<std::int64_t, double> link_free_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::uint64_t seq_ = 0;
  double now_ = 0;
  int done_ = 0;
  Simulation result_;
};

}  // namespace

Result<Simulation> simulate(const Schedule& s, const Network& net, const Costs& costs) {
  if (Status st = net.check(); !st.ok()) return st;
  if (Status st = costs.check(net); !st.ok()) return st;
  if (net.nodes != s.nodes()) return error(ErrorCode::kInvalidArgument, "the schedule has " + std::to_string(s.nodes()) + " nodes, the network " + std::to_string(net.nodes));
  if (Status st = validate(s); !st.ok()) return st;
  return Sim(s, net, costs).run();
}

double agent_cost(const Agent& a, const Network& net, const Costs& costs) {
  std::vector<int> path{a.origin};
  path.insert(path.end(), a.hops.begin(), a.hops.end());
  double t = costs.head_factor * costs.forward(a.origin);
  for (std::size_t k = 0; k < path.size(); ++k) {
    const int node = path[k], next = path[(k + 1) % path.size()];
    t += (1.0 + costs.backward_factor) * costs.forward(node);
    t += costs.hop(net, node, next) + costs.hop(net, next, node);
  }
  return t;
}

double predicted_makespan(const Schedule& s, const Network& net, const Costs& costs) {
  double worst = 0;
  for (const auto& a : s.agents) {
    double bottleneck = (1.0 + costs.backward_factor + costs.head_factor) * costs.forward(a.origin);
    for (int h : a.hops) bottleneck = std::max(bottleneck, (1.0 + costs.backward_factor) * costs.forward(h));
    worst = std::max(worst, a.start_s + agent_cost(a, net, costs) + (a.microbatches - 1) * bottleneck);
  }
  return worst;
}

}  // namespace gossamer::skippipe
