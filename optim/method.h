// The outer methods, as one table: the id every layer switches on, the name configs, reports and
// the command line use, and each method's traits, which the config's checks, the memory model, the
// planner and the report read instead of lists of names. A method name is parsed once
// (train/outer.cpp builds optim::OuterConfig) and the config schema's allowed values for outer.method
// come from this table. A new method is one row here and one class.
// Header only; constants and pure functions, thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gossamer::optim {

enum class Method : std::uint8_t {
  kDdp = 0,              // data-parallel all-reduce of gradients every step
  kDiLoCo = 1,           // outer Nesterov on the averaged pseudo-gradient every H steps
  kStreamingDiLoCo = 2,  // DiLoCo by fragments that take turns, overlapped, quantized
  kNoLoCo = 3,           // random-pair partial averaging, no all-reduce
  kCO2 = 4,              // one-step-stale asynchronous averaging
  kLocal = 5,            // independent workers, no synchronization
  kSparseLoCo = 6,       // top-k + 2-bit pseudo-gradients with error feedback, all-gathered
  kMuLoCo = 7,           // Muon inner steps, DiLoCo's outer step on error-fed low-bit pseudo-gradients
};

// How a method exchanges what it shares.
enum class Exchange : std::uint8_t {
  kNone = 0,       // nothing (independent workers)
  kAllReduce = 1,  // every member's contribution through allreduce_mean over the group's links
  kAllGather = 2,  // every member's sparse contribution to every other (SparseLoCo)
  kPairs = 3,      // partial averaging with random partners (NoLoCo)
};

// What a member newcomer must fetch besides the shared weights.
enum class NewcomerNeeds : std::uint8_t {
  kNothing = 0,         // independent workers: nothing is shared
  kOuterState = 1,      // the outer optimizer's state (momentum, outer weights, pending averages)
  kOptimizerState = 2,  // the inner optimizer's state (ddp: the members step one AdamW together)
};

// The bits per value a method's round sends, as the planner (sim/plan.h) counts them.
enum class PlanBits : std::uint8_t {
  kAsked = 0,           // the codec the plan is asked about (gossamer plan --codec)
  kAskedStreaming = 1,  // the streaming codec asked about, else the codec asked about
  kInt2 = 2,            // its own default, int2 (2 bits): what it sends is error-fed
  kSparse = 3,          // its default top-k values with their indices
};

struct MethodInfo {
  Method id{};
  std::string_view name{};
  Exchange exchange = Exchange::kNone;
  std::string_view codec_key{};  // the config key of its codec; empty: none of its own
  // Which outer.aggregation rules it accepts besides mean: the robust ones need an owner per chunk
  // that sees every contribution (all-reduce), trimmed_mean also dense values per coordinate to sort.
  bool filtered_aggregation = false;
  bool trimmed_aggregation = false;
  bool time_budget = false;            // outer.round_budget = "time" (token-weighted rounds) applies
  bool overlapped = false;             // its exchange runs behind `overlap` inner steps (the planner counts them)
  bool one_round_stale = false;        // it applies each round's average a round later (CO2): the planner counts the round
  bool muon_inner = false;             // its workers step with Muon whatever train.optimizer says
  bool flat_gradient_on_host = false;  // the memory model: its flat gradient buffer stays in host memory
  bool stage_sync = false;             // it may synchronise a pipeline stage's replicas (pipeline.stage_sync)
  bool in_default_compare = false;     // `gossamer compare` runs it when --methods is not given
  NewcomerNeeds newcomer = NewcomerNeeds::kNothing;
  // The planner: it synchronises every inner step rather than every round (ddp); each of its rounds
  // moves one fragment of the model (streaming_diloco); what a value costs on the wire.
  bool every_step = false;
  bool fragmented = false;
  PlanBits plan_bits = PlanBits::kAsked;
  std::string_view note{};  // one sentence on what shapes its curve, for the report's readers
};

