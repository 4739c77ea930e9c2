#include <doctest/doctest.h>

#include <torch/torch.h>

#include "optim/diloco.h"
#include "optim/ranks.h"

using namespace gossamer;
using namespace gossamer::optim;
using namespace std::chrono_literals;
using testing::mesh;
using testing::on_ranks;
using testing::in;

TEST_CASE("DiLoCo with outer lr 1 and momentum 0 is plain averaging (FedAvg)") {
  const int m = 4;
  auto groups = mesh(m);
  std::vector<std::vector<at::Tensor>> params(m);
  std::vector<std::unique_ptr<DiLoCo>> opt(m);
  DiLoCoOptions o;
  o.inner_steps = 3;
  o.outer_lr = 1.0;
  o.outer_momentum = 0.0;
  for (int r = 0; r < m; ++r) {
    params[static_cast<std::size_t>(r)] = {torch::zeros({2, 3}), torch::zeros({5})};
    opt[static_cast<std::size_t>(r)] = std::make_unique<DiLoCo>(params[static_cast<std::size_t>(r)], groups[static_cast<std::size_t>(r)], o);
  }
  // "Local training": each rank moves its weights differently (integers: the mean is exact).
  for (int r = 0; r < m; ++r) {
    params[static_cast<std::size_t>(r)][0].fill_(static_cast<float>(4 * r));
    params[static_cast<std::size_t>(r)][1].fill_(static_cast<float>(-8 * r));
  }
  on_ranks(m, [&](int r) {
    for (std::int64_t s = 1; s <= 2; ++s) CHECK_FALSE(*opt[static_cast<std::size_t>(r)]->step(s, in(5s)));  // not a round yet
    auto did = opt[static_cast<std::size_t>(r)]->step(3, in(5s));
    REQUIRE(did.ok());
    CHECK(*did);
  });
  for (int r = 0; r < m; ++r) {
    CHECK(torch::equal(params[static_cast<std::size_t>(r)][0], torch::full({2, 3}, 6.0f)));   // mean of 0, 4, 8, 12
    CHECK(torch::equal(params[static_cast<std::size_t>(r)][1], torch::full({5}, -12.0f)));
    CHECK(torch::equal(opt[static_cast<std::size_t>(r)]->outer_weights(), opt[0]->outer_weights()));
    CHECK(opt[static_cast<std::size_t>(r)]->rounds() == 1);
  }
}

TEST_CASE("DiLoCo's Nesterov outer step matches a hand computation over two rounds") {
  const int m = 2;
  auto groups = mesh(m);
  DiLoCoOptions o;
  o.inner_steps = 1;
  o.outer_lr = 0.7;
  o.outer_momentum = 0.9;
  std::vector<at::Tensor> p0 = {torch::tensor({1.0f, 2.0f})}, p1 = {torch::tensor({1.0f, 2.0f})};
  DiLoCo a(p0, groups[0], o), b(p1, groups[1], o);
  // Hand computation in double.
  double outer[2] = {1.0, 2.0}, v[2] = {0.0, 0.0};
  const float moves[2][2][2] = {{{0.5f, -1.0f}, {0.25f, 0.0f}}, {{-0.5f, 0.5f}, {1.0f, 1.0f}}};  // [round][rank][i]
  for (int round = 0; round < 2; ++round) {
    p0[0] -= torch::tensor({moves[round][0][0], moves[round][0][1]});
    p1[0] -= torch::tensor({moves[round][1][0], moves[round][1][1]});
    for (int i = 0; i < 2; ++i) {
      const double delta = (moves[round][0][i] + moves[round][1][i]) / 2.0;  // outer - local, averaged
      v[i] = 0.9 * v[i] + delta;
      outer[i] -= 0.7 * (delta + 0.9 * v[i]);
    }
    on_ranks(m, [&](int r) { REQUIRE((r == 0 ? a : b).step(round + 1, in(5s)).ok()); });
    for (int i = 0; i < 2; ++i) {
      CHECK(a.outer_weights()[i].item<double>() == doctest::Approx(outer[i]).epsilon(1e-6));
      CHECK(p0[0][i].item<double>() == doctest::Approx(outer[i]).epsilon(1e-6));
      CHECK(a.momentum()[i].item<double>() == doctest::Approx(v[i]).epsilon(1e-6));
    }
    CHECK(torch::equal(a.outer_weights(), b.outer_weights()));
    CHECK(torch::equal(a.momentum(), b.momentum()));
  }
}

