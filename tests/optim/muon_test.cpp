// Muon (optim/muon.h): the Newton-Schulz orthogonalization against the SVD, its bf16 path against
// fp32, and steps that lower a least-squares loss.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include <torch/linalg.h>
#include <torch/torch.h>

#include "optim/muon.h"

using namespace gossamer;
using namespace gossamer::optim;

namespace {

// U V^T of g's SVD, in fp64: what orthogonalize approximates.
at::Tensor polar(const at::Tensor& g) {
  auto [u, s, vh] = torch::linalg::svd(g.to(torch::kDouble), /*full_matrices=*/false, {});
  return torch::mm(u, vh);
}

double cosine(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(torch::kDouble).flatten(), y = b.to(torch::kDouble).flatten();
  return (torch::dot(x, y) / (x.norm() * y.norm())).item<double>();
}

// X = orthogonalize(G) is G's singular vectors with each singular value s mapped by an odd
// polynomial: U^T X V is diagonal. Singular values that are not tiny (above 1% of the largest) land
// near 1; tiny ones grow by at most a^5 (the iteration cannot tell them from noise, by design).
struct Spectrum {
  double off_diagonal = 0;      // largest |off-diagonal| of U^T X V
  double low = 1e9, high = 0;   // the range of the diagonal over G's non-tiny singular values
};

Spectrum spectrum_of(const at::Tensor& g, const at::Tensor& x) {
  auto [u, s, vh] = torch::linalg::svd(g.to(torch::kDouble), false, {});
  const at::Tensor d = torch::mm(torch::mm(u.t(), x.to(torch::kDouble)), vh.t());
  Spectrum out;
  out.off_diagonal = (d - torch::diag(torch::diagonal(d))).abs().max().item<double>();
  const double top = s[0].item<double>();
  for (std::int64_t i = 0; i < s.size(0); ++i) {
    if (s[i].item<double>() < 0.01 * top) continue;
    const double v = d[i][i].item<double>();
    out.low = std::min(out.low, v);
    out.high = std::max(out.high, v);
  }
  return out;
}

}  // namespace

TEST_CASE("muon: Newton-Schulz takes a matrix near U V^T, wide or tall, in fp32 and bf16") {
  torch::manual_seed(3);
  for (auto shape : {std::vector<std::int64_t>{32, 96}, std::vector<std::int64_t>{96, 32}, std::vector<std::int64_t>{64, 64}}) {
    CAPTURE(shape[0]);
    CAPTURE(shape[1]);
    // A gradient-like matrix: a few strong directions over noise, singular values spread widely.
    const at::Tensor g = torch::randn({shape[0], 4}).mm(torch::randn({4, shape[1]})) * 10 + torch::randn(shape);
    const at::Tensor x = orthogonalize(g, 5, torch::kFloat);
    CHECK(x.sizes().equals(g.sizes()));
    CHECK((x.scalar_type() == torch::kFloat));
    // G's singular vectors kept; its non-tiny singular values taken near 1.
    const Spectrum sp = spectrum_of(g, x);
    CHECK(sp.off_diagonal < 1e-3);
    CHECK(sp.low > 0.6);
    CHECK(sp.high < 1.25);
    CHECK(torch::linalg::svdvals(x.to(torch::kDouble), {}).max().item<double>() < 1.25);
    // Close to the exact polar factor U V^T.
    CHECK(cosine(x, polar(g)) > 0.9);
    // The bf16 path agrees with fp32 (bf16 has 8 bits of mantissa).
    const at::Tensor xb = orthogonalize(g, 5, torch::kBFloat16);
    CHECK(cosine(xb, x) > 0.99);
  }
  // A zero matrix stays zero, without NaN.
  const at::Tensor z = orthogonalize(torch::zeros({8, 16}), 5, torch::kFloat);
  CHECK(torch::isfinite(z).all().item<bool>());
  CHECK(z.abs().max().item<double>() == 0.0);
  // More iterations take the non-tiny singular values closer to 1.
  const at::Tensor g = torch::randn({48, 80});
  const Spectrum one = spectrum_of(g, orthogonalize(g, 1, torch::kFloat));
  const Spectrum five = spectrum_of(g, orthogonalize(g, 5, torch::kFloat));
  CHECK(std::max(1 - five.low, five.high - 1) < std::max(1 - one.low, one.high - 1));
}