inline constexpr std::array<MethodInfo, 8> kMethods = {{
    {.id = Method::kDdp,
     .name = "ddp",
     .exchange = Exchange::kAllReduce,
     .codec_key = "ddp.codec",
     .filtered_aggregation = true,
     .trimmed_aggregation = true,
     .flat_gradient_on_host = true,
     .stage_sync = true,
     .in_default_compare = true,
     .newcomer = NewcomerNeeds::kOptimizerState,
     .every_step = true,
     .note = "averages gradients every step: the loss to beat, at the most bytes."},
    {.id = Method::kDiLoCo,
     .name = "diloco",
     .exchange = Exchange::kAllReduce,
     .codec_key = "diloco.codec",
     .filtered_aggregation = true,
     .trimmed_aggregation = true,
     .time_budget = true,
     .stage_sync = true,
     .in_default_compare = true,
     .newcomer = NewcomerNeeds::kOuterState,
     .note = "averages the pseudo-gradient once per round and applies it at once with Nesterov momentum."},
    {.id = Method::kStreamingDiLoCo,
     .name = "streaming_diloco",
     .exchange = Exchange::kAllReduce,
     .codec_key = "streaming_diloco.codec",
     .filtered_aggregation = true,
     .trimmed_aggregation = true,
     .time_budget = true,
     .overlapped = true,
     .stage_sync = true,
     .in_default_compare = true,
     .newcomer = NewcomerNeeds::kOuterState,
     .fragmented = true,
     .plan_bits = PlanBits::kAskedStreaming,
     .note = "synchronizes one fragment at a time in quantized form; it is evaluated on its outer weights, which lag the workers' by up to a "
             "round."},
    {.id = Method::kNoLoCo,
     .name = "noloco",
     .exchange = Exchange::kPairs,
     .codec_key = "noloco.codec",
     .stage_sync = true,
     .in_default_compare = true,
     .newcomer = NewcomerNeeds::kOuterState,
     .note = "averages with one random partner per round instead of all workers, so its replicas differ and its curve is one worker's."},
    {.id = Method::kCO2,
     .name = "co2",
     .exchange = Exchange::kAllReduce,
     .codec_key = "co2.codec",
     .filtered_aggregation = true,
     .trimmed_aggregation = true,
     .one_round_stale = true,
     .stage_sync = true,
     .in_default_compare = true,
     .newcomer = NewcomerNeeds::kOuterState,
     .note = "applies each round's average one round late (the all-reduce overlaps the next round's compute), so its outer step must stay "
             "small enough to be stable (outer_lr x c / penalty < 1 - momentum, c the share of the way one round covers): on a short run of "
             "few rounds it trails DiLoCo, which applies each average at once; the last average is applied before the final evaluation."},
    {.id = Method::kLocal,
     .name = "local",
     .note = "never synchronizes: each worker trains alone (a floor for the others)."},
    {.id = Method::kSparseLoCo,
     .name = "sparseloco",
     .exchange = Exchange::kAllGather,
     .filtered_aggregation = true,
     .time_budget = true,
     .newcomer = NewcomerNeeds::kOuterState,
     .plan_bits = PlanBits::kSparse,
     .note = "sends only the largest values of each chunk of its pseudo-gradient, in 2 bits, to every other worker; what it leaves out stays "
             "in a per-worker error accumulator (in place of outer momentum) and goes out in later rounds, so it needs many rounds: on a short "
             "run most of the progress is still waiting in the accumulators at the end."},
    {.id = Method::kMuLoCo,
     .name = "muloco",
     .exchange = Exchange::kAllReduce,
     .codec_key = "muloco.codec",
     .filtered_aggregation = true,
     .trimmed_aggregation = true,
     .time_budget = true,
     .muon_inner = true,
     .newcomer = NewcomerNeeds::kOuterState,
     .plan_bits = PlanBits::kInt2,
     .note = "steps its weight matrices with Muon and sends DiLoCo's pseudo-gradient in 2 bits (by default); what the codec drops stays in a "
             "per-worker error residual and goes out in later rounds, and the outer step is DiLoCo's Nesterov one on the average."},
}};

// The names of the methods that may synchronise a pipeline stage's replicas.
inline std::vector<std::string> stage_sync_names() {
  std::vector<std::string> out;
  for (const auto& m : kMethods) {
    if (m.stage_sync) out.emplace_back(m.name);
  }
  return out;
}

constexpr bool methods_in_id_order() {
  for (std::size_t i = 0; i < kMethods.size(); ++i) {
    if (static_cast<std::size_t>(kMethods[i].id) != i) return false;
  }
  return true;
}
static_assert(methods_in_id_order(), "kMethods is indexed by Method: keep its rows in id order");

constexpr std::string_view method_name(Method m) { return kMethods[static_cast<std::size_t>(m)].name; }
constexpr const MethodInfo& method_info(Method m) { return kMethods[static_cast<std::size_t>(m)]; }

inline std::vector<std::string> method_names() {
  std::vector<std::string> out;
  for (const auto& m : kMethods) out.emplace_back(m.name);
  return out;
}

// What `gossamer compare` runs by default: the rows marked so, in the table's order.
inline std::vector<std::string> default_compare_methods() {
  std::vector<std::string> out;
  for (const auto& m : kMethods) {
    if (m.in_default_compare) out.emplace_back(m.name);
  }
  return out;
}

// kInvalidArgument naming the methods there are.
[[nodiscard]] inline Result<Method> parse_method(std::string_view name) {
  for (const auto& m : kMethods) {
    if (m.name == name) return m.id;
  }
  std::string names;
  for (const auto& m : kMethods) names += (names.empty() ? "" : ", ") + std::string(m.name);
  return error(ErrorCode::kInvalidArgument, "unknown outer method '" + std::string(name) + "': use one of " + names);
}

}  // namespace gossamer::optim