TEST_CASE("H=1, SGD inner, outer lr 1, momentum 0 is data-parallel SGD") {
  const int m = 3;
  auto groups = mesh(m);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor w0 = torch::randn({4}, gen);
  std::vector<at::Tensor> xs, ys;
  for (int r = 0; r < m; ++r) {
    xs.push_back(torch::randn({8, 4}, gen));
    ys.push_back(torch::randn({8}, gen));
  }
  auto grad = [&](const at::Tensor& w, int r) {  // least squares on rank r's data
    return 2.0 * xs[static_cast<std::size_t>(r)].t().matmul(xs[static_cast<std::size_t>(r)].matmul(w) - ys[static_cast<std::size_t>(r)]) / 8.0;
  };
  const double lr = 0.05;
  // Data parallel: w <- w - lr * mean_r grad_r(w).
  at::Tensor dp = w0.clone();
  for (int step = 0; step < 5; ++step) {
    at::Tensor g = torch::zeros_like(dp);
    for (int r = 0; r < m; ++r) g += grad(dp, r);
    dp -= lr * g / m;
  }
  // DiLoCo with H = 1.
  DiLoCoOptions o;
  o.inner_steps = 1;
  o.outer_lr = 1.0;
  o.outer_momentum = 0.0;
  std::vector<std::vector<at::Tensor>> w(m);
  std::vector<std::unique_ptr<DiLoCo>> opt(m);
  for (int r = 0; r < m; ++r) {
    w[static_cast<std::size_t>(r)] = {w0.clone()};
    opt[static_cast<std::size_t>(r)] = std::make_unique<DiLoCo>(w[static_cast<std::size_t>(r)], groups[static_cast<std::size_t>(r)], o);
  }
  on_ranks(m, [&](int r) {
    for (int step = 1; step <= 5; ++step) {
      auto& p = w[static_cast<std::size_t>(r)][0];
      p -= lr * grad(p, r);  // the inner SGD step
      REQUIRE(opt[static_cast<std::size_t>(r)]->step(step, in(5s)).ok());
    }
  });
  for (int r = 0; r < m; ++r) CHECK(torch::allclose(w[static_cast<std::size_t>(r)][0], dp, 1e-5, 1e-6));
}

TEST_CASE("a failed round changes nothing, state saves and loads, bad state is refused") {
  auto groups = mesh(2);
  DiLoCoOptions o;
  o.inner_steps = 1;
  std::vector<at::Tensor> p = {torch::ones({6})};
  DiLoCo d(p, groups[0], o);
  p[0] += 1;
  const at::Tensor outer_before = d.outer_weights().clone();
  auto r = d.step(1, in(200ms));  // rank 1 never answers
  CHECK(r.status().code() == ErrorCode::kTimeout);
  CHECK(torch::equal(d.outer_weights(), outer_before));
  CHECK(torch::equal(p[0], torch::full({6}, 2.0f)));  // local weights go on
  d.skip_round();
  CHECK(d.skipped_rounds() == 1);

  const Bytes state = d.save();
  std::vector<at::Tensor> q = {torch::zeros({6})};
  DiLoCo e(q, groups[1], o);
  REQUIRE(e.load(state).ok());
  CHECK(torch::equal(e.outer_weights(), d.outer_weights()));
  CHECK(e.skipped_rounds() == 1);
  std::vector<at::Tensor> wrong = {torch::zeros({7})};
  DiLoCo f(wrong, groups[1], o);
  CHECK(f.load(state).code() == ErrorCode::kMalformed);
  Bytes truncated = state;
  truncated.resize(truncated.size() - 3);
  CHECK_FALSE(e.load(truncated).ok());
}
