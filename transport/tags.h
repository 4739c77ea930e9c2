// Every message tag of the wire protocol, in one table. A link delivers messages by tag
// (transport/link.h); each user of a link owns a range of tags, and two users whose ranges overlapped
// could take each other's messages. The ranges are listed here, and the build fails when two overlap.
//
// Tags of methods that run collectives carry the round (or step, or fragment and window) in their low
// bits: the range is [base, base | span]. The all-reduce sends its means under `tag | kMeanPhase`, so
// a collective user's range keeps bit 31 clear and its image with bit 31 set overlaps nothing either.
// The values travel on the wire: renumbering one is a protocol change (docs/wire.md).
// Header only; constants and constexpr checks.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "transport/ids.h"

namespace gossamer::transport::tags {

// State transfer: the simulator's state hand-over, and real peers' requests and responses.
inline constexpr Tag kStateRequest = 0x05A7E100u;
inline constexpr Tag kStateResponse = 0x05A7E101u;
// Outer methods' collectives: base | (round mod 2^16).
inline constexpr Tag kDiLoCo = 0x0D010000u;
inline constexpr Tag kNoLoCo = 0x0D020000u;
inline constexpr Tag kCO2 = 0x0D030000u;
inline constexpr Tag kDdp = 0x0D040000u;  // | (step mod 2^16)
inline constexpr Tag kSparseLoCo = 0x0D050000u;
// Token-weighted rounds (optim/token_weights.h): what stands behind each member's contribution,
// exchanged before the round's collective: base | (the round's collective tag mod 2^24).
inline constexpr Tag kTokenWeights = 0x0C000000u;
// SkipPipe pipelines: activations and their gradients between stages, and each stage's replicas
// synchronising, both | (iteration mod 2^16).
inline constexpr Tag kPipeline = 0x0D700000u;
inline constexpr Tag kPipelineSync = 0x0D710000u;
// Pipelines across processes (src/runtime/pipeline_process.h): the agreement's messages under
// kPipelineHello | a sub-tag of its own (kPipelineSubTags), and a stage's weights sent for
// evaluation, | (iteration mod 2^16).
inline constexpr Tag kPipelineHello = 0x0D720000u;
inline constexpr Tag kPipelineHash = kPipelineHello | 0u;      // the schedule's hash
inline constexpr Tag kPipelineBye = kPipelineHello | 1u;       // the goodbye at the end
inline constexpr Tag kPipelineCommit = kPipelineHello | 2u;    // an iteration's confirmation
inline constexpr Tag kPipelineView = kPipelineHello | 3u;      // the nodes each reaches after a failure
inline constexpr Tag kLinkProbeAsk = kPipelineHello | 4u;      // a link probe (src/runtime/link_probe.h)
inline constexpr Tag kLinkProbeAnswer = kPipelineHello | 5u;   // its answer
inline constexpr Tag kPipelineEpoch = kPipelineHello | 6u;     // a new connection's epoch
inline constexpr Tag kPipelineProbeRow = kPipelineHello | 8u;  // each node's measured row
inline constexpr Tag kPipelineEval = 0x0D730000u;
// ddp on Gloo: where rank 0 serves the rendezvous store.
inline constexpr Tag kGlooRendezvous = 0x0D6C0000u;
// Streaming DiLoCo: base | (fragment mod 256) << 16 | (window mod 2^16).
inline constexpr Tag kStreaming = 0x0E000000u;
// Real peers: the first message on a new link says which group epoch it belongs to.
inline constexpr Tag kEpoch = 0x0F0E0000u;
// Striped links: every lane first says which link and lane it is.
inline constexpr Tag kLane = 0xFFFFFFF0u;
// The all-reduce's second phase (the means) under the caller's tag with this bit set.
inline constexpr Tag kMeanPhase = 0x80000000u;

struct TagRange {
  std::string_view owner;
  Tag first;
  Tag last;
  bool collective;  // its tags also travel with kMeanPhase set
};

inline constexpr std::array<TagRange, 15> kRanges = {{
    {"state requests (src/runtime/state_sync.h)", kStateRequest, kStateRequest, false},
    {"state responses (src/runtime/state_sync.h)", kStateResponse, kStateResponse, false},
    {"diloco rounds (optim/diloco.cpp)", kDiLoCo, kDiLoCo | 0xFFFFu, true},
    {"noloco rounds (optim/noloco.cpp)", kNoLoCo, kNoLoCo | 0xFFFFu, false},
    {"co2 rounds (optim/co2.cpp)", kCO2, kCO2 | 0xFFFFu, true},
    {"ddp steps (optim/data_parallel.cpp)", kDdp, kDdp | 0xFFFFu, true},
    {"sparseloco rounds (optim/sparseloco.cpp)", kSparseLoCo, kSparseLoCo | 0xFFFFu, false},
    {"token weights (optim/token_weights.cpp)", kTokenWeights, kTokenWeights | 0xFFFFFFu, true},
    {"gloo rendezvous (optim/gloo_sync.h)", kGlooRendezvous, kGlooRendezvous, false},
    {"pipeline activations (src/train/pipeline.h)", kPipeline, kPipeline | 0xFFFFu, false},
    {"pipeline stage sync (src/train/pipeline.h)", kPipelineSync, kPipelineSync | 0xFFFFu, true},
    {"pipeline agreement (src/runtime/pipeline_process.h)", kPipelineHello, kPipelineHello | 0xFu, false},
    {"pipeline evaluation weights (src/runtime/pipeline_process.h)", kPipelineEval, kPipelineEval | 0xFFFFu, false},
    {"streaming_diloco fragments (optim/streaming_diloco.cpp)", kStreaming, kStreaming | 0xFFFFFFu, true},
    {"group epochs (src/runtime/peer_links.h)", kEpoch, kEpoch, false},
}};
inline constexpr TagRange kLaneRange = {"striped lanes (transport/striped_link.h)", kLane, kLane, false};

// Where one range is shared by several messages, each message's sub-tag, listed so the build can
// check that no two messages share one and that each lies in its range.
struct SubTag {
  std::string_view message;
  Tag tag;
};
inline constexpr std::array<SubTag, 8> kPipelineSubTags = {{
    {"pipeline schedule hash", kPipelineHash},
    {"pipeline goodbye", kPipelineBye},
    {"pipeline commit", kPipelineCommit},
    {"pipeline view", kPipelineView},
    {"link probe ask", kLinkProbeAsk},
    {"link probe answer", kLinkProbeAnswer},
    {"pipeline epoch", kPipelineEpoch},
    {"pipeline probe row", kPipelineProbeRow},
}};

template <std::size_t N>
constexpr bool distinct_sub_tags(const std::array<SubTag, N>& subs, Tag first, Tag last) {
  for (std::size_t i = 0; i < N; ++i) {
    if (subs[i].tag < first || subs[i].tag > last) return false;
    for (std::size_t j = i + 1; j < N; ++j) {
      if (subs[i].tag == subs[j].tag) return false;
    }
  }
  return true;
}
static_assert(distinct_sub_tags(kPipelineSubTags, kPipelineHello, kPipelineHello | 0xFu),
              "two pipeline messages share a sub-tag, or one lies outside kPipelineHello's range: give each its own in transport/tags.h");

constexpr bool overlaps(Tag a_first, Tag a_last, Tag b_first, Tag b_last) { return a_first <= b_last && b_first <= a_last; }

// True when no two ranges (and no range and a collective's mean-phase image) share a tag.
constexpr bool disjoint() {
  std::array<TagRange, kRanges.size() + 1> all{};
  for (std::size_t i = 0; i < kRanges.size(); ++i) all[i] = kRanges[i];
  all[kRanges.size()] = kLaneRange;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].first > all[i].last) return false;
    if (all[i].collective && (all[i].last & kMeanPhase) != 0) return false;
    for (std::size_t j = 0; j < all.size(); ++j) {
      if (i != j && overlaps(all[i].first, all[i].last, all[j].first, all[j].last)) return false;
      if (all[i].collective && overlaps(all[i].first | kMeanPhase, all[i].last | kMeanPhase, all[j].first, all[j].last)) return false;
    }
  }
  return true;
}
static_assert(disjoint(), "two users of the wire own overlapping tag ranges: give one of them a range of its own in transport/tags.h");

}  // namespace gossamer::transport::tags
