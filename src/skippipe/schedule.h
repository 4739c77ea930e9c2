// A SkipPipe schedule (docs/skippipe.md; SKIPPIPE.md): which node hosts which stage, and the path each
// micro-batch takes. A micro-batch starts at a stage-0 node (its origin), which runs stage 0's blocks;
// it then visits `path_length - 1` nodes of distinct non-zero stages, in an order that may skip and
// reorder stages within bounds, returns to its origin for the head and the loss, and its backward
// retraces the path. Micro-batches are grouped in agents (the reference's unit of path finding): an
// agent is one path that carries `microbatches` of them, launched from `start_s` on.
//
// The rules validate() checks, each named in its error:
//   R1 origin:    an agent's origin is a stage-0 node;
//   R2 length:    it visits path_length - 1 nodes (a full pipeline: stages - 1), of distinct non-zero
//                 stages, each node hosting the stage it is visited for;
//   R3 reorder:   visiting a stage below the highest so far is a swap: at most max_swaps of them, each
//                 at most max_swap_distance below, max_swap_total in all; no jump more than max_jump
//                 stages past the highest (a full pipeline visits stages in order);
//   R4 load:      at most stage_capacity() agents visit each non-zero stage (skip modes);
//   R5 memory:    at most `memory` agents visit each non-zero node (skip modes; TC1);
//   R6 count:     the agents carry every micro-batch: stage-0 nodes x mbs_per_origin in all;
//   R7 timetable: when the schedule carries one, each micro-batch's compute follows its path in
//                 order, each hop no sooner than it can arrive, and no two computations overlap on a
//                 node (TC2: what the collision-aware scheduler plans, for runtimes to follow; the
//                 stage runtime does not enforce it yet).
//
// Wire form (version 1, little-endian, core/wire.h): magic "GSKP", version u8, mode u8, then the
// options (i32 each: stages, path_length, memory, mbs_per_origin, mbs_per_agent, max_swaps,
// max_swap_distance, max_swap_total, max_jump; u64 seed), nodes u32 and a u8 stage per node, agents
// u32 and per agent (origin u32, start f64, microbatches u32, hops u8 count then u32 each), then the
// timetable: u32 entries (0 when none) of (agent u32, microbatch u32, hop u8, forward start f64,
// backward start f64, head start f64). Peers agree on a schedule by the BLAKE2b-256 of these bytes (hash()).
//
// Decoding is a hostile-input boundary: sizes are checked against caps before anything is allocated.
// Threading: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/bytes.h"
#include "core/hash.h"
#include "core/status.h"

namespace gossamer::skippipe {

inline constexpr std::uint8_t kScheduleVersion = 1;
inline constexpr int kMaxNodes = 4096;
inline constexpr int kMaxStages = 64;
inline constexpr int kMaxAgents = 1 << 16;
inline constexpr std::int64_t kMaxMicrobatches = 1 << 20;  // per iteration, in a decoded schedule

// How the paths were chosen (the rows of compare's pipeline table).
enum class Mode : std::uint8_t {
  kFull = 0,         // every micro-batch visits every stage in order (DT-FM's pipelines)
  kCostBlind = 1,    // skipping, paths chosen without looking at costs ("random", DT-FM Skip)
  kNoCollision = 2,  // skipping, cost-aware, without TC2 ("non-ca")
  kSkipPipe = 3,     // skipping, cost- and collision-aware (CBS with TC2)
};
static_assert(static_cast<int>(Mode::kSkipPipe) == 3, "Mode values travel on the wire");
std::string_view mode_name(Mode m);

struct Options {
  int stages = 6;
  int path_length = 4;      // stages each micro-batch visits, stage 0 included (4 of 6: 33% skipped)
  int memory = 3;           // micro-batches in flight per node; agents per non-zero node (TC1)
  int mbs_per_origin = 6;   // micro-batches each stage-0 node starts per iteration
  int mbs_per_agent = 2;    // micro-batches an agent's path carries
  int max_swaps = 2;
  int max_swap_distance = 1;
  int max_swap_total = 2;
  int max_jump = 4;
  std::uint64_t seed = 5;

  [[nodiscard]] Status check() const;
};

struct Agent {
  int origin = 0;
  std::vector<int> hops;  // the nodes visited after the origin, in order
  double start_s = 0;     // when its first micro-batch leaves the origin
  int microbatches = 1;
};

// When a micro-batch's computations start: hop 0 is the origin (stage 0's blocks; its backward is
// the last of the micro-batch), hop k >= 1 the agent's k-th node. The head and loss run at the origin
// when the forward comes back, before the backward leaves again.
struct TimetableEntry {
  int agent = 0;
  int microbatch = 0;  // within the agent
  int hop = 0;
  double forward_start = 0;
  double backward_start = 0;
  double head_start = 0;  // hop 0 only: the head and loss
};

struct Schedule {
  Mode mode = Mode::kSkipPipe;
  Options options;
  std::vector<int> stage_of;  // node -> stage
  std::vector<Agent> agents;
  std::vector<TimetableEntry> timetable;  // empty: none planned (runtimes go first come, first served)

  int nodes() const { return static_cast<int>(stage_of.size()); }
  int origins() const;       // stage-0 nodes
  std::int64_t microbatches() const;  // in all
  // Agents that may visit one non-zero stage: every agent's visits spread evenly, rounded up.
  int stage_capacity() const;
  // Stages a micro-batch visits, stage 0 included.
  int visited() const { return mode == Mode::kFull ? options.stages : options.path_length; }

  Bytes encode() const;
  [[nodiscard]] static Result<Schedule> decode(ByteView bytes);
  Digest hash() const;
};

// The first rule the schedule breaks, named (R1 ... R7), or ok. `costs` (forward and hop times)
// and the network are needed for R7 only; without them R7 checks each micro-batch's order alone
// (overlaps need the durations).
struct Network;
struct Costs;
[[nodiscard]] Status validate(const Schedule& s, const Network* net = nullptr, const Costs* costs = nullptr);

// How many nodes host each stage: stage 0 carries every micro-batch, a non-zero stage only
// (path_length - 1) / (stages - 1) of them, so stage 0 gets nodes / path_length of the nodes
// (rounded) and the others share the rest evenly (the reference's [5,3,3,3,3,3] for 20 nodes).
std::vector<int> partition_sizes(int nodes, int stages, int path_length);

// Whether a sequence of non-zero stages keeps the reorder bounds (R3).
bool order_allowed(const std::vector<int>& stages, const Options& o);

}  // namespace gossamer::skippipe
