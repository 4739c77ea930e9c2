// Collectives over Links: where a tensor meets a peer.
//
// allreduce_mean follows the quantized scheme of torchft (ALGORITHMS.md section 2.5): each rank owns
// one contiguous chunk of the flattened tensor; every rank sends each other rank that rank's chunk,
// encoded once with the codec; the owner decodes the contributions and accumulates them in fp32 in
// rank order, divides by the group size, encodes the mean once, and sends it to every other rank,
// which decodes it. Chunks move in segments (kAllreduceSegmentValues), and a segment's mean leaves
// as soon as its sum is done, so the phases overlap as in a pipelined ring; contributions run a few
// segments ahead of the sums, so a rank waiting on one slow peer still feeds the others. Every rank ends with
// bit-identical values (all decode the same bytes), the sum is exact for integer-valued fp32
// tensors, and each rank sends and receives 2 (M-1)/M x n values of the codec's size (plus payload
// and frame headers for each segment).
//
// In a grid (Group::width >= 2) the same pieces take two hops where two ranks are not linked: each
// rank sends, per segment, one bundle to each rank it is linked to, holding its contributions to the
// chunks that go through or to that rank, and passes on what it gets for others in a second bundle;
// the means come back the same way. The owners sum the very same bytes in the same order, so the
// results are bit for bit those of the full mesh, robust aggregation included, with about
// 2 sqrt(N) links and 8 sqrt(N) messages per segment per rank instead of N - 1 links and 2 (N - 1)
// messages, at the cost of up to twice the bytes and one more round trip (choose_width says when
// that pays).
//
// Threading: call from one thread per rank; every rank of the group must make the same calls in the
// same order with the same tag. Errors: a lost or timed-out peer returns its Status and leaves the
// tensor untouched, so the caller can retry or skip the round; a mean chunk whose values a peer
// corrupted (NaN, Inf) is refused while the result is being written, so after that error the
// tensor's contents are unspecified: pass a buffer owned by this call (every optimizer here does).
// Contributions so large that their mean overflows float32 are kOutOfRange on the chunk's owner
// (the others then time out waiting for that mean).
// Misuse (a non-float tensor, a group without a link to some rank) throws ContractError.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/clock.h"
#include "core/status.h"
#include "optim/mean_tap.h"
#include "quant/format.h"
#include "transport/link.h"
#include "transport/tags.h"

namespace gossamer::optim {

// What a simulated poisoned worker does to its own contributions before they leave (sim.poison):
// multiplies them by `scale` (-1 flips their sign), and with `nan` sends NaN in place of the first
// value of each (fp32 codec; the encoder refuses NaN, so it is written into the encoded bytes; its
// own chunk's owner, itself, treats its own contribution as non-finite).
struct Poison {
  double scale = 1.0;
  bool nan = false;
};

// How a group's members are linked. Width 0: a full mesh, every rank linked to every other. Width w
// >= 2: a grid of rows of w ranks (rank r at row r / w and column r % w; the last row may be
// shorter), each rank linked to the others of its row and of its column only: about 2 sqrt(N) links
// instead of N - 1. A message between two ranks that are not linked goes through the rank at the
// first's row and the second's column, or, where the last row is too short for that, the one at the
// second's row and the first's column: both are linked to both.
bool grid_linked(int a, int b, int size, int width);
// The rank a message from `from` to `to` goes to first: `to` itself when the two are linked.
int grid_next_hop(int from, int to, int size, int width);

// This rank's view of a group: a link to every other member it is linked to (all of them in a full
// mesh), indexed by rank.
struct Group {
  int rank = 0;
  int size = 1;
  int width = 0;  // the layout (see grid_linked): 0, a full mesh
  std::vector<std::shared_ptr<transport::Link>> peers;  // peers[rank] is unused; null where not linked
  Clock* clock = &real_clock();  // the time deadlines, timings and waits use (virtual in a simulation)
  std::optional<Poison> poison;  // a simulated poisoned worker's (never set in real runs)
  // A fault drill's (`gossamer peer --crash-mid-round`, sim.crash_mid_round): called once this rank's
  // own share of the result (its mean of the last segment in allreduce_mean, its piece in allgather)
  // has gone to the first half of the ranks it sends it to, before the rest: between the exchange
  // and the commit. It kills the process or the simulated node. Unset: nothing happens.
  std::function<void()> crash_drill;
  // Where allreduce_mean leaves the codec's bytes of each mean while it is on (mean_tap.h): a member
  // keeping updates for a newcomer's catch-up. Null: nothing recorded.
  std::shared_ptr<MeanTap> mean_tap;
};

// How a chunk's owner combines the contributions (outer.aggregation).
//   kMean: the mean of all; a contribution that does not decode (malformed, NaN, Inf) fails the
//     collective, as a lost peer does.
//   kFiltered: contributions that do not decode are left out, and so is each whose distance to the
//     coordinate-wise median of the contributions exceeds `outlier_factor` times the median of those
//     distances; the mean of the rest. With nobody left out it is bit for bit kMean's result.
//   kTrimmedMean: contributions that do not decode are left out; of the rest, per coordinate, the
//     `trim` largest and `trim` smallest values are dropped (fewer when too few remain) and the others
//     averaged.
// The owner decides per segment (kAllreduceSegmentValues values) and sends the result; every rank
// decodes the same bytes, so ranks stay bit-identical. A rank whose own contribution is non-finite
// abstains (sends an empty contribution) under kFiltered and kTrimmedMean, and fails under kMean.
struct Aggregation {
  enum class Rule { kMean, kFiltered, kTrimmedMean };
  Rule rule = Rule::kMean;
  double outlier_factor = 3.0;
  int trim = 1;
};

// Bytes and time one collective cost this rank (payloads plus frame headers), and the contributions
// it left out as a chunk's owner (a sender's chunk counts once however many of its segments went).
struct CommStats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  double seconds = 0.0;
  std::uint64_t left_out = 0;
  CommStats& operator+=(const CommStats& o);
};

