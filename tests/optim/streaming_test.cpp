#include <doctest/doctest.h>

#include <torch/torch.h>

#include "optim/diloco.h"
#include "optim/fragments.h"
#include "optim/ranks.h"
#include "optim/streaming_diloco.h"

using namespace gossamer;
using namespace gossamer::optim;
using namespace std::chrono_literals;
using testing::mesh;
using testing::on_ranks;
using testing::in;

namespace {

std::vector<ParamBlock> blocks(int layers) {
  std::vector<ParamBlock> b;
  b.push_back({"embed", {torch::zeros({4})}});
  for (int l = 0; l < layers; ++l) b.push_back({"block." + std::to_string(l), {torch::zeros({2}), torch::zeros({3})}});
  b.push_back({"final", {torch::zeros({1})}});
  return b;
}

std::vector<std::string> names(const Fragment& f) { return f.blocks; }
}  // namespace

TEST_CASE("fragments: strided, sequential, and the embedding and final block placed as asked") {
  const auto b = blocks(6);
  FragmentOptions o;
  o.fragments = 3;
  auto strided = make_fragments(b, o);
  REQUIRE(strided.size() == 3);
  CHECK(names(strided[0]) == std::vector<std::string>{"embed", "block.0", "block.3"});
  CHECK(names(strided[1]) == std::vector<std::string>{"block.1", "block.4"});
  CHECK(names(strided[2]) == std::vector<std::string>{"block.2", "block.5", "final"});
  CHECK(strided[0].numel == 4 + 10);
  o.pattern = FragmentPattern::kSequential;
  auto seq = make_fragments(b, o);
  CHECK(names(seq[0]) == std::vector<std::string>{"embed", "block.0", "block.1"});
  CHECK(names(seq[2]) == std::vector<std::string>{"block.4", "block.5", "final"});
  o.edges = EdgePlacement::kOwnFragments;
  auto own = make_fragments(b, o);
  REQUIRE(own.size() == 5);
  CHECK(names(own.front()) == std::vector<std::string>{"embed"});
  CHECK(names(own.back()) == std::vector<std::string>{"final"});
  std::int64_t total = 0;
  for (const auto& f : own) total += f.numel;
  CHECK(total == 4 + 6 * 5 + 1);  // every tensor exactly once
  o.fragments = 7;
  CHECK_THROWS_AS(make_fragments(b, o), ContractError);
}

TEST_CASE("fragments of a pipeline stage's blocks: without the embedding or the final block, only the transformer blocks are cut") {
  const auto whole = blocks(4);
  const std::vector<ParamBlock> middle(whole.begin() + 1, whole.end() - 1);  // a stage past stage 0
  FragmentOptions o;
  o.fragments = 2;
  auto f = make_fragments(middle, o);
  REQUIRE(f.size() == 2);
  CHECK(names(f[0]) == std::vector<std::string>{"block.0", "block.2"});
  CHECK(names(f[1]) == std::vector<std::string>{"block.1", "block.3"});
  o.edges = EdgePlacement::kOwnFragments;
  CHECK(make_fragments(middle, o).size() == 2);  // no edge fragments for edges the stage has not
  const std::vector<ParamBlock> first(whole.begin(), whole.end() - 1);  // the embedding, no final block
  auto own = make_fragments(first, o);
  REQUIRE(own.size() == 3);
  CHECK(names(own.front()) == std::vector<std::string>{"embed"});
  CHECK(names(own.back()) == std::vector<std::string>{"block.1", "block.3"});
  o.fragments = 5;
  CHECK_THROWS_AS(make_fragments(middle, o), ContractError);
  CHECK_THROWS_AS(make_fragments(std::vector<ParamBlock>{whole.front(), whole.back()}, FragmentOptions{}), ContractError);
}

