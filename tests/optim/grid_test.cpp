// The all-reduce over a grid (optim/collectives.h: Group::width): its routes, its results against the
// full mesh's (bit for bit, robust rules included), its links and bytes, a lost rank, and the rule
// that chooses it.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <set>

#include "optim/collectives.h"
#include "optim/ranks.h"
#include "quant/codec.h"

using namespace gossamer;
using namespace gossamer::optim;
using namespace std::chrono_literals;
using testing::codec;
using testing::in;
using testing::mesh;
using testing::on_ranks;

namespace {

// The full mesh's groups with only the grid's links kept.
std::vector<Group> grid(int m, int width) {
  auto groups = mesh(m);
  for (int r = 0; r < m; ++r) {
    auto& g = groups[static_cast<std::size_t>(r)];
    g.width = width;
    for (int j = 0; j < m; ++j) {
      if (!grid_linked(r, j, m, width)) g.peers[static_cast<std::size_t>(j)].reset();
    }
  }
  return groups;
}

struct Run {
  std::vector<at::Tensor> t;
  std::vector<Status> st;
  std::vector<CommStats> stats;
};

Run all_reduce(std::vector<Group> groups, std::vector<at::Tensor> t, quant::CodecId id, std::int64_t segment, const Aggregation& agg = {},
               std::optional<Poison> poison = std::nullopt, Nanos timeout = 20s) {
  const int m = static_cast<int>(t.size());
  if (poison) groups[static_cast<std::size_t>(m - 1)].poison = poison;
  Run out{std::move(t), std::vector<Status>(static_cast<std::size_t>(m)), std::vector<CommStats>(static_cast<std::size_t>(m))};
  on_ranks(m, [&](int r) {
    const auto i = static_cast<std::size_t>(r);
    out.st[i] = allreduce_mean(groups[i], out.t[i], codec(id), 9, in(timeout), &out.stats[i], segment, agg);
  });
  return out;
}

std::vector<at::Tensor> random_tensors(int m, std::int64_t n, std::uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> t;
  for (int r = 0; r < m; ++r) t.push_back(torch::randn({n}));
  return t;
}

std::vector<at::Tensor> copies(const std::vector<at::Tensor>& t) {
  std::vector<at::Tensor> out;
  for (const auto& x : t) out.push_back(x.clone());
  return out;
}

}  // namespace

TEST_CASE("grid routes: every pair is linked or has one rank linked to both, and a rank holds about 2 sqrt(N) links") {
  for (int m = 1; m <= 40; ++m) {
    for (int w = 2; w <= 7; ++w) {
      CAPTURE(m);
      CAPTURE(w);
      const int rows = (m + w - 1) / w;
      for (int a = 0; a < m; ++a) {
        int links = 0;
        for (int b = 0; b < m; ++b) {
          if (a == b) continue;
          CHECK(grid_linked(a, b, m, w) == grid_linked(b, a, m, w));
          links += grid_linked(a, b, m, w) ? 1 : 0;
          const int via = grid_next_hop(a, b, m, w);
          REQUIRE(via >= 0);
          REQUIRE(via < m);
          CHECK(via != a);
          CHECK(grid_linked(a, via, m, w));
          if (via != b) CHECK(grid_linked(via, b, m, w));
        }
        if (m > w) CHECK(links <= (w - 1) + (rows - 1));
      }
    }
  }
}

TEST_CASE("a grid all-reduce gives every rank the full mesh's result bit for bit, for every codec, size and segmenting") {
  for (int m : {3, 5, 10, 17, 26}) {
    for (int w : {2, 3, static_cast<int>(std::ceil(std::sqrt(m)))}) {
      for (const auto id : {quant::CodecId::kFp32, quant::CodecId::kInt8, quant::CodecId::kBf16}) {
        for (std::int64_t segment : {kAllreduceSegmentValues, std::int64_t{37}}) {
          CAPTURE(m);
          CAPTURE(w);
          CAPTURE(static_cast<int>(id));
          CAPTURE(segment);
          const auto t = random_tensors(m, 301, static_cast<std::uint64_t>(m * 100 + w));
          const Run full = all_reduce(mesh(m), copies(t), id, segment);
          const Run g = all_reduce(grid(m, w), copies(t), id, segment);
          for (int r = 0; r < m; ++r) {
            const auto i = static_cast<std::size_t>(r);
            REQUIRE(full.st[i].ok());
            REQUIRE_MESSAGE(g.st[i].ok(), g.st[i].to_string());
            CHECK(torch::equal(g.t[i], full.t[i]));
            CHECK(torch::equal(g.t[i], g.t[0]));
          }
        }
      }
    }
  }
}

