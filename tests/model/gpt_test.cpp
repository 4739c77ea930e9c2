#include <doctest/doctest.h>

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "core/check.h"
#include "model/gpt.h"

using namespace gossamer;
using model::Gpt;
using model::GptConfig;

namespace {
GptConfig small() {
  GptConfig c;
  c.context = 16;
  c.layers = 2;
  c.width = 32;
  c.heads = 4;
  return c;
}
}  // namespace

TEST_CASE("forward gives (B, T, vocab) logits for any T up to the context") {
  Gpt gpt(small());
  for (std::int64_t T : {1, 7, 16}) {
    auto tokens = torch::randint(0, 256, {3, T}, torch::kLong);
    auto logits = gpt.forward(tokens);
    CHECK(logits.sizes() == torch::IntArrayRef({3, T, 256}));
    CHECK(torch::isfinite(logits).all().item<bool>());
  }
  CHECK_THROWS_AS(gpt.forward(torch::zeros({1, 17}, torch::kLong)), ContractError);
}

TEST_CASE("attention is causal: changing a later token never changes earlier logits") {
  Gpt gpt(small());
  gpt.train(false);
  torch::NoGradGuard no_grad;
  auto a = torch::randint(0, 256, {2, 16}, torch::kLong);
  for (std::int64_t pos : {0, 5, 15}) {
    auto b = a.clone();
    b.index_put_({torch::indexing::Slice(), pos}, (a.index({torch::indexing::Slice(), pos}) + 1) % 256);
    auto la = gpt.forward(a), lb = gpt.forward(b);
    using torch::indexing::Slice;
    if (pos > 0) CHECK(torch::equal(la.index({Slice(), Slice(0, pos)}), lb.index({Slice(), Slice(0, pos)})));
    // ... and the changed position itself does change the logits from there on.
    CHECK_FALSE(torch::equal(la.index({Slice(), Slice(pos, 16)}), lb.index({Slice(), Slice(pos, 16)})));
  }
}

TEST_CASE("blocks enumerate every parameter exactly once, in model order") {
  GptConfig c = small();
  Gpt gpt(c);
  auto blocks = gpt.blocks();
  REQUIRE(blocks.size() == static_cast<std::size_t>(c.layers + 2));
  CHECK(blocks.front().name == "embed");
  CHECK(blocks[1].name == "block.0");
  CHECK(blocks.back().name == "final");
  std::set<const void*> seen;
  std::int64_t total = 0;
  for (const auto& b : blocks) {
    for (const auto& p : b.parameters) {
      CHECK(seen.insert(p.tensor.unsafeGetTensorImpl()).second);
      total += p.tensor.numel();
    }
  }
  CHECK(seen.size() == gpt.module().parameters().size());
  // Closed form: embeddings V*d + T*d; per block 2 LayerNorms (4d), qkv (3d^2 + 3d), proj (d^2 + d),
  // fc (4d^2 + 4d), proj (4d^2 + d); final LayerNorm 2d. The head is tied.
  const std::int64_t d = c.width;
  const std::int64_t expected = 256 * d + c.context * d + c.layers * (12 * d * d + 13 * d) + 2 * d;
  CHECK(total == expected);
  CHECK(gpt.num_parameters() == expected);
}

TEST_CASE("initialization is seeded and GPT-2 scaled") {
  GptConfig c = small();
  Gpt a(c), b(c);
  c.init_seed += 1;
  Gpt other(c);
  auto pa = a.parameters(), pb = b.parameters(), po = other.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(torch::equal(pa[i], pb[i]));
  CHECK_FALSE(torch::equal(pa[0], po[0]));
  // Token embedding std ~0.02; residual projection std ~0.02/sqrt(2L).
  CHECK(pa[0].std().item<double>() == doctest::Approx(0.02).epsilon(0.05));
  for (const auto& p : a.named_parameters()) {
    if (p.name == "block.0.attn.proj.weight") CHECK(p.tensor.std().item<double>() == doctest::Approx(0.01).epsilon(0.1));
  }
}

