#include <doctest/doctest.h>

#include <torch/torch.h>

#include "quant/error_feedback.h"

using namespace gossamer;
using namespace gossamer::quant;

TEST_CASE("error feedback keeps the running sum of decoded values within one round's error") {
  EncodeOptions o;
  o.codec = CodecId::kFp4E3M0;
  o.block_size = 64;
  ErrorFeedback ef(o);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const std::int64_t n = 4096;
  at::Tensor sum_in = torch::zeros({n}), sum_ef = torch::zeros({n}), sum_plain = torch::zeros({n});
  double one_round = 0.0;
  for (int round = 0; round < 200; ++round) {
    // A persistent small bias plus noise: without feedback, the part below the quantization step is lost every round.
    const at::Tensor x = 0.01 + torch::randn({n}, gen);
    sum_in += x;
    sum_ef += *decode(ef.encode(x));
    const at::Tensor plain = *decode(encode(x, o));
    sum_plain += plain;
    one_round = std::max(one_round, (plain - x).abs().max().item<double>());
  }
  // With feedback the gap is exactly the carried residual, bounded by one round's error.
  CHECK(torch::allclose(sum_in - sum_ef, ef.residual(), 1e-3, 1e-3));
  const double ef_gap = (sum_in - sum_ef).abs().max().item<double>();
  const double plain_gap = (sum_in - sum_plain).abs().max().item<double>();
  MESSAGE("max drift after 200 rounds: with feedback " << ef_gap << ", without " << plain_gap);
  CHECK(ef_gap <= 2.0 * one_round);
  CHECK(plain_gap > 5.0 * ef_gap);
}

TEST_CASE("error feedback state saves and loads, bad state is refused") {
  EncodeOptions o;
  o.codec = CodecId::kInt4;
  ErrorFeedback a(o);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  (void)a.encode(torch::randn({300}, gen));
  ErrorFeedback b(o);
  REQUIRE(b.load(a.save()).ok());
  CHECK(torch::equal(a.residual(), b.residual()));
  const at::Tensor x = torch::randn({300}, gen);
  CHECK((a.encode(x) == b.encode(x)));
  Bytes bad = a.save();
  bad.resize(bad.size() - 3);
  CHECK_FALSE(b.load(bad).ok());
  CHECK_THROWS_AS((void)a.encode(torch::randn({7}, gen)), ContractError);
  a.reset();
  CHECK_FALSE(a.residual().defined());
}
