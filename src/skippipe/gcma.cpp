// GCMA (planner.h): the genetic search that assigns nodes to stages, and the score it minimises
// (a stage order's bottleneck matchings and the shortest closed tour through the stages).
#include "skippipe/planner.h"
#include "skippipe/planner_parts.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace gossamer::skippipe {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

using planner_parts::nodes_by_stage;

// ---- GCMA's pieces. ----

// The smallest t such that every node of the smaller group matches a distinct node of the other
// with cost <= t (cost[i][j] of row i of the smaller group, column j of the larger).
double bottleneck_matching(const std::vector<std::vector<double>>& cost) {
  const std::size_t rows = cost.size(), cols = rows == 0 ? 0 : cost[0].size();
  if (rows == 0) return 0;
  std::vector<double> values;
  for (const auto& r : cost) values.insert(values.end(), r.begin(), r.end());
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  std::vector<int> match(cols);
  std::vector<char> visited(cols);
  auto matches = [&](double t) {
    std::fill(match.begin(), match.end(), -1);
    std::function<bool(std::size_t)> augment = [&](std::size_t i) {
      for (std::size_t j = 0; j < cols; ++j) {
        if (cost[i][j] > t || visited[j]) continue;
        visited[j] = 1;
        if (match[j] < 0 || augment(static_cast<std::size_t>(match[j]))) {
          match[j] = static_cast<int>(i);
          return true;
        }
      }
      return false;
    };
    for (std::size_t i = 0; i < rows; ++i) {
      std::fill(visited.begin(), visited.end(), 0);
      if (!augment(i)) return false;
    }
    return true;
  };
  // Every row needs its own cheapest value at least: start the search there.
  double floor = 0;
  for (const auto& r : cost) floor = std::max(floor, *std::min_element(r.begin(), r.end()));
  std::size_t lo = static_cast<std::size_t>(std::lower_bound(values.begin(), values.end(), floor) - values.begin()), hi = values.size() - 1;
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (matches(values[mid])) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return values[lo];
}

// The shortest closed tour through every group (exact up to 12 groups, nearest neighbour beyond).
double shortest_tour(const std::vector<std::vector<double>>& d) {
  const int m = static_cast<int>(d.size());
  if (m <= 1) return 0;
  if (m <= 12) {
    const int full = 1 << m;
    std::vector<double> dp(static_cast<std::size_t>(full) * static_cast<std::size_t>(m), kInf);
    dp[1 * static_cast<std::size_t>(m) + 0] = 0;
    for (int mask = 1; mask < full; mask += 2) {
      for (int last = 0; last < m; ++last) {
        const double c = dp[static_cast<std::size_t>(mask) * static_cast<std::size_t>(m) + static_cast<std::size_t>(last)];
        if (c == kInf) continue;
        for (int nx = 1; nx < m; ++nx) {
          if (mask >> nx & 1) continue;
          double& t = dp[static_cast<std::size_t>(mask | 1 << nx) * static_cast<std::size_t>(m) + static_cast<std::size_t>(nx)];
          t = std::min(t, c + d[static_cast<std::size_t>(last)][static_cast<std::size_t>(nx)]);
        }
      }
    }
    double best = kInf;
    for (int last = 1; last < m; ++last) {
      best = std::min(best, dp[static_cast<std::size_t>(full - 1) * static_cast<std::size_t>(m) + static_cast<std::size_t>(last)] + d[static_cast<std::size_t>(last)][0]);
    }
    return best;
  }
  std::vector<char> used(static_cast<std::size_t>(m), 0);
  used[0] = 1;
  int at = 0;
  double total = 0;
  for (int k = 1; k < m; ++k) {
    int nx = -1;
    for (int j = 0; j < m; ++j) {
      if (!used[static_cast<std::size_t>(j)] && (nx < 0 || d[static_cast<std::size_t>(at)][static_cast<std::size_t>(j)] < d[static_cast<std::size_t>(at)][static_cast<std::size_t>(nx)])) nx = j;
    }
    used[static_cast<std::size_t>(nx)] = 1;
    total += d[static_cast<std::size_t>(at)][static_cast<std::size_t>(nx)];
    at = nx;
  }
  return total + d[static_cast<std::size_t>(at)][0];
}

}  // namespace

