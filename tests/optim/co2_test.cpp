#include <doctest/doctest.h>

#include <torch/torch.h>

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
