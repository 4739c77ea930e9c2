// The parts allreduce_mean's two layouts share (collectives.cpp, the full mesh; grid_allreduce.cpp,
// the grid): how a rank's contribution leaves, how an owner sums a segment, how chunks are read.
// Internal to optim; the contracts are collectives.h's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/bytes.h"
#include "core/clock.h"
#include "core/status.h"
#include "optim/collectives.h"
#include "quant/codec.h"
#include "transport/link.h"

namespace gossamer::optim::detail {

// Where chunk j of n values over `size` ranks begins.
std::int64_t chunk_begin(std::int64_t n, int size, int j);
// How the collective cuts n values over m ranks: chunk j (owned by rank j) in `count` near-equal
// segments of at most segment_values each; every rank computes the same cuts.
struct Segments {
  Segments(std::int64_t n, int m, std::int64_t segment_values);
  std::int64_t begin(int j, std::int64_t s) const;  // of segment s of chunk j (s = count: the chunk's end)
  std::int64_t length(int j, std::int64_t s) const { return begin(j, s + 1) - begin(j, s); }
  std::span<float> of(float* base, int j, std::int64_t s) const { return {base + begin(j, s), static_cast<std::size_t>(length(j, s))}; }
  std::int64_t n;
  int m;
  std::int64_t count;
};
Status send_counted(transport::Link& link, transport::Tag tag, const Bytes& payload, Deadline deadline, CommStats& stats);
// Receives one encoded chunk of `expect` values (the untrusted bytes are only inspected here).
Result<Bytes> recv_chunk(transport::Link& link, transport::Tag tag, std::int64_t expect, Deadline deadline, CommStats& stats);
// `st` with the peer it came from named (nothing added for this rank's own, `from` null).
Status decoded(Status st, const transport::Link* from);
// Errors of the bytes themselves (a contribution to leave out under a robust rule), as against a
// link's (lost peer, deadline), which fail the collective whatever the rule.
bool bad_payload(const Status& st);
// A contribution that does not leave as the codec's plain encoding of `values`: an empty one where
// this rank abstains under a robust rule (its values are not finite; `abstained` is set, and warned
// of once), or a simulated poisoned worker's NaN. Nothing otherwise.
std::optional<Bytes> special_contribution(const Group& g, std::span<const float> values, const quant::EncodeOptions& codec, bool robust,
                                          bool& abstained);
// The owner's result for one segment of its chunk: every rank's contribution in rank order
// (`contributions[j]` rank j's bytes; this rank's own are `own`), averaged, or combined by the robust
// rule, into `out`. `usable[j]` false: rank j's did not arrive in a usable form; set false for those
// the rule leaves out. `terms` and `rows` are scratch space. On a kMean failure `failed` names the
// rank whose bytes did not decode (-1: none in particular).
Status reduce_segment(const Group& g, const quant::EncodeOptions& codec, const Aggregation& agg, std::vector<Bytes>& contributions,
                      std::vector<char>& usable, std::span<const float> own, std::span<float> out, std::vector<quant::MeanTerm>& terms,
                      std::vector<float>& rows, std::ptrdiff_t& failed);
// After an all-reduce: the means' bytes (`parts`, by owner and segment; moved out) to the group's
// tap when `tapped`, and the contributions this rank left out (`left`, by rank) counted and logged.
void keep_and_report(const Group& g, std::int64_t n, bool tapped, std::vector<std::vector<Bytes>>& parts, const std::vector<char>& left,
                     transport::Tag tag, CommStats& stats);
// An encoding as one buffer (its head, the body appended).
Bytes joined(quant::EncodedView view);
// One all-reduce at one rank, as both layouts hold it: the values it sends (scaled for a simulated
// poisoned worker), the cuts, its own chunk as it is summed, the contributions to the segment at
// hand, the means by owner and segment, and whose contributions it left out.
struct MeanRound {
  MeanRound(const Group& group, const at::Tensor& tensor, const quant::EncodeOptions& encoding, std::int64_t segment_values,
            const Aggregation& aggregation);
  // This rank's values for segment s of chunk j; its chunk's sum for its segment s; the mean of
  // segment s of chunk j (ours only when not exact).
  std::span<float> sent(int j, std::int64_t s) const { return cuts.of(sent_data, j, s); }
  std::span<float> acc_segment(std::int64_t s) const;
  Bytes& part(int j, std::int64_t s) { return parts[static_cast<std::size_t>(j)][static_cast<std::size_t>(s)]; }
  // The owner's result for its segment s from `contributions` and `usable` as gathered (reduce_segment);
  // `left` marks the ranks left out.
  Status reduce(std::int64_t s, std::ptrdiff_t& failed);
  // With every mean in `parts`: decoded into `tensor` (straight into it when it is contiguous CPU
  // fp32, else through one staging tensor), then keep_and_report. `source(j)`, where given: the link
  // chunk j's means came over (named in errors; their buffers go back to it). On an error `failed`
  // names the chunk that did not decode.
  Status finish(at::Tensor& tensor, transport::Tag tag, CommStats& stats, const std::function<transport::Link*(int)>& source, int& failed);

  const Group& g;
  const quant::EncodeOptions& codec;
  const Aggregation& agg;
  const int r, m;
  const bool robust;  // a rule other than the plain mean
  const bool exact;   // fp32: round-trips bit for bit
  at::Tensor flat;    // the caller's values, flat CPU fp32
  at::Tensor sent_values;
  float* sent_data;
  const std::int64_t n;
  const Segments cuts;
  const std::int64_t mine_begin;  // where this rank's chunk begins
  const std::size_t acc_len;
  std::unique_ptr<float[]> acc;  // this rank's chunk as it is summed (written before it is read)
  std::vector<Bytes> contributions;  // to the segment at hand, by rank
  std::vector<quant::MeanTerm> terms;
  std::vector<char> usable, left;  // robust rules: in for the segment at hand; left out of any
  std::vector<float> rows;
  bool abstained = false;
  std::vector<std::vector<Bytes>> parts;  // [owner][segment]: the means as encoded by their owners
};
// allreduce_mean over a grid (Group::width >= 2; collectives.h), its traffic counted into `stats`.
Status grid_mean(const Group& g, at::Tensor& tensor, const quant::EncodeOptions& codec, transport::Tag tag, Deadline deadline,
                 std::int64_t segment_values, const Aggregation& agg, CommStats& stats);

}  // namespace gossamer::optim::detail
