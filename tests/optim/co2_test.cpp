#include <doctest/doctest.h>

#include <torch/torch.h>

#include <cmath>

#include "optim/co2.h"
#include "optim/ranks.h"

using namespace gossamer;
using namespace gossamer::optim;
using namespace std::chrono_literals;
using testing::mesh;
using testing::on_ranks;
using testing::in;

TEST_CASE("Work handles: results arrive asynchronously, a short wait times out without cancelling") {
  auto groups = mesh(2);
  AsyncCollectives c0(groups[0]), c1(groups[1]);
  auto w0 = c0.allreduce_mean(torch::full({4}, 2.0f), quant::EncodeOptions{}, 1, in(10s));
  // Rank 1 has not submitted yet: rank 0's collective cannot finish.
  CHECK(w0->wait(in(50ms)).code() == ErrorCode::kTimeout);
  CHECK_FALSE(w0->done());
  auto w1 = c1.allreduce_mean(torch::full({4}, 4.0f), quant::EncodeOptions{}, 1, in(10s));
  REQUIRE(w0->wait(in(10s)).ok());
  REQUIRE(w1->wait(in(10s)).ok());
  CHECK(torch::equal(w0->tensor(), torch::full({4}, 3.0f)));
  CHECK(torch::equal(w1->tensor(), w0->tensor()));
  CHECK(w0->stats().bytes_sent > 0);
}

TEST_CASE("CO2 applies each average exactly one round late (hand computation)") {
  const int m = 2;
  auto groups = mesh(m);
  std::vector<std::unique_ptr<AsyncCollectives>> comm;
  for (int r = 0; r < m; ++r) comm.push_back(std::make_unique<AsyncCollectives>(groups[static_cast<std::size_t>(r)]));
  CO2Options o;
  o.inner_steps = 1;
  o.outer_lr = 1.0;
  o.outer_momentum = 0.0;
  std::vector<std::vector<at::Tensor>> p(m);
  std::vector<std::unique_ptr<CO2>> opt(m);
  for (int r = 0; r < m; ++r) {
    p[static_cast<std::size_t>(r)] = {torch::zeros({2})};
    opt[static_cast<std::size_t>(r)] = std::make_unique<CO2>(p[static_cast<std::size_t>(r)], *comm[static_cast<std::size_t>(r)], o);
  }
  // Local "training" in round t on rank r adds move(t, r).
  auto move = [](int t, int r) { return torch::tensor({static_cast<float>(t + r), static_cast<float>(2 * t - r)}); };
  // Hand computation: start_t = weights at the start of round t, A_t = mean_r (start_t + move(t, r)),
  // x_{t+1,0} = x_{t,0} - (x_{t-1,0} - A_{t-1}) from round 2 on.
  at::Tensor start = torch::zeros({2}), prev_start, pending_avg;
  for (int t = 1; t <= 4; ++t) {
    const at::Tensor avg = start + (move(t, 0) + move(t, 1)) / 2;
    at::Tensor next = start.clone();
    if (pending_avg.defined()) next = start - (prev_start - pending_avg);
    on_ranks(m, [&](int r) {
      p[static_cast<std::size_t>(r)][0] += move(t, r);
      auto did = opt[static_cast<std::size_t>(r)]->step(t, in(10s));
      REQUIRE(did.ok());
      CHECK(*did);
    });
    CAPTURE(t);
    for (int r = 0; r < m; ++r) CHECK(torch::allclose(p[static_cast<std::size_t>(r)][0], next));
    prev_start = start;
    pending_avg = avg;
    start = next;
  }
}