TEST_CASE("Streaming DiLoCo with P = 1, tau = 0, alpha = 0 equals DiLoCo bit for bit") {
  const int m = 2;
  auto g_plain = mesh(m), g_stream = mesh(m);
  std::vector<std::unique_ptr<AsyncCollectives>> comm;
  for (int r = 0; r < m; ++r) comm.push_back(std::make_unique<AsyncCollectives>(g_stream[static_cast<std::size_t>(r)]));
  std::vector<std::vector<at::Tensor>> a(m), b(m);
  std::vector<std::unique_ptr<DiLoCo>> plain(m);
  std::vector<std::unique_ptr<StreamingDiLoCo>> stream(m);
  DiLoCoOptions d;
  d.inner_steps = 3;
  StreamingDiLoCoOptions s;
  s.inner_steps = 3;
  s.overlap = 0;
  s.mixing = 0.0;
  s.outer_lr = d.outer_lr;
  s.outer_momentum = d.outer_momentum;
  for (int r = 0; r < m; ++r) {
    a[static_cast<std::size_t>(r)] = {torch::zeros({3}), torch::zeros({2})};
    b[static_cast<std::size_t>(r)] = {torch::zeros({3}), torch::zeros({2})};
    plain[static_cast<std::size_t>(r)] = std::make_unique<DiLoCo>(a[static_cast<std::size_t>(r)], g_plain[static_cast<std::size_t>(r)], d);
    Fragment f;
    f.tensors = b[static_cast<std::size_t>(r)];
    stream[static_cast<std::size_t>(r)] = std::make_unique<StreamingDiLoCo>(std::vector<Fragment>{f}, *comm[static_cast<std::size_t>(r)], s);
  }
  on_ranks(m, [&](int r) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(r) + 1);
    for (std::int64_t step = 1; step <= 9; ++step) {
      const at::Tensor m0 = torch::randn({3}, gen), m1 = torch::randn({2}, gen);
      a[static_cast<std::size_t>(r)][0] += m0;
      a[static_cast<std::size_t>(r)][1] += m1;
      b[static_cast<std::size_t>(r)][0] += m0;
      b[static_cast<std::size_t>(r)][1] += m1;
      REQUIRE(plain[static_cast<std::size_t>(r)]->step(step, in(5s)).ok());
      REQUIRE(stream[static_cast<std::size_t>(r)]->step(step, in(5s)).ok());
    }
  });
  for (int r = 0; r < m; ++r) {
    CHECK(torch::equal(a[static_cast<std::size_t>(r)][0], b[static_cast<std::size_t>(r)][0]));
    CHECK(torch::equal(a[static_cast<std::size_t>(r)][1], b[static_cast<std::size_t>(r)][1]));
    CHECK(stream[static_cast<std::size_t>(r)]->rounds() == 3);
  }
}

TEST_CASE("Streaming DiLoCo's schedule: fragments take turns, launch tau steps early, and mix with alpha") {
  auto g = mesh(1);
  AsyncCollectives comm(g[0]);
  StreamingDiLoCoOptions o;
  o.inner_steps = 4;
  o.overlap = 1;
  o.mixing = 0.5;
  o.outer_lr = 1.0;
  o.outer_momentum = 0.0;
  std::vector<at::Tensor> t0 = {torch::zeros({1})}, t1 = {torch::zeros({1})};
  Fragment f0, f1;
  f0.tensors = t0;
  f1.tensors = t1;
  StreamingDiLoCo s({f0, f1}, comm, o);
  std::vector<int> completed;
  for (std::int64_t step = 1; step <= 8; ++step) {
    t0[0] += 1.0f;
    t1[0] += 1.0f;
    // At step 2, fragment 0 (launched at step 1: outer 0, local 1, Delta = -1) completes: outer = 1
    // and local (2, with the tau extra step) mixed half and half: 1.5.
    auto c = s.step(step, in(5s));
    REQUIRE(c.ok());
    completed.push_back(*c);
    if (step == 2) {
      CHECK(t0[0].item<float>() == doctest::Approx(1.5));
      CHECK(s.outer_weights(0).item<float>() == doctest::Approx(1.0));
      CHECK(t1[0].item<float>() == doctest::Approx(2.0));  // fragment 1 untouched so far
    }
  }
  // Fragment 0 completes at steps 2 and 6, fragment 1 at 4 and 8.
  CHECK(completed == std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1});
  StreamingDiLoCoOptions bad = o;
  bad.overlap = 2;  // tau must be below H/P = 2
  CHECK_THROWS_AS(StreamingDiLoCo({f0, f1}, comm, bad), ContractError);
}