// The tag of one round of a method's collective: the method's base (low 16 bits zero) and the round
// number modulo 2^16, so a message left over from an abandoned round is never taken for another's.
inline transport::Tag round_tag(transport::Tag method_base, std::int64_t round) {
  return method_base | static_cast<transport::Tag>(static_cast<std::uint64_t>(round) & 0xFFFFu);
}

// The collective's means travel under `tag | kAllreduceMeanPhase`, so callers' tags keep bit 31 clear.
inline constexpr transport::Tag kAllreduceMeanPhase = transport::tags::kMeanPhase;
// Each chunk moves in segments of at most this many values (1 MiB of fp32), so summing and sending
// means overlap the transfers of later segments.
inline constexpr std::int64_t kAllreduceSegmentValues = std::int64_t{1} << 18;

// The layout a group of `size` ranks should use for an all-reduce of `payload_bytes` (the tensor as
// the codec encodes it), on links of round-trip time `rtt` and `bandwidth_bytes_per_s` per rank
// (0: unknown, taken as 100 Mbit/s). It estimates, for the full mesh and for a grid of rows of
// ceil(sqrt(size)), the time of linking a new group (kDialedAtOnce links at a time, each two round
// trips) plus one all-reduce (the round trips of its hops, its messages at kMessageCost each, its
// bytes over the bandwidth: a grid sends up to twice the bytes), and returns the grid's width when it
// is the faster, else 0. Groups of 8 or fewer always use the full mesh.
int choose_width(int size, double payload_bytes, Nanos rtt, double bandwidth_bytes_per_s);
inline constexpr int kDialedAtOnce = 16;                                     // as PeerLinks dials
inline constexpr Nanos kMessageCost = std::chrono::microseconds(50);         // sending and receiving one message

[[nodiscard]] Status allreduce_mean(const Group& group, at::Tensor& tensor, const quant::EncodeOptions& codec, transport::Tag tag,
                                    Deadline deadline, CommStats* stats = nullptr,
                                    std::int64_t segment_values = kAllreduceSegmentValues, const Aggregation& aggregation = {});

// What the chunks' owners take from this rank when allreduce_mean runs over `size` ranks (full mesh
// or grid): `tensor` flattened, each segment as the collective cuts it passed through the codec
// (every rank's own chunk passes it too). Error feedback subtracts this from what it carried, so what
// quantization drops is exactly what stays behind. fp32: a copy.
at::Tensor allreduce_contribution(const at::Tensor& tensor, int size, const quant::EncodeOptions& codec,
                                  std::int64_t segment_values = kAllreduceSegmentValues);

// Sends `mine` to every other member and returns every member's bytes by rank (ours at our rank):
// an all-gather of opaque payloads, for methods whose contributions cannot be summed on the way
// (SparseLoCo's sparse ones). Each rank sends and receives (M-1) payloads. The bytes received are
// untrusted: the caller decodes and validates them. Errors as allreduce_mean (a lost or timed-out
// peer).
[[nodiscard]] Result<std::vector<Bytes>> allgather(const Group& group, Bytes mine, transport::Tag tag, Deadline deadline, CommStats* stats = nullptr);

// Sends `mine` to the peer and returns the peer's tensor (same shape), both encoded with the codec
// (NoLoCo's pairwise averaging). Both sides call it with the same tag.
[[nodiscard]] Result<at::Tensor> pair_exchange(transport::Link& peer, const at::Tensor& mine, const quant::EncodeOptions& codec,
                                               transport::Tag tag, Deadline deadline, const Clock& clock, CommStats* stats = nullptr);

}  // namespace gossamer::optim
