// allreduce_mean over a grid (collectives.h): the full mesh's pieces, each taking at most two hops.
//
// Per segment, on each link between two linked ranks, in this order (every rank computes the same
// sets from the group's size and width, so both ends know what comes):
//   contributions (tag): first-hand, a bundle of the sender's contributions to every chunk whose
//     owner is reached through the receiver (the receiver's own chunk among them); then, where any,
//     a bundle of the contributions the sender got first-hand from others and passes on to the
//     receiver, whose chunk they are;
//   means (tag | kAllreduceMeanPhase): first-hand, the sender's own mean (every segment's, as each
//     is summed); then, segment by segment where any, the means the sender got first-hand from
//     others and passes on to the receiver.
// A bundle: count u32 | count x (rank u32 | encoded piece blob), ranks ascending: for first-hand
// contributions the owner each is for, otherwise the rank each comes from. The ranks must be exactly
// the expected ones and every piece of the expected size, or the collective fails (as a lost peer
// does): the bytes are untrusted. The owners sum what arrives as the full mesh does, so the results
// are the full mesh's, bit for bit.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "core/wire.h"
#include "optim/collective_parts.h"
#include "quant/format.h"
#include "transport/protocol.h"

namespace gossamer::optim {

namespace {

int rows_of(int size, int width) { return (size + width - 1) / width; }

}  // namespace

bool grid_linked(int a, int b, int size, int width) {
  if (width < 2 || size <= width) return true;
  return a / width == b / width || a % width == b % width;
}

int grid_next_hop(int from, int to, int size, int width) {
  if (grid_linked(from, to, size, width)) return to;
  const int via = (from / width) * width + to % width;  // the first's row, the second's column
  if (via < size) return via;
  return (to / width) * width + from % width;  // the last row is too short there: the second's row, the first's column
}

int choose_width(int size, double payload_bytes, Nanos rtt, double bandwidth_bytes_per_s) {
  if (size <= 8) return 0;
  const double r = std::chrono::duration<double>(rtt).count();
  const double b = bandwidth_bytes_per_s > 0 ? bandwidth_bytes_per_s : 100e6 / 8;
  const double h = std::chrono::duration<double>(kMessageCost).count();
  const int width = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(size))));
  const int links_grid = (width - 1) + (rows_of(size, width) - 1), links_mesh = size - 1;
  const auto linking = [&](int links) { return std::ceil(static_cast<double>(links) / kDialedAtOnce) * 2 * r; };
  // Two one-way hops per phase in a grid against one; four bundles per link and segment against two
  // messages per peer; every piece at most twice on the wire against once.
  const double mesh = linking(links_mesh) + r + 2.0 * links_mesh * h + 2 * payload_bytes / b;
  const double grid = linking(links_grid) + 2 * r + 4.0 * links_grid * h + 4 * payload_bytes / b;
  return grid < mesh ? width : 0;
}