TEST_CASE("CO2's momentum clipping really clips, and the staleness penalty scales the update") {
  auto groups = mesh(1);
  AsyncCollectives comm(groups[0]);
  CO2Options o;
  o.inner_steps = 1;
  o.outer_momentum = 0.0;
  o.clip = true;
  o.clip_threshold = 0.25;
  std::vector<at::Tensor> p = {torch::zeros({3})};
  CO2 clipped(p, comm, o);
  p[0] += torch::tensor({10.0f, -10.0f, 0.1f});
  REQUIRE(clipped.step(1, in(5s)).ok());  // launches only
  REQUIRE(clipped.step(2, in(5s)).ok());  // applies round 1's average: g = 0 - (10, -10, 0.1)
  CHECK(torch::allclose(clipped.momentum(), torch::tensor({-0.25f, 0.25f, -0.1f})));

  auto g2 = mesh(1);
  AsyncCollectives comm2(g2[0]);
  CO2Options half = o;
  half.clip = false;
  half.gap_penalty = 2.0;
  std::vector<at::Tensor> q = {torch::zeros({1})};
  CO2 penalized(q, comm2, half);
  q[0] += 4.0f;
  REQUIRE(penalized.step(1, in(5s)).ok());
  REQUIRE(penalized.step(2, in(5s)).ok());
  CHECK(q[0].item<float>() == doctest::Approx(2.0));  // moved half way: g / Lambda
}

namespace {

// M ranks of CO2, each with its own parameters and communication thread.
struct Co2Ranks {
  std::vector<std::unique_ptr<AsyncCollectives>> comm;
  std::vector<std::vector<at::Tensor>> params;
  std::vector<std::unique_ptr<CO2>> opt;

  Co2Ranks(int m, const CO2Options& o, const std::vector<at::Tensor>& start, std::shared_ptr<const StalenessPenalty> penalty = nullptr,
           const std::vector<std::int64_t>& layers = {}) {
    auto groups = mesh(m);
    for (int r = 0; r < m; ++r) {
      comm.push_back(std::make_unique<AsyncCollectives>(groups[static_cast<std::size_t>(r)]));
      std::vector<at::Tensor> p;
      for (const auto& t : start) p.push_back(t.clone());
      params.push_back(p);
      opt.push_back(std::make_unique<CO2>(params.back(), *comm.back(), o, penalty, layers));
    }
  }
};

}  // namespace

TEST_CASE("CO2 on a quadratic follows the one-round-stale recurrence, and is stable exactly while alpha c / Lambda < 1 - beta") {
  // Rank r minimizes |x - c_r|^2 / 2 with tau gradient steps of size eta per round: a round moves the
  // weights a share c = 1 - (1 - eta)^tau of the way to c_r. With outer point x_t, the recurrence is
  //   xbar_t = (1 - c) x_t + c mean(c_r);  g_t = x_{t-1} - xbar_{t-1};  m_t = beta m_{t-1} + g_t / Lambda;
  //   x_{t+1} = x_t - alpha m_t,
  // whose error e_t = x_t - mean(c_r) obeys e_{t+1} = (1 + beta) e_t - (beta + alpha c / Lambda) e_{t-1}:
  // stable iff k = alpha c / Lambda < 1 - beta.
  const int m = 2, tau = 4;
  const double eta = 0.25, c = 1.0 - std::pow(1.0 - eta, tau);
  const std::vector<at::Tensor> targets = {torch::tensor({1.0, -2.0}, torch::kDouble), torch::tensor({3.0, 0.0}, torch::kDouble)};
  const at::Tensor optimum = (targets[0] + targets[1]) / 2;
  auto run = [&](double alpha, double beta, double lambda, int rounds) {
    CO2Options o;
    o.inner_steps = tau;
    o.outer_lr = alpha;
    o.outer_momentum = beta;
    o.gap_penalty = lambda;
    Co2Ranks ranks(m, o, {torch::zeros({2})});
    // The recurrence in double precision, from the same start.
    at::Tensor x = torch::zeros({2}, torch::kDouble), x_prev, avg_prev, mom = torch::zeros({2}, torch::kDouble);
    double worst = 0;
    for (int t = 1; t <= rounds; ++t) {
      on_ranks(m, [&](int r) {
        auto& p = ranks.params[static_cast<std::size_t>(r)][0];
        for (int s = 1; s <= tau; ++s) {
          p.sub_((p - targets[static_cast<std::size_t>(r)].to(torch::kFloat)) * eta);
          REQUIRE(ranks.opt[static_cast<std::size_t>(r)]->step((t - 1) * tau + s, in(10s)).ok());
        }
      });
      const at::Tensor avg = (1 - c) * x + c * optimum;
      at::Tensor next = x;
      if (avg_prev.defined()) {
        mom = beta * mom + (x_prev - avg_prev) / lambda;
        next = x - alpha * mom;
      }
      x_prev = x, avg_prev = avg, x = next;
      for (int r = 0; r < m; ++r) {
        const at::Tensor got = ranks.params[static_cast<std::size_t>(r)][0].to(torch::kDouble);
        worst = std::max(worst, ((got - x).abs().max() / (1.0 + x.abs().max())).item<double>());
      }
    }
    CHECK(worst < 1e-4);  // our CO2 is the recurrence (fp32 against double)
    return (x - optimum).norm().item<double>();
  };
  const double start = optimum.norm().item<double>();
  const double beta = 0.5;
  const double bound = (1 - beta) / c;  // the largest alpha / Lambda that is stable
  CHECK(run(0.8 * bound, beta, 1.0, 200) < 1e-3 * start);  // inside the bound: converges
  CHECK(run(1.2 * bound, beta, 1.0, 200) > start);          // outside: diverges
  CHECK(run(2.4 * bound, beta, 2.0, 200) > start);          // the penalty divides alpha: 1.2 x bound again
  CHECK(run(2.4 * bound, beta, 4.0, 200) < 1e-3 * start);   // 0.6 x bound
}

