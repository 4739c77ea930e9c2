#include <doctest/doctest.h>

#include <torch/torch.h>

#include "optim/collectives.h"
#include "optim/diloco.h"
#include "optim/ranks.h"
#include "quant/codec.h"

using namespace gossamer;
using namespace gossamer::optim;
using namespace std::chrono_literals;
using testing::in;
using testing::mesh;
using testing::on_ranks;

namespace {

quant::EncodeOptions int2(std::uint32_t block = 8) {
  quant::EncodeOptions o;
  o.codec = quant::CodecId::kInt2;
  o.block_size = block;
  return o;
}

}  // namespace

TEST_CASE("allreduce_contribution is each segment of the collective's cuts through the codec") {
  const at::Tensor x = torch::randn({1001});
  // fp32, or a group of one: the values themselves.
  CHECK(torch::equal(allreduce_contribution(x, 3, quant::EncodeOptions{}), x));
  CHECK(torch::equal(allreduce_contribution(x, 1, int2()), x));
  // Three ranks, segments of at most 100 values: chunks 0..333, 333..667, 667..1001, each cut in 4.
  const at::Tensor c = allreduce_contribution(x, 3, int2(), 100);
  std::int64_t at = 0;
  for (int j = 0; j < 3; ++j) {
    const std::int64_t b = 1001 * j / 3, e = 1001 * (j + 1) / 3;
    for (int s = 0; s < 4; ++s) {
      const std::int64_t sb = b + (e - b) * s / 4, se = b + (e - b) * (s + 1) / 4;
      CHECK(sb == at);
      const at::Tensor piece = x.slice(0, sb, se).contiguous();
      const auto decoded = quant::decode(quant::encode(piece, int2()));
      REQUIRE(decoded.ok());
      CHECK(torch::equal(c.slice(0, sb, se), *decoded));
      at = se;
    }
  }
  CHECK(at == 1001);
  CHECK_FALSE(torch::equal(c, x));  // 2 bits lose something
}

TEST_CASE("MuLoCo's error feedback: the residual holds exactly what the codec has not sent") {
  const int m = 2;
  auto groups = mesh(m);
  DiLoCoOptions o;
  o.inner_steps = 1;
  o.outer_lr = 1.0;
  o.outer_momentum = 0.0;
  o.codec = int2();
  o.error_feedback = true;
  o.error_decay = 1.0;
  std::vector<std::vector<at::Tensor>> params(m);
  std::vector<std::unique_ptr<DiLoCo>> opt(m);
  for (int r = 0; r < m; ++r) {
    params[static_cast<std::size_t>(r)] = {torch::zeros({40})};
    opt[static_cast<std::size_t>(r)] = std::make_unique<DiLoCo>(params[static_cast<std::size_t>(r)], groups[static_cast<std::size_t>(r)], o);
  }
  // Every round each rank "trains" its weights by a fixed step of its own; with beta 1 what was sent
  // plus what stays behind is everything that was computed.
  std::vector<at::Tensor> sent(m), pushed(m);
  for (int r = 0; r < m; ++r) {
    sent[static_cast<std::size_t>(r)] = torch::zeros({40});
    pushed[static_cast<std::size_t>(r)] = torch::zeros({40});
  }
  const int rounds = 6;
  std::vector<at::Tensor> contribution(m);
  for (int round = 1; round <= rounds; ++round) {
    const at::Tensor outer_before = opt[0]->outer_weights().clone();
    on_ranks(m, [&](int r) {
      const auto i = static_cast<std::size_t>(r);
      auto& opt_r = *opt[i];
      const at::Tensor step = torch::linspace(-1.0, 1.0, 40) * static_cast<float>(r + 1) + 0.1f * static_cast<float>(round);
      params[i][0].sub_(step);  // Delta = outer - local = step
      const at::Tensor before = opt_r.residual().clone();
      const at::Tensor expected = allreduce_contribution(before + step, m, o.codec);
      auto did = opt_r.step(round, in(5s));
      REQUIRE(did.ok());
      CHECK(*did);
      CHECK(torch::allclose(opt_r.residual(), before + step - expected, 0, 1e-6));
      sent[i] += expected;
      pushed[i] += step;
      contribution[i] = expected;
    });
    // The owners decode exactly those contributions, average them and send the mean in the codec
    // (outer lr 1, no momentum: the outer weights move by it).
    const at::Tensor mean = allreduce_contribution((contribution[0] + contribution[1]) / 2, m, o.codec);
    CHECK(torch::allclose(opt[0]->outer_weights(), outer_before - mean, 0, 1e-5));
  }
  for (int r = 0; r < m; ++r) {
    const auto i = static_cast<std::size_t>(r);
    CHECK(torch::allclose(sent[i] + opt[i]->residual(), pushed[i], 0, 1e-4));
    // The residual is the codec's error of one round at most, never the sum of all: it is bounded.
    CHECK(opt[i]->residual().abs().max().item<float>() < pushed[i].abs().max().item<float>() / 2);
  }
  // Both ranks applied the same mean: their outer weights are bit-identical.
  CHECK(torch::equal(opt[0]->outer_weights(), opt[1]->outer_weights()));
}

TEST_CASE("MuLoCo's state saves and loads with its residual; what newcomers get leaves the residual behind") {
  DiLoCoOptions o;
  o.inner_steps = 1;
  o.codec = int2();
  o.error_feedback = true;
  o.error_decay = 0.9;
  auto groups = mesh(2);
  std::vector<std::vector<at::Tensor>> params = {{torch::zeros({16})}, {torch::zeros({16})}};
  std::vector<std::unique_ptr<DiLoCo>> opt(2);
  for (std::size_t r = 0; r < 2; ++r) opt[r] = std::make_unique<DiLoCo>(params[r], groups[r], o);
  on_ranks(2, [&](int r) {
    const auto i = static_cast<std::size_t>(r);
    params[i][0].sub_(torch::linspace(0.0, 1.0, 16) * static_cast<float>(r + 1));
    REQUIRE(opt[i]->step(1, in(5s)).ok());
  });
  const DiLoCo& a = *opt[0];
  REQUIRE(a.residual().abs().sum().item<float>() > 0.0f);  // 2 bits left something behind
  const Bytes full = a.save();
  const Bytes shared = a.save_shared();
  CHECK(full.size() == shared.size());
  CHECK_FALSE((full == shared));
  std::vector<at::Tensor> params_b = {torch::zeros({16})};
  DiLoCo b(params_b, mesh(1)[0], o);
  REQUIRE(b.load(full).ok());
  CHECK((b.save() == full));
  CHECK(torch::equal(b.residual(), a.residual()));
  b.drop_replica_state();
  CHECK(b.residual().abs().sum().item<float>() == 0.0f);
  REQUIRE(b.load(shared).ok());
  CHECK(b.residual().abs().sum().item<float>() == 0.0f);
  CHECK(torch::equal(b.outer_weights(), a.outer_weights()));
  // A plain DiLoCo state is not MuLoCo's, nor the other way round.
  DiLoCoOptions plain;
  plain.inner_steps = 1;
  std::vector<at::Tensor> params_c = {torch::zeros({16})};
  DiLoCo c(params_c, mesh(1)[0], plain);
  CHECK_FALSE(b.load(c.save()).ok());
  CHECK_FALSE(c.load(full).ok());
}