double gcma_score(const std::vector<int>& stage_of, const Network& net, const Costs& costs, int stages) {
  const auto by = nodes_by_stage(stage_of, stages);
  double within = 0;
  for (const auto& g : by) {
    for (int a : g) {
      for (int b : g) {
        if (a != b) within = std::max(within, costs.hop(net, a, b));
      }
    }
  }
  std::vector<std::vector<double>> between(static_cast<std::size_t>(stages), std::vector<double>(static_cast<std::size_t>(stages), 0.0));
  std::vector<std::vector<double>> cost;
  for (int x = 0; x < stages; ++x) {
    for (int y = x + 1; y < stages; ++y) {
      const auto& gx = by[static_cast<std::size_t>(x)];
      const auto& gy = by[static_cast<std::size_t>(y)];
      const bool x_small = gx.size() <= gy.size();
      const auto& small = x_small ? gx : gy;
      const auto& large = x_small ? gy : gx;
      // One direction and back: a hop plus the sender's forward, each way.
      cost.assign(small.size(), std::vector<double>(large.size()));
      for (std::size_t i = 0; i < small.size(); ++i) {
        for (std::size_t j = 0; j < large.size(); ++j) {
          const int a = small[i], b = large[j];
          cost[i][j] = std::max(costs.hop(net, a, b) + costs.forward(a), costs.hop(net, b, a) + costs.forward(b));
        }
      }
      between[static_cast<std::size_t>(x)][static_cast<std::size_t>(y)] = between[static_cast<std::size_t>(y)][static_cast<std::size_t>(x)] = bottleneck_matching(cost);
    }
  }
  return within + 2.0 * shortest_tour(between);
}

Result<std::vector<int>> assign_gcma(const Network& net, const Costs& costs, const Options& o, const GcmaOptions& g) {
  if (Status st = o.check(); !st.ok()) return st;
  if (Status st = net.check(); !st.ok()) return st;
  if (Status st = costs.check(net); !st.ok()) return st;
  if (net.nodes < o.stages) return error(ErrorCode::kInvalidArgument, std::to_string(net.nodes) + " nodes cannot host " + std::to_string(o.stages) + " stages");
  if (g.population < 2 || g.trials < 0) return error(ErrorCode::kInvalidArgument, "GCMA needs a population of at least 2 and trials >= 0");
  const auto sizes = partition_sizes(net.nodes, o.stages, o.path_length);
  std::vector<int> base;
  for (int s = 0; s < o.stages; ++s) base.insert(base.end(), static_cast<std::size_t>(sizes[static_cast<std::size_t>(s)]), s);
  std::mt19937_64 rng(g.seed);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  auto shuffle = [&](std::vector<int>& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[pick(i)]);
  };
  struct Individual {
    std::vector<int> stage_of;
    double score;
  };
  std::vector<Individual> pop;
  pop.push_back({base, gcma_score(base, net, costs, o.stages)});  // nodes in order, as the reference's first guess
  while (static_cast<int>(pop.size()) < g.population) {
    std::vector<int> v = base;
    shuffle(v);
    const double sc = gcma_score(v, net, costs, o.stages);
    pop.push_back({std::move(v), sc});
  }
  auto tournament = [&]() -> const Individual& {
    const auto& x = pop[pick(pop.size())];
    const auto& y = pop[pick(pop.size())];
    return x.score <= y.score ? x : y;
  };
  for (int t = 0; t < g.trials; ++t) {
    const auto& pa = tournament();
    const auto& pb = tournament();
    // Uniform crossover, then repair the partition sizes by moving surplus nodes (at random) to
    // stages short of theirs; then, now and then, a swap of two nodes.
    std::vector<int> child(pa.stage_of.size());
    for (std::size_t n = 0; n < child.size(); ++n) child[n] = (rng() & 1) ? pa.stage_of[n] : pb.stage_of[n];
    std::vector<int> count(static_cast<std::size_t>(o.stages), 0);
    for (int s : child) ++count[static_cast<std::size_t>(s)];
    std::vector<int> order(child.size());
    std::iota(order.begin(), order.end(), 0);
    shuffle(order);
    for (int n : order) {
      const auto s = static_cast<std::size_t>(child[static_cast<std::size_t>(n)]);
      if (count[s] <= sizes[s]) continue;
      for (std::size_t d = 0; d < sizes.size(); ++d) {
        if (count[d] < sizes[d]) {
          --count[s];
          ++count[d];
          child[static_cast<std::size_t>(n)] = static_cast<int>(d);
          break;
        }
      }
    }
    if (rng() % 4 == 0) {
      const std::size_t a = pick(child.size()), b = pick(child.size());
      std::swap(child[a], child[b]);
    }
    const double sc = gcma_score(child, net, costs, o.stages);
    auto worst = std::max_element(pop.begin(), pop.end(), [](const Individual& x, const Individual& y) { return x.score < y.score; });
    if (sc < worst->score) *worst = Individual{std::move(child), sc};
  }
  return std::min_element(pop.begin(), pop.end(), [](const Individual& x, const Individual& y) { return x.score < y.score; })->stage_of;
}

}  // namespace gossamer::skippipe