TEST_CASE("CO2 with outer lr 1 and penalty 2 equals outer lr 0.5 and penalty 1, bit for bit") {
  const int m = 2;
  CO2Options a;
  a.inner_steps = 1;
  a.outer_momentum = 0.5;
  a.outer_lr = 1.0;
  a.gap_penalty = 2.0;
  CO2Options b = a;
  b.outer_lr = 0.5;
  b.gap_penalty = 1.0;
  const std::vector<at::Tensor> start = {torch::randn({5, 3}), torch::randn({7})};
  Co2Ranks ra(m, a, start), rb(m, b, start);
  torch::manual_seed(3);
  std::vector<std::vector<at::Tensor>> moves;
  for (int t = 0; t < 6 * m; ++t) moves.push_back({torch::randn({5, 3}), torch::randn({7})});
  for (int t = 1; t <= 6; ++t) {
    for (Co2Ranks* ranks : {&ra, &rb}) {
      on_ranks(m, [&](int r) {
        for (std::size_t i = 0; i < 2; ++i) ranks->params[static_cast<std::size_t>(r)][i].add_(moves[static_cast<std::size_t>((t - 1) * m + r)][i]);
        REQUIRE(ranks->opt[static_cast<std::size_t>(r)]->step(t, in(10s)).ok());
      });
    }
    for (int r = 0; r < m; ++r) {
      for (std::size_t i = 0; i < 2; ++i) CHECK(torch::equal(ra.params[static_cast<std::size_t>(r)][i], rb.params[static_cast<std::size_t>(r)][i]));
    }
  }
  CHECK_FALSE(torch::equal(ra.params[0][0], start[0]));
}

namespace {

// Records what it was given and penalizes layer l by (l + 1).
class LayerPenalty final : public StalenessPenalty {
 public:
  mutable std::vector<std::int64_t> rounds, offsets;
  mutable at::Tensor outer, previous, gradient;
  std::vector<double> lambda(const StalenessInputs& in) const override {
    rounds.push_back(in.round);
    offsets = in.layer_offsets;
    outer = in.outer.clone(), previous = in.previous_outer.clone(), gradient = in.pseudo_gradient.clone();
    std::vector<double> out;
    for (std::size_t l = 0; l + 1 < in.layer_offsets.size(); ++l) out.push_back(static_cast<double>(l + 1));
    return out;
  }
};

}  // namespace

