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

// The grid's phases at one rank (see the top of this file), over the state both layouts share.
class GridMean {
 public:
  GridMean(const Group& g, const at::Tensor& tensor, const quant::EncodeOptions& codec, transport::Tag tag, Deadline deadline,
           std::int64_t segment_values, const Aggregation& agg)
      : round_(g, tensor, codec, segment_values, agg),
        routes_(routes_of(g.rank, g.size, g.width)),
        tag_(tag),
        mean_tag_(tag | kAllreduceMeanPhase),
        deadline_(deadline),
        own_pieces_(static_cast<std::size_t>(g.size)) {
    for (int n : routes_.linked) GOSSAMER_CHECK(g.peers[static_cast<std::size_t>(n)], "allreduce_mean: no link to rank " + std::to_string(n));
  }

  Status run(at::Tensor& tensor, CommStats& stats) {
    for (std::int64_t s = 0; s < round_.cuts.count; ++s) {
      if (Status st = send_first_hand(s, stats); !st.ok()) return st;
      if (Status st = gather_contributions(s, stats); !st.ok()) return st;
      if (Status st = sum_and_send_mean(s, stats); !st.ok()) return st;
    }
    if (Status st = gather_means(stats); !st.ok()) return st;
    // Only now does the caller's tensor change, as in the full mesh.
    int failed = -1;
    Status st = round_.finish(tensor, tag_, stats, nullptr, failed);
    return st.ok() ? st : context(st, "decoding the mean of", failed);
  }

 private:
  transport::Link& link(int j) const { return *round_.g.peers[static_cast<std::size_t>(j)]; }
  Status context(Status st, const std::string& what, int j) const {
    return st.with_context("allreduce (grid of width " + std::to_string(round_.g.width) + "): rank " + std::to_string(round_.r) + " " + what +
                           " rank " + std::to_string(j));
  }
  // A bundle of what this rank holds for segment s, by rank, from `of`.
  template <typename Of>
  static Bytes bundle_of(const std::vector<int>& ranks, Of of) {
    std::vector<std::pair<int, const Bytes*>> items;
    for (int j : ranks) items.emplace_back(j, &of(j));
    return bundle(items);
  }

  // 1. First-hand: this rank's contributions, one bundle per linked rank.
  Status send_first_hand(std::int64_t s, CommStats& stats) {
    for (int d = 0; d < round_.m; ++d) {
      if (d == round_.r) continue;
      const std::span<float> values = round_.sent(d, s);
      Bytes& piece = own_pieces_[static_cast<std::size_t>(d)];
      if (auto special = special_contribution(round_.g, values, round_.codec, round_.robust, round_.abstained)) {
        piece = std::move(*special);
      } else {
        piece = joined(quant::encode_view(values, round_.codec));
      }
    }
    for (int to : routes_.linked) {
      const Bytes b = bundle_of(routes_.first_to.at(to), [&](int d) -> const Bytes& { return own_pieces_[static_cast<std::size_t>(d)]; });
      if (Status st = send_counted(link(to), tag_, b, deadline_, stats); !st.ok()) return context(st, "sending to", to);
    }
    return Status();
  }

  // 2. What comes first-hand: contributions to this rank's chunk, and others' to pass on; 3. passed
  // on: each linked rank gets the pieces for its chunk that came here.
  Status gather_contributions(std::int64_t s, CommStats& stats) {
    const int r = round_.r;
    std::map<int, std::map<int, Bytes>> to_pass;  // linked rank -> (sender -> its piece for it)
    std::fill(round_.usable.begin(), round_.usable.end(), 1);
    for (int from : routes_.linked) {
      const auto& owners = routes_.first_from.at(from);
      auto got = unbundle(link(from), tag_, owners, [&](int d) { return round_.cuts.length(d, s); }, deadline_, stats);
      if (!got.ok()) return context(got.status(), "receiving from", from);
      for (std::size_t i = 0; i < owners.size(); ++i) {
        if (owners[i] == r) round_.contributions[static_cast<std::size_t>(from)] = std::move((*got)[i]);
        else to_pass[owners[i]][from] = std::move((*got)[i]);
      }
    }
    for (int to : routes_.linked) {
      const auto& senders = routes_.passed_to.at(to);
      if (senders.empty()) continue;
      const Bytes b = bundle_of(senders, [&](int from) -> const Bytes& { return to_pass[to][from]; });
      if (Status st = send_counted(link(to), tag_, b, deadline_, stats); !st.ok()) return context(st, "passing on to", to);
    }
    for (int from : routes_.linked) {
      const auto& senders = routes_.passed_from.at(from);
      if (senders.empty()) continue;
      auto got = unbundle(link(from), tag_, senders, [&](int) { return round_.cuts.length(r, s); }, deadline_, stats);
      if (!got.ok()) return context(got.status(), "receiving what was passed on by", from);
      for (std::size_t i = 0; i < senders.size(); ++i) round_.contributions[static_cast<std::size_t>(senders[i])] = std::move((*got)[i]);
    }
    return Status();
  }

