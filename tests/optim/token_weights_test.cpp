#include <doctest/doctest.h>

#include <torch/torch.h>

#include "optim/diloco.h"
#include "optim/ranks.h"
#include "optim/sparseloco.h"
#include "optim/streaming_diloco.h"
#include "optim/token_weights.h"
#include "optim/work.h"

using namespace gossamer;
using namespace gossamer::optim;
using namespace std::chrono_literals;
using testing::in;
using testing::mesh;
using testing::on_ranks;

TEST_CASE("RoundWeights: scales are steps x N / total, 1 when equal or nobody computed; the fastest member's pace") {
  RoundWeights w({{40, 0.1}, {20, 0.2}, {10, 0.4}, {10, 0.0}});
  CHECK(w.total_steps() == 80);
  CHECK(w.scale(0) == doctest::Approx(2.0));
  CHECK(w.scale(1) == doctest::Approx(1.0));
  CHECK(w.scale(2) == doctest::Approx(0.5));
  CHECK(w.fastest_step_seconds() == doctest::Approx(0.1));
  RoundWeights equal({{7, 0.3}, {7, 0.3}, {7, 0.3}});
  for (int r = 0; r < 3; ++r) CHECK(equal.scale(r) == 1.0);  // exactly: a round of equals keeps its bits
  RoundWeights none({{0, 0.0}, {0, 0.0}});
  CHECK(none.scale(0) == 1.0);
  CHECK(none.fastest_step_seconds() == 0.0);
}

TEST_CASE("WorkMeter: steps and pace since the last merge; the pace outlives the merge") {
  WorkMeter m;
  m.add(0.5);
  m.add(1.5);
  CHECK(m.contribution().steps == 2);
  CHECK(m.contribution().step_seconds == doctest::Approx(1.0));
  m.merged();
  CHECK(m.contribution().steps == 0);
  CHECK(m.contribution().step_seconds == doctest::Approx(1.0));
}

TEST_CASE("exchange_contributions: every member ends with every claim, identical; hostile claims are clamped") {
  const int m = 4;
  auto groups = mesh(m);
  const std::vector<Contribution> claims = {{100, 0.1}, {50, 0.2}, {1000000, 0.05}, {-7, std::nan("")}};
  std::vector<RoundWeights> got(m);
  on_ranks(m, [&](int r) {
    auto w = exchange_contributions(groups[static_cast<std::size_t>(r)], claims[static_cast<std::size_t>(r)], 400, transport::tags::kDiLoCo | 3, in(5s));
    REQUIRE(w.ok());
    got[static_cast<std::size_t>(r)] = *w;
  });
  for (int r = 0; r < m; ++r) {
    const auto& ms = got[static_cast<std::size_t>(r)].members();
    REQUIRE(ms.size() == 4);
    CHECK(ms[0].steps == 100);
    CHECK(ms[1].steps == 50);
    CHECK(ms[2].steps == 400);  // clamped to what the round's slots allow
    CHECK(ms[3].steps == 0);    // a negative claim counts for nothing
    CHECK(ms[3].step_seconds == 0.0);
    CHECK(ms[1].step_seconds == doctest::Approx(0.2).epsilon(1e-5));
    for (int j = 0; j < m; ++j) CHECK(got[static_cast<std::size_t>(r)].scale(j) == got[0].scale(j));  // bit for bit
  }
  CHECK(got[0].fastest_step_seconds() == doctest::Approx(0.05).epsilon(1e-5));
}