namespace detail {

namespace {

// What flows over the links of one rank of a grid (see the top of this file).
struct Routes {
  std::vector<int> linked;                        // the ranks this one is linked to, ascending
  std::map<int, std::vector<int>> first_to;       // linked rank -> owners whose pieces go to it first-hand
  std::map<int, std::vector<int>> first_from;     // linked rank -> owners of the pieces it sends here first-hand
  std::map<int, std::vector<int>> passed_to;      // linked rank -> ranks whose pieces this one passes on to it
  std::map<int, std::vector<int>> passed_from;    // linked rank -> ranks whose pieces it passes on to this one
};

Routes routes_of(int r, int m, int w) {
  Routes out;
  for (int n = 0; n < m; ++n) {
    if (n != r && grid_linked(r, n, m, w)) out.linked.push_back(n);
  }
  for (int n : out.linked) {
    auto& to = out.first_to[n];
    auto& from = out.first_from[n];
    auto& passed_to = out.passed_to[n];
    auto& passed_from = out.passed_from[n];
    for (int d = 0; d < m; ++d) {
      if (d != r && grid_next_hop(r, d, m, w) == n) to.push_back(d);
      if (d != n && grid_next_hop(n, d, m, w) == r) from.push_back(d);
      if (d != r && d != n && grid_next_hop(d, n, m, w) == r) passed_to.push_back(d);
      if (d != r && d != n && grid_next_hop(d, r, m, w) == n) passed_from.push_back(d);
    }
  }
  return out;
}

Bytes bundle(const std::vector<std::pair<int, const Bytes*>>& items) {
  std::size_t size = 4;
  for (const auto& [rank, piece] : items) size += 8 + piece->size();
  Writer w(size);
  w.u32(static_cast<std::uint32_t>(items.size()));
  for (const auto& [rank, piece] : items) {
    w.u32(static_cast<std::uint32_t>(rank));
    w.blob(*piece);
  }
  return std::move(w).take();
}

// Reads a bundle from `from` that must hold exactly `ranks`, each piece of `numel(rank)` values.
template <typename Numel>
Result<std::vector<Bytes>> unbundle(transport::Link& link, transport::Tag tag, const std::vector<int>& ranks, Numel numel, Deadline deadline,
                                    CommStats& stats) {
  auto got = link.recv(tag, deadline);
  if (!got.ok()) return got.status();
  stats.bytes_received += got->size() + transport::kFrameHeaderBytes;
  Reader rd(*got, "an all-reduce bundle from peer " + link.peer().to_string());
  const std::uint32_t count = rd.u32();
  if (rd.ok() && count != ranks.size()) rd.fail(ErrorCode::kMalformed, std::to_string(count) + " pieces where " + std::to_string(ranks.size()) + " were expected (group out of step?)");
  std::vector<Bytes> pieces;
  for (std::size_t i = 0; rd.ok() && i < ranks.size(); ++i) {
    const std::uint32_t rank = rd.u32();
    const ByteView piece = rd.blob(std::size_t{1} << 30);
    if (rd.ok() && rank != static_cast<std::uint32_t>(ranks[i])) rd.fail(ErrorCode::kMalformed, "a piece of rank " + std::to_string(rank) + " where rank " + std::to_string(ranks[i]) + "'s was expected");
    if (!rd.ok()) break;
    const std::int64_t expect = numel(ranks[i]);
    auto info = quant::inspect(piece, expect);
    if (info.ok() && info->numel != expect) info = error(ErrorCode::kMalformed, "a piece of " + std::to_string(info->numel) + " values where " + std::to_string(expect) + " were expected");
    if (!info.ok()) {
      // The piece itself is bad: kept, so that the owner treats it as the full mesh would (a robust
      // rule leaves it out); a piece passed on is checked again by its owner.
      pieces.emplace_back();
      continue;
    }
    pieces.emplace_back(piece.begin(), piece.end());
  }
  rd.expect_end();
  if (!rd.ok()) return rd.status();
  link.recycle(std::move(*got));
  return pieces;
}

}  // namespace

Status allreduce_grid(const Group& g, at::Tensor& tensor, const quant::EncodeOptions& codec, transport::Tag tag, Deadline deadline,
                      CommStats* stats_out, std::int64_t segment_values, const Aggregation& agg) {
  Stopwatch watch(*g.clock);
  CommStats stats;
  const int r = g.rank, m = g.size, w = g.width;
  const Routes routes = routes_of(r, m, w);
  for (int n : routes.linked) GOSSAMER_CHECK(g.peers[static_cast<std::size_t>(n)], "allreduce_mean: no link to rank " + std::to_string(n));
  auto link = [&](int j) -> transport::Link& { return *g.peers[static_cast<std::size_t>(j)]; };
  auto rank_context = [&](Status st, const std::string& what, int j) {
    return st.with_context("allreduce (grid of width " + std::to_string(w) + "): rank " + std::to_string(r) + " " + what + " rank " + std::to_string(j));
  };
  const at::Tensor flat = tensor.detach().to(at::kCPU, at::kFloat).contiguous().reshape({-1});
  const std::int64_t n = flat.numel();
  const bool robust = agg.rule != Aggregation::Rule::kMean;
  const bool exact = codec.codec == quant::CodecId::kFp32;
  const at::Tensor sent_values = g.poison && g.poison->scale != 1.0 ? flat * g.poison->scale : flat;
  float* const sent_data = sent_values.data_ptr<float>();
  // The full mesh's chunks and segments, exactly.
  const Segments cuts(n, m, segment_values);
  const std::int64_t segs = cuts.count;
  auto seg_begin = [&](int j, std::int64_t s) { return cuts.begin(j, s); };
  auto seg_len = [&](int j, std::int64_t s) { return cuts.length(j, s); };
  auto segment = [&](float* base, int j, std::int64_t s) { return cuts.of(base, j, s); };
  const transport::Tag mean_tag = tag | kAllreduceMeanPhase;
  const std::int64_t mine_begin = chunk_begin(n, m, r);
  const auto acc_len = static_cast<std::size_t>(chunk_begin(n, m, r + 1) - mine_begin);
  const auto acc = std::make_unique_for_overwrite<float[]>(acc_len);
  std::vector<Bytes> contributions(static_cast<std::size_t>(m));
  std::vector<quant::MeanTerm> terms;
  std::vector<char> usable(static_cast<std::size_t>(m), 1), left(static_cast<std::size_t>(m), 0);
  std::vector<float> rows;
  bool abstained = false;
  std::vector<std::vector<Bytes>> parts(static_cast<std::size_t>(m), std::vector<Bytes>(static_cast<std::size_t>(segs)));
  std::vector<Bytes> own_pieces(static_cast<std::size_t>(m));  // this rank's contributions to one segment of each chunk

  for (std::int64_t s = 0; s < segs; ++s) {
    // 1. First-hand: this rank's contributions, one bundle per linked rank.
    for (int d = 0; d < m; ++d) {
      if (d == r) continue;
      const std::span<float> values = segment(sent_data, d, s);
      if (auto special = special_contribution(g, values, codec, robust, abstained)) {
        own_pieces[static_cast<std::size_t>(d)] = std::move(*special);
        continue;
      }
      const quant::EncodedView view = quant::encode_view(values, codec);
      Bytes& piece = own_pieces[static_cast<std::size_t>(d)];
      piece = view.head;
      piece.insert(piece.end(), view.body.begin(), view.body.end());
    }
    for (int to : routes.linked) {
      std::vector<std::pair<int, const Bytes*>> items;
      for (int d : routes.first_to.at(to)) items.emplace_back(d, &own_pieces[static_cast<std::size_t>(d)]);
      if (Status st = send_counted(link(to), tag, bundle(items), deadline, stats); !st.ok()) return rank_context(st, "sending to", to);
    }
    // 2. What comes first-hand: contributions to this rank's chunk, and others' to pass on.
    std::map<int, std::map<int, Bytes>> to_pass;  // linked rank -> (sender -> its piece for it)
    std::fill(usable.begin(), usable.end(), 1);
    for (int from : routes.linked) {
      const auto& owners = routes.first_from.at(from);
      auto got = unbundle(link(from), tag, owners, [&](int d) { return seg_len(d, s); }, deadline, stats);
      if (!got.ok()) return rank_context(got.status(), "receiving from", from);
      for (std::size_t i = 0; i < owners.size(); ++i) {
        if (owners[i] == r) contributions[static_cast<std::size_t>(from)] = std::move((*got)[i]);
        else to_pass[owners[i]][from] = std::move((*got)[i]);
      }
    }
    // 3. Passed on: each linked rank gets the pieces for its chunk that came here.
    for (int to : routes.linked) {
      const auto& senders = routes.passed_to.at(to);
      if (senders.empty()) continue;
      std::vector<std::pair<int, const Bytes*>> items;
      for (int from : senders) items.emplace_back(from, &to_pass[to][from]);
      if (Status st = send_counted(link(to), tag, bundle(items), deadline, stats); !st.ok()) return rank_context(st, "passing on to", to);
    }
    for (int from : routes.linked) {
      const auto& senders = routes.passed_from.at(from);
      if (senders.empty()) continue;
      auto got = unbundle(link(from), tag, senders, [&](int) { return seg_len(r, s); }, deadline, stats);
      if (!got.ok()) return rank_context(got.status(), "receiving what was passed on by", from);
      for (std::size_t i = 0; i < senders.size(); ++i) contributions[static_cast<std::size_t>(senders[i])] = std::move((*got)[i]);
    }
    // 4. The owner's sum, as the full mesh's: an empty piece is a contribution that did not decode.
    for (int j = 0; j < m; ++j) {
      if (j == r || !contributions[static_cast<std::size_t>(j)].empty()) continue;
      if (!robust) return rank_context(error(ErrorCode::kMalformed, "a contribution that does not decode"), "reducing the chunk of", j);
      usable[static_cast<std::size_t>(j)] = 0;
    }
    const std::span<float> acc_seg(acc.get() + (seg_begin(r, s) - mine_begin), static_cast<std::size_t>(seg_len(r, s)));
    std::ptrdiff_t failed = -1;
    const Status summed = reduce_segment(g, codec, agg, contributions, usable, segment(sent_data, r, s), acc_seg, terms, rows, failed);
    for (int j = 0; j < m; ++j) {
      if (!usable[static_cast<std::size_t>(j)]) left[static_cast<std::size_t>(j)] = 1;
    }
    if (!summed.ok()) {
      const int j = static_cast<int>(failed);
      if (robust || j < 0) return rank_context(summed, "averaging the chunk of", r);
      return rank_context(summed, "reducing the chunk of", j);
    }
    // 5. The mean, encoded once, first-hand to every linked rank.
    const quant::EncodedView mean = quant::encode_view(std::span<const float>(acc_seg), codec);
    Bytes& own_mean = parts[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)];
    own_mean = mean.head;
    own_mean.insert(own_mean.end(), mean.body.begin(), mean.body.end());
    for (std::size_t i = 0; i < routes.linked.size(); ++i) {
      const int to = routes.linked[i];
      if (Status st = send_counted(link(to), mean_tag, bundle({{r, &own_mean}}), deadline, stats); !st.ok()) return rank_context(st, "sending the mean to", to);
      if (g.crash_drill && s == segs - 1 && i + 1 == (routes.linked.size() + 1) / 2) g.crash_drill();
    }
  }
  // 6. The means: first-hand from each linked rank (every segment's: they were sent first), then
  // those passed on, segment by segment.
  for (std::int64_t s = 0; s < segs; ++s) {
    for (int from : routes.linked) {
      auto got = unbundle(link(from), mean_tag, {from}, [&](int j) { return seg_len(j, s); }, deadline, stats);
      if (!got.ok()) return rank_context(got.status(), "receiving the mean from", from);
      if ((*got)[0].empty()) return rank_context(error(ErrorCode::kMalformed, "a mean that does not decode"), "receiving the mean from", from);
      parts[static_cast<std::size_t>(from)][static_cast<std::size_t>(s)] = std::move((*got)[0]);
    }
  }
  for (std::int64_t s = 0; s < segs; ++s) {
    for (int to : routes.linked) {
      const auto& owners = routes.passed_to.at(to);
      if (owners.empty()) continue;
      std::vector<std::pair<int, const Bytes*>> items;
      for (int j : owners) items.emplace_back(j, &parts[static_cast<std::size_t>(j)][static_cast<std::size_t>(s)]);
      if (Status st = send_counted(link(to), mean_tag, bundle(items), deadline, stats); !st.ok()) return rank_context(st, "passing the means on to", to);
    }
    for (int from : routes.linked) {
      const auto& owners = routes.passed_from.at(from);
      if (owners.empty()) continue;
      auto got = unbundle(link(from), mean_tag, owners, [&](int j) { return seg_len(j, s); }, deadline, stats);
      if (!got.ok()) return rank_context(got.status(), "receiving the means passed on by", from);
      for (std::size_t i = 0; i < owners.size(); ++i) {
        if ((*got)[i].empty()) return rank_context(error(ErrorCode::kMalformed, "a mean that does not decode"), "receiving the mean of", owners[i]);
        parts[static_cast<std::size_t>(owners[i])][static_cast<std::size_t>(s)] = std::move((*got)[i]);
      }
    }
  }
  // Only now does the caller's tensor change, as in the full mesh.
  const bool direct = tensor.device().is_cpu() && tensor.scalar_type() == at::kFloat && tensor.is_contiguous();
  at::Tensor out = direct ? flat : torch::empty({n}, torch::kFloat);
  float* const out_data = out.data_ptr<float>();
  const bool tapped = !exact && g.mean_tap && g.mean_tap->enabled();
  for (int j = 0; j < m; ++j) {
    if (j == r && exact) {
      std::copy(acc.get(), acc.get() + acc_len, out_data + mine_begin);
      continue;
    }
    for (std::int64_t s = 0; s < segs; ++s) {
      if (Status st = quant::decode_into(parts[static_cast<std::size_t>(j)][static_cast<std::size_t>(s)], segment(out_data, j, s)); !st.ok()) {
        return rank_context(st, "decoding the mean of", j);
      }
    }
  }
  if (!direct) tensor.copy_(out.view(tensor.sizes()));
  keep_and_report(g, n, tapped, parts, left, tag, stats);
  stats.seconds = watch.elapsed_seconds();
  if (stats_out != nullptr) *stats_out += stats;
  return Status();
}

}  // namespace detail

}  // namespace gossamer::optim