TEST_CASE("a staleness penalty sees the outer points, the pseudo-gradient and the layers, and may scale each layer") {
  CO2Options o;
  o.inner_steps = 1;
  o.outer_momentum = 0.0;
  auto penalty = std::make_shared<LayerPenalty>();
  Co2Ranks ranks(1, o, {torch::zeros({2}), torch::zeros({3})}, penalty, /*layers=*/{2, 3});
  auto& p = ranks.params[0];
  p[0] += 6.0f;
  p[1] += 6.0f;
  REQUIRE(ranks.opt[0]->step(1, in(5s)).ok());  // launches the average of round 1: all 6
  CHECK(penalty->rounds.empty());
  p[0] += 1.0f;  // local progress in round 2 (replaced by the outer point at its end)
  REQUIRE(ranks.opt[0]->step(2, in(5s)).ok());  // g = x_{1,0} - xbar_1 = 0 - 6
  REQUIRE((penalty->rounds == std::vector<std::int64_t>{2}));
  CHECK((penalty->offsets == std::vector<std::int64_t>{0, 2, 5}));
  CHECK(torch::equal(penalty->gradient, torch::full({5}, -6.0f)));
  CHECK(torch::equal(penalty->previous, torch::zeros({5})));
  CHECK(torch::equal(penalty->outer, torch::zeros({5})));  // x_{2,0}: round 1 had nothing to apply
  // Layer 0 divided by 1, layer 1 by 2.
  CHECK(torch::equal(p[0], torch::full({2}, 6.0f)));
  CHECK(torch::equal(p[1], torch::full({3}, 3.0f)));
  // A penalty giving the wrong number of factors is a caller's bug, caught.
  class Wrong final : public StalenessPenalty {
    std::vector<double> lambda(const StalenessInputs&) const override { return {1.0, 2.0, 3.0}; }
  };
  Co2Ranks wrong(1, o, {torch::zeros({5})}, std::make_shared<Wrong>(), {2, 3});
  REQUIRE(wrong.opt[0]->step(1, in(5s)).ok());
  CHECK_THROWS(wrong.opt[0]->step(2, in(5s)));
}

TEST_CASE("finish applies the last round's average, so the end holds every average, and a later round does not count it lost") {
  const int m = 2;
  CO2Options o;
  o.inner_steps = 1;
  o.outer_lr = 1.0;
  o.outer_momentum = 0.0;
  Co2Ranks ranks(m, o, {torch::zeros({2})});
  // Round 1 moves rank r by (r + 1): the average is x_{1,0} + 1.5, applied at round 2 or by finish().
  on_ranks(m, [&](int r) {
    ranks.params[static_cast<std::size_t>(r)][0] += static_cast<float>(r + 1);
    REQUIRE(ranks.opt[static_cast<std::size_t>(r)]->step(1, in(10s)).ok());
  });
  for (int r = 0; r < m; ++r) CHECK(torch::equal(ranks.params[static_cast<std::size_t>(r)][0], torch::zeros({2})));  // not yet applied
  on_ranks(m, [&](int r) { REQUIRE(ranks.opt[static_cast<std::size_t>(r)]->finish(in(10s)).ok()); });
  for (int r = 0; r < m; ++r) {
    CHECK(torch::equal(ranks.params[static_cast<std::size_t>(r)][0], torch::full({2}, 1.5f)));
    CHECK(ranks.opt[static_cast<std::size_t>(r)]->skipped_rounds() == 0);
  }
  const Bytes saved = ranks.opt[0]->save();
  // Training goes on (a resumed run with more steps): round 2 has nothing pending and loses nothing.
  on_ranks(m, [&](int r) { REQUIRE(ranks.opt[static_cast<std::size_t>(r)]->step(2, in(10s)).ok()); });
  for (int r = 0; r < m; ++r) CHECK(ranks.opt[static_cast<std::size_t>(r)]->skipped_rounds() == 0);
  // The state after finish loads elsewhere with nothing pending: the next round only launches.
  Co2Ranks other(1, o, {torch::zeros({2})});
  REQUIRE(other.opt[0]->load(saved).ok());
  REQUIRE(other.opt[0]->finish(in(5s)).ok());  // nothing to finish
  CHECK((other.opt[0]->save() == saved));
}