TEST_CASE("Token-weighted DiLoCo: the round's mean weighs each Delta by the steps behind it, the same on every rank") {
  const int m = 3;
  auto groups = mesh(m);
  DiLoCoOptions o;
  o.inner_steps = 4;
  o.outer_lr = 1.0;
  o.outer_momentum = 0.0;
  o.token_weighted = true;
  std::vector<std::vector<at::Tensor>> params(m);
  std::vector<std::unique_ptr<DiLoCo>> opt(m);
  for (int r = 0; r < m; ++r) {
    params[static_cast<std::size_t>(r)] = {torch::zeros({6})};
    opt[static_cast<std::size_t>(r)] = std::make_unique<DiLoCo>(params[static_cast<std::size_t>(r)], groups[static_cast<std::size_t>(r)], o);
  }
  // Ranks computed 4, 2 and 1 of the round's 4 slots, and moved their weights to 1, 2 and 4.
  const std::vector<int> steps = {4, 2, 1};
  const std::vector<float> moved = {1.0f, 2.0f, 4.0f};
  on_ranks(m, [&](int r) {
    auto& opt_r = *opt[static_cast<std::size_t>(r)];
    for (int k = 0; k < steps[static_cast<std::size_t>(r)]; ++k) opt_r.count_step(0.1 * 4 / steps[static_cast<std::size_t>(r)]);
    params[static_cast<std::size_t>(r)][0].fill_(moved[static_cast<std::size_t>(r)]);
    for (std::int64_t s = 1; s < 4; ++s) REQUIRE_FALSE(*opt_r.step(s, in(5s)));  // step 2 calibrates: no round
    auto did = opt_r.step(4, in(5s));
    REQUIRE(did.ok());
    CHECK(*did);
  });
  // FedAvg of the weights, weighted 4:2:1: (4 x 1 + 2 x 2 + 1 x 4) / 7 = 12 / 7.
  for (int r = 0; r < m; ++r) {
    CHECK(params[static_cast<std::size_t>(r)][0][0].item<float>() == doctest::Approx(12.0 / 7.0).epsilon(1e-5));
    CHECK(torch::equal(opt[static_cast<std::size_t>(r)]->outer_weights(), opt[0]->outer_weights()));
    CHECK(opt[static_cast<std::size_t>(r)]->fastest_step_seconds() == doctest::Approx(0.1).epsilon(1e-5));
  }
}

TEST_CASE("Token-weighted DiLoCo with equal steps is bit for bit the plain round") {
  const int m = 2;
  auto plain_groups = mesh(m), weighted_groups = mesh(m);
  DiLoCoOptions o;
  o.inner_steps = 2;
  std::vector<std::vector<at::Tensor>> plain(m), weighted(m);
  std::vector<std::unique_ptr<DiLoCo>> a(m), b(m);
  torch::manual_seed(3);
  const at::Tensor start = torch::randn({50});
  const std::vector<at::Tensor> moves = {torch::randn({50}), torch::randn({50})};
  for (int r = 0; r < m; ++r) {
    plain[static_cast<std::size_t>(r)] = {start.clone()};
    weighted[static_cast<std::size_t>(r)] = {start.clone()};
    a[static_cast<std::size_t>(r)] = std::make_unique<DiLoCo>(plain[static_cast<std::size_t>(r)], plain_groups[static_cast<std::size_t>(r)], o);
    DiLoCoOptions w = o;
    w.token_weighted = true;
    b[static_cast<std::size_t>(r)] = std::make_unique<DiLoCo>(weighted[static_cast<std::size_t>(r)], weighted_groups[static_cast<std::size_t>(r)], w);
  }
  on_ranks(m, [&](int r) {
    const auto i = static_cast<std::size_t>(r);
    plain[i][0].add_(moves[i]);
    weighted[i][0].add_(moves[i]);
    b[i]->count_step(0.2);
    b[i]->count_step(0.2);
    REQUIRE(a[i]->step(2, in(5s)).ok());
    REQUIRE(b[i]->step(2, in(5s)).ok());
  });
  for (int r = 0; r < m; ++r) CHECK(torch::equal(a[static_cast<std::size_t>(r)]->outer_weights(), b[static_cast<std::size_t>(r)]->outer_weights()));
}