TEST_CASE("robust aggregation over a grid: the poisoned rank is left out as in the full mesh, with the same results") {
  const int m = 10, w = 3;
  for (const auto rule : {Aggregation::Rule::kFiltered, Aggregation::Rule::kTrimmedMean}) {
    Aggregation agg;
    agg.rule = rule;
    for (const Poison poison : {Poison{100.0, false}, Poison{1.0, true}}) {
      CAPTURE(static_cast<int>(rule));
      CAPTURE(poison.nan);
      const auto t = random_tensors(m, 64, 5);
      const Run full = all_reduce(mesh(m), copies(t), quant::CodecId::kFp32, 7, agg, poison);
      const Run g = all_reduce(grid(m, w), copies(t), quant::CodecId::kFp32, 7, agg, poison);
      std::uint64_t left_full = 0, left_grid = 0;
      for (int r = 0; r < m; ++r) {
        const auto i = static_cast<std::size_t>(r);
        REQUIRE(full.st[i].ok());
        REQUIRE(g.st[i].ok());
        CHECK(torch::equal(g.t[i], full.t[i]));
        left_full += full.stats[i].left_out;
        left_grid += g.stats[i].left_out;
      }
      CHECK(left_grid == left_full);
      if (rule == Aggregation::Rule::kFiltered) CHECK(left_grid == static_cast<std::uint64_t>(m));  // every owner left the poisoned rank out
    }
  }
}

TEST_CASE("a grid of 64 ranks: 14 links per rank instead of 63, at most twice the full mesh's bytes") {
  const int m = 64, w = 8;
  const auto t = random_tensors(m, 4096, 3);
  const Run full = all_reduce(mesh(m), copies(t), quant::CodecId::kInt8, kAllreduceSegmentValues);
  const auto groups = grid(m, w);
  for (const auto& g : groups) {
    int links = 0;
    for (const auto& p : g.peers) links += p ? 1 : 0;
    CHECK(links == 14);
  }
  const Run g = all_reduce(groups, copies(t), quant::CodecId::kInt8, kAllreduceSegmentValues);
  std::uint64_t bytes_full = 0, bytes_grid = 0;
  for (int r = 0; r < m; ++r) {
    const auto i = static_cast<std::size_t>(r);
    REQUIRE(g.st[i].ok());
    CHECK(torch::equal(g.t[i], full.t[i]));
    bytes_full += full.stats[i].bytes_sent;
    bytes_grid += g.stats[i].bytes_sent;
  }
  CHECK(bytes_grid > bytes_full);
  CHECK(bytes_grid < 2 * bytes_full);
}

TEST_CASE("a rank lost from a grid fails the all-reduce on the others, with an error, and leaves their tensors untouched") {
  const int m = 9, w = 3;
  auto groups = grid(m, w);
  const auto t = random_tensors(m, 50, 9);
  std::vector<at::Tensor> mine = copies(t);
  std::vector<Status> st(static_cast<std::size_t>(m));
  on_ranks(m, [&](int r) {
    if (r == 4) return;  // rank 4 (the middle of the grid) never comes
    const auto i = static_cast<std::size_t>(r);
    st[i] = allreduce_mean(groups[i], mine[i], codec(quant::CodecId::kFp32), 9, in(500ms));
  });
  for (int r = 0; r < m; ++r) {
    if (r == 4) continue;
    const auto i = static_cast<std::size_t>(r);
    CHECK_FALSE(st[i].ok());
    CHECK(torch::equal(mine[i], t[i]));
  }
}

TEST_CASE("the layout rule: a full mesh for small groups, large payloads or short round trips; a grid for many peers far apart") {
  const double small = 139e3, large = 600e6, wan = 100e6 / 8;
  CHECK(choose_width(8, small, 80ms, wan) == 0);
  CHECK(choose_width(16, small, 80ms, wan) == 0);
  CHECK(choose_width(64, small, 80ms, wan) == 8);
  CHECK(choose_width(256, small, 80ms, wan) == 16);
  CHECK(choose_width(1024, small, 80ms, wan) == 32);
  CHECK(choose_width(256, large, 80ms, wan) == 0);  // bytes dominate: the grid would send twice as many
  CHECK(choose_width(24, small, 100us, 0) == 0);     // one machine: round trips cost nothing
}