TEST_CASE("an untrained model predicts bytes about uniformly") {
  Gpt gpt(small());
  auto tokens = torch::randint(0, 256, {4, 16}, torch::kLong);
  auto targets = torch::randint(0, 256, {4, 16}, torch::kLong);
  const double loss = gpt.loss(tokens, targets).item<double>();
  CHECK(loss == doctest::Approx(std::log(256.0)).epsilon(0.02));
}

TEST_CASE("dropout draws from the model's own seeded generator") {
  GptConfig c = small();
  c.dropout = 0.3;
  Gpt a(c), b(c);
  a.train(true);
  b.train(true);
  auto tokens = torch::randint(0, 256, {2, 16}, torch::kLong);
  const auto state = a.rng_state();
  auto la = a.forward(tokens);
  CHECK(torch::equal(la, b.forward(tokens)));          // same seed, same masks
  CHECK_FALSE(torch::equal(la, a.forward(tokens)));    // the generator advanced
  a.set_rng_state(state);
  CHECK(torch::equal(la, a.forward(tokens)));          // restored state replays the masks
  a.train(false);
  CHECK(torch::equal(a.forward(tokens), a.forward(tokens)));  // no dropout in eval mode
}

TEST_CASE("the forward in pieces (embed, blocks, head) is the forward, bit for bit, and so are its gradients") {
  GptConfig c = small();
  c.layers = 4;
  Gpt whole(c), pieces(c);  // the same seed: the same weights
  auto tokens = torch::randint(0, 256, {2, 16}, torch::kLong);
  auto targets = torch::randint(0, 256, {2, 16}, torch::kLong);
  const auto loss_of = [&](const at::Tensor& logits) { return torch::nn::functional::cross_entropy(logits.reshape({-1, 256}), targets.reshape({-1})); };
  auto a = loss_of(whole.forward(tokens));
  auto x = pieces.embed(tokens);
  for (std::int64_t i = 0; i < c.layers; ++i) x = pieces.block(i, x);
  auto b = loss_of(pieces.head(x));
  CHECK(torch::equal(a, b));
  a.backward();
  b.backward();
  const auto pa = whole.module().parameters(), pb = pieces.module().parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(torch::equal(pa[i].grad(), pb[i].grad()));
  CHECK_THROWS_AS(pieces.block(4, x), ContractError);
}

TEST_CASE("scaling a block's residual branches scales its output projections only, and factor 0 makes the block the identity") {
  Gpt gpt(small());
  gpt.train(false);
  torch::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> before;
  for (const auto& b : gpt.blocks()) {
    for (const auto& p : b.parameters) before[p.name] = p.tensor.clone();
  }
  gpt.scale_residual_branches(1, 0.5);
  int scaled = 0;
  for (const auto& b : gpt.blocks()) {
    for (const auto& p : b.parameters) {
      CAPTURE(p.name);
      const bool branch_out = p.name.rfind("block.1.", 0) == 0 && p.name.find(".proj.") != std::string::npos;
      if (branch_out) {
        ++scaled;
        CHECK(torch::equal(p.tensor, before[p.name] * 0.5));  // a power of two: exact
      } else {
        CHECK(torch::equal(p.tensor, before[p.name]));
      }
    }
  }
  CHECK(scaled == 4);  // attention's and the MLP's output projection, weight and bias
  const auto x = torch::randn({2, 16, 32});
  const auto half = gpt.block(1, x);
  CHECK(!torch::equal(half, x));
  gpt.scale_residual_branches(1, 0.0);
  CHECK(torch::equal(gpt.block(1, x), x));  // nothing added: the block is skipped
  CHECK(!torch::equal(gpt.block(0, x), x));
  CHECK_THROWS_AS(gpt.scale_residual_branches(2, 0.5), ContractError);
  CHECK_THROWS_AS(gpt.scale_residual_branches(0, std::nan("")), ContractError);
}
