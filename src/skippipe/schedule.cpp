#include "skippipe/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "core/wire.h"
#include "skippipe/topology.h"

namespace gossamer::skippipe {

namespace {

constexpr char kMagic[4] = {'G', 'S', 'K', 'P'};
constexpr double kSlack = 1e-9;  // timetable comparisons: what floating point may lose

Status broken(const char* rule, const std::string& what) { return error(ErrorCode::kInvalidArgument, std::string(rule) + ": " + what); }

std::string agent_name(std::size_t a) { return "agent " + std::to_string(a); }

}  // namespace

std::string_view mode_name(Mode m) {
  switch (m) {
    case Mode::kFull: return "pipeline-full";
    case Mode::kCostBlind: return "skippipe-random";
    case Mode::kNoCollision: return "skippipe-noca";
    case Mode::kSkipPipe: return "skippipe";
  }
  return "unknown";
}

Status Options::check() const {
  auto bad = [](const std::string& what) { return error(ErrorCode::kInvalidArgument, what); };
  if (stages < 2 || stages > kMaxStages) return bad("pipeline.stages must lie in [2, " + std::to_string(kMaxStages) + "]");
  if (path_length < 2 || path_length > stages) return bad("pipeline.path_length must lie in [2, pipeline.stages]");
  if (memory < 1) return bad("pipeline.memory must be >= 1");
  if (memory > 1024) return bad("pipeline.memory must be at most 1024");
  if (mbs_per_origin < 1 || mbs_per_agent < 1 || mbs_per_origin > (1 << 16)) return bad("micro-batches per origin must lie in [1, 65536], per agent >= 1");
  if (mbs_per_origin % mbs_per_agent != 0) return bad("micro-batches per origin must be a multiple of those per agent");
  if (max_swaps < 0 || max_swap_distance < 0 || max_swap_total < 0 || max_jump < 1) return bad("reorder bounds must be >= 0 (jump >= 1)");
  return Status();
}

int Schedule::origins() const { return static_cast<int>(std::count(stage_of.begin(), stage_of.end(), 0)); }

std::int64_t Schedule::microbatches() const {
  std::int64_t n = 0;
  for (const auto& a : agents) n += a.microbatches;
  return n;
}

int Schedule::stage_capacity() const {
  const int visits = static_cast<int>(agents.size()) * (visited() - 1);
  return (visits + options.stages - 2) / (options.stages - 1);
}

std::vector<int> partition_sizes(int nodes, int stages, int path_length) {
  std::vector<int> sizes(static_cast<std::size_t>(stages), 0);
  if (stages < 2 || nodes < stages) return sizes;
  int first = static_cast<int>(std::lround(static_cast<double>(nodes) / path_length));
  first = std::clamp(first, 1, nodes - (stages - 1));
  sizes[0] = first;
  const int rest = nodes - first;
  for (int s = 1; s < stages; ++s) sizes[static_cast<std::size_t>(s)] = rest / (stages - 1) + (s - 1 < rest % (stages - 1) ? 1 : 0);
  return sizes;
}

bool order_allowed(const std::vector<int>& stages, const Options& o) {
  int highest = 0, swaps = 0, total = 0;
  for (int s : stages) {
    if (s > highest) {
      if (s - highest > o.max_jump) return false;
      highest = s;
      continue;
    }
    const int distance = highest - s;
    ++swaps;
    total += distance;
    if (distance > o.max_swap_distance || swaps > o.max_swaps || total > o.max_swap_total) return false;
  }
  return true;
}

namespace {

// R1 to R6: the nodes host every stage, and each agent's path keeps the rules.
Status check_paths(const Schedule& s) {
  if (Status st = s.options.check(); !st.ok()) return st;
  const int n = s.nodes();
  if (n < s.options.stages) return broken("R2 length", std::to_string(n) + " nodes cannot host " + std::to_string(s.options.stages) + " stages");
  std::vector<int> hosts(static_cast<std::size_t>(s.options.stages), 0);
  for (int st : s.stage_of) {
    if (st < 0 || st >= s.options.stages) return broken("R2 length", "a node hosts stage " + std::to_string(st) + ", outside the pipeline");
    ++hosts[static_cast<std::size_t>(st)];
  }
  for (int st = 0; st < s.options.stages; ++st) {
    if (hosts[static_cast<std::size_t>(st)] == 0) return broken("R2 length", "no node hosts stage " + std::to_string(st));
  }
  const bool full = s.mode == Mode::kFull;
  const int hops = s.visited() - 1;
  std::vector<int> stage_load(static_cast<std::size_t>(s.options.stages), 0), node_load(static_cast<std::size_t>(n), 0);
  for (std::size_t a = 0; a < s.agents.size(); ++a) {
    const Agent& ag = s.agents[a];
    if (ag.origin < 0 || ag.origin >= n || s.stage_of[static_cast<std::size_t>(ag.origin)] != 0) {
      return broken("R1 origin", agent_name(a) + " starts at node " + std::to_string(ag.origin) + ", not a stage-0 node");
    }
    if (ag.microbatches < 1 || !std::isfinite(ag.start_s) || ag.start_s < 0) return broken("R6 count", agent_name(a) + " carries no micro-batch or starts before 0");
    if (static_cast<int>(ag.hops.size()) != hops) {
      return broken("R2 length", agent_name(a) + " visits " + std::to_string(ag.hops.size()) + " nodes after its origin, not " + std::to_string(hops));
    }
    std::vector<int> stages;
    for (int node : ag.hops) {
      if (node < 0 || node >= n) return broken("R2 length", agent_name(a) + " visits node " + std::to_string(node) + ", outside the network");
      const int st = s.stage_of[static_cast<std::size_t>(node)];
      if (st == 0) return broken("R2 length", agent_name(a) + " visits stage 0 again at node " + std::to_string(node));
      if (std::find(stages.begin(), stages.end(), st) != stages.end()) return broken("R2 length", agent_name(a) + " visits stage " + std::to_string(st) + " twice");
      stages.push_back(st);
      ++stage_load[static_cast<std::size_t>(st)];
      ++node_load[static_cast<std::size_t>(node)];
    }
    if (full ? !std::is_sorted(stages.begin(), stages.end()) : !order_allowed(stages, s.options)) {
      return broken("R3 reorder", agent_name(a) + "'s order of stages breaks the reorder bounds");
    }
  }
  if (!full) {
    const int cap = s.stage_capacity();
    for (int st = 1; st < s.options.stages; ++st) {
      if (stage_load[static_cast<std::size_t>(st)] > cap) {
        return broken("R4 load", std::to_string(stage_load[static_cast<std::size_t>(st)]) + " agents visit stage " + std::to_string(st) + ", more than " + std::to_string(cap));
      }
    }
    for (int node = 0; node < n; ++node) {
      if (node_load[static_cast<std::size_t>(node)] > s.options.memory) {
        return broken("R5 memory", std::to_string(node_load[static_cast<std::size_t>(node)]) + " agents visit node " + std::to_string(node) + ", more than memory " +
                                       std::to_string(s.options.memory));
      }
    }
  }
  if (s.microbatches() != static_cast<std::int64_t>(s.origins()) * s.options.mbs_per_origin) {
    return broken("R6 count", "the agents carry " + std::to_string(s.microbatches()) + " micro-batches, not " + std::to_string(s.origins() * s.options.mbs_per_origin));
  }
  return Status();
}

// R7: one entry per (agent, micro-batch, hop), the path's order kept, and no overlaps (these only
// with the network and costs that give durations).
Status check_timetable(const Schedule& s, const Network* net, const Costs* costs) {
  const int n = s.nodes();
  const int hops = s.visited() - 1;
  std::map<std::tuple<int, int, int>, const TimetableEntry*> at;
  for (const auto& e : s.timetable) {
    if (e.agent < 0 || e.agent >= static_cast<int>(s.agents.size()) || e.microbatch < 0 || e.microbatch >= s.agents[static_cast<std::size_t>(e.agent)].microbatches ||
        e.hop < 0 || e.hop > hops || !std::isfinite(e.forward_start) || !std::isfinite(e.backward_start) || !std::isfinite(e.head_start)) {
      return broken("R7 timetable", "an entry names no micro-batch of the schedule");
    }
    if (!at.emplace(std::make_tuple(e.agent, e.microbatch, e.hop), &e).second) return broken("R7 timetable", "an entry is there twice");
  }
  if (static_cast<std::int64_t>(at.size()) != s.microbatches() * (hops + 1)) return broken("R7 timetable", "entries are missing");
  const bool timed = net != nullptr && costs != nullptr;
  std::vector<std::vector<std::pair<double, double>>> busy(static_cast<std::size_t>(n));
  for (std::size_t a = 0; a < s.agents.size(); ++a) {
    const Agent& ag = s.agents[a];
    std::vector<int> path{ag.origin};
    path.insert(path.end(), ag.hops.begin(), ag.hops.end());
    for (int mb = 0; mb < ag.microbatches; ++mb) {
      // Every (agent, micro-batch, hop) has its entry: the count matched and none is there twice.
      auto entry = [&](int hop) {
        const auto it = at.find({static_cast<int>(a), mb, hop});
        return it == at.end() ? nullptr : it->second;
      };
      for (int h = 0; h <= hops; ++h) {
        if (entry(h) == nullptr) return broken("R7 timetable", "entries are missing");
      }
      const std::string who = agent_name(a) + " micro-batch " + std::to_string(mb);
      if (entry(0)->forward_start + kSlack < ag.start_s) return broken("R7 timetable", who + " leaves before its agent starts");
      double ready = 0;  // when the next computation may start at the earliest
      for (int h = 0; h <= hops; ++h) {
        const int node = path[static_cast<std::size_t>(h)];
        const double f = timed ? costs->forward(node) : 0;
        if (entry(h)->forward_start + kSlack < ready) return broken("R7 timetable", who + " runs its forward at hop " + std::to_string(h) + " before it can arrive");
        busy[static_cast<std::size_t>(node)].emplace_back(entry(h)->forward_start, entry(h)->forward_start + f);
        const int next = path[static_cast<std::size_t>(h == hops ? 0 : h + 1)];
        ready = entry(h)->forward_start + f + (timed ? costs->hop(*net, node, next) : 0);
      }
      const double head = entry(0)->head_start;
      if (head + kSlack < ready) return broken("R7 timetable", who + " runs its head before its forward is back");
      const double hf = timed ? costs->head_factor * costs->forward(ag.origin) : 0;
      busy[static_cast<std::size_t>(ag.origin)].emplace_back(head, head + hf);
      ready = head + hf;
      for (int h = hops; h >= 0; --h) {
        const int node = path[static_cast<std::size_t>(h)];
        const int prev = h == hops ? ag.origin : path[static_cast<std::size_t>(h + 1)];
        if (timed) ready += costs->hop(*net, prev, node);
        if (entry(h)->backward_start + kSlack < ready) return broken("R7 timetable", who + " runs its backward at hop " + std::to_string(h) + " before its gradient can arrive");
        const double b = timed ? costs->backward_factor * costs->forward(node) : 0;
        busy[static_cast<std::size_t>(node)].emplace_back(entry(h)->backward_start, entry(h)->backward_start + b);
        ready = entry(h)->backward_start + b;
      }
    }
  }
  if (!timed) return Status();  // without durations, overlaps cannot be told
  for (int node = 0; node < n; ++node) {
    auto& b = busy[static_cast<std::size_t>(node)];
    std::sort(b.begin(), b.end());
    for (std::size_t i = 1; i < b.size(); ++i) {
      if (b[i].first + kSlack < b[i - 1].second) {
        return broken("R7 timetable", "two computations overlap on node " + std::to_string(node) + " at " + std::to_string(b[i].first) + " s");
      }
    }
  }
  return Status();
}

}  // namespace

Status validate(const Schedule& s, const Network* net, const Costs* costs) {
  if (Status st = check_paths(s); !st.ok()) return st;
  if (s.timetable.empty()) return Status();
  return check_timetable(s, net, costs);
}

Bytes Schedule::encode() const {
  Writer w;
  w.raw(ByteView(reinterpret_cast<const std::byte*>(kMagic), 4));
  w.u8(kScheduleVersion);
  w.u8(static_cast<std::uint8_t>(mode));
  for (int v : {options.stages, options.path_length, options.memory, options.mbs_per_origin, options.mbs_per_agent, options.max_swaps,
                options.max_swap_distance, options.max_swap_total, options.max_jump}) {
    w.i32(v);
  }
  w.u64(options.seed);
  w.u32(static_cast<std::uint32_t>(stage_of.size()));
  for (int st : stage_of) w.u8(static_cast<std::uint8_t>(st));
  w.u32(static_cast<std::uint32_t>(agents.size()));
  for (const auto& a : agents) {
    w.u32(static_cast<std::uint32_t>(a.origin));
    w.f64(a.start_s);
    w.u32(static_cast<std::uint32_t>(a.microbatches));
    w.u8(static_cast<std::uint8_t>(a.hops.size()));
    for (int h : a.hops) w.u32(static_cast<std::uint32_t>(h));
  }
  w.u32(static_cast<std::uint32_t>(timetable.size()));
  for (const auto& e : timetable) {
    w.u32(static_cast<std::uint32_t>(e.agent));
    w.u32(static_cast<std::uint32_t>(e.microbatch));
    w.u8(static_cast<std::uint8_t>(e.hop));
    w.f64(e.forward_start);
    w.f64(e.backward_start);
    w.f64(e.head_start);
  }
  return std::move(w).take();
}

Result<Schedule> Schedule::decode(ByteView bytes) {
  Reader r(bytes, "schedule");
  const ByteView magic = r.raw(4);
  const std::uint8_t version = r.u8();
  const std::uint8_t mode = r.u8();
  if (!r.ok()) return r.status();
  if (std::memcmp(magic.data(), kMagic, 4) != 0) return error(ErrorCode::kMalformed, "schedule: bad magic");
  if (version != kScheduleVersion) {
    return error(ErrorCode::kVersionMismatch, "schedule: version " + std::to_string(version) + ", this peer reads " + std::to_string(kScheduleVersion) +
                                                  ": run one version of gossamer across the pipeline");
  }
  if (mode > static_cast<std::uint8_t>(Mode::kSkipPipe)) return error(ErrorCode::kMalformed, "schedule: unknown mode " + std::to_string(mode));
  Schedule s;
  s.mode = static_cast<Mode>(mode);
  Options& o = s.options;
  for (int* v : {&o.stages, &o.path_length, &o.memory, &o.mbs_per_origin, &o.mbs_per_agent, &o.max_swaps, &o.max_swap_distance, &o.max_swap_total, &o.max_jump}) {
    *v = r.i32();
  }
  o.seed = r.u64();
  const std::uint32_t nodes = r.u32();
  if (!r.ok()) return r.status();
  if (Status st = o.check(); !st.ok()) return error(ErrorCode::kMalformed, "schedule: " + st.message());
  if (nodes > static_cast<std::uint32_t>(kMaxNodes) || nodes > r.remaining()) return error(ErrorCode::kOutOfRange, "schedule: " + std::to_string(nodes) + " nodes");
  s.stage_of.resize(nodes);
  for (auto& st : s.stage_of) st = r.u8();
  const std::uint32_t agents = r.u32();
  if (!r.ok()) return r.status();
  if (agents > static_cast<std::uint32_t>(kMaxAgents) || agents > r.remaining() / 17) return error(ErrorCode::kOutOfRange, "schedule: " + std::to_string(agents) + " agents");
  s.agents.resize(agents);
  for (auto& a : s.agents) {
    a.origin = static_cast<int>(r.u32());
    a.start_s = r.f64();
    const std::uint32_t mbs = r.u32();
    const std::uint8_t hops = r.u8();
    if (!r.ok()) return r.status();
    if (mbs > 1u << 20 || hops >= kMaxStages) return error(ErrorCode::kOutOfRange, "schedule: an agent of " + std::to_string(mbs) + " micro-batches and " + std::to_string(hops) + " hops");
    a.microbatches = static_cast<int>(mbs);
    a.hops.resize(hops);
    for (auto& h : a.hops) {
      const std::uint32_t node = r.u32();
      h = node >= nodes ? -1 : static_cast<int>(node);
    }
    if (a.origin < 0 || a.origin >= static_cast<int>(nodes)) a.origin = -1;
  }
  const std::uint32_t entries = r.u32();
  if (!r.ok()) return r.status();
  if (entries > r.remaining() / 33) return error(ErrorCode::kOutOfRange, "schedule: " + std::to_string(entries) + " timetable entries do not fit");
  s.timetable.resize(entries);
  for (auto& e : s.timetable) {
    e.agent = static_cast<int>(std::min<std::uint32_t>(r.u32(), kMaxAgents));
    e.microbatch = static_cast<int>(std::min<std::uint32_t>(r.u32(), 1u << 20));
    e.hop = r.u8();
    e.forward_start = r.f64();
    e.backward_start = r.f64();
    e.head_start = r.f64();
  }
  r.expect_end();
  if (!r.ok()) return r.status();
  if (s.microbatches() > kMaxMicrobatches) return error(ErrorCode::kOutOfRange, "schedule: " + std::to_string(s.microbatches()) + " micro-batches");
  if (Status st = validate(s); !st.ok()) return error(ErrorCode::kMalformed, "schedule: " + st.message());
  return s;
}

Digest Schedule::hash() const { return digest_of(encode()); }

}  // namespace gossamer::skippipe
