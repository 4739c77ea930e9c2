// Staleness-aware outer steps (optim/diloco.h): each round's mean Delta applied `delay_rounds`
// later, with the paper's Nesterov outer step or with CGAD (Adam on age-gated pseudo-gradients). The
// stability tests run DiLoCo at delays of 1 to 8 rounds on a noisy ill-conditioned quadratic with a
// known optimum, far from the start (as a model's weights travel far over training, many outer steps
// long): CGAD trains at every delay; Nesterov, at the DiLoCo paper's settings (lr 0.7, momentum
// 0.9), converges on time and blows up from a delay of one round.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include <torch/torch.h>

#include "optim/diloco.h"
#include "optim/ranks.h"

using namespace gossamer;
using namespace gossamer::optim;
using namespace std::chrono_literals;
using testing::in;
using testing::mesh;
using testing::on_ranks;

namespace {

constexpr std::int64_t kInner = 10;   // H
constexpr int kRounds = 150;
constexpr double kInnerLr = 0.05;

// Two workers run DiLoCo on f(x) = 1/2 sum a_i (x_i - x*_i)^2 (curvatures 0.2 to 2), plain SGD
// inside with seeded gradient noise. The loss of the outer weights at the end over that at the start
// (non-finite when it blew up).
double final_over_initial(OuterStep step, std::int64_t delay) {
  const int m = 2;
  const std::int64_t n = 64;
  auto groups = mesh(m);
  DiLoCoOptions o;
  o.inner_steps = kInner;
  o.outer_step = step;
  o.delay_rounds = delay;
  o.cgad.lr = kInnerLr * std::sqrt(static_cast<double>(kInner));  // train/outer.cpp's rule
  const at::Tensor curvature = torch::linspace(0.2, 2.0, n);
  const at::Tensor target = torch::linspace(-5.0, 5.0, n);
  const auto loss = [&](const at::Tensor& x) { return 0.5 * (curvature * (x - target).pow(2)).sum().item<double>(); };
  std::vector<std::vector<at::Tensor>> params(m);
  std::vector<std::unique_ptr<DiLoCo>> opt(m);
  for (int r = 0; r < m; ++r) {
    params[static_cast<std::size_t>(r)] = {torch::zeros({n})};
    opt[static_cast<std::size_t>(r)] = std::make_unique<DiLoCo>(params[static_cast<std::size_t>(r)], groups[static_cast<std::size_t>(r)], o);
  }
  const double initial = loss(torch::zeros({n}));
  on_ranks(m, [&](int r) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(r) + 7);
    std::normal_distribution<float> noise(0.0f, 0.3f);
    at::Tensor& x = params[static_cast<std::size_t>(r)][0];
    for (std::int64_t s = 1; s <= kInner * kRounds; ++s) {
      at::Tensor g = curvature * (x - target);
      auto* gp = g.data_ptr<float>();
      for (std::int64_t i = 0; i < n; ++i) gp[i] += noise(rng);
      x.sub_(g * kInnerLr);
      REQUIRE(opt[static_cast<std::size_t>(r)]->step(s, in(10s)).ok());
    }
  });
  CHECK(torch::equal(opt[0]->outer_weights(), opt[1]->outer_weights()));  // replicas stay identical
  return loss(opt[0]->outer_weights()) / initial;
}

}  // namespace

TEST_CASE("stale outer steps at delays of 1 to 8 rounds: CGAD converges at every delay, Nesterov is the least stable") {
  double worst_cgad = 0, worst_nesterov = 0;
  for (std::int64_t delay = 0; delay <= 8; ++delay) {
    CAPTURE(delay);
    const double cgad = final_over_initial(OuterStep::kCGAD, delay);
    const double nesterov = final_over_initial(OuterStep::kNesterov, delay);
    MESSAGE("delay " << delay << ": final/initial loss, cgad " << cgad << ", nesterov " << nesterov);
    CHECK(std::isfinite(cgad));
    CHECK(cgad < 0.1);  // it trains at every delay: the loss falls at least ten-fold
    if (delay == 0) {
      CHECK(cgad < 0.001);  // on time both converge
      CHECK(nesterov < 0.001);
    } else {
      CHECK_FALSE(nesterov < 1.0);  // late, the paper's step blows up (or at best never improves)
    }
    worst_cgad = std::max(worst_cgad, cgad);
    worst_nesterov = std::isfinite(nesterov) ? std::max(worst_nesterov, nesterov) : INFINITY;
  }
  CHECK(worst_nesterov > 10 * worst_cgad);
}

TEST_CASE("a delayed or CGAD state saves and loads whole, and refuses another delay's") {
  auto groups = mesh(1);
  for (OuterStep step : {OuterStep::kNesterov, OuterStep::kCGAD}) {
    DiLoCoOptions o;
    o.inner_steps = 1;
    o.outer_step = step;
    o.delay_rounds = 3;
    o.cgad.lr = 0.1;
    std::vector<at::Tensor> p = {torch::zeros({5})};
    DiLoCo a(p, groups[0], o);
    for (std::int64_t s = 1; s <= 5; ++s) {  // 5 rounds: 2 applied, 3 waiting
      p[0].sub_(torch::full({5}, 0.1f * static_cast<float>(s)));
      REQUIRE(*a.step(s, in(5s)));
    }
    const Bytes saved = a.save();
    std::vector<at::Tensor> q = {torch::zeros({5})};
    DiLoCo b(q, groups[0], o);
    REQUIRE(b.load(ByteView(saved)).ok());
    CHECK((b.save() == saved));
    CHECK(b.rounds() == 5);
    // The same next round on both: the same outer weights (the waiting means came along).
    for (auto* t : {&p, &q}) (*t)[0].sub_(torch::full({5}, 1.0f));
    REQUIRE(*a.step(6, in(5s)));
    REQUIRE(*b.step(6, in(5s)));
    CHECK(torch::equal(a.outer_weights(), b.outer_weights()));
    // Another delay, or the plain method's state, is refused and changes nothing.
    DiLoCoOptions other = o;
    other.delay_rounds = 2;
    std::vector<at::Tensor> r = {torch::zeros({5})};
    DiLoCo c(r, groups[0], other);
    const Bytes before = c.save();
    CHECK_FALSE(c.load(ByteView(saved)).ok());
    CHECK((c.save() == before));
    DiLoCoOptions plain;
    plain.inner_steps = 1;
    std::vector<at::Tensor> u = {torch::zeros({5})};
    DiLoCo d(u, groups[0], plain);
    CHECK_FALSE(d.load(ByteView(saved)).ok());
    CHECK_FALSE(a.load(ByteView(d.save())).ok());
  }
}