  // 4. The owner's sum, as the full mesh's: an empty piece is a contribution that did not decode.
  // 5. The mean, encoded once, first-hand to every linked rank.
  Status sum_and_send_mean(std::int64_t s, CommStats& stats) {
    const int r = round_.r;
    for (int j = 0; j < round_.m; ++j) {
      if (j == r || !round_.contributions[static_cast<std::size_t>(j)].empty()) continue;
      if (!round_.robust) return context(error(ErrorCode::kMalformed, "a contribution that does not decode"), "reducing the chunk of", j);
      round_.usable[static_cast<std::size_t>(j)] = 0;
    }
    std::ptrdiff_t failed = -1;
    if (const Status summed = round_.reduce(s, failed); !summed.ok()) {
      const int j = static_cast<int>(failed);
      if (round_.robust || j < 0) return context(summed, "averaging the chunk of", r);
      return context(summed, "reducing the chunk of", j);
    }
    Bytes& own_mean = round_.part(r, s);
    own_mean = joined(quant::encode_view(std::span<const float>(round_.acc_segment(s)), round_.codec));
    for (std::size_t i = 0; i < routes_.linked.size(); ++i) {
      const int to = routes_.linked[i];
      if (Status st = send_counted(link(to), mean_tag_, bundle({{r, &own_mean}}), deadline_, stats); !st.ok()) return context(st, "sending the mean to", to);
      if (round_.g.crash_drill && s == round_.cuts.count - 1 && i + 1 == (routes_.linked.size() + 1) / 2) round_.g.crash_drill();
    }
    return Status();
  }

  // 6. The means: first-hand from each linked rank (every segment's: they were sent first), then
  // those passed on, segment by segment.
  Status gather_means(CommStats& stats) {
    const auto length = [&](std::int64_t s) { return [&, s](int j) { return round_.cuts.length(j, s); }; };
    for (std::int64_t s = 0; s < round_.cuts.count; ++s) {
      for (int from : routes_.linked) {
        auto got = unbundle(link(from), mean_tag_, {from}, length(s), deadline_, stats);
        if (!got.ok()) return context(got.status(), "receiving the mean from", from);
        if ((*got)[0].empty()) return context(error(ErrorCode::kMalformed, "a mean that does not decode"), "receiving the mean from", from);
        round_.part(from, s) = std::move((*got)[0]);
      }
    }
    for (std::int64_t s = 0; s < round_.cuts.count; ++s) {
      for (int to : routes_.linked) {
        const auto& owners = routes_.passed_to.at(to);
        if (owners.empty()) continue;
        const Bytes b = bundle_of(owners, [&](int j) -> const Bytes& { return round_.part(j, s); });
        if (Status st = send_counted(link(to), mean_tag_, b, deadline_, stats); !st.ok()) return context(st, "passing the means on to", to);
      }
      for (int from : routes_.linked) {
        const auto& owners = routes_.passed_from.at(from);
        if (owners.empty()) continue;
        auto got = unbundle(link(from), mean_tag_, owners, length(s), deadline_, stats);
        if (!got.ok()) return context(got.status(), "receiving the means passed on by", from);
        for (std::size_t i = 0; i < owners.size(); ++i) {
          if ((*got)[i].empty()) return context(error(ErrorCode::kMalformed, "a mean that does not decode"), "receiving the mean of", owners[i]);
          round_.part(owners[i], s) = std::move((*got)[i]);
        }
      }
    }
    return Status();
  }

  MeanRound round_;
  const Routes routes_;
  const transport::Tag tag_, mean_tag_;
  const Deadline deadline_;
  std::vector<Bytes> own_pieces_;  // this rank's contributions to one segment of each chunk
};

}  // namespace

Status grid_mean(const Group& g, at::Tensor& tensor, const quant::EncodeOptions& codec, transport::Tag tag, Deadline deadline,
                 std::int64_t segment_values, const Aggregation& agg, CommStats& stats) {
  return GridMean(g, tensor, codec, tag, deadline, segment_values, agg).run(tensor, stats);
}

}  // namespace detail

}  // namespace gossamer::optim