TEST_CASE("muon: steps lower a least-squares loss, with momentum and weight decay as stated") {
  torch::manual_seed(5);
  const at::Tensor inputs = torch::randn({256, 24});
  const at::Tensor target_w = torch::randn({16, 24});
  const at::Tensor targets = inputs.mm(target_w.t());
  at::Tensor w = torch::zeros({16, 24}, torch::requires_grad());
  MuonOptions o;
  o.lr = 0.05;
  o.bf16 = false;
  auto muon = Muon::make({w}, o);
  REQUIRE(muon.ok());
  auto loss = [&] { return (inputs.mm(w.t()) - targets).pow(2).mean(); };
  const double before = loss().item<double>();
  double last = before;
  for (int i = 0; i < 200; ++i) {
    if (w.grad().defined()) w.mutable_grad().zero_();
    at::Tensor l = loss();
    l.backward();
    muon->step();
    last = l.item<double>();
  }
  CHECK(last < 0.05 * before);
  CHECK(muon->momenta()[0].abs().sum().item<double>() > 0);
  // One step from zero momentum with Nesterov: the update is orthogonalize(G + beta (M - G)) with
  // M = (1 - beta) G, scaled by lr (a wide matrix: scale 1); weight decay shrinks W first.
  at::Tensor v = torch::randn({8, 12}, torch::requires_grad());
  const at::Tensor v0 = v.detach().clone();
  MuonOptions d;
  d.lr = 0.1;
  d.weight_decay = 0.5;
  d.bf16 = false;
  auto one = Muon::make({v}, d);
  REQUIRE(one.ok());
  const at::Tensor grad = torch::randn({8, 12});
  v.mutable_grad() = grad.clone();
  one->step();
  const at::Tensor m = (1 - d.momentum) * grad;
  const at::Tensor want = v0 * (1 - d.lr * d.weight_decay) - d.lr * orthogonalize(grad + d.momentum * (m - grad), 5, torch::kFloat);
  CHECK(torch::allclose(v.detach(), want, 1e-5, 1e-6));
  // A parameter without a gradient is left alone.
  at::Tensor idle = torch::randn({4, 4}, torch::requires_grad());
  const at::Tensor idle0 = idle.detach().clone();
  auto none = Muon::make({idle}, d);
  REQUIRE(none.ok());
  none->step();
  CHECK(torch::equal(idle.detach(), idle0));
}

TEST_CASE("muon: with match_adamw a step's RMS is 0.2 lr for every shape, and the decay is lr wd") {
  torch::manual_seed(9);
  // Shapes of a transformer's matrices at two widths: square, tall (a fused QKV, an MLP's first
  // layer) and wide (its second); the reference's scale gives them RMS steps that differ by up to 2x
  // and shrink with width, Moonlight's gives each 0.2 lr.
  for (auto [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{{96, 96}, {288, 96}, {384, 96}, {96, 384}, {512, 512}, {512, 2048}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    for (const bool match : {false, true}) {
      at::Tensor w = torch::randn({rows, cols}, torch::requires_grad());
      const at::Tensor w0 = w.detach().clone();
      MuonOptions o;
      o.lr = 0.003;
      o.weight_decay = 0.1;
      o.match_adamw = match;
      o.bf16 = false;
      auto muon = Muon::make({w}, o);
      REQUIRE(muon.ok());
      w.mutable_grad() = torch::randn({rows, cols});
      muon->step();
      const double rms = (w.detach() - w0 * (1 - o.lr * o.weight_decay)).pow(2).mean().sqrt().item<double>();
      const double reference = o.lr * std::sqrt(std::max(1.0, double(rows) / double(cols))) / std::sqrt(double(std::max(rows, cols)));
      // Newton-Schulz leaves singular values in about [0.7, 1.2]: the RMS within 30% of its target.
      CHECK(rms == doctest::Approx(match ? 0.2 * o.lr : reference).epsilon(0.3));
    }
  }
}

TEST_CASE("muon: what it is given is checked") {
  CHECK(Muon::make({torch::zeros({4})}, {}).status().code() == ErrorCode::kInvalidArgument);  // a vector: AdamW's
  MuonOptions bad;
  bad.momentum = 1.0;
  CHECK_FALSE(Muon::make({torch::zeros({4, 4})}, bad).ok());
  auto m = Muon::make({torch::zeros({4, 4}), torch::zeros({2, 3})}, {});
  REQUIRE(m.ok());
  CHECK_FALSE(m->set_momenta({torch::zeros({4, 4})}).ok());                       // one short
  CHECK_FALSE(m->set_momenta({torch::zeros({4, 4}), torch::zeros({3, 2})}).ok());  // a shape differs
  CHECK_FALSE(m->set_momenta({torch::full({4, 4}, NAN), torch::zeros({2, 3})}).ok());
  CHECK(m->set_momenta({torch::ones({4, 4}), torch::ones({2, 3})}).ok());
  CHECK(m->momenta()[1].sum().item<double>() == 6.0);
}
