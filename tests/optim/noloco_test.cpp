#include <doctest/doctest.h>

#include <torch/torch.h>

#include <set>

#include "optim/noloco.h"
#include "optim/ranks.h"
#include "transport/protocol.h"
#include "quant/codec.h"

using namespace gossamer;
using namespace gossamer::optim;
using namespace std::chrono_literals;
using testing::mesh;
using testing::on_ranks;
using testing::in;

TEST_CASE("NoLoCo pairing is a deterministic perfect matching every replica computes alike") {
  for (int n = 1; n <= 17; ++n) {
    std::set<std::vector<int>> distinct;
    for (std::int64_t round = 1; round <= 20; ++round) {
      const auto p = noloco_pairing(n, round, 42);
      CHECK(p == noloco_pairing(n, round, 42));  // recomputed anywhere: the same
      int alone = 0;
      for (int r = 0; r < n; ++r) {
        const int q = p[static_cast<std::size_t>(r)];
        REQUIRE(q >= 0);
        REQUIRE(q < n);
        CHECK(p[static_cast<std::size_t>(q)] == r);  // symmetric
        alone += q == r ? 1 : 0;
      }
      CHECK(alone == n % 2);  // everyone paired, except one replica when n is odd
      distinct.insert(p);
    }
    if (n >= 6) CHECK(distinct.size() > 5);  // partners change from round to round
    if (n == 3 || n == 4) CHECK(distinct.size() > 1);  // (only 3 matchings exist there)
  }
  CHECK(noloco_pairing(8, 3, 1) != noloco_pairing(8, 3, 2));  // the seed matters
}

TEST_CASE("NoLoCo's outer update matches the reference code's coded form") {
  for (bool same : {true, false}) {
    CAPTURE(same);
    auto groups = mesh(2);
    NoLoCoOptions o;
    o.inner_steps = 1;
    o.outer_lr = 0.7;
    o.outer_lr_gamma = same ? 0.7 : 0.3;
    o.outer_momentum = 0.5;
    std::vector<at::Tensor> p0 = {torch::tensor({1.0f, 2.0f})}, p1 = {torch::tensor({3.0f, -2.0f})};
    NoLoCo a(p0, groups[0], o), b(p1, groups[1], o);
    // Hand computation (double) for replica 0 over two rounds.
    double phi[2][2] = {{1, 2}, {3, -2}}, delta[2][2] = {{0, 0}, {0, 0}};
    const float moves[2][2][2] = {{{0.5f, 0.25f}, {-1.0f, 0.5f}}, {{0.125f, -0.5f}, {0.0f, 1.0f}}};
    for (int round = 0; round < 2; ++round) {
      p0[0] += torch::tensor({moves[round][0][0], moves[round][0][1]});
      p1[0] += torch::tensor({moves[round][1][0], moves[round][1][1]});
      double theta[2][2];
      for (int r = 0; r < 2; ++r) {
        for (int i = 0; i < 2; ++i) theta[r][i] = phi[r][i] + moves[round][r][i];
      }
      double next_phi[2][2];
      for (int r = 0; r < 2; ++r) {
        for (int i = 0; i < 2; ++i) {
          const double mean_delta = ((theta[0][i] - phi[0][i]) + (theta[1][i] - phi[1][i])) / 2;
          const double mean_phi = (phi[0][i] + phi[1][i]) / 2;
          delta[r][i] = 0.5 * delta[r][i] + 0.7 * mean_delta + o.outer_lr_gamma * (mean_phi - phi[r][i]);
          next_phi[r][i] = phi[r][i] + delta[r][i];
        }
      }
      std::memcpy(phi, next_phi, sizeof(phi));
      on_ranks(2, [&](int r) { REQUIRE((r == 0 ? a : b).step(round + 1, in(5s)).ok()); });
      for (int i = 0; i < 2; ++i) {
        CHECK(a.outer_weights()[i].item<double>() == doctest::Approx(phi[0][i]).epsilon(1e-6));
        CHECK(b.outer_weights()[i].item<double>() == doctest::Approx(phi[1][i]).epsilon(1e-6));
        CHECK(p0[0][i].item<double>() == doctest::Approx(phi[0][i]).epsilon(1e-6));
      }
    }
    CHECK(a.rounds() == 2);
    // Bytes: beta == gamma sends only the fast weights (2 values); otherwise fast and outer (4).
    const std::size_t per_round = quant::encode(torch::zeros({same ? 2 : 4}), o.codec).size() + transport::kFrameHeaderBytes;
    CHECK(a.comm().bytes_sent == 2 * per_round);
  }
}

TEST_CASE("NoLoCo with four replicas: every round pairs everyone and contracts the spread") {
  const int m = 4;
  auto groups = mesh(m);
  NoLoCoOptions o;
  o.inner_steps = 5;
  o.outer_momentum = 0.0;
  std::vector<std::vector<at::Tensor>> p(m);
  std::vector<std::unique_ptr<NoLoCo>> opt(m);
  for (int r = 0; r < m; ++r) {
    p[static_cast<std::size_t>(r)] = {torch::full({3}, static_cast<float>(r * 10))};
    opt[static_cast<std::size_t>(r)] = std::make_unique<NoLoCo>(p[static_cast<std::size_t>(r)], groups[static_cast<std::size_t>(r)], o);
  }
  auto spread = [&] {
    double lo = 1e30, hi = -1e30;
    for (int r = 0; r < m; ++r) {
      lo = std::min(lo, p[static_cast<std::size_t>(r)][0][0].item<double>());
      hi = std::max(hi, p[static_cast<std::size_t>(r)][0][0].item<double>());
    }
    return hi - lo;
  };
  const double before = spread();
  on_ranks(m, [&](int r) {
    for (std::int64_t s = 1; s <= 20; ++s) REQUIRE(opt[static_cast<std::size_t>(r)]->step(s, in(5s)).ok());
  });
  for (int r = 0; r < m; ++r) CHECK(opt[static_cast<std::size_t>(r)]->rounds() == 4);
  CHECK(spread() < 0.5 * before);  // pairwise averaging mixes the replicas without any all-reduce
}
