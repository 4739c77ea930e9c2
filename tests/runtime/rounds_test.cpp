// The peer runtime's round arithmetic and the shared state's encoding, alone.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include "optim/outer_optimizer.h"
#include "runtime/rounds.h"
#include "train/outer.h"

using namespace gossamer;
using namespace gossamer::runtime;

TEST_CASE("round schedule: diloco agrees round r before step r*H, ddp right after its boundary, streaming tau steps early") {
  const RoundSchedule diloco{10, 0};
  CHECK(diloco.agreed_before(10) == 1);
  CHECK(diloco.agreed_before(20) == 2);
  CHECK_FALSE(diloco.agreed_before(11).has_value());
  CHECK(diloco.rounds_over(29) == 2);
  CHECK(diloco.ends_round(30));
  CHECK_FALSE(diloco.ends_round(0));
  CHECK(diloco.first_round_after(20) == 3);
  CHECK(diloco.last_round(60) == 6);

  const RoundSchedule ddp{5, -1};  // agreed after step r*5, i.e. before step r*5 + 1
  CHECK(ddp.agreed_before(6) == 1);
  CHECK_FALSE(ddp.agreed_before(5).has_value());
  CHECK(ddp.first_round_after(5) == 1);  // its members hold the same state there: a newcomer takes part in round 1
  CHECK(ddp.first_round_after(6) == 2);
  CHECK(ddp.last_round(60) == 11);

  const RoundSchedule streaming{25, 5};  // launches tau = 5 steps before it completes
  CHECK(streaming.agreed_before(20) == 1);
  CHECK(streaming.agreed_before(45) == 2);
  CHECK(streaming.first_round_after(25) == 2);
  CHECK(streaming.last_round(100) == 4);
}

TEST_CASE("round schedule from a config: the method's period, and local refused") {
  train::RunConfig c;
  c.outer.method = optim::Method::kDiLoCo;
  c.diloco.inner_steps = 40;
  auto outer = train::outer_config(c);
  REQUIRE(outer.ok());
  auto s = round_schedule(c, *outer);
  REQUIRE(s.ok());
  CHECK(s->period == 40);
  CHECK(s->lead == 0);
  c.outer.method = optim::Method::kLocal;
  outer = train::outer_config(c);
  REQUIRE(outer.ok());
  s = round_schedule(c, *outer);
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("sparseloco's period by rule: Covenant's 30, shortened to leave three accumulator drains on short runs") {
  train::RunConfig c;
  c.outer.method = optim::Method::kSparseLoCo;
  c.sparseloco.inner_steps = 0;
  c.sparseloco.chunk = 4096;
  c.sparseloco.topk = 64;  // a drain: 64 rounds; three: 192
  c.sparseloco.flush_codec = quant::CodecId::kFp4E2M1;
  const std::vector<std::pair<std::int64_t, std::int64_t>> by_steps = {{3000, 15}, {9000, 30}, {100000, 30}, {600, 3}, {100, 1}};
  for (const auto& [steps, period] : by_steps) {
    CAPTURE(steps);
    c.train.steps = steps;
    CHECK(train::sparseloco_period(c) == period);
    auto outer = train::outer_config(c);
    REQUIRE(outer.ok());
    CHECK(outer->sparseloco.inner_steps == period);
    CHECK(outer->sparseloco.last_step == steps);  // the last round flushes
    auto s = round_schedule(c, *outer);
    REQUIRE(s.ok());
    CHECK(s->period == period);
  }
  c.train.steps = 3000;
  c.sparseloco.topk = 128;  // half the drain: rounds can be twice as long
  CHECK(train::sparseloco_period(c) == 30);
  c.sparseloco.inner_steps = 25;  // set: taken as it is
  CHECK(train::sparseloco_period(c) == 25);
  c.sparseloco.flush_codec.reset();
  auto outer = train::outer_config(c);
  REQUIRE(outer.ok());
  CHECK(outer->sparseloco.last_step == 0);
}

TEST_CASE("shared state: parameters and outer state round-trip, and wrong sizes and non-finite values are refused") {
  train::RunConfig c;
  c.outer.method = optim::Method::kDiLoCo;
  auto outer_config = train::outer_config(c);
  REQUIRE(outer_config.ok());
  std::vector<at::Tensor> params = {torch::arange(6, torch::kFloat).reshape({2, 3}), torch::full({4}, 0.5f)};
  std::vector<optim::ParamBlock> blocks = {{"all", params}};
  optim::Group alone;
  alone.peers.resize(1);
  auto setup = optim::make_outer_optimizer(*outer_config, blocks, alone);
  REQUIRE(setup.ok());
  const Bytes encoded = encode_shared_state(params, *setup->outer, ByteView(), true);

  std::vector<at::Tensor> into = {torch::zeros({2, 3}), torch::zeros({4})};
  auto inner = load_shared_state(encoded, into, *setup->outer);
  REQUIRE(inner.ok());
  CHECK(inner->empty());
  CHECK(torch::equal(into[0], params[0]));
  CHECK(torch::equal(into[1], params[1]));

  std::vector<at::Tensor> smaller = {torch::zeros({2, 3})};
  CHECK_FALSE(load_shared_state(encoded, smaller, *setup->outer).ok());  // more parameters than this model has
  std::vector<at::Tensor> bad = {torch::full({2, 3}, std::numeric_limits<float>::quiet_NaN()), torch::zeros({4})};
  const Bytes nan_state = encode_shared_state(bad, *setup->outer, ByteView(), true);
  CHECK(load_shared_state(nan_state, into, *setup->outer).status().code() == ErrorCode::kMalformed);
  Bytes cut(encoded.begin(), encoded.begin() + static_cast<std::ptrdiff_t>(encoded.size() / 2));
  CHECK_FALSE(load_shared_state(cut, into, *setup->outer).ok());
}