TEST_CASE("Token-weighted SparseLoCo: a member that computed nothing adds nothing; ranks stay identical") {
  const int m = 2;
  auto groups = mesh(m);
  SparseLoCoOptions o;
  o.inner_steps = 2;
  o.sparse.chunk = 4;
  o.sparse.topk = 4;
  o.error_decay = 0.0;
  o.token_weighted = true;
  std::vector<std::vector<at::Tensor>> params(m);
  std::vector<std::unique_ptr<SparseLoCo>> opt(m);
  for (int r = 0; r < m; ++r) {
    params[static_cast<std::size_t>(r)] = {torch::zeros({8})};
    opt[static_cast<std::size_t>(r)] = std::make_unique<SparseLoCo>(params[static_cast<std::size_t>(r)], groups[static_cast<std::size_t>(r)], o);
  }
  on_ranks(m, [&](int r) {
    const auto i = static_cast<std::size_t>(r);
    if (r == 0) {
      opt[i]->count_step(0.1);
      opt[i]->count_step(0.1);
      params[i][0].fill_(-3.0f);
    } else {
      params[i][0].fill_(100.0f);  // moved, but claims no steps: weighs nothing
    }
    REQUIRE(opt[i]->step(2, in(5s)).ok());
  });
  // Rank 0 alone, weighed x2 of a mean over 2: its own move, through the 2-level quantizer.
  for (int r = 0; r < m; ++r) {
    CHECK(params[static_cast<std::size_t>(r)][0][0].item<float>() == doctest::Approx(-3.0).epsilon(1e-5));
    CHECK(torch::equal(opt[static_cast<std::size_t>(r)]->outer_weights(), opt[0]->outer_weights()));
  }
}

TEST_CASE("Token-weighted Streaming DiLoCo: fragments weigh each member by its steps since the fragment launched") {
  const int m = 2;
  auto groups = mesh(m);
  StreamingDiLoCoOptions o;
  o.inner_steps = 4;
  o.overlap = 0;
  o.mixing = 0.0;
  o.outer_lr = 1.0;
  o.outer_momentum = 0.0;
  o.token_weighted = true;
  std::vector<std::vector<at::Tensor>> params(m);
  std::vector<std::unique_ptr<AsyncCollectives>> comm(m);
  std::vector<std::unique_ptr<StreamingDiLoCo>> opt(m);
  for (int r = 0; r < m; ++r) {
    const auto i = static_cast<std::size_t>(r);
    params[i] = {torch::zeros({4}), torch::zeros({4})};
    comm[i] = std::make_unique<AsyncCollectives>(groups[i]);
    std::vector<Fragment> fragments = {Fragment{{"a"}, {params[i][0]}, 4}, Fragment{{"b"}, {params[i][1]}, 4}};
    opt[i] = std::make_unique<StreamingDiLoCo>(std::move(fragments), *comm[i], o);
  }
  on_ranks(m, [&](int r) {
    const auto i = static_cast<std::size_t>(r);
    // Rank 0 computes every slot, rank 1 every other; both move their weights by their rank + 1.
    for (std::int64_t s = 1; s <= 4; ++s) {
      if (r == 0 || s % 2 == 0) {
        opt[i]->count_step(r == 0 ? 0.1 : 0.2);
        params[i][0].add_(static_cast<float>(r + 1) / (r == 0 ? 4.0f : 2.0f));
        params[i][1].add_(static_cast<float>(r + 1) / (r == 0 ? 4.0f : 2.0f));
      }
      REQUIRE(opt[i]->step(s, in(5s)).ok());
    }
  });
  // Fragment 0 completed at step 2: rank 0 had moved 0.5 in 2 steps, rank 1 1.0 in 1 step -> (2 x 0.5 + 1 x 1) / 3.
  for (int r = 0; r < m; ++r) {
    CHECK(opt[static_cast<std::size_t>(r)]->outer_weights(0)[0].item<float>() == doctest::Approx(2.0 / 3.0).epsilon(1e-5));
    // Fragment 1 at step 4: rank 0 moved 1 in 4 steps, rank 1 2 in 2 -> (4 x 1 + 2 x 2) / 6.
    CHECK(opt[static_cast<std::size_t>(r)]->outer_weights(1)[0].item<float>() == doctest::Approx(8.0 / 6.0).epsilon(1e-5));
    CHECK(torch::equal(opt[static_cast<std::size_t>(r)]->outer_weights(1), opt[0]->outer_weights(1)));
    CHECK(opt[static_cast<std::size_t>(r)]->fastest_step_seconds() == doctest::Approx(0.1).epsilon(1e-5));
  }
}
